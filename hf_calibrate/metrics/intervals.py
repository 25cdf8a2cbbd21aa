"""Bootstrap confidence intervals for the calibration metrics (docs/design.md §2, "Intervals").

**Poisson bootstrap** (:mod:`.bootstrap`). Replicate r gives sample i the weight w_ri ~ Poisson(1),
a pure function of (seed, r, i); every metric of a replicate is the metric of the weighted sample.
A weight therefore does not depend on batch order, device or process, and two models evaluated on
the same samples with the same seed share their weights — a paired bootstrap of their difference.

**Intervals.** For the means (accuracy, NLL, Brier): percentile intervals, the (1 ∓ confidence)/2
quantiles q₋, q₊ (linear interpolation) of the R replicate values. For the calibration errors
(ECE, MCE, RMS, AdaECE, smECE), which resampling biases upwards (a bin's |gap| is convex in its
mean), the percentile interval shifted by the bootstrap bias estimate b = mean(replicates) − point:
[q₋ − b, q₊ − b], its lower end cut at 0 for a single error (not for a paired difference). It
contains the point whenever the replicates' mean lies between q₋ and q₊, where the plain
percentile interval sits above a near-calibrated model's point in 10–33 % of test sets. The point
estimate is always the unweighted metric, never a replicate mean. A replicate whose weights are
all 0 (probability e^−N) has no metric and is left out. **No degenerate intervals:** below
:data:`MIN_INTERVAL_SAMPLES` samples or :data:`MIN_INTERVAL_REPLICATES` replicates there is no
interval — NaN ends (None in JSON) and its ``reason`` — since one sample or one replicate gives
low = high; where a user asks for intervals (``evaluate``, the ``evaluate`` modules, the CLI) a
replicate count from 1 to 99 is refused.

Example:
    >>> import torch
    >>> generator = torch.Generator().manual_seed(0)
    >>> probs = torch.softmax(torch.randn(500, 3, generator=generator), dim=1)
    >>> labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    >>> ece = bootstrap_intervals(probs, labels, metrics=["ece"], replicates=200)["ece"]
    >>> ece.low <= ece.high, ece.replicates, ece.seed
    (True, 200, 0)
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch

from ._checks import check_flag, check_n_bins, prepare_inputs
from .binned import equal_width_statistics, top_label
from .bootstrap import BLOCK_ELEMENTS, bootstrap_statistics, index_fingerprint, poisson_weights, resampled_metrics
from .catalog import HIGHER_IS_BETTER
from .draws import Draws, Interval, _json_float, draws_from_statistics
from .interval_options import (
    BIAS_SHIFTED_METRICS,
    DEFAULT_CONFIDENCE,
    DEFAULT_METRICS,
    DEFAULT_REPLICATES,
    MIN_INTERVAL_REPLICATES,
    MIN_INTERVAL_SAMPLES,
    ON_REQUEST_METRICS,
    PER_SAMPLE_METRICS,
    check_bootstrap,
    check_confidence,
    check_metrics,
    check_replicates,
    check_sample_index,
    check_seed,
)
from .scores import nll_and_brier_sums, nll_and_brier_terms

__all__ = [
    "BIAS_SHIFTED_METRICS",
    "BLOCK_ELEMENTS",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_METRICS",
    "MIN_INTERVAL_REPLICATES",
    "MIN_INTERVAL_SAMPLES",
    "DEFAULT_REPLICATES",
    "Draws",
    "HIGHER_IS_BETTER",
    "Interval",
    "ON_REQUEST_METRICS",
    "PER_SAMPLE_METRICS",
    "VERDICTS",
    "bootstrap_intervals",
    "bootstrap_statistics",
    "check_confidence",
    "check_metrics",
    "check_replicates",
    "check_sample_index",
    "check_seed",
    "draws_from_statistics",
    "index_fingerprint",
    "interval_columns",
    "paired_bootstrap_intervals",
    "poisson_weights",
    "resampled_metrics",
    "verdict",
]

VERDICTS = ("improved", "made worse", "no detectable change at this test size", "unchanged")


# ----------------------------------------------------------------------------- one-shot draws


def _one_shot_draws(
    probs: torch.Tensor, labels: torch.Tensor, names: Sequence[str], n_bins: int, replicates: int, seed: int
) -> Draws:
    """Draws of validated (N, C) probabilities, sample i carrying index i."""
    confidences, correct = top_label(probs, labels)
    indices = torch.arange(probs.shape[0], device=probs.device)
    width = equal_width_statistics(confidences, correct, n_bins)
    sums = torch.tensor(nll_and_brier_sums(probs, labels), dtype=torch.float64, device=probs.device)
    terms = nll_and_brier_terms(probs, labels)
    replicate_statistics = bootstrap_statistics(
        confidences, correct, terms, indices, seed=seed, replicates=replicates, n_bins=n_bins
    )
    return draws_from_statistics(
        names, (width, sums, *replicate_statistics), (confidences, correct, indices),
        n_bins=n_bins, replicates=replicates, seed=seed,
    )


def _one_shot_options(metrics: Any, n_bins: Any, replicates: Any, confidence: Any, seed: Any) -> Tuple[Any, ...]:
    """Validated (names, n_bins, replicates, confidence, seed) of the one-shot functions."""
    return (
        check_metrics(metrics, {}), check_n_bins(n_bins), check_replicates(replicates),
        check_confidence(confidence), check_seed(seed),
    )


# ----------------------------------------------------------------------------- public API


def bootstrap_intervals(
    probs: Any,
    labels: Any,
    *,
    metrics: Optional[Sequence[str]] = None,
    n_bins: int = 15,
    replicates: int = DEFAULT_REPLICATES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    from_logits: bool = False,
) -> Dict[str, Interval]:
    """Poisson-bootstrap intervals of calibration metrics (docs/design.md §2).

    For each replicate r = 0..R−1, sample i (row i) gets weight w_ri ~ Poisson(1), a function
    of (seed, r, i) only (:func:`poisson_weights`); the replicate's metric is the metric of the
    weighted sample, and the interval is [q_(1−γ)/2, q_(1+γ)/2] of the R values (γ = confidence),
    shifted by the bootstrap bias mean(values) − point for the calibration errors (lower end ≥ 0).

    Args:
        probs: (N, C) probabilities (logits with ``from_logits=True``); labels: (N,) class indices.
        metrics: names among ``accuracy, ece, mce, rms_ce, ada_ece, nll, brier`` (the default) and
            ``smooth_ece`` (on request: one smECE bandwidth search per replicate).
        n_bins: bins B of the binned metrics; replicates: R ≥ 1; confidence: in (0, 1); seed: int.

    Returns:
        {metric: :class:`Interval`}, point = the metric itself (units as the metric: NLL in nats).
        Cost O(R·N) time, O(R·B) memory plus blocks of 2¹⁹ weights.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]] * 25)
        >>> labels = torch.tensor([0, 0, 1, 1] * 25)
        >>> acc = bootstrap_intervals(probs, labels, metrics=["accuracy"], replicates=500)["accuracy"]
        >>> acc.point, acc.low < 0.75 < acc.high
        (0.75, True)
    """
    names, n_bins, replicates, confidence, seed = _one_shot_options(metrics, n_bins, replicates, confidence, seed)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    return _one_shot_draws(probs, labels, names, n_bins, replicates, seed).intervals(confidence)


def paired_bootstrap_intervals(
    probs_a: Any,
    probs_b: Any,
    labels: Any,
    *,
    metrics: Optional[Sequence[str]] = None,
    n_bins: int = 15,
    replicates: int = DEFAULT_REPLICATES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    from_logits: bool = False,
) -> Dict[str, Interval]:
    """Paired bootstrap intervals of metric(A) − metric(B) on the same N samples.

    Both models' replicate r weigh sample i by the same w_ri, so the interval reflects the
    variability of the difference, not of each metric. point = metric(A) − metric(B); A = B
    gives exactly 0 for point, low and high. Read the result with :func:`verdict`. Arguments
    as :func:`bootstrap_intervals`; ``probs_a`` and ``probs_b`` are (N, C) rows of the same samples.

    Example:
        >>> import torch
        >>> labels = torch.tensor([0, 1] * 100)
        >>> sharp = torch.tensor([[0.9, 0.1], [0.1, 0.9]] * 100)
        >>> vague = torch.tensor([[0.6, 0.4], [0.4, 0.6]] * 100)
        >>> nll = paired_bootstrap_intervals(sharp, vague, labels, metrics=["nll"], replicates=200)["nll"]
        >>> verdict(nll)
        'improved'
    """
    names, n_bins, replicates, confidence, seed = _one_shot_options(metrics, n_bins, replicates, confidence, seed)
    probs_a, labels_a = prepare_inputs(probs_a, labels, from_logits=from_logits)
    probs_b, labels_b = prepare_inputs(probs_b, labels, from_logits=from_logits)
    draws_a = _one_shot_draws(probs_a, labels_a, names, n_bins, replicates, seed)
    return (draws_a - _one_shot_draws(probs_b, labels_b, names, n_bins, replicates, seed)).intervals(confidence)


def interval_columns(
    probs: Any, labels: Any, names: Mapping[str, str], *, replicates: int, seed: int = 0, **options: Any
) -> Dict[str, float]:
    """Flat ``{key}_low`` / ``{key}_high`` floats of the 95 % bootstrap interval of metric ``names[key]``.

    The columns the ``evaluate`` modules add with ``bootstrap=R`` (flat floats, as
    ``evaluate.push_to_hub`` and leaderboards take them); ``replicates=0`` gives none, and R must
    otherwise be at least 100 (as for ``evaluate``). On fewer than 30 samples the ends are None and
    ``no_interval_reason`` says why (never an interval of zero width).
    ``options``: ``n_bins``, ``from_logits`` (see :func:`bootstrap_intervals`).

    Example:
        >>> columns = interval_columns([[0.9, 0.1], [0.2, 0.8]] * 20, [0, 0] * 20, {"acc": "accuracy"}, replicates=100)
        >>> sorted(columns), columns["acc_low"] < 0.5 < columns["acc_high"]
        (['acc_high', 'acc_low'], True)
    """
    replicates, seed = check_bootstrap(replicates), check_seed(seed)
    if not replicates:
        return {}
    intervals = bootstrap_intervals(probs, labels, metrics=list(names.values()), replicates=replicates, seed=seed, **options)
    columns = {f"{key}_{end}": _json_float(getattr(intervals[name], end)) for key, name in names.items() for end in ("low", "high")}
    reason = next((interval.reason for interval in intervals.values() if interval.reason), None)
    return {**columns, **({"no_interval_reason": reason} if reason else {})}


def verdict(difference: Interval, lower_is_better: bool = True) -> str:
    """Read a paired difference A − B: ``"improved"``, ``"made worse"``, no detectable change, or ``"unchanged"``.

    With ``lower_is_better`` (every calibration metric, NLL, Brier; pass ``False`` for accuracy),
    A improved on B when the whole interval lies below 0 (high < 0) and made it worse when it
    lies above (low > 0); an interval containing 0 gives ``"no detectable change at this test size"``,
    except a difference that is exactly 0 in every replicate (point, low and high all 0: the two sides
    agree on every sample, e.g. the accuracy of a method that keeps every prediction): ``"unchanged"``.

    Example:
        >>> verdict(Interval(point=-0.02, low=-0.03, high=-0.01, confidence=0.95, replicates=1000, seed=0))
        'improved'
        >>> verdict(Interval(point=0.01, low=-0.01, high=0.03, confidence=0.95, replicates=1000, seed=0))
        'no detectable change at this test size'
    """
    if not isinstance(difference, Interval):
        raise ValueError(
            f"difference must be an Interval (a value of paired_bootstrap_intervals or paired_intervals), "
            f"got {type(difference).__name__}."
        )
    improved, worse, undetected, unchanged = VERDICTS
    if not check_flag(lower_is_better, "lower_is_better"):
        improved, worse = worse, improved
    if difference.high < 0.0:
        return improved
    if difference.low > 0.0:
        return worse
    return unchanged if difference.point == difference.low == difference.high == 0.0 else undetected
