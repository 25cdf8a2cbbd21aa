"""Binned calibration errors' functional core: per-bin sufficient statistics and the formulas over them.

Every binned metric is computed in two steps: per-bin *sufficient statistics* (counts, sums of
confidence, sums of correctness, all float64) and a formula over them. The streaming
accumulator sums the same statistics across batches and processes and applies the same
formulas, so one-shot and streaming results agree to rounding. Notation as in
:mod:`hf_calibrate.metrics.functional` (docs/design.md §2).
"""

from __future__ import annotations

from typing import Literal, Optional, Tuple

import torch

from ._checks import row_chunks

Norm = Literal["l1", "l2", "max"]


# ----------------------------------------------------------------------------- statistics


def top_label(probs: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Return float64 confidences ``c`` (N,) and float64 correctness ``a`` (N,)."""
    confidences, predictions = probs.max(dim=1)
    return confidences.double(), (predictions == labels).double()


# Below this many bins, float32/float16/bfloat16 values times B are exact in float64 (24 + 29 bits).
_EXACT_PRODUCT_BINS = 1 << 29


def equal_width_bin_index(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Bin b holds (b/B, (b+1)/B]; exactly 0 goes to bin 0 and 1.0 to bin B-1.

    The boundaries are the float64 values b/B. For values of at most 24 significant bits
    (float32 and narrower) ``ceil(v·B) − 1`` is computed exactly in float64, and no such value
    lies strictly between b/B and its float64 rounding, so the arithmetic index equals the
    binary search over the boundaries, at a fraction of its cost.
    """
    if values.dtype in (torch.float32, torch.float16, torch.bfloat16) and n_bins < _EXACT_PRODUCT_BINS:
        index = (values.double() * n_bins).ceil_().long() - 1
    else:
        boundaries = torch.arange(n_bins + 1, dtype=torch.float64, device=values.device) / n_bins
        index = torch.bucketize(values.double(), boundaries, right=False) - 1
    return index.clamp_(0, n_bins - 1)


def _equal_mass_bin_index(num_samples: int, n_bins: int, device: torch.device) -> torch.Tensor:
    """Bin of each sorted position: the first ``N mod B`` bins hold ⌈N/B⌉ samples, the rest ⌊N/B⌋."""
    small, extra = divmod(num_samples, n_bins)
    position = torch.arange(num_samples, device=device)
    cut = extra * (small + 1)
    large_bins = torch.div(position, small + 1, rounding_mode="floor")
    if small == 0:  # fewer samples than bins: one sample per bin, trailing bins empty
        return large_bins
    return torch.where(position < cut, large_bins, extra + torch.div(position - cut, small, rounding_mode="floor"))


def _scatter_statistics(
    bin_index: torch.Tensor,
    confidences: torch.Tensor,
    correct: torch.Tensor,
    n_bins: int,
    weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-bin (Σw, Σw·c, Σw·a) of the samples in bins ``bin_index`` (n,).

    Without weights each sample counts once: shape (3, B). Weights (R, n) (float64 multiplicities)
    give (R, 3, B): the R rows go through one bincount over R·B cells, not a loop over rows.
    """
    if weights is None:
        stats = torch.zeros(3, n_bins, dtype=torch.float64, device=confidences.device)
        stats[0].scatter_add_(0, bin_index, torch.ones_like(confidences))
        stats[1].scatter_add_(0, bin_index, confidences)
        stats[2].scatter_add_(0, bin_index, correct)
        return stats
    rows = weights.shape[0]
    cells = (torch.arange(rows, device=bin_index.device)[:, None] * n_bins + bin_index).reshape(-1)
    masses = (weights if values is None else weights * values for values in (None, confidences, correct))
    stats = torch.stack([torch.bincount(cells, weights=mass.reshape(-1), minlength=rows * n_bins) for mass in masses])
    return stats.view(3, rows, n_bins).transpose(0, 1)


def equal_width_statistics(
    confidences: torch.Tensor, correct: torch.Tensor, n_bins: int, weights: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Per-bin (count, Σ confidence, Σ correct), shape (3, B), equal-width bins.

    With ``weights`` (R, n) — float64 sample multiplicities such as bootstrap counts — sample i
    counts ``w_ri`` times in row r: (Σw, Σw·c, Σw·a) per bin, shape (R, 3, B).

    Example:
        >>> import torch
        >>> c, a = torch.tensor([0.2, 0.9], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)
        >>> equal_width_statistics(c, a, 2, weights=torch.tensor([[1.0, 2.0]], dtype=torch.float64)).tolist()
        [[[1.0, 2.0], [0.2, 1.8], [0.0, 2.0]]]
    """
    return _scatter_statistics(equal_width_bin_index(confidences, n_bins), confidences, correct, n_bins, weights)


def equal_mass_order(
    confidences: torch.Tensor, correct: torch.Tensor, tiebreak: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Permutation sorting samples by confidence, ties by correctness (wrong first), then by ``tiebreak``.

    Without ``tiebreak`` equal (c, a) pairs keep their input order, which cannot change an
    unweighted statistic; with it (e.g. global sample indices) the order is total, so weighted
    statistics are identical whatever order the samples arrived in.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.7, 0.7, 0.7, 0.5], dtype=torch.float64)
        >>> a = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
        >>> equal_mass_order(c, a, torch.tensor([9, 8, 3, 0])).tolist()
        [3, 2, 1, 0]
    """
    order = None if tiebreak is None else torch.argsort(tiebreak, stable=True)
    for key in (correct, confidences):
        order = torch.argsort(key, stable=True) if order is None else order[torch.argsort(key[order], stable=True)]
    return order


def equal_mass_statistics(confidences: torch.Tensor, correct: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Per-bin (count, Σ confidence, Σ correct), shape (3, B), equal-mass bins.

    Samples are ordered by confidence, ties broken by correctness (wrong first), so the
    result does not depend on the order of the samples.
    """
    order = equal_mass_order(confidences, correct)
    bin_index = _equal_mass_bin_index(confidences.shape[0], n_bins, confidences.device)
    return _scatter_statistics(bin_index, confidences[order], correct[order], n_bins)


def weighted_equal_mass_statistics(
    confidences: torch.Tensor, correct: torch.Tensor, weights: torch.Tensor, n_bins: int
) -> torch.Tensor:
    """Equal-mass (count, Σc, Σa) of R integer-weighted resamples, shape (R, 3, B) (docs/design.md §2).

    Inputs (n,) must be in :func:`equal_mass_order`; ``weights`` (R, n) are float64 whole numbers.
    A sample of weight w stands for w consecutive copies, so the M = Σw copies are binned exactly
    as :func:`equal_mass_statistics` bins M samples: bin b holds copy positions [L_b, L_{b+1}),
    L_b = b·⌊M/B⌋ + min(b, M mod B), and a sample whose copies straddle L_b is split there. Bin
    sums are differences of the cumulative sums at the L_b: O(R·n), no copy is materialised.

    Example:
        >>> import torch
        >>> c = torch.tensor([0.5, 0.75, 1.0], dtype=torch.float64)
        >>> a = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
        >>> weighted_equal_mass_statistics(c, a, torch.tensor([[2.0, 0.0, 1.0]], dtype=torch.float64), 3)[0].tolist()
        [[1.0, 1.0, 1.0], [0.5, 0.5, 1.0], [1.0, 1.0, 1.0]]
    """
    values = torch.stack([torch.ones_like(confidences), confidences, correct])  # (3, n)
    cumulative = (weights * values[:, None]).cumsum_(-1)  # (3, R, n), in place: 3 values per weight
    ends = cumulative[0]  # copies up to and including each sample, (R, n)
    totals = ends[:, -1:]
    edge = torch.arange(n_bins + 1, dtype=torch.float64, device=weights.device)
    small = torch.div(totals, n_bins, rounding_mode="floor")
    bounds = edge * small + torch.minimum(edge, totals - small * n_bins)  # L_b, (R, B+1)
    # The sample holding copy position L_b (the last one for L_b = M), and its copies at or after L_b.
    holder = torch.searchsorted(ends, bounds, right=True).clamp_(max=weights.shape[1] - 1)
    after = ends.gather(1, holder) - bounds
    at_bounds = cumulative.gather(2, holder.expand(3, -1, -1)) - after * values[:, holder]
    return at_bounds.diff(dim=2).transpose(0, 1)


def classwise_statistics(probs: torch.Tensor, labels: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Per-class, per-bin (count, Σ p_k, Σ [y=k]), shape (3, C, B), equal-width bins over p_k."""
    num_classes = probs.shape[1]
    size = num_classes * n_bins
    stats = torch.zeros(3, size, dtype=torch.float64, device=probs.device)
    class_offset = torch.arange(num_classes, device=probs.device) * n_bins
    for chunk, chunk_labels in row_chunks(probs, labels):
        bin_index = equal_width_bin_index(chunk, n_bins)  # in the chunk's own dtype: exact, cheap
        bin_index += class_offset
        flat_index = bin_index.reshape(-1)
        # bincount accumulates float64 weights like scatter_add_, without a tensor of ones.
        stats[0] += torch.bincount(flat_index, minlength=size)
        stats[1] += torch.bincount(flat_index, weights=chunk.double().reshape(-1), minlength=size)
        label_index = bin_index.gather(1, chunk_labels[:, None]).squeeze(1)
        stats[2] += torch.bincount(label_index, minlength=size)
    return stats.view(3, num_classes, n_bins)


# ----------------------------------------------------------------------------- formulas


def calibration_error_from_statistics(stats: torch.Tensor, norm: Norm = "l1") -> float:
    """ECE (l1), RMS calibration error (l2) or MCE (max) from (3, B) bin statistics.

    With ``n_b`` the count, ``gap_b = |Σa/n_b − Σc/n_b|`` and ``N = Σ n_b``:
    l1 = Σ_b (n_b/N)·gap_b, l2 = sqrt(Σ_b (n_b/N)·gap_b²), max = max over non-empty bins of gap_b.
    Empty bins contribute nothing.
    """
    counts, confidence_sums, correct_sums = stats
    total = counts.sum()
    if total <= 0:
        raise ValueError("no samples were seen; calibration error is undefined.")
    filled = counts > 0
    gaps = (correct_sums[filled] - confidence_sums[filled]).abs() / counts[filled]
    weights = counts[filled] / total
    if norm == "l1":
        return float((weights * gaps).sum())
    if norm == "l2":
        return float((weights * gaps.square()).sum().sqrt())
    return float(gaps.max())


def calibration_errors_from_statistics(stats: torch.Tensor, norm: Norm = "l1") -> torch.Tensor:
    """:func:`calibration_error_from_statistics` of a batch (..., 3, B) of (weighted) statistics.

    Returns a float64 tensor of shape (...): l1 = Σ_b n_b·gap_b / N, l2 = sqrt(Σ_b n_b·gap_b² / N),
    max = max_b gap_b, NaN where N = Σ_b n_b is 0 (an empty resample). Empty bins have zero sums,
    so their gap is 0 and changes no norm; values agree with the scalar function to rounding.

    Example:
        >>> import torch
        >>> stats = torch.tensor([[[2.0, 0.0], [1.6, 0.0], [1.0, 0.0]], [[0.0, 0.0]] * 3], dtype=torch.float64)
        >>> calibration_errors_from_statistics(stats, "l1").tolist()
        [0.30000000000000004, nan]
    """
    counts, confidence_sums, correct_sums = stats.unbind(-2)
    total = counts.sum(-1)
    gaps = (correct_sums - confidence_sums).abs() / torch.where(counts > 0, counts, 1.0)
    if norm == "max":
        errors = gaps.amax(-1)
    elif norm == "l1":
        errors = (counts * gaps).sum(-1) / total
    else:
        errors = ((counts * gaps.square()).sum(-1) / total).sqrt()
    return errors.masked_fill(total <= 0, float("nan"))


def classwise_error_from_statistics(stats: torch.Tensor) -> float:
    """Mean over classes of the per-class equal-width ECE, from (3, C, B) statistics."""
    counts, prob_sums, frequency_sums = stats
    num_samples = counts[0].sum()
    per_class = (frequency_sums - prob_sums).abs().sum(dim=1) / num_samples
    return float(per_class.mean())
