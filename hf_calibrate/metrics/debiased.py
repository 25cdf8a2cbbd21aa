"""Debiased L2 calibration error of Kumar, Liang & Ma (2019), "Verified Uncertainty Calibration"
(docs/design.md §2).

The values are binned into B equal-mass bins whose edges lie halfway between neighbouring sorted
values (so equal values always share a bin), and each bin's squared gap is corrected for the
variance of its label mean:

    D = Σ_{b: n_b ≥ 2} (n_b/N) · [ (c̄_b − ā_b)² − ā_b(1 − ā_b)/(n_b − 1) ],   error = sqrt(max(D, 0))

This is ``calibration.get_calibration_error(probs, labels, p=2, debias=True)`` of the
``uncertainty-calibration`` package on data it deems continuous.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from ._checks import CHUNK_ELEMENTS, check_choice, check_n_bins, prepare_inputs
from .binned import _scatter_statistics, top_label

Mode = Literal["top-label", "marginal"]
MODES = ("top-label", "marginal")


def equal_mass_edges(values: torch.Tensor, n_bins: int, precision: torch.dtype) -> torch.Tensor:
    """Inner bin edges (K, B' − 1) of each row of ``values`` (K, N), B' = min(B, N).

    The sorted row is split into B' runs of consecutive values, the first N mod B' of ⌈N/B'⌉
    values and the others of ⌊N/B'⌋; an edge is the midpoint of the last value of a run and the
    first of the next, rounded to ``precision`` (the dtype of the probabilities).
    """
    num_samples = values.shape[1]
    parts = min(n_bins, num_samples)
    run, longer_runs = divmod(num_samples, parts)
    index = torch.arange(1, parts, device=values.device)
    starts = index * run + index.clamp(max=longer_runs)  # first position of runs 1 … B'−1
    ordered = values.sort(dim=1).values
    midpoints = (ordered[:, starts - 1] + ordered[:, starts]) / 2.0
    return midpoints.to(precision).double()


def debiased_squared_errors(values: torch.Tensor, targets: torch.Tensor, n_bins: int, precision: torch.dtype) -> torch.Tensor:
    """The debiased squared error D (module docstring) of each row: values and 0/1 targets (K, N), float64.

    A value on an edge goes to the lower bin. Bins of fewer than 2 samples add nothing, but
    still count in N.
    """
    rows, num_samples = values.shape
    edges = equal_mass_edges(values, n_bins, precision)
    parts = edges.shape[1] + 1
    bin_index = torch.searchsorted(edges, values) + parts * torch.arange(rows, device=values.device)[:, None]
    stats = _scatter_statistics(bin_index.reshape(-1), values.reshape(-1), targets.reshape(-1), rows * parts)
    counts, value_sums, target_sums = stats.view(3, rows, parts)
    sizes = counts.clamp(min=2.0)
    frequency = target_sums / sizes
    squared = ((value_sums - target_sums) / sizes).square() - frequency * (1.0 - frequency) / (sizes - 1.0)
    return torch.where(counts >= 2, squared * counts, 0.0).sum(dim=1) / num_samples


def _marginal_squared_errors(probs: torch.Tensor, labels: torch.Tensor, n_bins: int) -> torch.Tensor:
    """D of every class k, from (p_ik, [y_i = k]); classes taken a chunk of ≈ CHUNK_ELEMENTS values at a time."""
    num_samples, num_classes = probs.shape
    step = max(1, CHUNK_ELEMENTS // num_samples)
    squares = []
    for first in range(0, num_classes, step):
        classes = torch.arange(first, min(first + step, num_classes), device=probs.device)
        targets = (labels[None, :] == classes[:, None]).double()
        squares.append(debiased_squared_errors(probs[:, classes].double().T.contiguous(), targets, n_bins, probs.dtype))
    return torch.cat(squares)


def debiased_calibration_error(
    probs: Any, labels: Any, *, n_bins: int = 15, mode: Mode = "top-label", from_logits: bool = False
) -> float:
    r"""Debiased L2 calibration error (Kumar, Liang & Ma, 2019) over equal-mass bins.

    .. math:: D = \sum_{b:\,n_b \ge 2} \frac{n_b}{N}\Bigl[(\bar c_b - \bar a_b)^2
              - \frac{\bar a_b (1 - \bar a_b)}{n_b - 1}\Bigr], \qquad \mathrm{error} = \sqrt{\max(D, 0)}

    ``mode="top-label"``: c = max_k p_ik and a = [argmax_k p_ik = y_i] (ties → lowest index).
    ``mode="marginal"``: D_k of (p_ik, [y_i = k]) for every class, error = sqrt(mean_k max(D_k, 0)).
    Bins: the sorted values split into min(B, N) runs of ⌈N/B⌉ or ⌊N/B⌋, edges halfway between
    runs, a value on an edge in the lower bin (equal values share a bin). The variance term
    removes the plug-in estimate's upward bias of the squared error; sampling noise can make D
    negative, and then the error is 0.

    Args:
        probs: (N, C) probabilities, rows summing to 1 (logits with ``from_logits=True``).
        labels: (N,) integer class indices in [0, C).
        n_bins: number of bins B (≥ 1); fewer when N < B.
        mode: ``"top-label"`` or ``"marginal"`` (classwise).
        from_logits: apply softmax to ``probs`` first.

    Returns:
        The L2 error (not its square) in [0, 1], a Python float.

    Example:
        >>> import torch
        >>> confidences = torch.tensor([0.9, 0.8, 0.95, 0.85, 0.6, 0.7, 0.65, 0.55])
        >>> probs = torch.stack([confidences, 1 - confidences], dim=1)
        >>> labels = torch.tensor([0, 1, 1, 1, 0, 0, 0, 0])  # 1 of 4 right above 0.75, 4 of 4 below
        >>> round(debiased_calibration_error(probs, labels, n_bins=2), 4)  # sqrt((0.328125 + 0.140625) / 2)
        0.4841
    """
    n_bins = check_n_bins(n_bins)
    check_choice(mode, "mode", MODES)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    if mode == "marginal":
        return float(_marginal_squared_errors(probs, labels, n_bins).clamp(min=0.0).mean().sqrt())
    confidences, correct = top_label(probs, labels)
    squared = debiased_squared_errors(confidences[None, :], correct[None, :], n_bins, probs.dtype)
    return float(squared.clamp(min=0.0).sqrt())
