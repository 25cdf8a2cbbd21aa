"""Cost of the head-retraining methods (TST, V-TST, MaC-Cal) against one backbone pass (docs/design.md §3.3, §6).

Head methods run the frozen backbone once per split to cache the penultimate features, then
train a small head for many epochs on the cached rows. This benchmark times, on a timm
``resnet18`` (random weights, built from its config) and seeded synthetic images, in
interleaved rounds:

* one backbone forward pass over the training rows (``model(x)`` in batches, ``no_grad``): the unit;
* the one-off feature extraction the fits run (``hf_calibrate.fitting.collect_features``: one pass over
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

import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402
from _report import Measured, Timing  # noqa: E402

from hf_calibrate import CalibratedModel  # noqa: E402
from hf_calibrate.backbones import adapt  # noqa: E402
from hf_calibrate.data import prepare_data  # noqa: E402
from hf_calibrate.fitting import Engine, EngineOptions, collect_features  # noqa: E402

NAME = "head_cost"
TARGET = 0.05
METHODS = ("tst", "vtst", "mac_cal")
HOLDOUT = 0.2  # the head methods' default holdout_fraction


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=3, quick_repeats=1)
    parser.add_argument("--epochs", type=int, default=None, help="head epochs per fit (default 40, quick 3)")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_head_cost.py", args)
    if args.quick:
        image_size, count, classes, batch, epochs, model_name = 16, 64, 10, 32, args.epochs or 3, "resnet10t"
    else:
        image_size, count, classes, batch, epochs, model_name = 32, 3000, 100, 250, args.epochs or 40, "resnet18"
    model = _report.timm_model(model_name, image_size, num_classes=classes)
    x, y = _report.synthetic_images(model, count, image_size)
    data = TensorDataset(x, y)
    engine = Engine(EngineOptions(batch_size=batch, progress=False))
    backbone = adapt(model)
    prepared = prepare_data(data, backbone)
    train_indices, validation_indices = engine.split_indices(count, HOLDOUT)
    x_train = x[train_indices]
    feature_dim = backbone.final_layer().in_features

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

    contenders = {"backbone forward pass (train rows)": forward_pass, "feature extraction (train + validation)": extraction}
    contenders.update({f"fit {method}": fit(method) for method in METHODS})
    timings: Dict[str, Timing] = _report.interleaved(contenders, args.repeats, warmup=0 if args.quick else 1, progress="head cost")

    unit = timings["backbone forward pass (train rows)"].median
    extract = timings["feature extraction (train + validation)"].median
    rows = [
        ("backbone forward pass over the training rows", f"{unit:.3f}", timings["backbone forward pass (train rows)"].runs,
         "100%", "–", "–"),
        ("one-off feature extraction (train + validation rows)", f"{extract:.3f}",
         timings["feature extraction (train + validation)"].runs, f"{extract / unit:.0%}", "–", "–"),
    ]
    verdicts = []
    for method in METHODS:
        per_epoch = statistics.median(history[method])
        total = statistics.median(fit_totals[method])
        with_validation = (total - extract) / epochs
        rows.append((f"{method}: head epoch (training steps)", f"{per_epoch:.4f}", len(history[method]),
                     f"{per_epoch / unit:.2%}", f"{total:.2f}", f"{with_validation:.4f}"))
        verdicts.append((method, f"{per_epoch / unit:.2%}", _report.verdict(per_epoch / unit < TARGET),
                         f"{with_validation / unit:.2%}", f"{extract / per_epoch:.0f}"))
    train_rows, validation_rows = len(train_indices), len(validation_indices)
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
        f"{batch}; the extraction is `hf_calibrate.fitting.collect_features` (the same call `fit_head` makes): one pass "
        "over the training and the validation rows, with `batch_size` "
        f"{batch}: a forward pass with a hook capturing the classifier's input, plus the engine's batching and "
        "collation from a `TensorDataset`.",
        "- Options are the defaults (TST/V-TST: latent 128, Adam 1e-4; V-TST: 10 samples; MaC-Cal: 10 masks) "
        f"except `epochs={epochs}` and `batch_size={batch}`; `holdout_fraction` 0.2 (default) gives the validation rows.",
    ]
    session.finish("\n".join(lines) + "\n", NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
