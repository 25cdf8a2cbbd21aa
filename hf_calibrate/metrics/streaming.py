"""Streaming calibration metrics: the accumulator and what is computed from accumulators.

The accumulator :class:`CalibrationMetrics` (:mod:`.accumulator`, importable from here) sums
per-batch statistics across batches and processes. Built on it: intervals of two accumulators of
the same samples and of their paired difference (:func:`interval_report`, :func:`paired_intervals`;
docs/design.md §2, "Intervals"), and every metric of one array in one pass (:func:`calibration_report`).
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Sequence

from ._checks import prepare_inputs
from .accumulator import AccumulatorState, CalibrationMetrics
from .draws import Interval
from .interval_options import DEFAULT_CONFIDENCE, check_confidence

__all__ = ["CalibrationMetrics", "IntervalReport", "calibration_report", "interval_report", "paired_intervals"]


class IntervalReport(NamedTuple):
    """Intervals of two accumulators of the same samples and of their paired difference, per metric."""

    a: Dict[str, Interval]
    b: Dict[str, Interval]
    difference: Dict[str, Interval]  # metric(a) − metric(b)


def interval_report(
    a: CalibrationMetrics,
    b: CalibrationMetrics,
    *,
    metrics: Optional[Sequence[str]] = None,
    confidence: float = DEFAULT_CONFIDENCE,
    sync: bool = True,
) -> IntervalReport:
    """Intervals of ``a``, of ``b`` and of metric(a) − metric(b), from one set of replicates per accumulator.

    What :meth:`CalibrationMetrics.intervals` gives for each and :func:`paired_intervals` for the
    difference, at the cost of one of them (per-sample metrics such as smECE are resampled once
    per accumulator, not twice). The same conditions as :func:`paired_intervals`.

    Example:
        >>> import torch
        >>> labels = torch.tensor([0, 1] * 100)
        >>> a, b = CalibrationMetrics(2, bootstrap=200), CalibrationMetrics(2, bootstrap=200)
        >>> a.update(torch.tensor([[0.9, 0.1], [0.1, 0.9]] * 100), labels)
        >>> b.update(torch.tensor([[0.6, 0.4], [0.4, 0.6]] * 100), labels)
        >>> report = interval_report(a, b, metrics=["nll"])
        >>> report.a["nll"].point < report.b["nll"].point, report.difference["nll"].high < 0
        (True, True)
    """
    _check_pairable(a, b)
    names, confidence = a._metric_names(metrics), check_confidence(confidence)
    names = tuple(name for name in names if name in b._metric_names(None if metrics is None else names))
    state_a, state_b = a._synced_state(sync), b._synced_state(sync)
    _check_same_samples(state_a, state_b)
    draws_a, draws_b = a._draws(state_a, names), b._draws(state_b, names)
    return IntervalReport(draws_a.intervals(confidence), draws_b.intervals(confidence), (draws_a - draws_b).intervals(confidence))


def paired_intervals(
    a: CalibrationMetrics,
    b: CalibrationMetrics,
    *,
    metrics: Optional[Sequence[str]] = None,
    confidence: float = DEFAULT_CONFIDENCE,
    sync: bool = True,
) -> Dict[str, Interval]:
    """Paired bootstrap intervals of metric(a) − metric(b) for two accumulators of the same samples.

    ``a`` and ``b`` (e.g. calibrated and uncalibrated outputs of one test set) must share seed,
    bootstrap and n_bins and have seen the same samples under the same indices; then replicate r
    weighs each sample alike in both and the intervals are those of
    :func:`~hf_calibrate.metrics.intervals.paired_bootstrap_intervals`. Read them with
    :func:`~hf_calibrate.metrics.intervals.verdict`. Per-sample metrics need ``adaptive`` on both.

    Example:
        >>> import torch
        >>> labels = torch.tensor([0, 1] * 100)
        >>> a, b = CalibrationMetrics(2, bootstrap=200), CalibrationMetrics(2, bootstrap=200)
        >>> a.update(torch.tensor([[0.9, 0.1], [0.1, 0.9]] * 100), labels)
        >>> b.update(torch.tensor([[0.6, 0.4], [0.4, 0.6]] * 100), labels)
        >>> nll = paired_intervals(a, b, metrics=["nll"])["nll"]
        >>> nll.high < 0
        True
    """
    return interval_report(a, b, metrics=metrics, confidence=confidence, sync=sync).difference


def _check_same_samples(state_a: AccumulatorState, state_b: AccumulatorState) -> None:
    """Both synced states saw the same samples under the same indices."""
    counts = int(state_a.width[0].sum()), int(state_b.width[0].sum())
    if counts[0] != counts[1]:
        raise ValueError(
            f"paired_intervals needs the same samples in both accumulators, but a saw {counts[0]} and b saw "
            f"{counts[1]}; feed both every sample once (with the same sample_index)."
        )
    if int(state_a.fingerprint) != int(state_b.fingerprint):
        raise ValueError(
            "paired_intervals needs the same samples in both accumulators, but a and b saw different sample "
            "indices; pass each sample's sample_index to both (or feed both in the same order without it)."
        )


def _check_pairable(a: Any, b: Any) -> None:
    """Both bootstrap accumulators with the same weights (seed, replicates) and bins."""
    for name, metrics in (("a", a), ("b", b)):
        if not isinstance(metrics, CalibrationMetrics):
            raise ValueError(f"{name} must be a CalibrationMetrics, got {type(metrics).__name__}.")
    for option in ("bootstrap", "seed", "n_bins"):
        if getattr(a, option) != getattr(b, option):
            raise ValueError(
                f"paired_intervals needs the same {option} in both accumulators, but a has {option}="
                f"{getattr(a, option)!r} and b has {getattr(b, option)!r}; build both with the same {option}."
            )


def calibration_report(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> Dict[str, float]:
    """Every metric of :class:`CalibrationMetrics` on one (N, C) array, in one pass.

    Example:
        >>> import torch
        >>> report = calibration_report(torch.tensor([[0.95, 0.05], [0.35, 0.65]]), torch.tensor([0, 1]))
        >>> round(report["accuracy"], 2), round(report["ece"], 2)
        (1.0, 0.2)
    """
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    metrics = CalibrationMetrics(probs.shape[1], n_bins=n_bins)
    metrics.update(probs, labels, validate=False)
    return metrics.compute(sync=False)
