"""Poisson-bootstrap weights and the replicate statistics they give (docs/design.md §2, "Intervals").

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

The replicate statistics are the functional core's (:mod:`.binned`, :mod:`.scores`) weighted by
w_ri, summed in blocks of at most :data:`BLOCK_ELEMENTS` weights; :mod:`.intervals` turns them
into intervals.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Dict, Iterator, List, Tuple

import torch

from .binned import (
    calibration_errors_from_statistics,
    equal_mass_order,
    equal_width_statistics,
    weighted_equal_mass_statistics,
)
from .smooth import smooth_ece_from_confidences

#: Weights (replicates × samples) handled at once (4 MiB per float64 copy): bounds the working
#: set of a block to about 40 MiB.
BLOCK_ELEMENTS = 1 << 19

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


def canonical_samples(confidences: torch.Tensor, correct: torch.Tensor, indices: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The samples in equal-mass order with the index as last key: the same sequence on any split."""
    order = equal_mass_order(confidences, correct, indices)
    return confidences[order], correct[order], indices[order]


def _full_rows(seed: int, replicates: int, indices: torch.Tensor) -> Iterator[Tuple[int, torch.Tensor]]:
    """(r0, weights (rows, N)) of every sample for consecutive replicates, ≈ BLOCK_ELEMENTS at a time."""
    rows = max(1, BLOCK_ELEMENTS // max(1, indices.shape[0]))
    for r0 in range(0, replicates, rows):
        yield r0, poisson_weights(seed, torch.arange(r0, min(r0 + rows, replicates), device=indices.device), indices)


def resampled_ada_ece(samples: Tuple[torch.Tensor, ...], *, seed: int, replicates: int, n_bins: int) -> torch.Tensor:
    """AdaECE (l1, weighted equal-mass bins) of each replicate, (R,), from canonical samples."""
    confidences, correct, indices = samples
    return torch.cat([
        calibration_errors_from_statistics(weighted_equal_mass_statistics(confidences, correct, weights, n_bins), "l1")
        for _, weights in _full_rows(seed, replicates, indices)
    ])


def resampled_smooth_ece(samples: Tuple[torch.Tensor, ...], *, seed: int, replicates: int) -> torch.Tensor:
    """smECE (automatic bandwidth) of each replicate, (R,), NaN for an empty one: one call per replicate."""
    confidences, correct, indices = samples
    values = torch.full((replicates,), float("nan"), dtype=torch.float64)
    for r0, weights in _full_rows(seed, replicates, indices):
        for row, replicate_weights in enumerate(weights, start=r0):
            if bool(replicate_weights.sum() > 0):
                values[row] = smooth_ece_from_confidences(confidences, correct, weights=replicate_weights)
    return values

