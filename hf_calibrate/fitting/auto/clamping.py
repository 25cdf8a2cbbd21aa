"""Neural Clamping as a candidate of ``method="auto"``, when its estimated time fits the ``budget`` option.

Neural Clamping is not a logit method: each of its L-BFGS iterations is a forward and backward pass of the base
model, so it cannot be refitted on auto's folds at the logit methods' cost. It is scored instead by its own fit, as a
fit of it by name would run: that fit cross-fits δ on two folds and chooses its stopping iteration against
temperature scaling fitted on the same folds, and hands auto, per held-out row, its NLL minus that temperature
scaling's (:attr:`~hf_calibrate.fitting.runtime.engine.Engine.held_out_sink`). Added to the rows of auto's own temperature
scaling, these put Neural Clamping on auto's scale: its paired difference to temperature scaling is its own fit's.

That difference is slightly optimistic, since the stopping iteration was chosen on the same held-out rows (as a
linear map's l2 is in auto); auto's rule, which asks for a whole 95 % interval below 0, is there to absorb it. A fit
that held out only part of the rows (fewer than 50 or more than 10,000 of them) counts the other rows as no
difference, which can only weaken the evidence for it.

The time estimate is the base model's pass over the calibration data, timed in auto's own pass, times
:data:`PASSES_PER_FIT`. It is an estimate, not a bound: measured fits took 0.12–1.13× of it on the digits models (two runs of 5 seeds,
``benchmarks/results/auto_budget.md``) and about 1.0× on the BBC MiniLM, while on a model whose pass takes
milliseconds fixed costs can make a fit several times its estimate: a budget is a soft limit (docs/design.md §3.5).
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Tuple

import torch

from ...backbones import Backbone
from ...calibrators.neural_clamping import LBFGS_DEFAULTS, NeuralClamping
from ...data import CalibrationData
from ...results.reporting import seconds_text
from .scoring import Scored, candidate_warnings, default_options
from ..runtime.engine import Engine
from ..families import fit_calibrator

#: the method name: auto scores δ through Neural Clamping's own fit only
CLAMPING = NeuralClamping.method
#: passes of the base model over all the calibration data that a default fit takes when it runs all its iterations, counting a forward and
#: backward pass as two: its own pass for the base logits and the start of both folds' runs (3), then per L-BFGS
#: round the two folds' objective (a forward and backward pass over half the rows each: 2) and their held-out
#: scoring (1), with one spare evaluation for a line search
PASSES_PER_FIT = 3 + 4 * LBFGS_DEFAULTS["max_iterations"]


def estimated_seconds(pass_seconds: float) -> float:
    """Seconds a default Neural Clamping fit is estimated to take, from one pass of the base model (seconds)."""
    return pass_seconds * PASSES_PER_FIT


def budget_reason(budget: Optional[float], estimate: float, left: float) -> Optional[str]:
    """Why Neural Clamping is left out under ``budget`` (seconds, None: no budget) with ``left`` of it after the other
    candidates, its fit estimated at ``estimate`` seconds; None when it fits."""
    if budget is None:
        return (f"not a candidate without a budget: its fit would take about {seconds_text(estimate)} here "
                f"(auto's logit candidates take seconds); pass budget=<seconds> (e.g. budget={max(60, 2 * estimate):.0f}) to let it take part")
    if estimate > left:
        return (f"its fit would take about {seconds_text(estimate)}, more than the {seconds_text(max(left, 0.0))} left of "
                f"budget={budget:g} after the other candidates; raise budget to at least {math.ceil(estimate + budget - left)} to let it take part")
    return None


def score_clamping(backbone: Backbone, data: CalibrationData, reference: torch.Tensor, engine: Engine) -> Scored:
    """Neural Clamping with its defaults fitted on all of ``data``, its (N,) held-out NLL put on auto's scale through
    ``reference`` (auto's cross-fitted temperature scaling, (N,) nats). A fit that refuses the data (e.g. a stream
    that can be read only once) leaves it out with the reason; one that fell back to temperature scaling shares
    ``reference``. Its fit's warnings are said as they happen, named (:func:`.scoring.candidate_warnings`)."""
    start = time.perf_counter()
    options = default_options(CLAMPING, engine)
    sink: List[Tuple[torch.Tensor, torch.Tensor]] = []
    engine.held_out_sink = sink
    try:
        with candidate_warnings(CLAMPING, engine):
            calibrator, summary = fit_calibrator(backbone, data, NeuralClamping, options, engine)
    except ValueError as error:
        return Scored(CLAMPING, None, str(error), time.perf_counter() - start)
    finally:
        engine.held_out_sink = None
    fitted = (calibrator, summary, options, [])
    seconds = time.perf_counter() - start
    if summary.get("fell_back_to_temperature_scaling", False) or not sink:
        return Scored(CLAMPING, reference, None, seconds, fitted)
    rows, differences = sink[0]
    scores = reference.clone()
    scores[rows] += differences.to(scores)
    return Scored(CLAMPING, scores, None, seconds, fitted, scoring=scoring_text(summary["folds"], len(rows), len(reference)))


def scoring_text(folds: int, held: int, samples: int) -> str:
    """How Neural Clamping's row was scored: by its own fit's ``folds``-fold cross-fitting, ``held`` of the ``samples``
    calibration rows held out (the others count as no difference to temperature scaling)."""
    share = "" if held == samples else f" on {held:,} of the {samples:,} rows (the others count as no difference)"
    return (f"scored by its own fit's {folds}-fold cross-fitting{share}, its stopping iteration chosen on the same "
            "held-out rows (slightly optimistic)")

