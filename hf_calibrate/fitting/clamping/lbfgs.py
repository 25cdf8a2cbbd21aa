"""Neural Clamping by L-BFGS with a ridge and cross-fitted early stopping: ``optimizer="lbfgs"``, the default.

Why: the authors' recipe is 100 SGD steps from T = 1; each step is a forward and a backward pass
of the base model over the calibration data, and its small steps regularise by stopping early —
a gradient flow of duration τ = 100 × lr / (1 − momentum) = 10, which for a locally quadratic loss
shrinks like a ridge of strength ≈ 1/τ. Full-batch L-BFGS on (δ, log T), started at TS (δ = 0,
T = the TS optimum of its rows), gets there in 5–12 iterations on the zoo models, but run on the bare
objective it over-fits small calibration sets (once δ separates the classes, T → 0). So the
objective here carries that ridge explicitly, (ρ/2)·(‖δ‖₂² + (log T − log T₀)²) with ρ = 0.1
(:class:`Penalty`), and the iteration count is still chosen on held-out data.

Procedure (docs/design.md §3.2):

1. one forward pass caches the base logits; the selection plan is ``folds`` folds (rows dealt at random)
   (default 2 for 50–10,000 samples), a single ``holdout_fraction`` part, ``validation_data``, or
   nothing (``holdout_fraction=0`` with one fold); folds and part keep rows of equal base logits (copies
   of one input) together (:func:`~hf_calibrate.calibrators.holdout.fold_assignment`);
2. for every (γ, λ, ρ) of the grid, one L-BFGS run per fold on the other folds, in lockstep: after
   each iteration every run scores its held-out fold, and the held-out logits of all runs are
   pooled (every calibration sample is held out once). Iteration 0 is δ = 0 with each run's own
   TS temperature, i.e. temperature scaling cross-fitted the same way, so the comparison is paired.
   The runs stop ``patience`` iterations after the pooled score's best, or at ``max_iterations``;
3. the (γ, λ, ρ, iteration) with the best pooled score wins; iteration 0 means δ did not help, and
   the fit falls back to TS on all the calibration data (the ``temperature`` method's fit);
4. with several folds the fitted (δ, log T) is the mean of the fold runs' at the chosen iteration
   (``refit="average"``: no further pass; each run saw half the data, and the mean of such
   estimates is, to first order, the estimate from all of it) or a refit on all the data for that
   many iterations (``refit="all"``); with one held-out part (or ``validation_data``) the run's own
   state at that iteration is kept.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, List, Tuple

import torch

from ... import _distributed
from ...backbones import Backbone
from ...calibrators.neural_clamping import NeuralClamping, focal_loss
from ...data import CalibrationData
from . import stepwise_lbfgs
from ..runtime.engine import Engine

#: automatic folds: this many when the calibration data hold between the two sizes, else one held-out part
AUTO_FOLDS, AUTO_FOLDS_SIZES = 2, (50, 10_000)


def resolved_folds(options: NeuralClamping.Options, count: int, has_validation: bool, world: int = 1) -> int:
    """The number of folds a fit on ``count`` samples uses (1: one held-out part, or ``validation_data``).

    Automatic folds give way to a ``holdout_fraction`` other than its default: 0 (nothing held
    out) or another share asks for one held-out part of that size. Every fold must hold a sample
    for each of the ``world`` processes.
    """
    if has_validation:
        if options.folds not in (None, 1):
            raise ValueError(f"folds={options.folds} and validation_data both choose the selection data: pass one of them.")
        return 1
    if options.folds is None:
        low, high = AUTO_FOLDS_SIZES
        default_share = options.holdout_fraction == type(options).holdout_fraction
        return AUTO_FOLDS if low <= count <= high and default_share else 1
    if options.folds > 1 and count // options.folds < world:
        raise ValueError(f"folds={options.folds} over {count} calibration samples leaves {count // options.folds} per fold, fewer than "
                         f"the {world} processes that share each fold: use fewer folds or more calibration data.")
    return options.folds


@dataclasses.dataclass
class LbfgsRun:
    """One L-BFGS run: the rows it is scored on, its optimiser state and curve (its fitting rows are its objective's)."""

    held: torch.Tensor  # indices into ``held_data`` (empty: not scored)
    held_data: CalibrationData
    delta_shape: Tuple[int, ...]
    state: stepwise_lbfgs.LbfgsState
    keep_snapshots: bool = False  # keep θ of every iteration (a cross-fit keeps the chosen one, or its mean over the runs)
    scored: List[torch.Tensor] = dataclasses.field(default_factory=list)  # calibrated held-out logits per iteration
    trace: List[Tuple[float, float]] = dataclasses.field(default_factory=list)  # (‖δ‖₂, T) per iteration
    snapshots: List[torch.Tensor] = dataclasses.field(default_factory=list)  # θ per iteration, when kept

    def record_state(self) -> None:
        """Note the current θ's ‖δ‖₂ and T (and θ itself when snapshots are kept): once per iteration."""
        theta = self.state.theta
        self.trace.append((float(theta[:-1].norm()), math.exp(float(theta[-1]))))
        if self.keep_snapshots:
            self.snapshots.append(theta.clone())


@dataclasses.dataclass(frozen=True)
class Penalty:
    """The objective's terms beside the focal loss: λ‖δ‖₂ + (ρ/2)·(‖δ‖₂² + (log T − log T₀)²)."""

    weight: float  # λ
    ridge: float  # ρ
    start_log_temperature: float  # log T₀

    def __call__(self, delta: torch.Tensor, log_t: torch.Tensor) -> torch.Tensor:
        squares = delta.square().sum() + (log_t - self.start_log_temperature).square()
        return self.weight * delta.norm() + 0.5 * self.ridge * squares


class Objective:
    """The Neural Clamping objective over some rows, as a function of the flat θ = (δ, log T) — one pass per call."""

    def __init__(self, backbone: Backbone, data: CalibrationData, indices: torch.Tensor, shape: Tuple[int, ...],
                 gamma: float, penalty: Penalty, engine: Engine, on_evaluation: Callable[[], None]) -> None:
        self.backbone, self.data, self.indices, self.shape = backbone, data, indices, shape
        self.gamma, self.penalty, self.engine, self.on_evaluation = gamma, penalty, engine, on_evaluation

    def __call__(self, theta: torch.Tensor) -> stepwise_lbfgs.Evaluation:
        """(mean focal loss of f(x + δ)/T + the :class:`Penalty`, its gradient in θ); the loss is summed over processes."""
        engine = self.engine
        delta, log_t = split_theta(theta, self.shape, engine.device)
        delta.requires_grad_(True)
        log_t.requires_grad_(True)
        loss_sum = torch.zeros((), device=engine.device)
        for _, micro_batches in engine.batches(self.data, engine.global_batches(self.indices, shuffle=False)):
            for _, inputs, labels in micro_batches:
                with engine.autocast():
                    logits = self.backbone.logits(inputs, delta)
                loss = focal_loss(logits.float() * torch.exp(-log_t), labels, self.gamma, reduction="sum") / len(self.indices)
                loss.backward()
                loss_sum += loss.detach()
            engine.sync_faults()
        engine.all_reduce_gradients([delta, log_t])
        _distributed.all_reduce_sum_(loss_sum)
        penalty = self.penalty(delta, log_t)
        penalty.backward()
        self.on_evaluation()
        gradient = torch.cat([delta.grad.flatten(), log_t.grad.view(1)]).double().cpu()
        return float(loss_sum) + float(penalty.detach()), gradient


def join_theta(delta: torch.Tensor, log_t: torch.Tensor) -> torch.Tensor:
    """θ = (δ flattened, log T) as one float64 CPU vector."""
    return torch.cat([delta.detach().flatten().double().cpu(), log_t.detach().view(1).double().cpu()])


def split_theta(theta: torch.Tensor, shape: Tuple[int, ...], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(δ of ``shape``, log T) as float32 leaves on ``device``."""
    values = theta.to(device=device, dtype=torch.float32)
    return values[:-1].reshape(shape).clone(), values[-1].clone()


def score_run(run: LbfgsRun, backbone: Backbone, engine: Engine) -> torch.Tensor:
    """Calibrated logits f(x + δ)/T of the run's held rows at its current θ (one forward pass over them)."""
    delta, log_t = split_theta(run.state.theta, run.delta_shape, engine.device)
    logits, _ = engine.collect_logits(backbone, run.held_data, run.held, delta=delta, description="held-out check")
    return logits * torch.exp(-log_t)


def lockstep(runs: List[LbfgsRun], objectives: List[Objective], backbone: Backbone, engine: Engine,
             options: NeuralClamping.Options, pooled_score: Callable[[List[torch.Tensor]], float]) -> List[float]:
    """Iterate every run once per round, score the pooled held-out logits after each round; return the curve.

    The curve's entry 0 is the runs' start (δ = 0, their TS temperatures). Rounds stop ``patience``
    rounds after the pooled score's best entry, at ``max_iterations``, or when every run has converged (a converged
    run's held-out logits stay as they are: its θ no longer moves).
    """
    curve = [pooled_score([run.scored[-1] for run in runs])]
    best = 0
    for iteration in range(1, options.max_iterations + 1):
        moved = [stepwise_lbfgs.iterate(run.state, objective) for run, objective in zip(runs, objectives)]
        for run, did_move in zip(runs, moved):
            run.scored.append(score_run(run, backbone, engine) if did_move else run.scored[-1])
            run.record_state()
        curve.append(pooled_score([run.scored[-1] for run in runs]))
        best = iteration if curve[-1] < curve[best] else best
        if patience_spent(iteration, best, options.patience) or not any(moved):
            break
    return curve


def patience_spent(iteration: int, best: int, patience: int) -> bool:
    """Whether :func:`lockstep`'s rounds stop after round ``iteration``: ``patience`` rounds past the ``best`` one."""
    return iteration - best >= patience
