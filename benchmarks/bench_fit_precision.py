"""From how many logits should a logit fit work in float32? Time and held-out NLL of both precisions.

A logit fit works in float64 up to ``memory.FLOAT64_MAX_ELEMENTS`` logit values (rows × classes), in float32 above;
probmetrics works in float32 on float32 logits at every size. For every logit method, at sizes around the threshold,
this script fits the same rows once in each precision (``memory.FLOAT64_MAX_ELEMENTS`` patched to ∞ or 0), round by
round interleaved, and gives the median time of each, their ratio, and the held-out NLL difference float32 − float64
with its paired 95 % interval over the rows of a second draw (``holdout.paired_difference``).

Data: ``bench_fit_cost.synthetic`` (labels from softmax(a ⊙ z + b), so the per-class maps have something to learn),
the fit draw seeded as there, the held-out draw 20,000 rows; the digits models' real logits (449 × 10, their other
half held out).

Usage::

    python benchmarks/bench_fit_precision.py            # writes results/fit_precision.md (~5 min)
    python benchmarks/bench_fit_precision.py --quick    # 1,000 × 100, 1 round, prints
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple
from unittest import mock

import torch
import torch.nn.functional as F

import _report
from bench_fit_cost import Predict, ours, problems, synthetic, warm_up

NAME = "fit_precision"
METHODS = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix", "histogram", "isotonic")
SIZES = ("digits", "1000x100", "5000x100", "20000x100")
PRECISIONS = {"float64": math.inf, "float32": 0}


def held_out_draw(size: str, data: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rows a fit is scored on: the digits' other half, or 20,000 new rows of the synthetic labels."""
    if size == "digits":
        return data[2], data[3]
    return synthetic(20_000, int(size.split("x")[1]), 99)


def fit_once(method: str, limit: float, logits: torch.Tensor, labels: torch.Tensor) -> Tuple[float, Predict]:
    """Seconds of one default fit of ``method`` (``bench_fit_cost.ours``) with ``memory.FLOAT64_MAX_ELEMENTS`` =
    ``limit``, and its logits → probabilities."""
    from hf_calibrate.calibrators import memory

    with mock.patch.object(memory, "FLOAT64_MAX_ELEMENTS", limit), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        predict = ours(method)(logits, labels)
        return time.perf_counter() - start, predict


def compare(method: str, data: Tuple[torch.Tensor, ...], held: Tuple[torch.Tensor, torch.Tensor], rounds: int) -> Tuple[str, ...]:
    """One table row: both precisions' median time, their ratio and the held-out NLL difference."""
    from hf_calibrate.calibrators.holdout import paired_difference

    times: Dict[str, List[float]] = {name: [] for name in PRECISIONS}
    losses: Dict[str, torch.Tensor] = {}
    for _ in range(rounds):
        for name, limit in PRECISIONS.items():
            seconds, predict = fit_once(method, limit, data[0], data[1])
            times[name].append(seconds)
            with torch.no_grad():
                losses[name] = F.nll_loss(predict(held[0]).clamp_min(1e-300).log(), held[1], reduction="none")
    medians = {name: statistics.median(values) for name, values in times.items()}
    difference = paired_difference(losses["float32"] - losses["float64"])
    interval = "" if difference["low"] is None else f" [{difference['low']:+.5f}, {difference['high']:+.5f}]"
    return (method, _report.fmt_seconds(medians["float64"]), _report.fmt_seconds(medians["float32"]),
            f"{medians['float32'] / medians['float64']:.2f}", f"{float(losses['float64'].mean()):.5f}",
            f"{difference['point']:+.5f}{interval}")


def report_lines(args: argparse.Namespace) -> List[str]:
    lines: List[str] = []
    warm_up()
    for size, title, data in problems(["1000x100"] if args.quick else SIZES):
        print(title, flush=True)
        held = held_out_draw(size, data)
        rows = [compare(method, data, held, 1 if args.quick else 3) for method in METHODS]
        lines += [f"### {title}", "", *_report.table(
            ("method", "float64", "float32", "time float32 / float64", "held-out NLL (float64)", "NLL float32 − float64 [95 %]"),
            rows, "lrrrrl"), ""]
    return lines


NOTES = [
    "## Notes",
    "",
    "- Time: the median of 3 fits per precision, the precisions interleaved round by round, one torch thread.",
    "- The interval is the paired normal 95 % interval of the per-row held-out NLL difference (`holdout.paired_difference`).",
    "- Every fit runs with its defaults (the linear maps' check against TS, the binning priors' selection included).",
]


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "Logit fits in float32 against float64, around the precision threshold"
    return _report.run_once("bench_fit_precision.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    raise SystemExit(main())
