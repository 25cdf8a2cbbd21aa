"""Vector scaling's fit: Newton steps, one pass over the logits each.

The mean NLL of softmax(a ⊙ z + b) is convex in (a, b). Its gradient and Hessian are sums over
the samples, so one pass over the logits, chunk by cache-sized chunk, gives the loss, the gradient
and the curvature together. Two kinds of step:

* **Full Newton** (up to :data:`FULL_NEWTON_MAX_CLASSES` classes): the whole (2C × 2C) Hessian, whose
  cross-class part is the outer product of the rows' (p ⊙ z, p): P·N·4C² more multiply-adds a pass,
  repaid by quadratic convergence (5–6 iterations at 10 classes where the block steps took 15).
* **Block Newton** (above it): the exact per-class 2×2 Hessian blocks (∂²/∂a_c², ∂²/∂a_c∂b_c,
  ∂²/∂b_c²), ignoring the coupling between classes through the softmax normaliser. The Hessian is a
  weighted graph Laplacian (each diagonal entry is the sum of its row's off-diagonal magnitudes), so it
  is at most twice its block diagonal and the block step is at most twice too long along any direction.
  At 1,000 classes the coupling is weak and 2–3 iterations suffice (benchmarks/results/logit_fits.md).

An Armijo backtracking line search, whose trial pass is the next iteration's pass, makes either safe.
Scales stay within :data:`SCALE_BOUNDS` (a projected Newton step: a class at a bound whose gradient
points outwards keeps its scale and moves only its bias).

The objective may add :class:`TowardsTemperature`, a ridge towards the temperature-scaling solution that is
separable by class, so it adds to the Hessian's per-class blocks only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..base import chunk_rows

ARMIJO = 1e-4
#: a fit stopped by max_iter whose predicted further decrease exceeds this (nats) is reported as not converged
VISIBLE_DECREASE = 1e-6
MAX_HALVINGS = 20
#: the scales a_c are kept in [1e-4, 1e4] (just inside): the range a saved artifact allows for
#: exp(log_scale). A class whose optimum lies beyond a bound (e.g. a negative scale) is held there.
SCALE_BOUNDS = (1.01e-4, 1e4 / 1.01)
#: classes up to which the steps use the full Hessian (module docstring); above it, its 2×2 blocks
FULL_NEWTON_MAX_CLASSES = 24


def vector_scaling_pass(logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                        rows: Optional[torch.Tensor] = None,
                        coupled: bool = False) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """For each of P problems on the same (N, C) ``logits`` and (N,) ``labels``, the mean NLL of softmax(a ⊙ z + b) over
    its rows, and its per-class sums / rows: Σ p·z and Σ p (the gradient before the label terms), Σ z²q, Σ z·q and Σ q
    with q = p(1 − p).

    ``scale`` a, ``bias`` b: (P, C), any float dtype; ``rows``: (P, N) 0/1 of the rows each problem holds (None: one
    problem of every row). Returns the (P,) float64 losses and a (5, P, C) float64 tensor. A chunk's column sums are
    products at the logits' precision with the rows' 0/1 (a float64-accumulating ``sum(dim=0)`` of float32 took 14× as
    long), added up over chunks in float64; chunks shrink with P, so P problems hold about one problem's chunk memory.
    """
    problems = scale.shape[0]
    rows = torch.ones(1, logits.shape[0], dtype=logits.dtype, device=logits.device) if rows is None else rows.to(logits.dtype)
    chunk = max(1, chunk_rows(logits) // problems)
    scale, bias = scale.to(logits.dtype)[:, None, :], bias.to(logits.dtype)[:, None, :]
    sums = torch.zeros(5, problems, logits.shape[1], dtype=torch.float64, device=logits.device)
    loss = torch.zeros(problems, dtype=torch.float64, device=logits.device)
    products = torch.zeros(problems, 2 * logits.shape[1], 2 * logits.shape[1], dtype=torch.float64,
                           device=logits.device) if coupled else None
    for start in range(0, logits.shape[0], chunk):
        z, y, member = logits[start : start + chunk], labels[start : start + chunk], rows[:, None, start : start + chunk]
        shifted = torch.addcmul(bias, z, scale)  # (P, n, C)
        top = shifted.amax(dim=2, keepdim=True)
        label_terms = shifted.gather(2, y[None, :, None].expand(problems, -1, 1))
        probs = shifted.sub_(top).exp_()
        total = probs.sum(dim=2, keepdim=True)
        loss += (member.squeeze(1) * (top + total.log() - label_terms).squeeze(2)).sum(1, dtype=torch.float64)
        probs.div_(total)
        curvature = torch.addcmul(probs, probs, probs, value=-1)
        weighted = curvature * z
        spread = probs.mul(z)
        sums[0] += torch.bmm(member, spread).squeeze(1).double()  # (P, 1, n) @ (P, n, C): the column sums
        sums[1] += torch.bmm(member, probs).squeeze(1).double()
        if products is not None:
            rows_u = torch.cat([spread, probs], dim=2)  # (P, n, 2C)
            products += torch.bmm(rows_u.mul(member.transpose(1, 2)).transpose(1, 2), rows_u).double()
        sums[3] += torch.bmm(member, weighted).squeeze(1).double()
        sums[2] += torch.bmm(member, weighted.mul_(z)).squeeze(1).double()
        sums[4] += torch.bmm(member, curvature).squeeze(1).double()
    counts = rows.double().sum(dim=1)
    if products is not None:
        products /= counts[:, None, None]
    return loss / counts, sums / counts[:, None], products


@dataclasses.dataclass(frozen=True)
class TowardsTemperature:
    """The ridge ρ · Σ_c ((a_c − β)/β)² + ρ · Σ_c b_c² pulling vector scaling towards temperature scaling, per problem.

    In the temperature-scaled logits x = β z the map is (1 + v) ⊙ x + b with v = a/β − 1, and this is the ridge
    ρ (‖v‖₂² + ‖b‖₂²) of structured vector scaling (Berta et al., 2026): zero at the TS solution (a = β, b = 0),
    separable by class, with the constant 2×2 Hessian block 2ρ [[1/β², 0], [0, 1]].

    Attributes:
        strength: (P, 1) ρ ≥ 0 (0: no pull), per squared parameter.
        beta: (P, 1) β = 1/T of the temperature-scaling solution pulled towards (> 0).
    """

    strength: torch.Tensor
    beta: torch.Tensor

    def terms(self, scale: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """((P,) penalty, (2, P, C) gradient in (a, b), (3, P, C) Hessian blocks (aa, ab, bb)) at (P, C) scale, bias."""
        offset = scale / self.beta - 1
        value = self.strength.squeeze(1) * (offset.square().sum(1) + bias.square().sum(1))
        gradient = 2 * self.strength * torch.stack([offset / self.beta, bias])
        ones = torch.ones_like(scale)
        blocks = 2 * self.strength * torch.stack([ones / self.beta**2, torch.zeros_like(scale), ones])
        return value, gradient, blocks


#: (scale, bias, objective, gradient, Hessian blocks, coupling) of P problems at one point: (P, C), (P, C), (P,),
#: (2, P, C), (3, P, C) and the Hessian's cross-class part (P, 2C, 2C) for full Newton steps, else (P, 0, 0)
State = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def fit_vector_scaling(
    logits: torch.Tensor, labels: torch.Tensor, beta: torch.Tensor, max_iter: int, strength: torch.Tensor,
    start: Tuple[torch.Tensor, torch.Tensor], rows: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """(scale a, bias b, summary) of P problems on (N, C) ``logits`` and (N,) ``labels``, each minimising the mean NLL
    of softmax(a ⊙ z + b) over its rows plus the :class:`TowardsTemperature` penalty of its ``strength`` (P,) towards
    its ``beta`` (P,), from ``start`` ((P, C) scale, (P, C) bias); ``rows`` (P, N) 0/1 (None: one problem of every
    row). The problems share each pass over the logits (:func:`vector_scaling_pass`), each with its own Newton steps
    and line search.

    A problem stops when half its Newton decrement (the predicted decrease) is below the logits' precision times its
    objective, when its line search cannot decrease it, or after ``max_iter`` iterations (without the penalty, on
    separable data or data lacking some class, the optimum lies at infinity). The summary: ``loss`` (P,) (NLL +
    penalty), ``iterations`` (the most any problem took), ``passes``, and per problem ``converged`` (False only when
    ``max_iter`` stopped it while its last predicted decrease, half the Newton decrement, was above
    :data:`VISIBLE_DECREASE` nats) and ``classes_at_bound`` (scales ending at a bound of :data:`SCALE_BOUNDS`).
    """
    problems, classes = len(beta), logits.shape[1]
    rows = torch.ones(1, len(labels), dtype=logits.dtype, device=logits.device) if rows is None else rows.to(logits.dtype)
    member = rows.double()
    counts = member.sum(dim=1, keepdim=True)
    count = torch.zeros(problems, classes, dtype=torch.float64, device=logits.device).index_add_(1, labels, member) / counts
    true_logits = logits.gather(1, labels[:, None]).squeeze(1).double()
    true_sum = torch.zeros_like(count).index_add_(1, labels, member * true_logits) / counts
    penalty = TowardsTemperature(strength.double().reshape(-1, 1), beta.double().reshape(-1, 1))
    full = classes <= FULL_NEWTON_MAX_CLASSES
    uncoupled = torch.zeros(problems, 0, 0, dtype=torch.float64, device=logits.device)

    def evaluate(scale: torch.Tensor, bias: torch.Tensor) -> State:
        nll, sums, products = vector_scaling_pass(logits, labels, scale, bias, rows, coupled=full)
        value, gradient, blocks = penalty.terms(scale, bias)
        return (scale, bias, nll + value, torch.stack([sums[0] - true_sum, sums[1] - count]) + gradient, sums[2:] + blocks,
                uncoupled if products is None else products)

    state = evaluate(start[0].double().clamp(*SCALE_BOUNDS), start[1].double())
    threshold = (torch.finfo(logits.dtype).eps * state[2].abs()).clamp_min(1e-10)
    active = torch.ones(problems, dtype=torch.bool, device=logits.device)
    decrement = torch.full((problems,), math.inf, dtype=torch.float64, device=logits.device)
    passes, iterations = 1, torch.zeros(problems, dtype=torch.long, device=logits.device)
    while bool(active.any()):
        step_scale, step_bias = _newton_direction(state)
        decrement = torch.where(active, -(step_scale * state[3][0] + step_bias * state[3][1]).sum(1), decrement)
        active &= decrement / 2 > threshold  # the predicted decrease is below the logits' precision
        if not bool(active.any()):
            break
        state, accepted, trials = _line_search(evaluate, state, step_scale, step_bias, decrement, active)
        passes += trials
        iterations += accepted.long()
        active &= accepted & (iterations < max_iter)  # a failed line search: no achievable decrease
    converged = (decrement / 2 <= VISIBLE_DECREASE) | (iterations < max_iter)
    at_bound = ((state[0] <= SCALE_BOUNDS[0] * 1.0001) | (state[0] >= SCALE_BOUNDS[1] / 1.0001)).sum(1)
    summary = {"loss": state[2].tolist(), "iterations": int(iterations.max()), "passes": passes,
               "converged": converged.tolist(), "classes_at_bound": at_bound.tolist()}
    return state[0], state[1], summary


def _newton_direction(state: State) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each problem's (P, C) steps in scale and bias: the full Newton step where ``state`` holds the coupling and that
    step is a descent direction inside the scale bounds (:func:`_full_direction`), else the block step
    (:func:`_block_direction`)."""
    step_scale, step_bias = _block_direction(state[3], state[4], state[0])
    if state[5].numel() == 0:
        return step_scale, step_bias
    full_scale, full_bias = _full_direction(state)
    gradient = state[3]
    descends = torch.isfinite(full_scale).all(1) & torch.isfinite(full_bias).all(1) & (
        (full_scale * gradient[0] + full_bias * gradient[1]).sum(1) < 0)
    return (torch.where(descends[:, None], full_scale, step_scale), torch.where(descends[:, None], full_bias, step_bias))


def _full_direction(state: State) -> Tuple[torch.Tensor, torch.Tensor]:
    """−H⁻¹ g with the whole (2C × 2C) Hessian of each problem (:func:`full_hessian`); NaN for a problem where the
    system does not solve, or where a class is held at a scale bound or the step would cross one: near the bounds the
    block steps, which stop each class at its bound on its own, go on."""
    scale, gradient = state[0], state[3]
    classes = scale.shape[1]
    hessian = full_hessian(state[4], state[5])
    trace = hessian.diagonal(dim1=1, dim2=2).sum(1).abs().clamp_min(1e-300)
    hessian = hessian + torch.diag_embed((1e-12 * trace / (2 * classes))[:, None].expand(-1, 2 * classes))
    grad = torch.cat([gradient[0], gradient[1]], dim=1)
    step = -torch.linalg.solve_ex(hessian, grad.unsqueeze(2))[0].squeeze(2)
    step_scale, step_bias = step[:, :classes], step[:, classes:]
    low, high = SCALE_BOUNDS
    inside = ((scale + step_scale > low) & (scale + step_scale < high)).all(1) & ~_held(scale, gradient[0]).any(1)
    return step_scale.masked_fill(~inside[:, None], math.nan), step_bias


def full_hessian(blocks: torch.Tensor, coupling: torch.Tensor) -> torch.Tensor:
    """The (P, 2C, 2C) Hessian in (a_1 … a_C, b_1 … b_C) of P problems from their (3, P, C) per-class blocks (aa, ab,
    bb) and the (P, 2C, 2C) Σ uᵀu / rows of :func:`vector_scaling_pass`: −uᵀu off the blocks' entries, the blocks on
    them (each Hessian entry of the softmax NLL is δ_cd E[p_c …] − E[p_c p_d …])."""
    classes = blocks.shape[2]
    hessian = -coupling.clone()
    diagonal = torch.arange(classes, device=blocks.device)
    hessian[:, diagonal, diagonal] = blocks[0]
    hessian[:, diagonal, diagonal + classes] = blocks[1]
    hessian[:, diagonal + classes, diagonal] = blocks[1]
    hessian[:, diagonal + classes, diagonal + classes] = blocks[2]
    return hessian


def _held(scale: torch.Tensor, grad_scale: torch.Tensor) -> torch.Tensor:
    """(P, C) True where a class's scale is at a bound of :data:`SCALE_BOUNDS` and its gradient points outwards."""
    low, high = SCALE_BOUNDS
    return ((scale <= low) & (grad_scale > 0)) | ((scale >= high) & (grad_scale < 0))


def _block_direction(gradient: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """−H_c⁻¹ g_c for each class's 2×2 block (of each problem: (2, P, C) gradient, (3, P, C) blocks, (P, C) scale),
    shortened per class to stop at a scale bound; a class held at a bound (its gradient pointing outwards) takes the
    1-D Newton step in its bias only."""
    grad_scale, grad_bias = gradient[0], gradient[1]
    h_aa, h_ab, h_bb = blocks[0], blocks[1], blocks[2]
    ridge = 1e-12 * (h_aa + h_bb).clamp_min(1e-300)
    determinant = (h_aa + ridge) * (h_bb + ridge) - h_ab.square()
    step_scale = -((h_bb + ridge) * grad_scale - h_ab * grad_bias) / determinant
    step_bias = -((h_aa + ridge) * grad_bias - h_ab * grad_scale) / determinant
    low, high = SCALE_BOUNDS
    held = _held(scale, grad_scale)
    step_scale = torch.where(held, torch.zeros_like(step_scale), step_scale)
    step_bias = torch.where(held, -grad_bias / (h_bb + ridge), step_bias)
    step_scale, step_bias = (torch.nan_to_num(step, nan=0.0, posinf=0.0, neginf=0.0) for step in (step_scale, step_bias))
    room = torch.where(step_scale < 0, scale - low, high - scale).clamp_min(0)
    shrink = torch.where(step_scale.abs() > room, room / step_scale.abs().clamp_min(1e-300), torch.ones_like(step_scale))
    return step_scale * shrink, step_bias * shrink  # a positive factor per block keeps a descent direction


def _line_search(
    evaluate: Callable[[torch.Tensor, torch.Tensor], State], state: State, step_scale: torch.Tensor, step_bias: torch.Tensor,
    decrement: torch.Tensor, active: torch.Tensor,
) -> Tuple[State, torch.Tensor, int]:
    """Armijo backtracking from the full step, for each ``active`` problem on its own: (the state with each problem's
    accepted point, (P,) which were accepted, passes made). A problem that is not active keeps its point."""
    length = torch.ones_like(decrement)
    pending, accepted = active.clone(), torch.zeros_like(active)
    for trial in range(1, MAX_HALVINGS + 1):
        moved = torch.where(pending, length, torch.zeros_like(length))[:, None]
        new_scale = (state[0] + moved * step_scale).clamp(*SCALE_BOUNDS)  # only rounding can leave the bounds
        new_state = evaluate(new_scale, state[1] + moved * step_bias)
        better = pending & torch.isfinite(new_state[2]) & (new_state[2] <= state[2] - ARMIJO * length * decrement)
        accepted |= better
        pending &= ~better
        if not bool(pending.any()):  # the usual case: every problem not pending was evaluated where it stands
            return new_state, accepted, trial
        state = _merged(state, new_state, better)
        length = torch.where(pending, length / 2, length)
    return state, accepted, MAX_HALVINGS


def _merged(state: State, new_state: State, take: torch.Tensor) -> State:
    """``state`` with the problems of (P,) ``take`` from ``new_state``."""
    scale, bias, value, gradient, blocks, coupling = (torch.where(take.view(shape), new, old) for new, old, shape in zip(
        new_state, state, ((-1, 1), (-1, 1), (-1,), (1, -1, 1), (1, -1, 1), (-1, 1, 1))))
    return scale, bias, value, gradient, blocks, coupling
