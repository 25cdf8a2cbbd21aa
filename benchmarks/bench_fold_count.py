"""How many folds the default checks need on large logits: 5 against 2, paired.

Vector, matrix and Dirichlet check their ridge against TS, and histogram binning and isotonic regression their prior,
by K-fold cross-fitted NLL; ``method="auto"`` scores its candidates on K folds too. Each check costs K fits on
(K − 1)/K of the rows: 4 data-sized fits at K = 5, 1 at K = 2. K is 2 from ``holdout.LARGE_LOGITS`` (10⁷)
logit values on, 5 below (``holdout.default_folds``). This script fits every such method (and ``auto``) with K = 5
everywhere (the rule below the threshold) and K = 2 everywhere (the rule at these sizes) on the same logits and
compares, on a second draw of the same size:

* what each check chose (λ or TS, the prior m or TS, auto's method),
* its time (one fit each; one torch thread), and
* the held-out NLL of the two outcomes, with the paired 95 % interval of (K = 2) − (K = 5) over the held-out rows.

Data (as ``bench_fit_cost.py`` and ``bench_logit_fits.py``): ``3·randn(N, C)`` float32 logits with labels from
``softmax(a ⊙ z + b)`` (per-class a ∈ [0.25, 0.75], b ~ N(0, 0.5²): TS leaves per-class miscalibration) at 10,000 ×
500 (at the threshold: 10⁷ values) and 25,000 × 1,000, and labels from ``softmax(z / 2)`` (TS is the truth: a richer map can only fit noise) at
50,000 × 1,000.

Usage::

    python benchmarks/bench_fold_count.py            # writes results/fold_count.md (~30 min)
    python benchmarks/bench_fold_count.py --quick    # 2,000 × 100, prints
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from unittest import mock
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import _report
from bench_fit_cost import auto, synthetic
from bench_logit_fits import make_logits

NAME = "fold_count"
METHODS = ("vector", "matrix", "dirichlet", "histogram", "isotonic")
#: methods fitted at the TS-is-truth size, where the C × C maps would take minutes to confirm what vector shows
TRUTH_METHODS = ("vector", "histogram", "isotonic")
FOLDS = (5, 2)
Data = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def problems(quick: bool) -> List[Tuple[str, Sequence[str], Data]]:
    """(title, methods, (fit logits, labels, held-out logits, labels)) of each size."""
    sizes = [(2000, 100)] if quick else [(20_000, 500), (25_000, 1000)]
    found = []
    for count, classes in sizes:
        seed = next(seed for seed in range(0, 100, 2) if len(synthetic(count, classes, seed)[1].unique()) == classes)
        found.append((f"{count:,} × {classes:,}, labels from softmax(a ⊙ z + b) (seed {seed})", METHODS,
                      (*synthetic(count, classes, seed), *synthetic(count, classes, seed + 1))))
    if not quick:
        found.append(("50,000 × 1,000, labels from softmax(z / 2): TS is the truth", TRUTH_METHODS,
                      (*make_logits(50_000, 1000, 0), *make_logits(50_000, 1000, 1))))
    return found


def fit_method(method: str, logits: torch.Tensor, labels: torch.Tensor) -> Tuple[Callable, str]:
    """Fit ``method`` with its default options: (held-out logits → per-row NLL, what its check chose)."""
    from hf_calibrate.calibrators import calibrator_class, parse_options

    cls = calibrator_class(method)
    options = parse_options(cls.Options, {}, method)
    calibrator = cls.create(logits.shape[1], options)
    summary = calibrator.fit_logits(logits, labels, options)
    calibrator.is_fitted = True
    key = "l2" if "l2" in summary else "prior"
    chosen = "TS" if summary.get(key) is None else f"{key} = {summary[key]:g}"
    return lambda test, test_labels: per_row_nll(calibrator(test), test_labels), chosen


def fit_auto(logits: torch.Tensor, labels: torch.Tensor) -> Tuple[Callable, str]:
    """``method="auto"``'s choice among the logit candidates on its default folds (``bench_fit_cost.auto``)."""
    predict = auto(logits, labels)
    return lambda test, test_labels: F.nll_loss(predict(test).clamp_min(1e-300).log(), test_labels, reduction="none"), auto.chosen


def per_row_nll(calibrated: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(calibrated.detach().double(), labels, reduction="none")


def compare(label: str, fit: Callable[[], Tuple[Callable, str]], data: Data) -> Tuple[Any, ...]:
    """One table row: each K's choice, time and held-out NLL, then (K = 2) − (K = 5) with its paired interval. K is
    set through the threshold of ``holdout.default_folds``, so every selection inside the fit (auto's candidates' own)
    uses it too."""
    from hf_calibrate.calibrators import holdout

    outcomes = {}
    for folds in FOLDS:
        with warnings.catch_warnings(), mock.patch.object(holdout, "LARGE_LOGITS", 0 if folds == 2 else math.inf):
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            score, chosen = fit()
            seconds = time.perf_counter() - started
        with torch.no_grad():
            outcomes[folds] = (chosen, seconds, score(data[2], data[3]))
        print(f"  {label}, K = {folds}: {chosen}, {seconds:.1f} s, NLL {float(outcomes[folds][2].mean()):.4f}", flush=True)
    difference = holdout.paired_difference(outcomes[2][2] - outcomes[5][2])
    cells = [cell for folds in FOLDS for cell in (outcomes[folds][0], _report.fmt_seconds(outcomes[folds][1]),
                                                  f"{float(outcomes[folds][2].mean()):.4f}")]
    interval = f"{difference['point']:+.4f} [{difference['low']:+.4f}, {difference['high']:+.4f}]"
    return (label, *cells, interval, f"{outcomes[2][1] / outcomes[5][1]:.2f}")


def measure(quick: bool) -> List[Tuple[str, List[Tuple[Any, ...]], float]]:
    results = []
    for title, methods, data in problems(quick):
        print(title, flush=True)
        logits, labels = data[0], data[1]
        uncalibrated = float(F.cross_entropy(data[2].double(), data[3]))
        rows = [compare(method, lambda m=method: fit_method(m, logits, labels), data) for method in methods]
        rows.append(compare("auto", lambda: fit_auto(logits, labels), data))
        results.append((title, rows, uncalibrated))
    return results


HEADERS = ("method", "K = 5 chose", "K = 5 time", "K = 5 NLL", "K = 2 chose", "K = 2 time", "K = 2 NLL",
           "NLL (K = 2) − (K = 5) [95 %]", "time (K = 2) / (K = 5)")
NOTES = [
    "## Notes",
    "",
    "- One fit per method and K (these fits take seconds to minutes; this shared 2-core machine varies by about "
    "±30 % run to run, so the time ratio is indicative).",
    "- The interval is the paired normal 95 % interval of the per-row held-out NLL difference over the held-out "
    "draw's rows (`holdout.paired_difference`). A difference of 0 with an empty interval means both K chose the same "
    "and fitted the same map to the optimiser's tolerance.",
    "- `auto` runs every logit candidate on all rows and on K folds, and is scored on its choice's held-out NLL.",
    "- At 50,000 × 1,000, where TS is the truth (its held-out NLL on the same draws: 5.7967, results/logit_fits.md), "
    "auto and the binning priors kept TS with either K; vector's check chose λ = 1 with 2 folds, +.0002 [−.0000, "
    "+.0004] above TS. (On folds dealt by class instead of at random, auto chose structured matrix there, 5.8014: "
    "results/fold_leak.md says why.)",
]


def report_lines(args: argparse.Namespace) -> List[str]:
    lines = []
    for title, rows, uncalibrated in measure(args.quick):
        lines += [f"### {title}", "", f"Uncalibrated held-out NLL: {uncalibrated:.4f}.", "",
                  *_report.table(HEADERS, rows, "llrrlrrlr"), ""]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "Folds of the default checks on large logits: 5 against 2"
    return _report.run_once("bench_fold_count.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    raise SystemExit(main())
