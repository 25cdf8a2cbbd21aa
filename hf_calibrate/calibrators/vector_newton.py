"""Vector scaling's fit: Newton steps with the exact per-class 2×2 Hessian blocks, one pass each.

The mean NLL of softmax(a ⊙ z + b) is convex in (a, b). Its gradient and the diagonal blocks
of its Hessian (for class c: ∂²/∂a_c², ∂²/∂a_c∂b_c, ∂²/∂b_c²) are column sums over the samples,
so one pass over the logits, chunk by cache-sized chunk, gives the loss, the gradient and
the blocks together. The blocks ignore the coupling between classes through the softmax
normaliser; the Hessian is a weighted graph Laplacian (each diagonal entry is the sum of its
row's off-diagonal magnitudes), so it is at most twice its block diagonal and the block-Newton
step is at most twice too long along any direction: an Armijo backtracking line search, whose
trial pass is the next iteration's pass, makes it safe. At 1,000 classes the coupling is weak
and 2–3 iterations suffice (benchmarks/results/logit_fits.md); with 2 classes it is strongest
(about a dozen). Scales stay within :data:`SCALE_BOUNDS` (a projected Newton step: a class at
a bound whose gradient points outwards keeps its scale and moves only its bias).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import torch

from .base import chunk_rows

ARMIJO = 1e-4
MAX_HALVINGS = 20
#: the scales a_c are kept in [1e-4, 1e4] (just inside): the range a saved artifact allows for
#: exp(log_scale). A class whose optimum lies beyond a bound (e.g. a negative scale) is held there.
SCALE_BOUNDS = (1.01e-4, 1e4 / 1.01)


def vector_scaling_pass(logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> Tuple[float, torch.Tensor]:
    """Mean NLL of softmax(scale ⊙ logits + bias) and a (5, C) float64 tensor of per-class sums / N:
    Σ p·z and Σ p (the gradient before the label terms), Σ z²q, Σ z·q and Σ q with q = p(1 − p).

    ``logits`` (N, C) float32 or float64; ``scale``, ``bias`` (C,) of any float dtype.
    """
    rows = chunk_rows(logits)
    scale, bias = scale.to(logits.dtype), bias.to(logits.dtype)
    sums = torch.zeros(5, logits.shape[1], dtype=torch.float64, device=logits.device)
    loss = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        z, y = logits[start : start + rows], labels[start : start + rows]
        shifted = torch.addcmul(bias, z, scale)
        top = shifted.amax(dim=1, keepdim=True)
        probs = (shifted - top).exp_()
        total = probs.sum(dim=1, keepdim=True)
        loss += (top + total.log() - shifted.gather(1, y[:, None])).sum(dtype=torch.float64)
        probs.div_(total)
        curvature = probs * (1 - probs)
        weighted = curvature * z
        for row, values in enumerate((probs * z, probs, weighted * z, weighted, curvature)):
            sums[row] += values.sum(dim=0, dtype=torch.float64)
    return float(loss) / logits.shape[0], sums / logits.shape[0]


def fit_vector_scaling(logits: torch.Tensor, labels: torch.Tensor, beta: float, max_iter: int) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """(scale a, bias b, summary) minimising the mean NLL of softmax(a ⊙ z + b), from a = β, b = 0 (TS).

    Stops when half the Newton decrement (the predicted decrease) is below the logits'
    precision times the loss, when the line search cannot decrease the loss, or after
    ``max_iter`` iterations (on data lacking some class the optimum lies at infinity).
    """
    classes = logits.shape[1]
    count = torch.bincount(labels, minlength=classes).double() / len(labels)
    true_sum = torch.zeros(classes, dtype=torch.float64, device=logits.device)
    true_sum.index_add_(0, labels, logits.gather(1, labels[:, None]).squeeze(1).double())
    true_sum /= len(labels)
    scale = torch.full((classes,), beta, dtype=torch.float64, device=logits.device).clamp(*SCALE_BOUNDS)
    bias = torch.zeros(classes, dtype=torch.float64, device=logits.device)
    loss, sums = vector_scaling_pass(logits, labels, scale, bias)
    passes, iteration, threshold = 1, 0, max(1e-10, torch.finfo(logits.dtype).eps * abs(loss))
    while iteration < max_iter:
        step_scale, step_bias = _newton_direction(sums, count, true_sum, scale)
        decrement = -float((step_scale * (sums[0] - true_sum) + step_bias * (sums[1] - count)).sum())
        if decrement / 2 <= threshold:
            break
        accepted, trials = _line_search(logits, labels, scale, bias, step_scale, step_bias, loss, decrement)
        passes += trials
        if accepted is None:
            break
        scale, bias, loss, sums = accepted
        iteration += 1
    return scale, bias, {"loss": loss, "iterations": iteration, "passes": passes}


def _newton_direction(sums: torch.Tensor, count: torch.Tensor, true_sum: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """−H_c⁻¹ g_c for each class's 2×2 block, shortened per class to stop at a scale bound; a class held at
    a bound (its gradient pointing outwards) takes the 1-D Newton step in its bias only."""
    grad_scale, grad_bias = sums[0] - true_sum, sums[1] - count
    h_aa, h_ab, h_bb = sums[2], sums[3], sums[4]
    ridge = 1e-12 * (h_aa + h_bb).clamp_min(1e-300)
    determinant = (h_aa + ridge) * (h_bb + ridge) - h_ab.square()
    step_scale = -((h_bb + ridge) * grad_scale - h_ab * grad_bias) / determinant
    step_bias = -((h_aa + ridge) * grad_bias - h_ab * grad_scale) / determinant
    low, high = SCALE_BOUNDS
    held = ((scale <= low) & (grad_scale > 0)) | ((scale >= high) & (grad_scale < 0))
    step_scale = torch.where(held, torch.zeros_like(step_scale), step_scale)
    step_bias = torch.where(held, -grad_bias / (h_bb + ridge), step_bias)
    step_scale, step_bias = (torch.nan_to_num(step, nan=0.0, posinf=0.0, neginf=0.0) for step in (step_scale, step_bias))
    room = torch.where(step_scale < 0, scale - low, high - scale).clamp_min(0)
    shrink = torch.where(step_scale.abs() > room, room / step_scale.abs().clamp_min(1e-300), torch.ones_like(step_scale))
    return step_scale * shrink, step_bias * shrink  # a positive factor per block keeps a descent direction


def _line_search(logits, labels, scale, bias, step_scale, step_bias, loss, decrement):
    """Armijo backtracking from the full step: ((scale, bias, loss, sums) or None on failure, passes made)."""
    length = 1.0
    for trial in range(1, MAX_HALVINGS + 1):
        new_scale = (scale + length * step_scale).clamp(*SCALE_BOUNDS)  # only rounding can leave the bounds
        new_bias = bias + length * step_bias
        new_loss, new_sums = vector_scaling_pass(logits, labels, new_scale, new_bias)
        if math.isfinite(new_loss) and new_loss <= loss - ARMIJO * length * decrement:
            return (new_scale, new_bias, new_loss, new_sums), trial
        length /= 2
    return None, MAX_HALVINGS
