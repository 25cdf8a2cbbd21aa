"""Bootstrap confidence intervals for the calibration metrics (docs/design.md §2, "Intervals").

**Poisson bootstrap.** Replicate r gives sample i the weight w_ri ~ Poisson(1) instead of a
multinomial count, so replicates need neither N nor the other samples and a stream can be
resampled one batch at a time (Oza & Russell 2001, "online bagging"; Hanley & MacGibbon 2006,
"Creating non-parametric bootstrap samples using Poisson frequencies"; Chamandy et al. 2012,
"Estimating uncertainty for massive data streams"). Every metric of a replicate is the metric of
the weighted sample — a sample of weight w counts as w copies.

**Counter-based weights.** w_ri is a pure function of (seed, r, i): with SplitMix64's finaliser
``mix`` on 64-bit words, k_r = mix(mix(seed) + (r+1)·γ) and u_ri = mix(k_r + (i+1)·γ)
(γ = 0x9E3779B97F4A7C15, wrapping int64 arithmetic on tensors), and w_ri is the inverse
Poisson(1) CDF of u_ri/2⁶⁴ (u_ri unsigned): the number of entries of the table ⌊F(k)·2⁶⁴⌋ (F to
50 digits) that are ≤ u_ri. A weight therefore does not depend on batch order, device or process: a streaming
accumulator equals the one-shot computation with the same seed up to float64 summation order,
2 processes equal 1 when each sample carries its global index, and two models evaluated on the
same samples with the same seed share their weights — a paired bootstrap of their difference.

**Intervals.** For the means (accuracy, NLL, Brier): percentile intervals, the (1 ∓ confidence)/2
quantiles q₋, q₊ (linear interpolation) of the R replicate values. For the calibration errors
(ECE, MCE, RMS, AdaECE, smECE), which resampling biases upwards (a bin's |gap| is convex in its
mean), the percentile interval shifted by the bootstrap bias estimate b = mean(replicates) − point:
[q₋ − b, q₊ − b], its lower end cut at 0 for a single error (not for a paired difference). It
contains the point whenever the replicates' mean lies between q₋ and q₊, where the plain
percentile interval sits above a near-calibrated model's point in 10–33 % of test sets. The point
estimate is always the unweighted metric, never a replicate mean. A replicate whose weights are
all 0 (probability e^−N) has no metric and is left out.

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

import math
import numbers
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from ._checks import as_tensor, check_flag, check_n_bins, prepare_inputs
from .functional import (
    calibration_error_from_statistics,
    calibration_errors_from_statistics,
    equal_mass_order,
    equal_mass_statistics,
    equal_width_statistics,
    metrics_from_statistics,
    nll_and_brier_sums,
    nll_and_brier_terms,
    top_label,
    weighted_equal_mass_statistics,
)
from .smooth import smooth_ece_from_confidences

#: Replicates by default: R = 1,000 puts the Monte Carlo error of a 95 % endpoint near 2 % of the
#: interval's width; the streaming state is R·(3B + 2) float64 values (376 kB for B = 15).
DEFAULT_REPLICATES = 1000
DEFAULT_CONFIDENCE = 0.95
#: Weights (replicates × samples) handled at once (4 MiB per float64 copy): bounds the working
#: set of a block to about 40 MiB.
BLOCK_ELEMENTS = 1 << 19
#: Metrics with intervals by default, and those computed only on request (smooth_ece costs one
#: full smECE bandwidth search per replicate).
DEFAULT_METRICS = ("accuracy", "ece", "mce", "rms_ce", "ada_ece", "nll", "brier")
ON_REQUEST_METRICS = ("smooth_ece",)
#: Metrics that need each sample's confidence (equal-mass bins, kernel smoothing).
PER_SAMPLE_METRICS = ("ada_ece", "smooth_ece")
#: Calibration errors, biased upwards by resampling: their intervals are shifted by the bootstrap bias.
BIAS_SHIFTED_METRICS = ("ece", "mce", "rms_ce", "ada_ece", "smooth_ece")
VERDICTS = ("improved", "made worse", "no detectable change at this test size")
#: the metrics for which a higher value is better (a verdict reads their difference the other way)
HIGHER_IS_BETTER = frozenset({"accuracy"})

# ----------------------------------------------------------------------------- weight generator

_MASK64 = (1 << 64) - 1


def _as_int64(word: int) -> int:
    """The int64 whose two's-complement bits are ``word mod 2⁶⁴``."""
    word &= _MASK64
    return word - (1 << 64) if word >> 63 else word


_GAMMA = _as_int64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = _as_int64(0xBF58476D1CE4E5B9), _as_int64(0x94D049BB133111EB)


def _shift_right(words: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return (words >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(words: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors, in place (multiplication wraps modulo 2⁶⁴).

    z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
    (logical shifts), with one scratch tensor.
    """
    shifted = torch.empty_like(words)
    for bits, multiplier in ((30, _MIX1), (27, _MIX2), (31, None)):
        torch.bitwise_right_shift(words, bits, out=shifted)
        words ^= shifted.bitwise_and_((1 << (64 - bits)) - 1)
        if multiplier is not None:
            words *= multiplier
    return words


def _poisson_thresholds() -> List[int]:
    """⌊F(k)·2⁶⁴⌋ − 2⁶³ for the Poisson(1) CDF F, k = 0, 1, … while the tail 1 − F(k) is ≥ 2⁻⁶⁴.

    Shifted by 2⁶³ so that int64 comparison with a word whose sign bit is flipped orders the
    word as the unsigned 64-bit integer it stands for.
    """
    with localcontext() as context:
        context.prec = 50
        mass, cumulative, thresholds, k = Decimal(-1).exp(), Decimal(0), [], 0
        while (1 - cumulative) * (1 << 64) >= 1:
            cumulative += mass
            thresholds.append(int(cumulative * (1 << 64)) - (1 << 63))
            k += 1
            mass /= k
    return thresholds


_THRESHOLDS = _poisson_thresholds()
_COMPARED = 5  # thresholds compared one by one; P(w ≥ 5) = 0.37 % of the weights are searched


def _replicate_keys(seed: int, replicates: torch.Tensor) -> torch.Tensor:
    """k_r = mix(mix(seed) + (r+1)·γ) for int64 replicate numbers r."""
    seed_word = _mix64(torch.tensor([_as_int64(seed)], dtype=torch.int64, device=replicates.device))
    return _mix64((replicates.long() + 1) * _GAMMA + seed_word)


def poisson_weights(seed: int, replicates: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Poisson(1) bootstrap weights w_ri of replicates r (R,) and sample indices i (n,), float64 (R, n).

    w_ri = #{k : T_k ≤ u_ri} with T_k = ⌊F(k)·2⁶⁴⌋ and u_ri = mix(k_r + (i+1)·γ) read as an
    unsigned 64-bit integer (module docstring): a function of (seed, r, i) only, on any device.
    Indices are non-negative int64.

    Example:
        >>> import torch
        >>> poisson_weights(0, torch.arange(2), torch.tensor([0, 1, 2, 3, 4])).tolist()
        [[1.0, 1.0, 1.0, 1.0, 2.0], [0.0, 0.0, 2.0, 0.0, 1.0]]
    """
    words = _replicate_keys(seed, replicates)[:, None] + (indices.long()[None, :] + 1) * _GAMMA
    uniform = _mix64(words).view(-1)
    uniform ^= _as_int64(1 << 63)  # unsigned order as int64 order (thresholds are shifted alike)
    # Compare with the first thresholds (3× faster than a search); search only the 0.4 % beyond.
    counts = torch.ge(uniform, _THRESHOLDS[0]).to(torch.uint8)
    for threshold in _THRESHOLDS[1:_COMPARED]:
        counts += torch.ge(uniform, threshold)
    weights = counts.double()
    tail = torch.nonzero(uniform >= _THRESHOLDS[_COMPARED - 1]).squeeze(1)
    thresholds = torch.tensor(_THRESHOLDS, dtype=torch.int64, device=indices.device)
    weights[tail] = torch.bucketize(uniform[tail], thresholds, right=True).double()
    return weights.view(words.shape)


def index_fingerprint(indices: torch.Tensor) -> torch.Tensor:
    """Σ_i h(i) (int64, 0-d) with h a 31-bit hash of the index: equal index sets give equal sums.

    Order-free and exact, so it can be summed over batches and processes; it cannot overflow
    for fewer than 2³² samples.

    Example:
        >>> import torch
        >>> int(index_fingerprint(torch.tensor([3, 1, 2]))) == int(index_fingerprint(torch.tensor([1, 2, 3])))
        True
    """
    return _shift_right(_mix64(indices.long() * _GAMMA), 33).sum()


def _blocks(replicates: int, num_samples: int) -> Iterator[Tuple[int, int, int, int]]:
    """(r0, r1, i0, i1) blocks of at most BLOCK_ELEMENTS weights covering replicates × samples."""
    columns = max(1, min(num_samples, BLOCK_ELEMENTS))
    rows = max(1, BLOCK_ELEMENTS // columns)
    for r0 in range(0, replicates, rows):
        for i0 in range(0, num_samples, columns):
            yield r0, min(r0 + rows, replicates), i0, min(i0 + columns, num_samples)


# ----------------------------------------------------------------------------- validation


def check_replicates(value: Any, name: str = "replicates", *, allow_zero: bool = False) -> int:
    """A positive integer (``allow_zero``: non-negative); bools refused.

    Example:
        >>> check_replicates(1000), check_replicates(0, "bootstrap", allow_zero=True)
        (1000, 0)
    """
    low = 0 if allow_zero else 1
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        what = "a non-negative integer (0 turns intervals off)" if allow_zero else "a positive integer"
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    return int(value)


def check_confidence(value: Any) -> float:
    """A real number strictly between 0 and 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"confidence must be a number strictly between 0 and 1 (e.g. 0.95 for 95 %), got {value!r}.")
    return float(value)


def check_seed(value: Any) -> int:
    """An integer (any sign: the weights use it modulo 2⁶⁴); bools refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {value!r}.")
    return int(value)


def check_sample_index(values: Any, num_samples: int) -> torch.Tensor:
    """Global sample indices of a batch: 1-D, integer, one per sample, non-negative; as int64."""
    index = as_tensor(values, "sample_index")
    if index.ndim != 1 or index.shape[0] != num_samples:
        raise ValueError(
            f"sample_index must be one-dimensional with one index per sample of the batch ({num_samples},), "
            f"got shape {tuple(index.shape)}."
        )
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise ValueError(f"sample_index must hold integer sample indices, got dtype {index.dtype}.")
    if index.numel() and int(index.min()) < 0:
        raise ValueError(f"sample_index must be non-negative, got {int(index.min())}.")
    return index.long()


def check_metrics(metrics: Any, unavailable: Dict[str, str]) -> Tuple[str, ...]:
    """Names of the metrics to bootstrap, without repeats: ``None`` → the defaults not ``unavailable``.

    ``unavailable`` maps a metric that cannot be computed here to the reason and the fix.
    """
    if metrics is None:
        return tuple(name for name in DEFAULT_METRICS if name not in unavailable)
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise ValueError(f"metrics must be a non-empty list of metric names such as ['ece', 'nll'], got {metrics!r}.")
    known = DEFAULT_METRICS + ON_REQUEST_METRICS
    for name in metrics:
        if name not in known:
            raise ValueError(f"metrics must be names among {', '.join(map(repr, known))}; got {name!r}.")
        if name in unavailable:
            raise ValueError(f"metrics asks for {name!r}, but {unavailable[name]}")
    return tuple(dict.fromkeys(metrics))


# ----------------------------------------------------------------------------- replicate statistics


def bootstrap_statistics(
    confidences: torch.Tensor,
    correct: torch.Tensor,
    terms: torch.Tensor,
    indices: torch.Tensor,
    *,
    seed: int,
    replicates: int,
    n_bins: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Weighted equal-width statistics (R, 3, B) and weighted (Σ NLL, Σ Brier) (R, 2) of R replicates.

    ``confidences``, ``correct`` and ``indices`` are (n,), ``terms`` the (2, n) per-sample NLL
    and Brier terms; float64 sums over blocks of at most BLOCK_ELEMENTS weights.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.9, 0.6], dtype=torch.float64)
        >>> a = torch.tensor([1.0, 0.0], dtype=torch.float64)
        >>> width, sums = bootstrap_statistics(c, a, torch.zeros(2, 2, dtype=torch.float64), torch.arange(2),
        ...                                    seed=0, replicates=3, n_bins=5)
        >>> width.shape, sums.shape, width[:, 0].sum(1).tolist()
        (torch.Size([3, 3, 5]), torch.Size([3, 2]), [2.0, 0.0, 5.0])
    """
    device = confidences.device
    width = torch.zeros(replicates, 3, n_bins, dtype=torch.float64, device=device)
    sums = torch.zeros(replicates, 2, dtype=torch.float64, device=device)
    for r0, r1, i0, i1 in _blocks(replicates, confidences.shape[0]):
        weights = poisson_weights(seed, torch.arange(r0, r1, device=device), indices[i0:i1])
        width[r0:r1] += equal_width_statistics(confidences[i0:i1], correct[i0:i1], n_bins, weights)
        sums[r0:r1] += weights @ terms[:, i0:i1].T
    return width, sums


def resampled_metrics(width: torch.Tensor, sums: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The metrics of :func:`metrics_from_statistics` for each replicate: (R,) tensors, NaN if empty.

    ``width`` (R, 3, B) and ``sums`` (R, 2) as from :func:`bootstrap_statistics`.

    Example:
        >>> import torch
        >>> width = torch.tensor([[[2.0], [1.5], [1.0]], [[0.0], [0.0], [0.0]]], dtype=torch.float64)
        >>> resampled_metrics(width, torch.ones(2, 2, dtype=torch.float64))["accuracy"].tolist()
        [0.5, nan]
    """
    count = width[:, 0].sum(-1)
    return {
        "accuracy": width[:, 2].sum(-1) / count,
        "ece": calibration_errors_from_statistics(width, "l1"),
        "mce": calibration_errors_from_statistics(width, "max"),
        "rms_ce": calibration_errors_from_statistics(width, "l2"),
        "nll": sums[:, 0] / count,
        "brier": sums[:, 1] / count,
    }


def _canonical(confidences: torch.Tensor, correct: torch.Tensor, indices: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The samples in equal-mass order with the index as last key: the same sequence on any split."""
    order = equal_mass_order(confidences, correct, indices)
    return confidences[order], correct[order], indices[order]


def _full_rows(seed: int, replicates: int, indices: torch.Tensor) -> Iterator[Tuple[int, torch.Tensor]]:
    """(r0, weights (rows, N)) of every sample for consecutive replicates, ≈ BLOCK_ELEMENTS at a time."""
    rows = max(1, BLOCK_ELEMENTS // max(1, indices.shape[0]))
    for r0 in range(0, replicates, rows):
        yield r0, poisson_weights(seed, torch.arange(r0, min(r0 + rows, replicates), device=indices.device), indices)


def _resampled_ada_ece(samples: Tuple[torch.Tensor, ...], *, seed: int, replicates: int, n_bins: int) -> torch.Tensor:
    """AdaECE (l1, weighted equal-mass bins) of each replicate, (R,), from canonical samples."""
    confidences, correct, indices = samples
    return torch.cat([
        calibration_errors_from_statistics(weighted_equal_mass_statistics(confidences, correct, weights, n_bins), "l1")
        for _, weights in _full_rows(seed, replicates, indices)
    ])


def _resampled_smooth_ece(samples: Tuple[torch.Tensor, ...], *, seed: int, replicates: int) -> torch.Tensor:
    """smECE (automatic bandwidth) of each replicate, (R,), NaN for an empty one: one call per replicate."""
    confidences, correct, indices = samples
    values = torch.full((replicates,), float("nan"), dtype=torch.float64)
    for r0, weights in _full_rows(seed, replicates, indices):
        for row, replicate_weights in enumerate(weights, start=r0):
            if bool(replicate_weights.sum() > 0):
                values[row] = smooth_ece_from_confidences(confidences, correct, weights=replicate_weights)
    return values


# ----------------------------------------------------------------------------- intervals


def _json_float(value: float) -> Optional[float]:
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval [low, high] of one metric (or of a paired difference): percentile for the means,
    bias-shifted percentile for the calibration errors (module docstring).

    Attributes:
        point: the metric on the samples as they are (unweighted), or the plain difference.
        low, high: the (1 − confidence)/2 and (1 + confidence)/2 quantiles of the replicates (for a
            calibration error shifted by the bootstrap bias, low cut at 0); NaN only if every
            replicate was empty (N tiny).
        confidence: the nominal level, e.g. 0.95.
        replicates: the number of bootstrap replicates R drawn.
        seed: the seed of the weights (report it with the interval to make it reproducible).

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

    def contains(self, value: float) -> bool:
        """Whether low ≤ value ≤ high."""
        return self.low <= value <= self.high

    @property
    def excludes_zero(self) -> bool:
        """Whether the whole interval lies on one side of 0 (low > 0 or high < 0)."""
        return self.low > 0.0 or self.high < 0.0

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able form: floats (None for NaN) and ints."""
        return {
            "point": _json_float(self.point), "low": _json_float(self.low), "high": _json_float(self.high),
            "confidence": self.confidence, "replicates": self.replicates, "seed": self.seed,
        }


@dataclass(frozen=True)
class Draws:
    """Point estimates and the R replicate values (CPU float64 (R,), NaN for empty replicates) per metric.

    Example:
        >>> import torch
        >>> draws = Draws({"ece": 0.1}, {"ece": torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4], dtype=torch.float64)}, 5, 0)
        >>> interval = draws.intervals(0.5)["ece"]  # quartiles 0.1, 0.3 shifted by the bias 0.2 − 0.1
        >>> round(interval.low, 12), round(interval.high, 12), (draws - draws).intervals(0.5)["ece"].high
        (0.0, 0.2, 0.0)
    """

    points: Dict[str, float]
    values: Dict[str, torch.Tensor]
    replicates: int
    seed: int
    difference: bool = False  # paired differences A − B (no lower bound of 0)

    def __sub__(self, other: "Draws") -> "Draws":
        """Paired differences self − other (same weights: same seed, replicates and samples)."""
        names = [name for name in self.points if name in other.points]
        return Draws(
            {name: self.points[name] - other.points[name] for name in names},
            {name: self.values[name] - other.values[name] for name in names},
            self.replicates,
            self.seed,
            difference=True,
        )

    def intervals(self, confidence: float) -> Dict[str, Interval]:
        """Intervals at level ``confidence``, one per metric: percentile for the means, bias-shifted
        percentile for the calibration errors (:data:`BIAS_SHIFTED_METRICS`; see the module docstring)."""
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

    Shared by the one-shot functions and :class:`~hf_calibrate.metrics.streaming.CalibrationMetrics`;
    per-sample metrics regenerate their weights from the indices, in canonical sample order.
    """
    width, sums, replicate_width, replicate_sums = statistics
    points, values = metrics_from_statistics(width, sums), resampled_metrics(replicate_width, replicate_sums)
    # In canonical order the per-sample metrics are the same to the last bit on any split.
    canonical = _canonical(*samples) if any(name in PER_SAMPLE_METRICS for name in names) else None
    if "ada_ece" in names:
        points["ada_ece"] = calibration_error_from_statistics(equal_mass_statistics(*samples[:2], n_bins), "l1")
        values["ada_ece"] = _resampled_ada_ece(canonical, seed=seed, replicates=replicates, n_bins=n_bins)
    if "smooth_ece" in names:
        points["smooth_ece"] = smooth_ece_from_confidences(*canonical[:2])
        values["smooth_ece"] = _resampled_smooth_ece(canonical, seed=seed, replicates=replicates)
    return Draws({name: points[name] for name in names}, {name: values[name].cpu() for name in names}, replicates, seed)


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
    ``evaluate.push_to_hub`` and leaderboards take them); ``replicates=0`` gives none.
    ``options``: ``n_bins``, ``from_logits`` (see :func:`bootstrap_intervals`).

    Example:
        >>> columns = interval_columns([[0.9, 0.1], [0.2, 0.8]] * 20, [0, 0] * 20, {"acc": "accuracy"}, replicates=100)
        >>> sorted(columns), columns["acc_low"] < 0.5 < columns["acc_high"]
        (['acc_high', 'acc_low'], True)
    """
    replicates, seed = check_replicates(replicates, "bootstrap", allow_zero=True), check_seed(seed)
    if not replicates:
        return {}
    intervals = bootstrap_intervals(probs, labels, metrics=list(names.values()), replicates=replicates, seed=seed, **options)
    return {f"{key}_{end}": float(getattr(intervals[name], end)) for key, name in names.items() for end in ("low", "high")}


def verdict(difference: Interval, lower_is_better: bool = True) -> str:
    """Read a paired difference A − B: ``"improved"``, ``"made worse"`` or no detectable change.

    With ``lower_is_better`` (every calibration metric, NLL, Brier; pass ``False`` for accuracy),
    A improved on B when the whole interval lies below 0 (high < 0) and made it worse when it
    lies above (low > 0); an interval containing 0 gives ``"no detectable change at this test size"``.

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
    improved, worse, unchanged = VERDICTS
    if not check_flag(lower_is_better, "lower_is_better"):
        improved, worse = worse, improved
    if difference.high < 0.0:
        return improved
    if difference.low > 0.0:
        return worse
    return unchanged
