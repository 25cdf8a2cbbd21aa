"""Inference time of ``CalibratedModel`` against its base model on the same inputs (docs/design.md §6).

For a timm ``resnet18`` and a transformers ``ViTForImageClassification`` (random weights,
built from configs), one fixed batch of 32 images goes through, under ``torch.no_grad()``:

* the base model (``model(x)`` / ``model(pixel_values=x)``);
* the base model again (a null contender: its ratio to the first shows the timing noise);
* a ``CalibratedModel`` with temperature scaling (logits / T after the base);
* a ``CalibratedModel`` with Neural Clamping (x + δ before the base, / T after);

each once per round, in interleaved rounds; the table gives medians and ratios to the base. Two
more tables: the fixed cost per call of the wrapper (near-zero-compute models, batch 1), and
the same calls without ``torch.no_grad()``.

Usage::

    python benchmarks/bench_inference.py           # 128×128 px, batch 32, 20 rounds; writes results/inference.md
    python benchmarks/bench_inference.py --quick   # 16×16 px, batch 4, tiny ViT; prints only
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import TensorDataset

import _report
from _report import Timing

from hf_calibrate import CalibratedModel

NAME = "inference"
TARGET = 1.05
MODELS = ("timm resnet18", "transformers ViT")


def build(kind: str, image_size: int, quick: bool = False) -> torch.nn.Module:
    if kind == "timm resnet18":
        return _report.timm_model("resnet18", image_size)
    if quick:
        return _report.transformers_vit(image_size, patch_size=8, hidden_size=32, layers=1, heads=2)
    return _report.transformers_vit(image_size, patch_size=16)


def calibrated_models(model: torch.nn.Module, image_size: int, count: int) -> Dict[str, CalibratedModel]:
    x, y = _report.synthetic_images(model, count, image_size, seed=1)
    data = TensorDataset(x, y)
    common = dict(batch_size=count, progress=False)
    return {
        "temperature": CalibratedModel.fit(model, data, method="temperature", **common),
        "neural_clamping": CalibratedModel.fit(model, data, method="neural_clamping", epochs=2, holdout_fraction=0, **common),
    }


def call_of(kind: str, x: torch.Tensor) -> Callable[[torch.nn.Module], Any]:
    if kind.startswith("transformers"):
        return lambda m: m(pixel_values=x).logits
    return lambda m: m(x)


def contenders(
    kind: str, model: torch.nn.Module, calibrated: Dict[str, CalibratedModel], x: torch.Tensor, *, grad: bool = False,
    calls: int = 1, noise_check: bool = True,
) -> Dict[str, Callable[[], Any]]:
    """Base, (base again,) TS and NC calibrated; each run = ``calls`` calls under no_grad (or grad mode)."""
    call = call_of(kind, x)

    def timed(target: torch.nn.Module) -> Callable[[], Any]:
        def run() -> Any:
            with torch.set_grad_enabled(grad):
                for _ in range(calls):
                    out = call(target)
            return None if grad else out

        return run

    result = {"base model": timed(model)}
    if noise_check:
        result["base model (again: noise check)"] = timed(model)
    result["CalibratedModel, temperature"] = timed(calibrated["temperature"])
    result["CalibratedModel, neural_clamping"] = timed(calibrated["neural_clamping"])
    return result


def tiny(kind: str) -> torch.nn.Module:
    """Near-zero-compute models of each kind, so a call's time is mostly the Python around it."""
    if kind == "timm resnet18":
        return _report.timm_model("test_resnet", 16)
    return _report.transformers_vit(16, patch_size=8, hidden_size=16, layers=1, heads=2)


@dataclasses.dataclass
class Results:
    """Timings per model kind (under no_grad, in grad mode, and on tiny models for the fixed cost), and ‖δ‖ per kind."""

    image_size: int
    batch: int
    overhead_calls: int
    timings: Dict[str, Dict[str, Timing]] = dataclasses.field(default_factory=dict)
    grad: Dict[str, Dict[str, Timing]] = dataclasses.field(default_factory=dict)
    overhead: Dict[str, Dict[str, Timing]] = dataclasses.field(default_factory=dict)
    deltas: Dict[str, float] = dataclasses.field(default_factory=dict)


def measure(args: argparse.Namespace) -> Results:
    """For each model kind: interleaved rounds under no_grad, in grad mode, and of the fixed cost per call."""
    image_size, batch = (16, 4) if args.quick else (128, 32)
    grad_rounds = max(1, args.repeats // 2)
    overhead_calls = 3 if args.quick else 100
    results = Results(image_size, batch, overhead_calls)
    x = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(7))
    for kind in MODELS:
        model = build(kind, image_size, args.quick)
        calibrated = calibrated_models(model, image_size, 2 * batch)
        results.deltas[kind] = float(calibrated["neural_clamping"].calibrator.delta.detach().norm())
        results.timings[kind] = _report.interleaved(contenders(kind, model, calibrated, x), args.repeats, warmup=0 if args.quick else 2, progress=kind)
        results.grad[kind] = _report.interleaved(
            contenders(kind, model, calibrated, x, grad=True, noise_check=False), grad_rounds, warmup=0 if args.quick else 1,
            progress=f"{kind} (grad mode)",
        )
        small = tiny(kind)
        small_x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(8))
        small_calibrated = calibrated_models(small, 16, 8)
        results.overhead[kind] = _report.interleaved(
            contenders(kind, small, small_calibrated, small_x, calls=overhead_calls), args.repeats, warmup=0 if args.quick else 2,
            progress=f"{kind} (overhead)",
        )
    return results


def _rows(results: Results) -> Tuple[List[tuple], List[tuple], List[tuple], List[tuple]]:
    """Rows of the timing, targets, grad-mode and fixed-cost tables."""
    rows, verdicts = [], []
    for kind, timings in results.timings.items():
        base = timings["base model"]
        for name, timing in timings.items():
            rows.append(
                (kind, name, f"{timing.median * 1e3:.1f}", f"{timing.min * 1e3:.1f}", timing.runs,
                 f"{timing.median / base.median:.3f}×", f"{_report.paired_ratio(timing, base):.3f}×")
            )
        for name in ("CalibratedModel, temperature", "CalibratedModel, neural_clamping"):
            ratio = _report.paired_ratio(timings[name], base)
            verdicts.append((kind, name.split(", ")[1], f"{ratio:.3f}×", _report.verdict(ratio <= TARGET)))
    grad_rows = []
    for kind, timings in results.grad.items():
        base = timings["base model"]
        for name, timing in timings.items():
            grad_rows.append((kind, name, f"{timing.median * 1e3:.1f}", timing.runs, f"{_report.paired_ratio(timing, base):.3f}×"))
    overhead_rows = []
    for kind, timings in results.overhead.items():
        base = timings["base model"]
        for name, timing in timings.items():
            if name.startswith("base model (again"):
                continue
            per_call = timing.median / results.overhead_calls
            extra = (timing.median - base.median) / results.overhead_calls
            share = extra / (results.timings[kind]["base model"].median) if name != "base model" else 0.0
            overhead_rows.append((kind, name, f"{per_call * 1e6:.0f}", f"{extra * 1e6:+.0f}" if name != "base model" else "–",
                                  f"{share:.3%}" if name != "base model" else "–"))
    return rows, verdicts, grad_rows, overhead_rows


def report(session: _report.Session, results: Results) -> str:
    args, batch, image_size, deltas = session.args, results.batch, results.image_size, results.deltas
    overhead_calls = results.overhead_calls
    rows, verdicts, grad_rows, overhead_rows = _rows(results)
    lines = [
        *session.header("CalibratedModel inference overhead", ("torch", "timm", "transformers")),
        f"## One batch of {batch} images, 3×{image_size}×{image_size}, float32, `torch.no_grad()`, CPU",
        "",
        *_report.table(("model", "contender", "median ms", "min ms", "runs", "ratio of medians", "paired ratio"), rows, "llrrrrr"),
        "",
        "## Targets",
        "",
        *_report.table(("model", "calibration", "paired ratio to base", f"≤ {TARGET}×"), verdicts, "llrl"),
        "",
        "## Fixed cost per call (near-zero-compute models, batch 1)",
        "",
        *_report.table(("model kind", "contender", "µs per call", "overhead µs per call", "overhead / base call above"),
                       overhead_rows, "llrrr"),
        "",
        "## Without `torch.no_grad()` (grad mode)",
        "",
        *_report.table(("model", "contender", "median ms", "runs", "paired ratio to base"), grad_rows, "llrrr"),
        "",
        "## Notes",
        "",
        f"- {args.repeats} interleaved rounds after 2 warm-up rounds; in each round every contender runs the same "
        "fixed batch once. *paired ratio* = median over rounds of (contender time / base time in the same round), "
        "which cancels slow drifts of the machine's load; *ratio of medians* is shown too. The second base-model "
        "row is the same call timed again: its distance from 1.000× is the noise of this measurement on this "
        "shared machine.",
        "- The calibrated models wrap the *same* base model object (fit does not copy it): temperature "
        f"scaling fitted on {2 * batch} seeded images, Neural Clamping fitted for 2 epochs with "
        "`holdout_fraction=0` (so δ ≠ 0: ‖δ‖ = " + ", ".join(f"{d:.3g} ({k})" for k, d in deltas.items()) + ").",
        "- A `CalibratedModel` call goes through `forward` → the backbone adapter (`parse_call`, a device check, "
        "`x + δ` for Neural Clamping, the base call, a logits shape check) → the calibrator (`logits * exp(-log T)`); "
        "for transformers bases the base's `ModelOutput` is returned with its logits replaced.",
        f"- *Fixed cost per call*: timm `test_resnet` and a 1-layer transformers ViT (hidden 16) on one 16×16 image, "
        f"{overhead_calls} calls per timing, so the time is mostly the Python around the model; *overhead / base "
        "call above* divides that fixed cost by the base model's median time in the first table: the share the "
        "wrapper adds at that size (it shrinks as the model grows).",
        "- *Grad mode*: the same calls without `torch.no_grad()` (as a user calling the model directly might). The "
        "base and the fitted calibrator (δ, log T) are both frozen (`requires_grad=False`), so no autograd graph "
        "is recorded and grad mode costs what no_grad costs.",
        "- timm `resnet18` and transformers `ViTForImageClassification` (hidden 192, 6 layers, 3 heads, 16×16 "
        "patches) with random weights (`pretrained=False` / from a `ViTConfig`); inputs are seeded N(0, 1).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=20, quick_repeats=2)
    args = _report.parse(parser, argv)
    session = _report.Session("bench_inference.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
