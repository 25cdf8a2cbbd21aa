"""Cost of the head-retraining methods (TST, V-TST, MaC-Cal) against one backbone pass (docs/design.md §3.3, §6).

Head methods run the frozen backbone once per split to cache the penultimate features, then
train a small head for many epochs on the cached rows. This benchmark times, on a timm
``resnet18`` (random weights, built from its config) and seeded synthetic images, in
interleaved rounds:

* one backbone forward pass over the training rows (``model(x)`` in batches, ``no_grad``): the unit;
* the one-off feature extraction the fits run (``hf_calibrate.fitting.heads.collect_features``: one pass over
  the training and validation rows, exactly as ``fit_head`` calls it);
* a full ``CalibratedModel.fit(..., method=m)`` for each head method (default options, 40 epochs),

and reports each method's per-epoch head cost (median of ``fit_summary["history"][i]["seconds"]``:
the training steps over the cached features) as a share of one backbone forward pass over the
same training rows. Target (docs/design.md §6): under 5 %.

Usage::

    python benchmarks/bench_head_cost.py           # 32×32 px, 3,000 images, 100 classes; writes results/head_cost.md
    python benchmarks/bench_head_cost.py --quick   # tiny sizes, prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import TensorDataset

import _report
from _report import Measured, Timing

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.data import prepare_data
from hf_calibrate.fitting import Engine, EngineOptions
from hf_calibrate.fitting.heads import collect_features

NAME = "head_cost"
TARGET = 0.05
METHODS = ("tst", "vtst", "mac_cal")
HOLDOUT = 0.2  # the head methods' default holdout_fraction
FORWARD = "backbone forward pass (train rows)"
EXTRACTION = "feature extraction (train + validation)"


@dataclasses.dataclass
class Setup:
    """The sizes of one run: image side in px, images, classes, batch, head epochs, timm model name."""

    image_size: int
    count: int
    classes: int
    batch: int
    epochs: int
    model_name: str


@dataclasses.dataclass
class Results:
    """Timings of every contender, each method's per-epoch seconds and whole-fit seconds, and the split's sizes."""

    setup: Setup
    timings: Dict[str, Timing]
    history: Dict[str, List[float]]
    fit_totals: Dict[str, List[float]]
    train_rows: int
    validation_rows: int
    feature_dim: int


def setup_of(args: argparse.Namespace) -> Setup:
    if args.quick:
        return Setup(16, 64, 10, 32, args.epochs or 3, "resnet10t")
    return Setup(32, 3000, 100, 250, args.epochs or 40, "resnet18")


def measure(args: argparse.Namespace) -> Results:
    """Interleaved rounds of the forward pass, the extraction and one whole fit per head method."""
    setup = setup_of(args)
    batch, epochs = setup.batch, setup.epochs
    model = _report.timm_model(setup.model_name, setup.image_size, num_classes=setup.classes)
    x, y = _report.synthetic_images(model, setup.count, setup.image_size)
    data = TensorDataset(x, y)
    engine = Engine(EngineOptions(batch_size=batch, progress=False))
    backbone = adapt(model)
    prepared = prepare_data(data, backbone)
    train_indices, validation_indices = engine.split_indices(setup.count, HOLDOUT)
    x_train = x[train_indices]

    def forward_pass() -> None:
        with torch.no_grad():
            for start in range(0, len(x_train), batch):
                model(x_train[start : start + batch])

    def extraction() -> Measured:
        started = time.perf_counter()
        collect_features(backbone, prepared, engine, description="features")
        return Measured([time.perf_counter() - started])

    history: Dict[str, List[float]] = {method: [] for method in METHODS}
    fit_totals: Dict[str, List[float]] = {method: [] for method in METHODS}

    def fit(method: str):
        def run() -> Measured:
            started = time.perf_counter()
            fitted = CalibratedModel.fit(model, data, method=method, epochs=epochs, batch_size=batch, progress=False)
            fit_totals[method].append(time.perf_counter() - started)
            seconds = [record["seconds"] for record in fitted.fit_summary["history"]]
            history[method].extend(seconds)
            return Measured(seconds)

        return run

    contenders = {FORWARD: forward_pass, EXTRACTION: extraction}
    contenders.update({f"fit {method}": fit(method) for method in METHODS})
    timings: Dict[str, Timing] = _report.interleaved(contenders, args.repeats, warmup=0 if args.quick else 1, progress="head cost")
    return Results(setup, timings, history, fit_totals, len(train_indices), len(validation_indices),
                   backbone.final_layer().in_features)


def _rows(results: Results) -> Tuple[List[tuple], List[tuple]]:
    """Rows of the step table and of the targets table."""
    timings, epochs = results.timings, results.setup.epochs
    unit = timings[FORWARD].median
    extract = timings[EXTRACTION].median
    rows = [
        ("backbone forward pass over the training rows", f"{unit:.3f}", timings[FORWARD].runs, "100%", "–", "–"),
        ("one-off feature extraction (train + validation rows)", f"{extract:.3f}",
         timings[EXTRACTION].runs, f"{extract / unit:.0%}", "–", "–"),
    ]
    verdicts = []
    for method in METHODS:
        per_epoch = statistics.median(results.history[method])
        total = statistics.median(results.fit_totals[method])
        with_validation = (total - extract) / epochs
        rows.append((f"{method}: head epoch (training steps)", f"{per_epoch:.4f}", len(results.history[method]),
                     f"{per_epoch / unit:.2%}", f"{total:.2f}", f"{with_validation:.4f}"))
        verdicts.append((method, f"{per_epoch / unit:.2%}", _report.verdict(per_epoch / unit < TARGET),
                         f"{with_validation / unit:.2%}", f"{extract / per_epoch:.0f}"))
    return rows, verdicts


def report(session: _report.Session, results: Results) -> str:
    args, setup = session.args, results.setup
    image_size, classes, batch, epochs, model_name = setup.image_size, setup.classes, setup.batch, setup.epochs, setup.model_name
    train_rows, validation_rows, feature_dim = results.train_rows, results.validation_rows, results.feature_dim
    rows, verdicts = _rows(results)
    lines = [
        *session.header("Head retraining: feature extraction vs per-epoch head cost", ("torch", "timm")),
        f"## timm {model_name}, {train_rows:,} training + {validation_rows:,} validation images of 3×{image_size}×{image_size}, "
        f"{classes} classes, features d = {feature_dim}, {epochs} head epochs, CPU",
        "",
        *_report.table(
            ("step", "median s", "runs", "% of one forward pass", "whole fit, median s", "per epoch incl. validation, s"),
            rows, "lrrrrr",
        ),
        "",
        "## Targets",
        "",
        *_report.table(
            ("method", "head epoch / forward pass", f"< {TARGET:.0%}", "incl. per-epoch validation", "epochs per extraction cost"),
            verdicts, "lrlrr",
        ),
        "",
        "## Notes",
        "",
        f"- Interleaved rounds ({args.repeats} timed{', after 1 warm-up' if not args.quick else ''}); each round runs "
        "the forward pass, the extraction, and one whole fit per method (which runs its own extraction). "
        "Head-epoch medians are over every epoch of every timed fit.",
        f"- *head epoch*: `fit_summary[\"history\"][i][\"seconds\"]` — the Adam steps over the cached training "
        f"features ({train_rows:,} rows, `head_batch_size` 128), without the per-epoch validation scoring. "
        "*per epoch incl. validation* = (whole fit − one extraction) / epochs: it adds the validation NLL/ECE "
        "each epoch, the best-state copy and the fit's fixed costs.",
        f"- The forward pass is `model(x)` under `no_grad` over the {train_rows:,} training images in batches of "
        f"{batch}; the extraction is `hf_calibrate.fitting.heads.collect_features` (the same call `fit_head` makes): one pass "
        "over the training and the validation rows, with `batch_size` "
        f"{batch}: a forward pass with a hook capturing the classifier's input, plus the engine's batching and "
        "collation from a `TensorDataset`.",
        "- Options are the defaults (TST/V-TST: latent 128, Adam 1e-4; V-TST: 10 samples; MaC-Cal: 10 masks) "
        f"except `epochs={epochs}` and `batch_size={batch}`; `holdout_fraction` 0.2 (default) gives the validation rows.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=3, quick_repeats=1)
    parser.add_argument("--epochs", type=int, default=None, help="head epochs per fit (default 40, quick 3)")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_head_cost.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
