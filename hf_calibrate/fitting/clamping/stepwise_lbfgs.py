"""L-BFGS one iteration at a time, for objectives whose every evaluation is a pass over the data.

Neural Clamping's objective costs a forward and an input-gradient pass of the base model over
the calibration data per evaluation, so the optimiser here is built to spend as few as it can
and to hand control back after every iteration (the caller scores a held-out part between
iterations and stops early):

* the search direction is the classic two-loop recursion over the last ``history`` curvature
  pairs (Nocedal & Wright, *Numerical Optimization*, Alg. 7.4), scaled by γ = sᵀy / yᵀy;
* the step is found by backtracking on the Armijo condition f(θ + t·d) ≤ f(θ) + c·t·∇fᵀd
  (c = 10⁻⁴), trying t = 1 first — on a quasi-Newton direction it is usually accepted, so an
  iteration costs one evaluation (torch's strong-Wolfe search re-evaluates the accepted point
  when called step by step: two);
* the first direction is −∇f scaled to unit 1-norm when that is shorter (torch's rule: a cautious
  first step whose curvature pair then sets the scale of the next);
* a pair is kept only when sᵀy > 0 (the curvature condition), so the implied Hessian stays
  positive definite.

Everything is on one flat float64 parameter vector; the caller maps it to its tensors.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Optional, Tuple

import torch

#: Armijo's sufficient-decrease constant
ARMIJO = 1e-4
#: step shrink factor per backtracking trial, and trials before an iteration gives up
SHRINK, MAX_TRIALS = 0.25, 8

Evaluation = Tuple[float, torch.Tensor]  # (objective value, gradient: flat, like θ)


@dataclasses.dataclass
class LbfgsState:
    """Where the optimiser stands: θ, f(θ), ∇f(θ) and the curvature pairs."""

    theta: torch.Tensor
    value: float
    gradient: torch.Tensor
    history: int = 10
    steps: List[torch.Tensor] = dataclasses.field(default_factory=list)  # s_k = θ_{k+1} − θ_k
    changes: List[torch.Tensor] = dataclasses.field(default_factory=list)  # y_k = ∇f_{k+1} − ∇f_k
    converged: bool = False


def start(theta: torch.Tensor, evaluate: Callable[[torch.Tensor], Evaluation], history: int = 10) -> LbfgsState:
    """The state at ``theta`` (one evaluation); a non-finite objective or gradient there is a FloatingPointError."""
    value, gradient = evaluate(theta)
    if not (math.isfinite(value) and bool(torch.isfinite(gradient).all())):
        raise FloatingPointError(f"the objective is {value} at the starting point (or its gradient is not finite): the model's "
                                 "outputs overflow there. Fit in float32 (mixed_precision='no'), or check temperature_init.")
    return LbfgsState(theta.detach().clone(), value, gradient, history)


def direction(state: LbfgsState) -> torch.Tensor:
    """−H·∇f by the two-loop recursion (−∇f · min(1, 1/‖∇f‖₁) before any curvature pair)."""
    gradient = state.gradient
    if not state.steps:
        return -gradient * min(1.0, 1.0 / max(float(gradient.abs().sum()), 1e-12))
    q = gradient.clone()
    alphas = []
    for s, y in zip(reversed(state.steps), reversed(state.changes)):
        alpha = float(s @ q) / float(y @ s)
        q -= alpha * y
        alphas.append(alpha)
    s, y = state.steps[-1], state.changes[-1]
    r = q * (float(s @ y) / float(y @ y))
    for (s, y), alpha in zip(zip(state.steps, state.changes), reversed(alphas)):
        beta = float(y @ r) / float(y @ s)
        r += (alpha - beta) * s
    return -r


def iterate(state: LbfgsState, evaluate: Callable[[torch.Tensor], Evaluation]) -> bool:
    """One iteration in place: direction, Armijo backtracking from t = 1, curvature update.

    Returns False (and sets ``converged``) when no step along the direction lowers f enough:
    the gradient is zero to rounding, or the direction is not one of descent.
    """
    if state.converged:
        return False
    d = direction(state)
    slope = float(state.gradient @ d)
    trial = _backtrack(state, d, slope, evaluate) if slope < 0 else None
    if trial is None:
        state.converged = True
        return False
    theta, value, gradient = trial
    s, y = theta - state.theta, gradient - state.gradient
    if float(s @ y) > 1e-12 * float(y @ y):
        state.steps.append(s)
        state.changes.append(y)
        del state.steps[:-state.history], state.changes[:-state.history]
    state.theta, state.value, state.gradient = theta, value, gradient
    return True


def _backtrack(state: LbfgsState, d: torch.Tensor, slope: float,
               evaluate: Callable[[torch.Tensor], Evaluation]) -> Optional[Tuple[torch.Tensor, float, torch.Tensor]]:
    """The first t in 1, ¼, ¹⁄₁₆, … whose point passes Armijo's test: (θ + t·d, f, ∇f), or None."""
    t = 1.0
    for _ in range(MAX_TRIALS):
        theta = state.theta + t * d
        value, gradient = evaluate(theta)
        if math.isfinite(value) and bool(torch.isfinite(gradient).all()) and value <= state.value + ARMIJO * t * slope:
            return theta, value, gradient
        t *= SHRINK
    return None
