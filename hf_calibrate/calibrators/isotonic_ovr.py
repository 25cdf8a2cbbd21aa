"""One-vs-rest isotonic regression without sorting every class's N scores.

Class k's map is the increasing isotonic fit of the targets [y = k] on the scores p_k of all
N samples. Only the n_k ≈ N/C samples of class k are positives; the rest are zeros. Writing
u_1 < … < u_m for the distinct scores of the positives, every sample falls in one *gap*:
gap 0 holds the scores below u_1 (all negatives), gap r ≥ 1 holds [u_r, u_{r+1}), i.e. the
samples scoring exactly u_r (all positives of that score and any tied negatives) followed by
negatives only. Within gap r ≥ 1 the targets never increase (a positive mean, then zeros), and
the isotonic fit is constant over any run of non-increasing targets (the pool-adjacent-
violators lemma), so pooling each gap into one weighted point changes no fitted value. The fit
then needs, per class, only each gap's count and largest score (its smallest is u_r; gap 0's
is the class's smallest score): one pass computing p_k chunk by chunk, a batched binary search
against the u's, a bincount and a scatter-max, and C tiny isotonic fits of at most m + 1 points.

The knots are the exact ones of sorting all N scores (both ends of every constant block):
benchmarks/results/logit_fits.md has the time against the top-label fit, tests/
test_calibrators.py the agreement with scikit-learn's IsotonicRegression.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch

from .base import chunk_rows

Knots = Tuple[np.ndarray, np.ndarray]


def one_vs_rest_isotonic_knots(logits: torch.Tensor, labels: torch.Tensor) -> List[Knots]:
    """Per class k, the knots (x, y) of the isotonic fit of [y = k] on p_k = softmax(logits)_k.

    Args:
        logits: (N, C) finite logits, any float dtype, any device.
        labels: (N,) class indices in [0, C).

    Returns:
        C pairs of float64 numpy arrays (both non-decreasing), ties merged, both ends of every
        constant block kept so that linear interpolation between knots is exact.
    """
    shift, log_norm = _row_shift_and_log_norm(logits)
    own = (logits.gather(1, labels[:, None]).squeeze(1).double() - shift) - log_norm  # log p_{y_i}
    log_values, positives = _distinct_positive_scores(own, labels, logits.shape[1])
    counts, lows, highs = _gap_statistics(logits, (shift, log_norm), log_values)
    return [_class_knots(positives[k], counts[k], lows[k], highs[k]) for k in range(logits.shape[1])]


def _row_shift_and_log_norm(logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(N,) float64 row maxima m and L = log Σ_k exp(z_k − m), chunk by chunk.

    log p_k = (z_k − m) − L: z_k − m is exact, so rows that differ by a constant shift get
    bit-identical scores (as softmax gives them), and each score is two correctly rounded
    subtractions, bit-identical however it is computed.
    """
    shift = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    log_norm = torch.empty_like(shift)
    rows = chunk_rows(logits)
    for start in range(0, logits.shape[0], rows):
        chunk = logits[start : start + rows]
        shift[start : start + rows] = chunk.max(dim=1).values.double()
        log_norm[start : start + rows] = (chunk.double() - shift[start : start + rows, None]).exp_().sum(dim=1).log_()
    return shift, log_norm


def _distinct_positive_scores(own_scores: torch.Tensor, labels: torch.Tensor, classes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(C, m) distinct log-scores of each class's positives, increasing, padded with +inf;
    and (C, m) float64 how many positives score each (0 in the padding)."""
    scores, classes_of = own_scores.cpu().numpy(), labels.cpu().numpy()
    order = np.lexsort((scores, classes_of))
    scores, classes_of = scores[order], classes_of[order]
    starts = np.flatnonzero(np.concatenate([[True], (np.diff(scores) != 0) | (np.diff(classes_of) != 0)]))
    group_class = classes_of[starts]
    first_group = np.searchsorted(group_class, np.arange(classes))
    rank = np.arange(len(starts)) - first_group[group_class]
    width = max(1, int(rank.max(initial=-1)) + 1)
    values = np.full((classes, width), np.inf)
    counts = np.zeros((classes, width))
    values[group_class, rank] = scores[starts]
    counts[group_class, rank] = np.diff(np.append(starts, len(scores)))
    return torch.from_numpy(values).to(own_scores.device), torch.from_numpy(counts)


def _gap_statistics(
    logits: torch.Tensor, normalisers: Tuple[torch.Tensor, torch.Tensor], log_values: torch.Tensor,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class and gap 0..m: (C, m + 1) sample counts, smallest and largest scores p_k.

    Everything is found in log space (:func:`_row_shift_and_log_norm`), where a positive's
    score is bit-identical to the one its u_r came from, so it always lands in its own gap and
    ties are exact; only the (C, m + 1) extremes are exponentiated. Gap r ≥ 1 starts at u_r.
    """
    shift, log_norm = normalisers
    classes, width = log_values.shape[0], log_values.shape[1] + 1
    offsets = (torch.arange(classes, device=logits.device) * width)[:, None]
    counts = torch.zeros(classes * width, dtype=torch.float64, device=logits.device)
    highs = torch.full_like(counts, -np.inf)
    lowest = torch.full((classes,), np.inf, dtype=torch.float64, device=logits.device)
    rows = chunk_rows(logits)
    for start in range(0, logits.shape[0], rows):
        chunk = logits[start : start + rows]
        scores = torch.empty((classes, chunk.shape[0]), dtype=torch.float64, device=logits.device)
        scores.copy_(chunk.T).sub_(shift[None, start : start + rows]).sub_(log_norm[None, start : start + rows])
        gaps = torch.searchsorted(log_values, scores, right=True).add_(offsets).flatten()
        counts += torch.bincount(gaps, minlength=classes * width)
        highs.scatter_reduce_(0, gaps, scores.flatten(), "amax")
        lowest = torch.minimum(lowest, scores.min(dim=1).values)
    lows = torch.cat([lowest[:, None], log_values], dim=1)
    return counts.view(classes, width).cpu().numpy(), lows.exp().cpu().numpy(), highs.view(classes, width).exp().cpu().numpy()


def _class_knots(positives: torch.Tensor, counts: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> Knots:
    """Knots of one class's isotonic fit from its pooled gaps 0..m (empty gaps dropped).

    ``positives`` (m,) counts the positives at each u_r: gap r ≥ 1's hits; gap 0 has none.
    """
    from scipy.optimize import isotonic_regression

    hits = np.concatenate([[0.0], positives.numpy()])
    kept = counts > 0
    counts, hits, lows, highs = counts[kept], hits[kept], lows[kept], highs[kept]
    fitted = isotonic_regression(hits / counts, weights=counts, increasing=True).x
    changes = np.flatnonzero(np.diff(fitted) != 0)
    knots_x = np.concatenate([lows[:1], np.stack([highs[changes], lows[changes + 1]], 1).ravel(), highs[-1:]])
    knots_x = np.maximum.accumulate(knots_x)  # exp of ordered log-scores may be out of order in the last bit
    knots_y = np.concatenate([fitted[:1], np.stack([fitted[changes], fitted[changes + 1]], 1).ravel(), fitted[-1:]])
    repeated = np.concatenate([[False], (np.diff(knots_x) == 0) & (np.diff(knots_y) == 0)])
    return knots_x[~repeated], knots_y[~repeated]
