"""Bootstrap replicates to intervals: :class:`Draws` (points and replicate values per metric) and :class:`Interval`.

Percentile intervals for the means, bias-shifted percentile intervals for the calibration errors
(docs/design.md §2, "Intervals"; :mod:`.intervals` describes both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from .binned import calibration_error_from_statistics, equal_mass_statistics
from .bootstrap import canonical_samples, resampled_ada_ece, resampled_metrics, resampled_smooth_ece
from .functional import metrics_from_statistics
from .interval_options import BIAS_SHIFTED_METRICS, PER_SAMPLE_METRICS, no_interval_reason
from .smooth import smooth_ece_from_confidences


def _json_float(value: float) -> Optional[float]:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval [low, high] of one metric (or of a paired difference): percentile for the means,
    bias-shifted percentile for the calibration errors (:mod:`.intervals`' docstring).

    Attributes:
        point: the metric on the samples as they are (unweighted), or the plain difference.
        low, high: the (1 − confidence)/2 and (1 + confidence)/2 quantiles of the replicates (for a
            calibration error shifted by the bootstrap bias, low cut at 0); NaN (None in JSON) when
            there is no interval: fewer than ``MIN_INTERVAL_SAMPLES`` samples or
            ``MIN_INTERVAL_REPLICATES`` replicates (``reason`` says which), or every replicate empty.
        confidence: the nominal level, e.g. 0.95.
        replicates: the number of bootstrap replicates R drawn.
        seed: the seed of the weights (report it with the interval to make it reproducible).
        reason: why there is no interval, or None.

    Example:
        >>> interval = Interval(point=0.05, low=0.03, high=0.08, confidence=0.95, replicates=1000, seed=0)
        >>> interval.contains(0.04), interval.excludes_zero
        (True, True)
    """

    point: float
    low: float
    high: float
    confidence: float
    replicates: int
    seed: int
    reason: Optional[str] = None

    def contains(self, value: float) -> bool:
        """Whether low ≤ value ≤ high."""
        return self.low <= value <= self.high

    @property
    def excludes_zero(self) -> bool:
        """Whether the whole interval lies on one side of 0 (low > 0 or high < 0)."""
        return self.low > 0.0 or self.high < 0.0

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able form: floats (None for NaN) and ints, and the ``reason`` when there is no interval."""
        ends = {"point": _json_float(self.point), "low": _json_float(self.low), "high": _json_float(self.high)}
        return {**ends, "confidence": self.confidence, "replicates": self.replicates, "seed": self.seed,
                **({"reason": self.reason} if self.reason else {})}


@dataclass(frozen=True)
class Draws:
    """Point estimates and the R replicate values (CPU float64 (R,), NaN for empty replicates) per metric.

    Example:
        >>> import torch
        >>> draws = Draws({"ece": 0.1}, {"ece": torch.linspace(0.0, 0.4, 101, dtype=torch.float64)}, 101, 0)
        >>> interval = draws.intervals(0.5)["ece"]  # quartiles 0.1, 0.3 shifted by the bias 0.2 − 0.1
        >>> round(interval.low, 12), round(interval.high, 12), (draws - draws).intervals(0.5)["ece"].high
        (0.0, 0.2, 0.0)
        >>> Draws({"ece": 0.1}, {"ece": torch.zeros(101, dtype=torch.float64)}, 101, 0, samples=1).intervals(0.95)["ece"].reason
        'no interval: 1 sample, fewer than the 30 an interval needs'
    """

    points: Dict[str, float]
    values: Dict[str, torch.Tensor]
    replicates: int
    seed: int
    difference: bool = False  # paired differences A − B (no lower bound of 0)
    samples: Optional[int] = None  # the samples resampled (None: not known)

    def __sub__(self, other: "Draws") -> "Draws":
        """Paired differences self − other (same weights: same seed, replicates and samples)."""
        names = [name for name in self.points if name in other.points]
        return Draws(
            {name: self.points[name] - other.points[name] for name in names},
            {name: self.values[name] - other.values[name] for name in names},
            self.replicates,
            self.seed,
            difference=True,
            samples=self.samples,
        )

    def intervals(self, confidence: float) -> Dict[str, Interval]:
        """Intervals at level ``confidence``, one per metric: percentile for the means, bias-shifted
        percentile for the calibration errors (:data:`BIAS_SHIFTED_METRICS`; see :mod:`.intervals`' docstring);
        none (NaN ends and the reason) below ``MIN_INTERVAL_SAMPLES`` samples or ``MIN_INTERVAL_REPLICATES``
        replicates (:func:`~.interval_options.no_interval_reason`)."""
        reason = no_interval_reason(self.samples, self.replicates)
        if reason:
            nan = float("nan")
            return {name: Interval(point, nan, nan, confidence, self.replicates, self.seed, reason)
                    for name, point in self.points.items()}
        tail = (1.0 - confidence) / 2.0
        levels = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
        result = {}
        for name, point in self.points.items():
            low, high = torch.nanquantile(self.values[name], levels).tolist()
            if name in BIAS_SHIFTED_METRICS:
                bias = float(torch.nanmean(self.values[name])) - point
                low, high = low - bias, high - bias
                if not self.difference:  # a calibration error is >= 0
                    low = max(low, 0.0)
            result[name] = Interval(point, low, high, confidence, self.replicates, self.seed)
        return result


def draws_from_statistics(
    names: Sequence[str],
    statistics: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    samples: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    n_bins: int,
    replicates: int,
    seed: int,
) -> Draws:
    """Points and replicates of ``names`` from (width (3, B), sums (2,), replicate width (R, 3, B),
    replicate sums (R, 2)) and, for per-sample metrics, (confidences, correct, indices) (N,).

    Shared by the one-shot functions and :class:`~hf_calibrate.metrics.accumulator.CalibrationMetrics`;
    per-sample metrics regenerate their weights from the indices, in canonical sample order.
    """
    width, sums, replicate_width, replicate_sums = statistics
    points, values = metrics_from_statistics(width, sums), resampled_metrics(replicate_width, replicate_sums)
    # In canonical order the per-sample metrics are the same to the last bit on any split.
    canonical = canonical_samples(*samples) if any(name in PER_SAMPLE_METRICS for name in names) else None
    if "ada_ece" in names:
        points["ada_ece"] = calibration_error_from_statistics(equal_mass_statistics(*samples[:2], n_bins), "l1")
        values["ada_ece"] = resampled_ada_ece(canonical, seed=seed, replicates=replicates, n_bins=n_bins)
    if "smooth_ece" in names:
        points["smooth_ece"] = smooth_ece_from_confidences(*canonical[:2])
        values["smooth_ece"] = resampled_smooth_ece(canonical, seed=seed, replicates=replicates)
    return Draws({name: points[name] for name in names}, {name: values[name].cpu() for name in names}, replicates, seed,
                 samples=int(width[0].sum()))
