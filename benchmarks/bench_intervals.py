"""Do the bootstrap intervals cover the truth? Coverage on synthetic data with a known truth.

Data: 10-class softmax probabilities of N(0, 3²) logits, labels drawn from them; the model
reports softmax(T · logits): T = 1 is perfectly calibrated (true ECE 0), T = 1.5 over-confident.
The "truth" of each metric is its value on 400,000 fresh samples of the same distribution (0 for
the calibrated model's ECE). Per (T, N) the script draws ``--sims`` independent test sets and
reports how often the 95 % interval of ``hf_calibrate.metrics.bootstrap_intervals`` (R =
``--replicates``) covers the truth and contains its own point, for the library's intervals and,
for the calibration errors, the plain percentile interval the library no longer uses
(docs/design.md §2, "Intervals"). Paired: the verdict on ECE(calibrated) − ECE(over-confident)
on the same samples (power: how often "improved").

Usage::

    python benchmarks/bench_intervals.py            # writes benchmarks/results/intervals.md
    python benchmarks/bench_intervals.py --quick    # tiny, prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import _report

from hf_calibrate.metrics import bootstrap_intervals, calibration_report, paired_bootstrap_intervals, verdict
from hf_calibrate.metrics.intervals import BIAS_SHIFTED_METRICS

NAME = "intervals"
METRICS = ("accuracy", "nll", "brier", "ece", "ada_ece")
TEMPERATURES = (1.0, 1.5)


def sample(count: int, seed: int, temperature: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(reported probabilities (count, 10) float64, labels (count,)) of one synthetic test set."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(count, 10, generator=generator, dtype=torch.float64) * 3
    labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=generator).squeeze(1)
    return torch.softmax(logits * temperature, 1), labels


def truths(temperature: float) -> Dict[str, float]:
    """Each metric on 400,000 fresh samples; a calibrated model's calibration errors are 0 by definition."""
    report = calibration_report(*sample(400_000, 10_000, temperature))
    return {name: (0.0 if temperature == 1.0 and name in BIAS_SHIFTED_METRICS else report[name]) for name in METRICS}


def plain_percentile(probs: torch.Tensor, labels: torch.Tensor, name: str, replicates: int, seed: int) -> Tuple[float, float]:
    """The unshifted percentile interval of a calibration error: the library's interval with its bias shift undone."""
    from hf_calibrate.metrics.intervals import _one_shot_draws

    draws = _one_shot_draws(probs, labels, [name], 15, replicates, seed)
    values = draws.values[name]
    low, high = torch.nanquantile(values, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def coverage_row(temperature: float, count: int, sims: int, replicates: int, truth: Dict[str, float]) -> List[List[str]]:
    """Rows (metric, interval kind, coverage, contains-point, mean width) for one (T, N)."""
    tallies: Dict[Tuple[str, str], List[float]] = {}
    for sim in range(sims):
        probs, labels = sample(count, sim, temperature)
        found = bootstrap_intervals(probs, labels, metrics=list(METRICS), replicates=replicates, seed=sim)
        for name in METRICS:
            kinds = [("library", found[name].low, found[name].high)]
            if name in BIAS_SHIFTED_METRICS:
                kinds.append(("plain percentile", *plain_percentile(probs, labels, name, replicates, sim)))
            for kind, low, high in kinds:
                tally = tallies.setdefault((name, kind), [0.0, 0.0, 0.0])
                tally[0] += low <= truth[name] <= high
                tally[1] += low <= found[name].point <= high
                tally[2] += high - low
    return [
        [f"{temperature}", f"{count:,}", name, kind, f"{truth[name]:.4f}", f"{covered / sims:.2f}", f"{inside / sims:.2f}",
         f"{width / sims:.4f}"]
        for (name, kind), (covered, inside, width) in tallies.items()
    ]


def power_row(count: int, sims: int, replicates: int) -> List[str]:
    """How often the paired ECE verdict says the calibrated model improved on the over-confident one (same samples)."""
    verdicts = []
    for sim in range(sims):
        calibrated, labels = sample(count, sim, 1.0)
        overconfident, _ = sample(count, sim, 1.5)
        difference = paired_bootstrap_intervals(calibrated, overconfident, labels, metrics=["ece"], replicates=replicates, seed=sim)
        verdicts.append(verdict(difference["ece"]))
    return [f"{count:,}", f"{verdicts.count('improved') / sims:.2f}", f"{verdicts.count('made worse') / sims:.2f}"]


@dataclasses.dataclass
class Results:
    """Rows of the coverage and power tables, and the simulation sizes they came from."""

    coverage: List[List[str]]
    power: List[List[str]]
    sims: int
    replicates: int


def measure(args: argparse.Namespace) -> Results:
    """Coverage rows for every temperature and N, then the paired verdict's power per N."""
    counts, sims, replicates = ((200,), 3, 50) if args.quick else ((300, 1000, 3000), args.sims, args.replicates)
    coverage = []
    for temperature in TEMPERATURES:
        truth = truths(temperature)
        for count in counts:
            print(f"T={temperature} N={count:,} …", file=sys.stderr, flush=True)
            coverage += coverage_row(temperature, count, sims, replicates, truth)
    return Results(coverage, [power_row(count, sims, replicates) for count in counts], sims, replicates)


def report(session: _report.Session, results: Results) -> str:
    coverage, power, sims, replicates = results.coverage, results.power, results.sims, results.replicates
    lines = session.header("Bootstrap intervals: coverage on synthetic data", ["torch"])
    lines += [
        f"{sims} test sets per row, R = {replicates} Poisson-bootstrap replicates, nominal level 95 %. "
        "'covers': the interval holds the truth (the metric on 400,000 fresh samples; 0 for the calibrated "
        "model's calibration errors); 'holds point': it holds its own point estimate.",
        "",
        *_report.table(("T", "N", "metric", "interval", "truth", "covers", "holds point", "mean width"), coverage, "lrllrrrr"),
        "",
        "Paired verdict on ECE(calibrated) − ECE(over-confident, T = 1.5), same samples and weights:",
        "",
        *_report.table(("N", "improved", "made worse"), power, "lrr"),
        "",
        "Reading: a calibrated model's true ECE is 0, but the binned estimate is biased upwards by more than its "
        "spread, so no interval of the estimate covers 0 there; its interval is the estimate's spread. Decide between "
        "models with the paired difference and its verdict.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=1, quick_repeats=1)
    parser.add_argument("--sims", type=int, default=100, help="test sets per row")
    parser.add_argument("--replicates", type=int, default=300, help="bootstrap replicates R")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_intervals.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
