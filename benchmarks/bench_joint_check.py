"""Where should a linear map's check fit its folds jointly? Joint against one by one, time and scores.

The default check of vector, matrix and Dirichlet calibration (λ = 1 against TS by K-fold cross-fitting, then the
fit on all rows) is K + 1 fits. ``LinearMap.fits_jointly`` decides whether they run as one joint fit of stacked
problems (``calibrators.solvers.linear_maps``) or one by one. For each map, at sizes around its limits, this script fits
the same rows both ways (``LinearMap.fits_jointly`` patched to True or False), round by round interleaved, and gives
the median time of each, their ratio, and the largest difference between the two runs' cross-fitted scores (the
optimisers' tolerance: the two must choose alike).

Data: the digits models' real logits (449 × 10) and ``bench_fit_cost.synthetic`` (labels from softmax(a ⊙ z + b)).

Usage::

    python benchmarks/bench_joint_check.py            # writes results/joint_check.md (~4 min)
    python benchmarks/bench_joint_check.py --quick    # 449 × 10, 1 round, prints
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple
from unittest import mock

import torch

import _report
from bench_fit_cost import problems, warm_up

NAME = "joint_check"
METHODS = ("vector", "matrix", "dirichlet")
SIZES = ("digits", "2000x20", "1000x50", "4000x30", "800x100", "1000x100", "5000x100", "10000x100", "20000x50")
#: sizes where a C×C map's check is not timed: minutes one by one, and far above its joint limit
MATRIX_SKIPPED = ("10000x100", "20000x50")


def fit_once(method: str, joint: bool, logits: torch.Tensor, labels: torch.Tensor) -> Tuple[float, Dict[str, float], bool]:
    """Seconds of one default fit of ``method`` with ``fits_jointly`` forced to ``joint``, its cross-fitted scores,
    and whether the library's own rule fits jointly there."""
    from hf_calibrate.calibrators import calibrator_class
    from hf_calibrate.calibrators.solvers import linear_maps
    from hf_calibrate.calibrators.holdout import default_folds

    cls = calibrator_class(method)
    rule = getattr(linear_maps, method.upper()).fits_jointly(default_folds(None, *logits.shape) + 1, *logits.shape)
    with mock.patch.object(linear_maps.LinearMap, "fits_jointly", lambda *arguments: joint), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        summary = cls(logits.shape[1]).fit_logits(logits, labels, cls.Options())
        return time.perf_counter() - start, summary["l2_cv_nll"], rule


def compare(method: str, data: Tuple[torch.Tensor, ...], rounds: int) -> Tuple[str, ...]:
    """One table row: both ways' median time, their ratio, the largest score difference, and the library's rule."""
    times: Dict[bool, List[float]] = {True: [], False: []}
    scores: Dict[bool, Dict[str, float]] = {}
    for _ in range(rounds):
        for joint in (True, False):
            seconds, scores[joint], rule = fit_once(method, joint, data[0], data[1])
            times[joint].append(seconds)
    medians = {joint: statistics.median(values) for joint, values in times.items()}
    difference = max(abs(scores[True][key] - scores[False][key]) for key in scores[False])
    return (method, _report.fmt_seconds(medians[True]), _report.fmt_seconds(medians[False]),
            f"{medians[True] / medians[False]:.2f}", f"{difference:.1e}", "joint" if rule else "one by one")


def report_lines(args: argparse.Namespace) -> List[str]:
    rows = []
    warm_up()
    for size, title, data in problems(["digits"] if args.quick else SIZES):
        print(title, flush=True)
        shape = f"{data[0].shape[0]:,} × {data[0].shape[1]:,}" + (f" ({title.split(':')[0]})" if size == "digits" else "")
        for method in METHODS:
            if method != "vector" and size in MATRIX_SKIPPED:
                continue
            rows.append((shape, *compare(method, data, 1 if args.quick else 3)))
    headers = ("logits", "method", "joint", "one by one", "time joint / one by one", "largest score difference",
               "the library fits")
    return [*_report.table(headers, rows, "llrrrrl"), ""]


NOTES = [
    "## Notes",
    "",
    "- Time: the median of 3 default fits each way (λ = 1 against TS on 5 folds, and the fit on all rows), the two ways "
    "interleaved round by round, one torch thread.",
    "- The score difference is the largest |cross-fitted NLL (joint) − (one by one)| over the candidates (TS, λ = 1), "
    "in nats: what the optimisers' tolerance leaves (L-BFGS stops within ~1e-9 of each fold's objective either way).",
    "- The rule (`LinearMap.fits_jointly`): vector jointly up to P·N·C = 2²², a C×C map up to P·N·C² = 2²⁴ and "
    "P·N·C = 2¹⁸ (its stack of (P, C, N) arrays), P = K + 1 problems.",
    "- C×C maps also gained jointly at 1,000 × 50 and 4,000 × 30 (their rows) but are fitted one by one there: their "
    "stack exceeds 2¹⁸ values, the cap that keeps a joint fit's memory within its estimate (20 MiB in float64).",
    "- A joint L-BFGS run shares one 20-step history among its problems; where the ridge is weak it can need many "
    "more iterations than any problem alone, so after `linear_maps.JOINT_LBFGS_ITERATIONS` (70) it finishes each "
    "problem on its own. On such fits (λ = 1e-3 or 1e-2 through `l2_grid`, 200–300 × 4) the joint path took "
    "1.15–1.35× the time of the fits one by one (a reviewer's cases; 2–2.2× before that cap).",
]


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "A linear map's check fitted jointly against one fold at a time"
    return _report.run_once("bench_joint_check.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    raise SystemExit(main())
