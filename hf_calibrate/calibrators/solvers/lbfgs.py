"""Strong-Wolfe L-BFGS for the full-matrix logit maps, with the manners of a long fit.

Matrix scaling and Dirichlet calibration have C² + C parameters; at C = 1,000 one evaluation
of the objective and its gradient over 50,000 logits is two (N × C) · (C × C) products, seconds
on a CPU, and a fit takes hundreds of them. So the driver here
* times one evaluation first (when it is large: :data:`TIME_FROM_WORK`) and warns with an
  upper bound of the whole fit when it exceeds :data:`WARN_AFTER_SECONDS` (:func:`warn_if_long`);
* counts evaluations on a progress bar (:func:`..fit_context.fit_context`);
* keeps the best parameters evaluated so far and, when the context allows it, returns them
  on Ctrl-C instead of losing the fit (:func:`minimise`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Dict, List

import torch

from ..._warnings import warn_user
from ..fit_context import fit_context

#: stop when an iteration lowers the mean NLL by less than this (scipy's L-BFGS-B default
#: ftol, 2.2e-9 relative, is of this size at the NLLs of calibration problems)
TOLERANCE_CHANGE = 1e-9
WARN_AFTER_SECONDS = 60.0
#: below this many multiply-adds per evaluation (N·C² for a C×C map) a fit is not timed: it
#: takes well under WARN_AFTER_SECONDS, and timing a millisecond is mostly noise
TIME_FROM_WORK = 1e9
HISTORY_SIZE = 20
#: objective evaluations a fit of a C×C map at its default ridge typically takes: 10–34 measured from 450 × 10 to
#: 50,000 × 1,000 on the isotropic variables (:func:`.linear_maps.isotropic_scale`; 14–60 before them); the estimate said
#: before a long fit
TYPICAL_EVALUATIONS = 35
#: a fit whose objective still falls by more than this (nats) is reported as not converged
VISIBLE_DECREASE = 1e-6


def max_evaluations(max_iter: int) -> int:
    """Objective evaluations L-BFGS may spend on ``max_iter`` iterations (torch's default)."""
    return max_iter * 5 // 4


def time_one_evaluation(objective: Callable[[], torch.Tensor], parameters: List[torch.Tensor]) -> float:
    """Seconds of one objective + gradient evaluation at ``parameters``' current values.

    The faster of two timings: the first also pays for one-off set-up (allocations, kernels).
    """
    timings = []
    for _ in range(2):
        started = time.perf_counter()
        objective().backward()
        float(parameters[0].grad.flatten()[0])  # waits for an accelerator to finish
        timings.append(time.perf_counter() - started)
        for tensor in parameters:
            tensor.grad = None
    return min(timings)


@dataclasses.dataclass(frozen=True)
class CostBound:
    """A fit's time: about ``fits`` × :data:`TYPICAL_EVALUATIONS` evaluations, at most ``fits`` L-BFGS runs of
    ``max_iter`` iterations."""

    seconds_per_evaluation: float
    fits: int
    max_iter: int

    @property
    def seconds(self) -> float:
        return self.seconds_per_evaluation * self.fits * max_evaluations(self.max_iter)

    @property
    def typical_seconds(self) -> float:
        return self.seconds_per_evaluation * self.fits * min(TYPICAL_EVALUATIONS, max_evaluations(self.max_iter))

    def describe(self) -> str:
        return (f"one evaluation of the objective takes {self.seconds_per_evaluation:.2f} s here; the fit runs up to "
                f"{self.fits} L-BFGS fit(s) of at most {max_evaluations(self.max_iter)} evaluations each: up to "
                f"{duration(self.seconds)}, typically about {duration(self.typical_seconds)} ({TYPICAL_EVALUATIONS} "
                "evaluations a fit)")


def warn_if_long(what: str, bound: CostBound, advice: str) -> None:
    """Warn, before it starts, that a fit may take longer than :data:`WARN_AFTER_SECONDS`."""
    if bound.seconds <= WARN_AFTER_SECONDS:
        return
    warn_user(f"{what}: {bound.describe()}. {advice} Ctrl-C keeps the best state so far (in a single process).")


def duration(seconds: float) -> str:
    """Seconds in words: '42 s', '7 min', '2.5 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{math.ceil(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def minimise(parameters: List[torch.Tensor], objective: Callable[[], torch.Tensor], max_iter: int, description: str) -> Dict[str, Any]:
    """Minimise ``objective`` over ``parameters`` (leaf tensors, updated in place) with L-BFGS.

    The parameters end at the best point evaluated. Returns ``loss`` (there), ``iterations``,
    ``evaluations``, ``converged`` (False only when its budget — ``max_iter`` iterations or their evaluations —
    stopped the fit while its best
    objective still fell by more than :data:`VISIBLE_DECREASE` nats over the last
    :data:`HISTORY_SIZE` evaluations) and ``interrupted`` (True when Ctrl-C stopped the fit early;
    only where :func:`..fit_context.fit_context` allows it, else the KeyboardInterrupt propagates).
    """
    optimizer = torch.optim.LBFGS(
        parameters, lr=1.0, max_iter=max_iter, max_eval=max_evaluations(max_iter), tolerance_grad=1e-9,
        tolerance_change=TOLERANCE_CHANGE, history_size=HISTORY_SIZE, line_search_fn="strong_wolfe",
    )
    best: Dict[str, Any] = {"loss": math.inf, "state": [tensor.detach().clone() for tensor in parameters], "evaluations": 0,
                            "trail": []}
    context = fit_context()
    with context.progress(max_evaluations(max_iter), description) as bar:

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = objective()
            loss.backward()
            value = float(loss.detach())
            best["evaluations"] += 1
            if value < best["loss"]:
                best.update(loss=value, state=[tensor.detach().clone() for tensor in parameters])
            best["trail"] = (best["trail"] + [best["loss"]])[-HISTORY_SIZE - 1:]
            bar.update(1)
            return loss

        interrupted = _step(optimizer, closure, context.interruptible)
    with torch.no_grad():
        for tensor, value in zip(parameters, best["state"]):  # the start if nothing was evaluated
            tensor.copy_(value)
    iterations = int(optimizer.state[parameters[0]].get("n_iter", 0))
    still_falling = best["trail"][0] - best["trail"][-1] > VISIBLE_DECREASE if best["trail"] else False
    budget_spent = iterations >= max_iter or best["evaluations"] >= max_evaluations(max_iter)
    return {"loss": best["loss"], "iterations": iterations, "evaluations": best["evaluations"],
            "converged": not (still_falling and budget_spent), "interrupted": interrupted}


def _step(optimizer: torch.optim.LBFGS, closure: Callable[[], torch.Tensor], interruptible: bool) -> bool:
    """Run the optimiser; True when Ctrl-C stopped it and ``interruptible`` allowed that."""
    try:
        optimizer.step(closure)
    except KeyboardInterrupt:
        if not interruptible:
            raise
        return True
    return False
