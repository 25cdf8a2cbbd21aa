"""What the comparison's HTML report (:mod:`.html_report`) shows beyond the ranked rows: each method's per-class
calibration, ``method="auto"``'s decisions, and the interval of each reliability bin's accuracy.

Plain data, no plotting: :func:`per_class_calibration` reads an accumulator's classwise statistics (the ones its
classwise ECE is the mean of), :func:`auto_decisions` the fit summaries, and :func:`bin_accuracy_intervals` the
bins of a comparison's ``reliability`` JSON.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..metrics import CalibrationMetrics
from ..metrics.intervals import DEFAULT_CONFIDENCE


def per_class_calibration(accumulator: CalibrationMetrics) -> Dict[str, List[float]]:
    """The per-class terms of the classwise ECE over every sample ``accumulator`` saw, one entry per class k:

    * ``ece``: Σ_b |Σ [y = k] − Σ p_k| / N over equal-width bins b of p_k (N samples); their mean over the C classes
      is the accumulator's ``classwise_ece``;
    * ``mean_probability``: Σ p_k / N, the share of class k the model predicts;
    * ``frequency``: Σ [y = k] / N, the share of class k in the labels;
    * ``samples``: the number of samples labelled k.

    Empty lists when the accumulator was built with ``classwise=False``. Under several processes every process must
    call it (the statistics are summed across them, as :meth:`CalibrationMetrics.compute` does).
    """
    if not isinstance(accumulator, CalibrationMetrics):
        raise ValueError(f"accumulator must be a CalibrationMetrics, got {type(accumulator).__name__}.")
    # The classwise statistics (count, Σ p_k, Σ [y = k]) per class and bin, (3, C, B), summed over processes.
    counts, probability_sums, label_sums = accumulator._synced_state(sync=True).classes
    if counts.shape[0] == 0:
        return {"ece": [], "mean_probability": [], "frequency": [], "samples": []}
    total = counts[0].sum()
    return {
        "ece": ((label_sums - probability_sums).abs().sum(dim=1) / total).tolist(),
        "mean_probability": (probability_sums.sum(dim=1) / total).tolist(),
        "frequency": (label_sums.sum(dim=1) / total).tolist(),
        "samples": [int(round(value)) for value in label_sums.sum(dim=1).tolist()],
    }


def auto_decisions(models: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{name: the ``"auto"`` entry of its ``fit_summary``} for each model ``method="auto"`` fitted (the candidates
    scored, the choice and its reason: what :func:`.reporting.auto_table` and :func:`.reporting.auto_note` read)."""
    decisions = {}
    for name, model in models.items():
        summary = getattr(model, "fit_summary", None)
        if isinstance(summary, Mapping) and summary.get("auto"):
            decisions[name] = summary["auto"]
    return decisions


def wilson_interval(count: int, accuracy: float, confidence: float = DEFAULT_CONFIDENCE) -> Tuple[float, float]:
    """The Wilson score interval (low, high) of a proportion ``accuracy`` observed in ``count`` ≥ 1 samples.

    A bin's accuracy is a binomial proportion: the Wilson interval keeps inside [0, 1] and keeps its coverage near
    the nominal ``confidence`` for the small counts and the accuracies near 0 or 1 that reliability bins hold.

    Example:
        >>> low, high = wilson_interval(20, 0.9)
        >>> round(low, 4), round(high, 4)
        (0.699, 0.9721)
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}.")
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must lie in [0, 1], got {accuracy!r}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}.")
    z = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    denominator = 1.0 + z * z / count
    centre = (accuracy + z * z / (2 * count)) / denominator
    half = z * math.sqrt(accuracy * (1.0 - accuracy) / count + z * z / (4 * count * count)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def bin_accuracy_intervals(
    bins: Mapping[str, Sequence[Any]], confidence: float = DEFAULT_CONFIDENCE
) -> List[Optional[Tuple[float, float]]]:
    """The Wilson interval of each bin's accuracy in ``bins`` (``ReliabilityBins.to_dict()``: ``counts`` and
    ``accuracy`` per bin), None for an empty bin."""
    intervals: List[Optional[Tuple[float, float]]] = []
    for count, accuracy in zip(bins["counts"], bins["accuracy"]):
        intervals.append(None if not count or accuracy is None else wilson_interval(int(count), accuracy, confidence))
    return intervals
