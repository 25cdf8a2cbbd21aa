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

The objective may add :class:`TowardsTemperature`, a ridge towards the temperature-scaling solution that is
separable by class, so its Hessian blocks are exact and the steps unchanged in kind.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .base import chunk_rows

ARMIJO = 1e-4
#: a fit stopped by max_iter whose predicted further decrease exceeds this (nats) is reported as not converged
VISIBLE_DECREASE = 1e-6
MAX_HALVINGS = 20
#: the scales a_c are kept in [1e-4, 1e4] (just inside): the range a saved artifact allows for
#: exp(log_scale). A class whose optimum lies beyond a bound (e.g. a negative scale) is held there.
SCALE_BOUNDS = (1.01e-4, 1e4 / 1.01)


def vector_scaling_pass(logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> Tuple[float, torch.Tensor]:
    """Mean NLL of softmax(scale ⊙ logits + bias) and a (5, C) float64 tensor of per-class sums / N:
    Σ p·z and Σ p (the gradient before the label terms), Σ z²q, Σ z·q and Σ q with q = p(1 − p).

    ``logits`` (N, C) float32 or float64; ``scale``, ``bias`` (C,) of any float dtype. A chunk's column sums are
    matrix-vector products at the logits' precision (a float64-accumulating ``sum(dim=0)`` of float32 took 14× as
    long), added up over chunks in float64.
    """
    rows = chunk_rows(logits)
    scale, bias = scale.to(logits.dtype), bias.to(logits.dtype)
    sums = torch.zeros(5, logits.shape[1], dtype=torch.float64, device=logits.device)
    loss = torch.zeros((), dtype=torch.float64, device=logits.device)
    ones = torch.ones(rows, dtype=logits.dtype, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        z, y = logits[start : start + rows], labels[start : start + rows]
        shifted = torch.addcmul(bias, z, scale)
        top = shifted.amax(dim=1, keepdim=True)
        label_terms = shifted.gather(1, y[:, None])
        probs = shifted.sub_(top).exp_()
        total = probs.sum(dim=1, keepdim=True)
        loss += (top + total.log() - label_terms).sum(dtype=torch.float64)
        probs.div_(total)
        curvature = torch.addcmul(probs, probs, probs, value=-1)
        weighted = curvature * z
        row = ones[: len(z)]  # (rows,) @ (rows, C): the column sums
        sums[0] += (row @ probs.mul(z)).double()
        sums[1] += (row @ probs).double()
        sums[3] += (row @ weighted).double()
        sums[2] += (row @ weighted.mul_(z)).double()
        sums[4] += (row @ curvature).double()
    return float(loss) / logits.shape[0], sums / logits.shape[0]


@dataclasses.dataclass(frozen=True)
class TowardsTemperature:
    """The ridge ρ · Σ_c ((a_c − β)/β)² + ρ · Σ_c b_c² pulling vector scaling towards temperature scaling.

    In the temperature-scaled logits x = β z the map is (1 + v) ⊙ x + b with v = a/β − 1, and this is the ridge
    ρ (‖v‖₂² + ‖b‖₂²) of structured vector scaling (Berta et al., 2026): zero at the TS solution (a = β, b = 0),
    separable by class, with the constant 2×2 Hessian block 2ρ [[1/β², 0], [0, 1]].

    Attributes:
        strength: ρ ≥ 0 (0: no pull), per squared parameter.
        beta: β = 1/T of the temperature-scaling solution pulled towards (> 0).
    """

    strength: float
    beta: float

    def terms(self, scale: torch.Tensor, bias: torch.Tensor) -> Tuple[float, torch.Tensor, torch.Tensor]:
        """(penalty, (2, C) gradient in (a, b), (3, C) Hessian blocks (aa, ab, bb))."""
        offset = scale / self.beta - 1
        value = self.strength * float(offset.square().sum() + bias.square().sum())
        gradient = 2 * self.strength * torch.stack([offset / self.beta, bias])
        ones = torch.ones_like(scale)
        blocks = 2 * self.strength * torch.stack([ones / self.beta**2, torch.zeros_like(scale), ones])
        return value, gradient, blocks


#: (scale, bias, objective, (2, C) gradient, (3, C) Hessian blocks) at one point
State = Tuple[torch.Tensor, torch.Tensor, float, torch.Tensor, torch.Tensor]


def fit_vector_scaling(
    logits: torch.Tensor, labels: torch.Tensor, beta: float, max_iter: int, strength: float = 0.0,
    start: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """(scale a, bias b, summary) minimising the mean NLL of softmax(a ⊙ z + b) plus the
    :class:`TowardsTemperature` penalty of ``strength`` towards β; from ``start`` (scale, bias), by default
    a = β, b = 0 (the TS solution).

    Stops when half the Newton decrement (the predicted decrease) is below the logits'
    precision times the objective, when the line search cannot decrease it, or after ``max_iter``
    iterations (without the penalty, on separable data or data lacking some class, the optimum lies
    at infinity). The summary: ``loss`` (NLL + penalty), ``iterations``, ``passes``, ``converged``
    (False only when ``max_iter`` stopped the fit while its last predicted decrease, half the Newton
    decrement, was above :data:`VISIBLE_DECREASE` nats) and ``classes_at_bound`` (scales ending at a
    bound of :data:`SCALE_BOUNDS`).
    """
    classes = logits.shape[1]
    count = torch.bincount(labels, minlength=classes).double() / len(labels)
    true_sum = torch.zeros(classes, dtype=torch.float64, device=logits.device)
    true_sum.index_add_(0, labels, logits.gather(1, labels[:, None]).squeeze(1).double())
    true_sum /= len(labels)
    penalty = TowardsTemperature(float(strength), float(beta))

    def evaluate(scale: torch.Tensor, bias: torch.Tensor) -> State:
        nll, sums = vector_scaling_pass(logits, labels, scale, bias)
        value, gradient, blocks = penalty.terms(scale, bias)
        return scale, bias, nll + value, torch.stack([sums[0] - true_sum, sums[1] - count]) + gradient, sums[2:] + blocks

    if start is None:
        start = (torch.full((classes,), beta, dtype=torch.float64, device=logits.device), torch.zeros(classes, dtype=torch.float64, device=logits.device))
    state = evaluate(start[0].double().clamp(*SCALE_BOUNDS), start[1].double())
    passes, iteration, stopped, decrement = 1, 0, False, math.inf
    threshold = max(1e-10, torch.finfo(logits.dtype).eps * abs(state[2]))
    while iteration < max_iter and not stopped:
        step_scale, step_bias = _newton_direction(state[3], state[4], state[0])
        decrement = -float((step_scale * state[3][0] + step_bias * state[3][1]).sum())
        accepted, trials = (None, 0) if decrement / 2 <= threshold else _line_search(evaluate, state, step_scale, step_bias, decrement)
        passes += trials
        stopped = accepted is None  # the predicted or achievable decrease is below the logits' precision
        if accepted is not None:
            state, iteration = accepted, iteration + 1
    converged = stopped or decrement / 2 <= VISIBLE_DECREASE
    at_bound = int(((state[0] <= SCALE_BOUNDS[0] * 1.0001) | (state[0] >= SCALE_BOUNDS[1] / 1.0001)).sum())
    summary = {"loss": state[2], "iterations": iteration, "passes": passes, "converged": bool(converged), "classes_at_bound": at_bound}
    return state[0], state[1], summary


def _newton_direction(gradient: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """−H_c⁻¹ g_c for each class's 2×2 block, shortened per class to stop at a scale bound; a class held at
    a bound (its gradient pointing outwards) takes the 1-D Newton step in its bias only."""
    grad_scale, grad_bias = gradient[0], gradient[1]
    h_aa, h_ab, h_bb = blocks[0], blocks[1], blocks[2]
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


def _line_search(
    evaluate: Callable[[torch.Tensor, torch.Tensor], State], state: State, step_scale: torch.Tensor, step_bias: torch.Tensor,
    decrement: float,
) -> Tuple[Optional[State], int]:
    """Armijo backtracking from the full step: (the accepted state or None on failure, passes made)."""
    length = 1.0
    for trial in range(1, MAX_HALVINGS + 1):
        new_scale = (state[0] + length * step_scale).clamp(*SCALE_BOUNDS)  # only rounding can leave the bounds
        new_state = evaluate(new_scale, state[1] + length * step_bias)
        if math.isfinite(new_state[2]) and new_state[2] <= state[2] - ARMIJO * length * decrement:
            return new_state, trial
        length /= 2
    return None, MAX_HALVINGS
