"""What the intervals cost an evaluation: ``CalibratedModel.evaluate`` with bootstrap=1000 against bootstrap=0.

Two measurements, interleaved rounds in one process (ratios are paired per round):

* **a real evaluation**: the demo's digits CNN (timm resnet10t, cached zoo model), temperature
  scaling fitted on its calibration split, evaluated on its 450-sample test split — the base's
  forward pass included, as a user runs it;
* **the metrics alone**: the two accumulators an evaluation feeds and their summary
  (``hf_calibrate.results.evaluation.accumulators`` / ``summarize``), on N synthetic 10-class logits in
  batches of 256 — what the bootstrap adds per sample, without any model.

smECE's intervals are not part of an evaluation (on request, docs/design.md §2); the last table
times them alone, per replicate.

Usage::

    python benchmarks/bench_evaluate_cost.py            # writes benchmarks/results/evaluate_cost.md
    python benchmarks/bench_evaluate_cost.py --quick    # tiny, prints only
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import TensorDataset

import _report

from hf_calibrate import CalibratedModel
from hf_calibrate.results.evaluation import accumulators, summarize
from hf_calibrate.metrics import bootstrap_intervals

NAME = "evaluate_cost"
REPLICATES = 1000
BATCH = 256


def _model_and_data(quick: bool) -> Tuple[str, Any, Any, Any]:
    """(label, model, calibration data, test data): the demo's digits CNN, or with ``quick`` a random timm
    resnet10t on synthetic 32-px images (no zoo model to train)."""
    if quick:
        model = _report.timm_model("resnet10t", 32)
        calibration, test = (TensorDataset(*_report.synthetic_images(model, 200, 32, seed=seed)) for seed in (0, 1))
        return "random resnet10t, synthetic (quick)", model, calibration, test
    from hf_calibrate.demo import digits_timm_cnn

    demo = digits_timm_cnn(progress=False)
    return "digits CNN test split", demo.model, demo.dataset["calibration"], demo.dataset["test"]


def real_evaluation(rounds: int, quick: bool) -> List[str]:
    """A temperature-scaled CNN's test evaluation, bootstrap=0 vs 1000: one table row."""
    label, model, calibration, test = _model_and_data(quick)
    calibrated = CalibratedModel.fit(model, calibration, method="temperature", progress=False)
    runs = {f"bootstrap={r}": (lambda r=r: calibrated.evaluate(test, bootstrap=r, progress=False)) for r in (0, REPLICATES)}
    timings = _report.interleaved(runs, rounds, warmup=1, progress="evaluate")
    base, with_intervals = timings["bootstrap=0"], timings[f"bootstrap={REPLICATES}"]
    return [f"{label} ({len(test)})", _report.fmt_seconds(base.median),
            _report.fmt_seconds(with_intervals.median), f"{_report.paired_ratio(with_intervals, base):.2f}×"]


def _metrics_only(logits: torch.Tensor, labels: torch.Tensor, replicates: int) -> Callable[[], Any]:
    def run() -> Any:
        before, after = accumulators(logits.shape[1], 15, replicates, 0)
        for start in range(0, len(labels), BATCH):
            index = torch.arange(start, min(start + BATCH, len(labels)))
            before.update(logits[index], labels[index], sample_index=index, from_logits=True)
            after.update(logits[index] / 1.5, labels[index], sample_index=index, from_logits=True)
        return summarize(before, after)

    return run


def _synthetic(count: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``count`` 10-class N(0, 3²) logits and labels drawn from their softmax (seeded by ``count``)."""
    generator = torch.Generator().manual_seed(count)
    logits = torch.randn(count, 10, generator=generator) * 3
    return logits, torch.multinomial(torch.softmax(logits, 1), 1, generator=generator).squeeze(1)


def metrics_only(counts: Sequence[int], rounds: int) -> List[List[str]]:
    """The accumulators and summary alone, bootstrap=0 vs 1000, per N: table rows."""
    rows = []
    for count in counts:
        logits, labels = _synthetic(count)
        runs = {str(r): _metrics_only(logits, labels, r) for r in (0, REPLICATES)}
        timings = _report.interleaved(runs, rounds, warmup=1, progress=f"metrics N={count:,}")
        base, with_intervals = timings["0"], timings[str(REPLICATES)]
        extra = (with_intervals.median - base.median) / count
        rows.append([f"synthetic, N = {count:,}", _report.fmt_seconds(base.median), _report.fmt_seconds(with_intervals.median),
                     f"{_report.paired_ratio(with_intervals, base):.2f}×", f"{extra * 1e6:.1f} µs"])
    return rows


def smooth_ece_replicates(counts: Sequence[int], replicates: int) -> List[List[str]]:
    """smECE intervals alone (one bandwidth search per replicate): seconds per replicate, per N."""
    rows = []
    for count in counts:
        logits, labels = _synthetic(count)
        timing = _report.interleaved(
            {"smooth_ece": lambda: bootstrap_intervals(logits, labels, metrics=["smooth_ece"], replicates=replicates,
                                                       from_logits=True)}, 1)["smooth_ece"]
        rows.append([f"N = {count:,}", str(replicates), _report.fmt_seconds(timing.median / replicates)])
    return rows


def measure(args: argparse.Namespace) -> Dict[str, List[List[str]]]:
    """The three tables' rows: a real evaluation, the metrics alone, smECE replicates."""
    counts = (2_000,) if args.quick else (1_000, 10_000, 100_000)
    return {
        "real": [real_evaluation(args.repeats, args.quick)],
        "metrics": metrics_only(counts, args.repeats),
        "smooth": smooth_ece_replicates(counts[:2], 20 if args.quick else 100),
    }


def report(session: _report.Session, tables: Dict[str, List[List[str]]]) -> str:
    lines = session.header("What the intervals cost an evaluation", ["torch", "timm"])
    lines += [
        f"`evaluate(bootstrap=0)` against `evaluate(bootstrap={REPLICATES})` (the default): medians over interleaved "
        "rounds; the ratio is the median of per-round ratios.",
        "",
        *_report.table(("evaluation", "bootstrap=0", f"bootstrap={REPLICATES}", "ratio"), tables["real"], "lrrr"),
        "",
        "The metrics alone: the two accumulators an evaluation feeds (batches of 256, 10 classes) and their summary "
        "(intervals of 7 metrics per side and of their paired differences); 'extra per sample' is the median "
        "difference divided by N.",
        "",
        *_report.table(("data", "bootstrap=0", f"bootstrap={REPLICATES}", "ratio", "extra per sample"), tables["metrics"], "lrrrr"),
        "",
        "smECE intervals (on request, not in an evaluation): seconds per replicate.",
        "",
        *_report.table(("data", "replicates", "per replicate"), tables["smooth"], "lrr"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    args = _report.parse(parser, argv)
    session = _report.Session("bench_evaluate_cost.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
