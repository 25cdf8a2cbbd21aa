"""Proper scores' per-sample terms: negative log-likelihood and Brier score, float64 (docs/design.md §2).

Rows are read in bounded chunks; the log is taken of p clamped at :data:`NLL_CLAMP`.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._checks import row_chunks

NLL_CLAMP = 1e-12


def _true_class_terms(chunk: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """p_{i,y_i} and −log max(p_{i,y_i}, 1e-12) of a float64 row chunk, each (n,)."""
    p_true = chunk.gather(1, labels[:, None]).squeeze(1)
    return p_true, p_true.clamp(min=NLL_CLAMP).log().neg_()


def nll_and_brier_sums(probs: torch.Tensor, labels: torch.Tensor) -> Tuple[float, float]:
    """Σ_i −log max(p_{i,y_i}, 1e-12) and Σ_i Σ_k (p_ik − [y_i=k])², float64."""
    nll_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
    brier_sum = torch.zeros((), dtype=torch.float64, device=probs.device)
    for chunk, chunk_labels in row_chunks(probs, labels):
        chunk = chunk.double()
        p_true, nll = _true_class_terms(chunk, chunk_labels)
        nll_sum += nll.sum()
        flat = chunk.reshape(-1)  # Σ_k p² over the chunk as one dot product: no squared copy
        brier_sum += torch.dot(flat, flat) - 2.0 * p_true.sum() + chunk.shape[0]
    return float(nll_sum), float(brier_sum)


def nll_and_brier_terms(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample −log max(p_{i,y_i}, 1e-12) (nats) and Σ_k (p_ik − [y_i=k])², float64, shape (2, N).

    Example:
        >>> import torch
        >>> nll_and_brier_terms(torch.tensor([[0.5, 0.5], [0.25, 0.75]]), torch.tensor([0, 1])).tolist()
        [[0.6931471805599453, 0.2876820724517809], [0.5, 0.125]]
    """
    parts = []
    for chunk, chunk_labels in row_chunks(probs, labels):
        chunk = chunk.double()
        p_true, nll = _true_class_terms(chunk, chunk_labels)
        parts.append(torch.stack([nll, chunk.square().sum(1) - 2.0 * p_true + 1.0]))
    return torch.cat(parts, dim=1)
