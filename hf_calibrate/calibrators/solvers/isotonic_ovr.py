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
is the class's smallest score): two passes computing p_k chunk by chunk with the very softmax
the calibrator's forward applies (one gathers the positives' scores, one finds every score's
gap by a batched binary search against the u's, with an index-add and a scatter-max), and C
tiny isotonic fits of at most m + 1 points. Scores are compared exactly as forward will see
them, so ties (probabilities that underflow to 0, rows that are permutations of each other)
merge exactly as in a full sort.

The knots are the exact ones of sorting all N scores (both ends of every constant block):
benchmarks/results/logit_fits.md has the time against the top-label fit, tests/
test_calibrators.py the agreement with scikit-learn's IsotonicRegression.
"""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..base import chunk_rows

Knots = Tuple[np.ndarray, np.ndarray]
#: the gap tables hold C × (largest class + 1) entries; beyond this many per sample (classes very
#: unbalanced) sorting every class is cheaper
MAX_GAPS_PER_SAMPLE = 4


def one_vs_rest_isotonic_knots(logits: torch.Tensor, labels: torch.Tensor) -> Optional[List[Knots]]:
    """Per class k, the knots (x, y) of the isotonic fit of [y = k] on p_k = softmax(logits)_k.

    Args:
        logits: (N, C) finite logits, any float dtype, any device.
        labels: (N,) class indices in [0, C).

    Returns:
        C pairs of float64 numpy arrays (both non-decreasing), ties merged, both ends of every
        constant block kept so that linear interpolation between knots is exact; or None when
        the classes are so unbalanced that the gap tables (C × the largest class) would exceed
        :data:`MAX_GAPS_PER_SAMPLE` × N entries (sort every class instead).
    """
    labels = labels.to(logits.device)
    own = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    for start, probs in _probability_chunks(logits):
        own[start : start + len(probs)] = probs.gather(1, labels[start : start + len(probs), None]).squeeze(1)
    values, positives = _distinct_positive_scores(own, labels, logits.shape[1])
    if values.numel() > MAX_GAPS_PER_SAMPLE * max(logits.shape[0], logits.shape[1]):
        return None
    counts, lows, highs = _gap_statistics(logits, values)
    return [_class_knots(positives[k], counts[k], lows[k], highs[k]) for k in range(logits.shape[1])]


def _probability_chunks(logits: torch.Tensor) -> Iterator[Tuple[int, torch.Tensor]]:
    """(first row, float64 softmax of a cache-sized chunk of rows): bit for bit the values the
    calibrator's forward computes (softmax works row by row), so ties and knots are those it sees."""
    rows = chunk_rows(logits)
    for start in range(0, logits.shape[0], rows):
        yield start, torch.softmax(logits[start : start + rows].double(), dim=1)


def _distinct_positive_scores(own_scores: torch.Tensor, labels: torch.Tensor, classes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(C, m) distinct scores of each class's positives, increasing, padded with +inf;
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


def _gap_statistics(logits: torch.Tensor, values: torch.Tensor) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class and gap 0..m: (C, m + 1) sample counts, smallest and largest scores p_k.

    A positive's score here is bit-identical to the one its u_r came from (the same softmax of
    the same chunk), so it lands in its own gap and ties are exact. Gap r ≥ 1 starts at u_r;
    gap 0 at the class's smallest score. Accumulation is per element (no (C, m + 1) work per chunk).
    """
    classes, width = values.shape[0], values.shape[1] + 1
    offsets = (torch.arange(classes, device=logits.device) * width)[:, None]
    counts = torch.zeros(classes * width, dtype=torch.float64, device=logits.device)
    highs = torch.full_like(counts, -np.inf)
    lowest = torch.full((classes,), np.inf, dtype=torch.float64, device=logits.device)
    for _, probs in _probability_chunks(logits):
        scores = probs.T.contiguous()  # (C, rows): each class's scores in a row
        gaps = torch.searchsorted(values, scores, right=True).add_(offsets).flatten()
        counts.index_add_(0, gaps, torch.ones_like(scores).flatten())
        highs.scatter_reduce_(0, gaps, scores.flatten(), "amax")
        lowest = torch.minimum(lowest, scores.min(dim=1).values)
    lows = torch.cat([lowest[:, None], values], dim=1)
    return counts.view(classes, width).cpu().numpy(), lows.cpu().numpy(), highs.view(classes, width).cpu().numpy()


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
    knots_y = np.concatenate([fitted[:1], np.stack([fitted[changes], fitted[changes + 1]], 1).ravel(), fitted[-1:]])
    repeated = np.concatenate([[False], (np.diff(knots_x) == 0) & (np.diff(knots_y) == 0)])
    return knots_x[~repeated], knots_y[~repeated]
