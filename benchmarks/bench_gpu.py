"""Neural Clamping fit throughput on GPUs: images/s against the forward + input-backward floor.

NOT MEASURED IN THIS REPOSITORY: the machine the committed results come from has no GPU. The
script is tested here on CPU with ``--device cpu --quick`` (tiny models and sizes) only; run it
on a GPU machine to get real numbers.

For timm ``resnet50`` and ``vit_base_patch16_224`` (``pretrained=False``: random weights from
the config) at 224×224 px on seeded synthetic images, in fp32 and bf16 autocast, it times in
interleaved rounds

* **floor**: frozen model, δ the only leaf requiring grad, batches already on the device, one
  forward + one backward to δ per step (+ the all-reduce of δ's gradient under several processes);
* **ours**: ``CalibratedModel.fit(..., method="neural_clamping", holdout_fraction=0,
  mixed_precision=...)`` on a CPU ``TensorDataset`` (the engine collates and copies each batch to
  the device, as a user's fit would); per-epoch time from ``fit_summary["history"]``;
* **reference style**: NCToolkit's loop (parameters keep ``requires_grad=True``; SGD over [δ, T]);

and reports images/s per process group. Multi-GPU: launch under torchrun; rank 0 reports::

    python benchmarks/bench_gpu.py --json /tmp/gpu1.json                       # 1 GPU
    torchrun --nproc_per_node 4 benchmarks/bench_gpu.py --compare /tmp/gpu1.json  # 4 GPUs, with speed-up vs 1
    python benchmarks/bench_gpu.py --device cpu --quick                        # the CPU smoke run

``--batch`` is the global batch (split over processes); ``--count`` the images per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import _report
from _report import Measured, Timing

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import focal_loss

NAME = "gpu"
NOT_MEASURED = (
    "**GPU numbers were not measured in this repository** (its benchmark machine has no GPU); "
    "this file is the output of whoever ran the script, on the machine named above."
)
PRECISION = {"fp32": None, "bf16": torch.bfloat16}


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if world() > 1:
        dist.barrier()


def autocast(device: torch.device, precision: str):
    dtype = PRECISION[precision]
    if dtype is None:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=dtype)


def local_slices(count: int, batch: int) -> List[slice]:
    """This process's strided share of each global batch, as the engine splits them (contiguous here)."""
    per = batch // world()
    return [slice(start + rank() * per, start + (rank() + 1) * per) for start in range(0, count, batch)]


def floor_epoch(model, x, y, batch: int, precision: str, device: torch.device) -> None:
    model.requires_grad_(False)
    delta = torch.zeros(x.shape[1:], device=device, requires_grad=True)
    for part in local_slices(len(x), batch):
        with autocast(device, precision):
            logits = model(x[part] + delta)
        F.cross_entropy(logits.float(), y[part]).backward()
        if world() > 1:
            dist.all_reduce(delta.grad)


def reference_epoch(model, x, y, batch: int, precision: str, device: torch.device, state: Dict[str, Any]) -> None:
    model.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    if "optimizer" not in state:
        state["delta"] = torch.zeros(x.shape[1:], device=device, requires_grad=True)
        state["temperature"] = torch.ones((), device=device, requires_grad=True)
        state["optimizer"] = torch.optim.SGD([state["delta"], state["temperature"]], lr=0.01, momentum=0.9)
    delta, temperature, optimizer = state["delta"], state["temperature"], state["optimizer"]
    for part in local_slices(len(x), batch):
        optimizer.zero_grad()
        with autocast(device, precision):
            logits = model(x[part] + delta)
        loss = focal_loss(logits.float() / temperature, y[part], 1.0) + 0.01 * torch.norm(delta, 2)
        loss.backward()
        if world() > 1:
            for tensor in (delta, temperature):
                dist.all_reduce(tensor.grad)
        optimizer.step()
    model.zero_grad(set_to_none=True)
    model.requires_grad_(False)


def timed_epochs(run: Callable[[], None], epochs: int, device: torch.device) -> Measured:
    seconds = []
    for _ in range(epochs):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return Measured(seconds)


def measure_model(name: str, args, accelerator, device: torch.device) -> Dict[str, Dict[str, Timing]]:
    model = _report.timm_model(name, args.image_size, num_classes=args.classes).to(device)
    generator = torch.Generator().manual_seed(0)
    x_cpu = torch.randn(args.count, 3, args.image_size, args.image_size, generator=generator)
    y_cpu = torch.randint(0, args.classes, (args.count,), generator=generator)
    x, y = x_cpu.to(device), y_cpu.to(device)
    results = {}
    for precision in args.precisions.split(","):
        state: Dict[str, Any] = {}

        def ours(precision: str = precision) -> Measured:
            fitted = CalibratedModel.fit(
                model, TensorDataset(x_cpu, y_cpu), method="neural_clamping", epochs=args.epochs, holdout_fraction=0,
                batch_size=args.batch, mixed_precision="no" if precision == "fp32" else precision, progress=False,
                accelerator=accelerator,
            )
            return Measured([record["seconds"] for record in fitted.fit_summary["history"]])

        contenders = {
            "floor": lambda precision=precision: timed_epochs(
                lambda: floor_epoch(model, x, y, args.batch, precision, device), args.epochs, device),
            "ours": ours,
            "reference style": lambda precision=precision, state=state: timed_epochs(
                lambda: reference_epoch(model, x, y, args.batch, precision, device, state), args.epochs, device),
        }
        results[precision] = _report.interleaved(contenders, args.repeats, warmup=0 if args.quick else 1,
                                                 progress=f"{name} {precision}" if rank() == 0 else None)
    return results


@dataclasses.dataclass
class Results:
    """model → precision → contender → per-epoch timings, and the device they ran on."""

    timings: Dict[str, Dict[str, Dict[str, Timing]]]
    device: torch.device


def fill_defaults(args: argparse.Namespace) -> None:
    """The sizes left unset on the command line: the full run's, or tiny ones with ``--quick``."""
    quick = args.quick
    args.models = args.models or ("resnet18,vit_tiny_patch16_224" if quick else "resnet50,vit_base_patch16_224")
    args.image_size = args.image_size or (32 if quick else 224)
    args.count = args.count or (16 if quick else 2048)
    args.batch = args.batch or (8 if quick else 256)
    args.epochs = args.epochs or (1 if quick else 2)


def measure(args: argparse.Namespace) -> Results:
    """Start the process group (accelerate), then time every model of ``--models`` in every precision."""
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=args.device == "cpu")
    device = accelerator.device
    if args.batch % world() or args.count % args.batch:
        raise SystemExit(f"--batch must be a multiple of the {world()} processes and divide --count.")
    timings = {}
    for name in args.models.split(","):
        timings[name] = measure_model(name, args, accelerator, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return Results(timings, device)


def raw_numbers(results: Results) -> Dict[str, Any]:
    """Median seconds per model, precision and contender, and the world size: the ``--json`` file."""
    raw: Dict[str, Any] = {name: {precision: {contender: timing.median for contender, timing in timings.items()}
                                  for precision, timings in by_precision.items()}
                           for name, by_precision in results.timings.items()}
    raw["_world"] = world()
    return raw


def _rows(results: Results, count: int, previous: Optional[Dict[str, Any]]) -> List[tuple]:
    """One row per model, precision and contender; ``previous`` (a ``--compare`` file) adds the scaling column."""
    rows = []
    for name, by_precision in results.timings.items():
        for precision, timings in by_precision.items():
            floor = timings["floor"].median
            fp32_ours = results.timings[name].get("fp32", {}).get("ours")
            for contender, timing in timings.items():
                speedup = "–"
                if previous and name in previous and precision in previous[name]:
                    speedup = f"{previous[name][precision][contender] / timing.median:.2f}× vs {previous['_world']} proc"
                bf16_gain = (f"{fp32_ours.median / timing.median:.2f}×" if contender == "ours" and precision != "fp32"
                             and fp32_ours else "–")
                rows.append((name, precision, contender, f"{count / timing.median:.1f}", f"{timing.median:.3f}",
                             timing.runs, f"{timing.median / floor:.2f}×", bf16_gain, speedup))
    return rows


def report(session: _report.Session, results: Results) -> str:
    args, device = session.args, results.device
    previous = json.loads(args.compare.read_text()) if args.compare else None
    rows = _rows(results, args.count, previous)
    gpu = _report.gpu_description()
    lines = [
        *session.header("Neural Clamping fit throughput on GPU", ("torch", "timm", "accelerate")),
        NOT_MEASURED if gpu is None or args.device == "cpu" else
        "GPU numbers below come from the machine named above; none were measured in this repository's own runs.",
        "",
        f"## {args.count} images of 3×{args.image_size}×{args.image_size} per epoch, global batch {args.batch}, "
        f"{world()} process(es) on {device.type}{' — CPU SMOKE RUN, NOT GPU NUMBERS' if device.type == 'cpu' else ''}",
        "",
        *_report.table(("model", "precision", "contender", "images / s", "median s / epoch", "epochs timed",
                        "ratio to floor", "bf16 speed-up (ours)", "scaling"), rows, "lllrrrrrr"),
        "",
        "## Notes",
        "",
        "- floor: frozen model, δ the only leaf needing grad, batches already on the device (each process its "
        "strided share), forward under autocast, cross-entropy, backward to δ, all-reduce of δ's gradient "
        "when there are several processes. ours: `CalibratedModel.fit` from a CPU `TensorDataset` (collation "
        "and host-to-device copies included). reference style: NCToolkit's loop (parameter gradients computed).",
        "- images/s = images per epoch / median epoch seconds (the whole process group; rank 0 reports, after "
        "`cuda.synchronize` and a barrier).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=3, quick_repeats=1)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="timm names (default resnet50,vit_base_patch16_224; quick: "
                        "resnet18,vit_tiny_patch16_224)")
    parser.add_argument("--image-size", type=int, default=None, help="default 224 (quick 32)")
    parser.add_argument("--count", type=int, default=None, help="images per epoch (default 2048; quick 16)")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default 256; quick 8)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per round per contender (default 2; quick 1)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw numbers here (rank 0)")
    parser.add_argument("--compare", type=Path, default=None, help="a --json file of a run on fewer processes: adds speed-ups")
    args = _report.parse(parser, argv)
    fill_defaults(args)
    session = _report.Session("bench_gpu.py", args)
    results = measure(args)
    if rank() != 0:
        return 0
    # results/gpu.md only from a full GPU run; a CPU run prints (or goes to --output)
    session.finish(report(session, results), NAME, write_default=results.device.type == "cuda")
    if args.json:
        args.json.write_text(json.dumps(raw_numbers(results), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
