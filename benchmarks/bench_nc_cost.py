"""Cost of one Neural Clamping epoch, as ratios to its floor, in one process (docs/design.md §6).

Three contenders run on the same model and the same preloaded data, in interleaved rounds:

* **floor** — one forward and one input-gradient backward pass over the data: the model is
  frozen (``requires_grad_(False)``), δ (one input-shaped tensor) is the only leaf that
  requires grad, batches are slices of preloaded tensors, no optimizer. No NC fit can cost
  less per epoch (it must run the model forward and differentiate to its input).
* **ours** — ``CalibratedModel.fit(model, TensorDataset(x, y), method="neural_clamping",
  epochs=E, holdout_fraction=0, batch_size=B, progress=False)``; the per-epoch time is each
  ``fit_summary["history"][i]["seconds"]`` (the epoch loop only: data loading and collation,
  forward, backward, the collective no-ops, the optimizer step; not the one-off base-logit
  pass and TS fit before the first epoch).
* **reference style** — the loop of the authors' NCToolkit as docs/design.md §3.2 describes it: the model
  in eval mode but its parameters left with ``requires_grad=True`` (so every backward also
  computes parameter gradients, which accumulate and are never used), ``SGD([δ, T], lr=0.01,
  momentum=0.9)``, ``zero_grad`` each step, loss = focal(γ=1)(f(x + δ)/T) + 0.01·‖δ‖₂. It gets
  the same preloaded tensors as the floor (the reference iterates a DataLoader, so this is a
  lower bound on its cost).

Models: a timm ``resnet18`` and a transformers ``ViTForImageClassification`` (ViT-Tiny width,
6 layers, 8×8 patches), built from configs with random weights, on seeded synthetic images.

Usage::

    python benchmarks/bench_nc_cost.py             # 64×64 px, N=512, batch 128; writes results/nc_cost.md
    python benchmarks/bench_nc_cost.py --quick     # tiny sizes, prints only
    python benchmarks/bench_nc_cost.py --profile   # also cProfile one `ours` fit (top functions)
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import _report
from _report import Measured, Timing

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.calibrators import focal_loss
from hf_calibrate.data import prepare_data
from hf_calibrate.fitting import Engine, EngineOptions

NAME = "nc_cost"
TARGET = 1.15  # ours / floor (docs/design.md §6)
CONTENDERS = ("floor", "ours", "reference style", "ours: batching + collation alone")


def build(kind: str, image_size: int) -> torch.nn.Module:
    if kind == "timm resnet18":
        return _report.timm_model("resnet18", image_size)
    if kind == "transformers ViT":
        return _report.transformers_vit(image_size, patch_size=8 if image_size >= 32 else 4)
    raise ValueError(kind)


def floor_epoch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> None:
    """Forward + backward to δ over every batch; the model frozen, δ the only leaf needing grad."""
    model.requires_grad_(False)
    delta = torch.zeros(x.shape[1:], requires_grad=True)
    for start in range(0, len(x), batch):
        loss = F.cross_entropy(_report.logits_of(model, x[start : start + batch] + delta), y[start : start + batch])
        loss.backward()


def reference_epoch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, state: Dict[str, Any]) -> None:
    """NCToolkit-style: parameters keep requires_grad=True, SGD over [δ, T] only, zero_grad every step."""
    model.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    if "optimizer" not in state:
        state["delta"] = torch.zeros(x.shape[1:], requires_grad=True)
        state["temperature"] = torch.ones((), requires_grad=True)
        state["optimizer"] = torch.optim.SGD([state["delta"], state["temperature"]], lr=0.01, momentum=0.9)
    delta, temperature, optimizer = state["delta"], state["temperature"], state["optimizer"]
    for start in range(0, len(x), batch):
        optimizer.zero_grad()
        logits = _report.logits_of(model, x[start : start + batch] + delta) / temperature
        loss = focal_loss(logits, y[start : start + batch], 1.0) + 0.01 * torch.norm(delta, 2)
        loss.backward()
        optimizer.step()
    model.zero_grad(set_to_none=True)
    model.requires_grad_(False)


def ours_fit(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, epochs: int) -> CalibratedModel:
    return CalibratedModel.fit(
        model, TensorDataset(x, y), method="neural_clamping", epochs=epochs, holdout_fraction=0, batch_size=batch,
        progress=False,
    )


def data_path_epoch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, epoch: int) -> None:
    """What ours does per epoch besides the model: seeded shuffle, index batches, DataLoader + collate, to device."""
    engine = Engine(EngineOptions(batch_size=batch, progress=False))
    data = prepare_data(TensorDataset(x, y), adapt(model))
    global_batches = engine.global_batches(torch.arange(len(x)), shuffle=True, epoch=epoch)
    for _, micro_batches in engine.batches(data, global_batches):
        for _ in micro_batches:
            pass


def per_epoch(run: Callable[[], None], epochs: int) -> Measured:
    seconds = []
    for _ in range(epochs):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return Measured(seconds)


def measure_model(kind: str, image_size: int, count: int, batch: int, epochs: int, rounds: int, warmup: int = 1) -> Dict[str, Timing]:
    """Per-epoch timings of the four contenders on one model, interleaved over ``rounds``."""
    model = build(kind, image_size)
    x, y = _report.synthetic_images(model, count, image_size)
    reference_state: Dict[str, Any] = {}

    def ours() -> Measured:
        fitted = ours_fit(model, x, y, batch, epochs)
        return Measured([record["seconds"] for record in fitted.fit_summary["history"]])

    contenders = {
        "floor": lambda: per_epoch(lambda: floor_epoch(model, x, y, batch), epochs),
        "ours": ours,
        "reference style": lambda: per_epoch(lambda: reference_epoch(model, x, y, batch, reference_state), epochs),
        "ours: batching + collation alone": lambda: per_epoch(lambda: data_path_epoch(model, x, y, batch, 1), epochs),
    }
    return _report.interleaved(contenders, rounds, warmup=warmup, progress=kind)


def profile_ours(kind: str, image_size: int, count: int, batch: int, epochs: int, top: int = 25) -> str:
    """cProfile of one `ours` fit: the functions with the largest cumulative and own time."""
    model = build(kind, image_size)
    x, y = _report.synthetic_images(model, count, image_size)
    ours_fit(model, x, y, batch, 1)  # warm up
    profiler = cProfile.Profile()
    profiler.enable()
    ours_fit(model, x, y, batch, epochs)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    return stream.getvalue()


@dataclasses.dataclass
class Results:
    """Per-model timings (model kind → contender → per-epoch seconds), the sizes used and an optional profile."""

    timings: Dict[str, Dict[str, Timing]]
    sizes: Dict[str, Any]
    profile: str


def measure(args: argparse.Namespace) -> Results:
    """Time every model named in ``--models``; profile one `ours` fit with ``--profile``."""
    if args.quick:
        sizes = dict(image_size=16, count=32, batch=16, epochs=1)
    else:
        sizes = dict(image_size=64, count=512, batch=128, epochs=2)
    timings = {}
    for kind in args.models.split(","):
        timings[kind] = measure_model(kind, sizes["image_size"], sizes["count"], sizes["batch"], sizes["epochs"], args.repeats,
                                      warmup=0 if args.quick else 1)
    profile = ""
    if args.profile:
        profile = profile_ours("timm resnet18", sizes["image_size"], sizes["count"], sizes["batch"], sizes["epochs"])
    return Results(timings, sizes, profile)


def _rows(results: Results) -> Tuple[List[tuple], List[tuple]]:
    """Rows of the seconds-per-epoch table and of the targets table."""
    sizes = results.sizes
    rows, verdicts = [], []
    for kind, timings in results.timings.items():
        floor = timings["floor"].median
        for name in CONTENDERS:
            timing = timings[name]
            rows.append(
                (kind, name, f"{timing.median:.3f}", f"{timing.min:.3f}", timing.runs, f"{timing.median / floor:.2f}×",
                 f"{_report.paired_ratio(timing, timings['floor']):.3f}×", f"{sizes['count'] / timing.median:.0f}")
            )
        ours = _report.paired_ratio(timings["ours"], timings["floor"])
        reference = _report.paired_ratio(timings["reference style"], timings["floor"])
        verdicts.append(
            (kind, f"{ours:.3f}×", _report.verdict(ours <= TARGET), f"{reference:.3f}×",
             _report.verdict(ours < reference), f"{_report.paired_ratio(timings['reference style'], timings['ours']):.2f}×")
        )
    return rows, verdicts


def report(session: _report.Session, results: Results) -> str:
    args, sizes = session.args, results.sizes
    rows, verdicts = _rows(results)
    lines = [
        *session.header("Neural Clamping fit: cost per epoch", ("torch", "timm", "transformers", "accelerate")),
        f"## Seconds per epoch ({sizes['count']} images of 3×{sizes['image_size']}×{sizes['image_size']}, batch "
        f"{sizes['batch']}, {sizes['count'] // sizes['batch']} steps per epoch, float32, CPU)",
        "",
        *_report.table(
            ("model", "contender", "median s / epoch", "min s", "epochs timed", "ratio of medians", "paired ratio to floor",
             "images / s"),
            rows, "llrrrrrr",
        ),
        "",
        "## Targets",
        "",
        *_report.table(
            ("model", "ours / floor", f"≤ {TARGET}×", "reference style / floor", "ours < reference", "reference / ours"),
            verdicts, "lrlrlr",
        ),
        "",
        "## Notes",
        "",
        "- **floor**: `model.requires_grad_(False)`; δ = `torch.zeros(3, H, W, requires_grad=True)` the only leaf "
        "needing grad; per batch of preloaded tensors `cross_entropy(model(x + δ), y).backward()`; no optimizer.",
        "- **ours**: `CalibratedModel.fit(model, TensorDataset(x, y), method=\"neural_clamping\", "
        f"epochs={sizes['epochs']}, holdout_fraction=0, batch_size={sizes['batch']}, progress=False)`; per-epoch "
        "time = `fit_summary[\"history\"][i][\"seconds\"]` (the epoch loop: index batching, DataLoader over the "
        "TensorDataset with its default collate, forward, focal loss, backward to δ and log T, the all-reduce "
        "no-ops, the finiteness check, the SGD step).",
        "- **reference style**: NCToolkit's loop — parameters left with `requires_grad=True` (so backward also "
        "computes and accumulates parameter gradients nobody uses), `SGD([δ, T], lr=0.01, momentum=0.9)`, "
        "`optimizer.zero_grad()` each step, focal loss (γ=1) of `f(x + δ)/T` + 0.01·‖δ‖₂; on the same preloaded "
        "tensors as the floor (the reference uses a DataLoader, so this understates its cost).",
        "- **ours: batching + collation alone**: the data path of ours' epoch without the model — the engine's "
        "seeded shuffle and global/micro batches, a `DataLoader` over the `TensorDataset` with the default "
        "collate (stacking B images from single-item indexing), the move to the device. Its ratio to the floor "
        "is the upper bound on what ours can lose to data handling.",
        f"- Each round runs every contender for {sizes['epochs']} epochs (ours: one fit call of "
        f"{sizes['epochs']} epochs); {'no' if args.quick else 'one'} untimed warm-up round, then {args.repeats} timed rounds; medians over "
        "all timed epochs. *paired ratio* = median over epochs of (contender's i-th epoch / the floor's i-th "
        "epoch), epochs of the same round seconds apart, so load drifts cancel; the targets use it. "
        "*ratio of medians* is shown too.",
        "- timm `resnet18` and transformers `ViTForImageClassification` (hidden 192, 6 layers, 3 heads, 8×8 "
        "patches) are built from configs with random weights (`pretrained=False`); the images are seeded "
        "N(0, 1) tensors (already \"normalised\") and the labels are drawn from each model's own softmax.",
    ]
    if results.profile:
        lines += ["", "## cProfile of one `ours` fit (timm resnet18; sorted by own time)", "", "```", results.profile.strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=4, quick_repeats=1)
    parser.add_argument("--profile", action="store_true", help="append a cProfile of one `ours` fit")
    parser.add_argument("--models", default="timm resnet18,transformers ViT", help="comma-separated subset")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_nc_cost.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
