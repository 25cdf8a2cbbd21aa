"""The L-BFGS Neural Clamping fit end to end: plan the held-out data, cross-fit, choose, refit or fall back.

The pieces (folds, runs, the lockstep rounds) are :mod:`.lbfgs`; the procedure is described there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...backbones import Backbone
from ...calibrators.holdout import (content_groups, fold_assignment, note_repeated_rows, note_validation_copies, paired_difference,
                                   rows_repeating, shown_below_zero)
from ...calibrators.neural_clamping import NeuralClamping
from ...calibrators.requirements import warn_if_probabilities
from ...calibrators.temperature import CALIBRATION_DATA_FIX, fit_inverse_temperature, temperature_method_beta, warn_if_without_minimum
from ...data import CalibrationData
from . import stepwise_lbfgs
from ..runtime.engine import Engine
from .lbfgs import LbfgsRun, Objective, Penalty, join_theta, lockstep, resolved_folds, score_run
from .start import holdout_scores, initial_delta, require_rereadable


@dataclasses.dataclass
class FoldRows:
    """One run's rows: fitted on ``train`` of the calibration data, scored on ``held`` of ``held_data``."""

    train: torch.Tensor
    held: torch.Tensor
    held_data: CalibrationData
    held_logits: torch.Tensor  # base logits of the held rows
    held_labels: torch.Tensor


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One setting of the objective to cross-fit: focal γ, λ on ‖δ‖₂, ridge ρ."""

    gamma: float
    weight: float
    ridge: float

    def record(self) -> Dict[str, float]:
        return {"gamma": self.gamma, "delta_weight": self.weight, "ridge": self.ridge}


@dataclasses.dataclass
class BestIterate:
    """The best (grid point, iteration) of the cross-fit, its pooled held-out logits and its runs' mean θ there."""

    score: float = math.inf
    point: Optional[GridPoint] = None
    iteration: int = 0
    pooled: Optional[torch.Tensor] = None
    theta: Optional[torch.Tensor] = None
    record: Optional[Dict[str, Any]] = None


class ClampingFit:
    """State shared by the steps of one fit: the model, data, options, engine, δ's shape and the evaluation count."""

    def __init__(self, backbone: Backbone, data: CalibrationData, calibrator: NeuralClamping,
                 options: NeuralClamping.Options, engine: Engine, bar: Any) -> None:
        self.backbone, self.data, self.calibrator, self.options, self.engine, self.bar = backbone, data, calibrator, options, engine, bar
        self.shape = tuple(calibrator.delta.shape)
        self.evaluations = 0

    def counted(self) -> None:
        self.evaluations += 1
        self.bar.update(1)

    def objective(self, train: torch.Tensor, point: GridPoint, start_log_temperature: float) -> Objective:
        penalty = Penalty(point.weight, point.ridge, start_log_temperature)
        return Objective(self.backbone, self.data, train, self.shape, point.gamma, penalty, self.engine, self.counted)

    def start_log_temperature(self, train: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """log T₀ of a run on ``train`` (rounded to float32, as θ holds it): ``temperature_init``, else the
        ``temperature`` method's fit on those rows."""
        if isinstance(self.options.temperature_init, str):
            value = -math.log(temperature_method_beta(logits[train], labels[train]))
        else:
            value = math.log(self.options.temperature_init)
        return float(torch.tensor(value, dtype=torch.float32))

    def start_theta(self, train: torch.Tensor, log_temperature: float) -> torch.Tensor:
        """θ₀ of a run on ``train``: δ's starting point and ``log_temperature``."""
        log_t = torch.tensor(log_temperature, device=self.engine.device)
        delta = initial_delta(self.backbone, self.data, train, self.calibrator, self.options, self.engine, log_t)
        return join_theta(delta, log_t)

    def run(self, part: FoldRows, point: GridPoint, logits: torch.Tensor, labels: torch.Tensor, keep_snapshots: bool) -> Tuple[LbfgsRun, Objective]:
        """A started run on ``part`` (one evaluation at θ₀), scored once at θ₀."""
        log_temperature = self.start_log_temperature(part.train, logits, labels)
        objective = self.objective(part.train, point, log_temperature)
        state = stepwise_lbfgs.start(self.start_theta(part.train, log_temperature), objective)
        run = LbfgsRun(part.held, part.held_data, self.shape, state, keep_snapshots)
        if len(part.held) and self.options.delta_init == "zero":  # θ₀ = (0, log T): the cached base logits / T
            run.scored.append(part.held_logits * math.exp(-float(state.theta[-1])))
        elif len(part.held):
            run.scored.append(score_run(run, self.backbone, self.engine))
        run.record_state()
        return run, objective


def fit_by_lbfgs(backbone: Backbone, data: CalibrationData, calibrator: NeuralClamping, options: NeuralClamping.Options,
                 engine: Engine, validation: Optional[CalibrationData] = None) -> Dict[str, Any]:
    """Fit ``calibrator`` (δ, log T) in place by cross-fitted L-BFGS; return the fit summary (with ``duplicate_rows``:
    the folds or hold-out keep rows of equal base logits together, and fewer distinct rows than folds make fewer folds)."""
    require_rereadable(data, validation)
    logits, labels = engine.collect_logits(backbone, data, description="base logits", keep_inputs=True)
    if engine.is_main:
        warn_if_probabilities(logits)
        warn_if_without_minimum(fit_inverse_temperature(logits, labels)[0], logits, labels,
                                "the base model's logits over the calibration data", CALIBRATION_DATA_FIX)
    groups = content_groups(logits)
    folds = resolved_folds(options, len(data), validation is not None, engine.world)
    parts = _parts(backbone, data, validation, (logits, labels, groups), folds, options, engine)
    folds = len(parts)  # fewer distinct rows than folds make fewer folds
    grid = [GridPoint(gamma, weight, ridge) for gamma in options.gamma for weight in options.delta_weight for ridge in options.ridge]
    if len(grid) > 1 and not len(parts[0].held):
        raise ValueError("selecting among several gamma/delta_weight/ridge values needs held-out data: folds > 1, "
                         "holdout_fraction > 0 or validation_data.")
    refit_iterations = options.max_iterations if folds > 1 and options.refit == "all" else 0
    with engine.progress(len(grid) * len(parts) * options.max_iterations + refit_iterations, "Neural Clamping (L-BFGS)") as bar:
        fit = ClampingFit(backbone, data, calibrator, options, engine, bar)
        if not len(parts[0].held):
            summary = _fit_without_selection(fit, parts[0], logits, labels)
        else:
            summary = _cross_fit_and_choose(fit, parts, grid, logits, labels, folds)
    if validation is not None:
        note_validation_copies(summary, rows_repeating(logits, parts[0].held_logits), len(parts[0].held))
    return note_repeated_rows(summary, groups)


def _parts(backbone: Backbone, data: CalibrationData, validation: Optional[CalibrationData],
           base: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], folds: int, options: NeuralClamping.Options, engine: Engine) -> List[FoldRows]:
    """The runs' rows: one per fold, one held-out part, the validation data, or all rows and nothing held out. ``base``:
    the base's (N, C) logits, (N,) labels and (N,) content groups of the calibration data; a row's copies stay in one
    part, and fewer distinct rows than ``folds`` make as many folds as there are distinct rows."""
    logits, labels, groups = base
    if validation is not None:
        held_logits, held_labels = engine.collect_logits(backbone, validation, description="base logits (validation)", keep_inputs=True)
        return [FoldRows(torch.arange(len(data)), torch.arange(len(validation)), validation, held_logits, held_labels)]
    if folds == 1:
        train, held = engine.split_indices(len(data), options.holdout_fraction, groups)
        return [FoldRows(train, held, data, logits[held.to(logits.device)], labels[held.to(labels.device)])]
    assignment = fold_assignment(labels, folds, engine.options.seed, groups)
    parts = []
    for fold in range(int(assignment.max()) + 1):
        held = torch.nonzero(assignment == fold).flatten()
        train = torch.nonzero(assignment != fold).flatten()
        parts.append(FoldRows(train, held, data, logits[held.to(logits.device)], labels[held.to(labels.device)]))
    return parts


def _fit_without_selection(fit: ClampingFit, part: FoldRows, logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, Any]:
    """Nothing held out: L-BFGS on all rows until it converges or reaches ``max_iterations``; the last state is kept."""
    point = GridPoint(fit.options.gamma[0], fit.options.delta_weight[0], fit.options.ridge[0])
    run, objective = fit.run(part, point, logits, labels, keep_snapshots=False)
    iterations = _iterate(run, objective, fit.options.max_iterations)
    _set_calibrator(fit.calibrator, run.state.theta, fit.shape)
    summary = _summary(fit, folds=1, fit_samples=len(part.train), holdout_samples=0, logits=logits, labels=labels)
    summary["selected"] = _state_record(run.state, point, iterations)
    summary.update(iterations=iterations, evaluations=fit.evaluations, fell_back_to_temperature_scaling=False)
    return summary


def _iterate(run: LbfgsRun, objective: Objective, iterations: int) -> int:
    """Up to ``iterations`` L-BFGS iterations of ``run``; the number taken (fewer once it converges)."""
    taken = 0
    while taken < iterations and stepwise_lbfgs.iterate(run.state, objective):
        taken += 1
    return taken


def _cross_fit_and_choose(fit: ClampingFit, parts: List[FoldRows], grid: List[GridPoint], logits: torch.Tensor,
                          labels: torch.Tensor, folds: int) -> Dict[str, Any]:
    """Cross-fit every grid point, pick the best (point, iteration) against TS, then refit, keep or fall back."""
    options, metric = fit.options, f"holdout_{fit.options.select_metric}"
    held_labels = torch.cat([part.held_labels for part in parts]).cpu()
    baseline_logits = torch.cat([part.held_logits * math.exp(-fit.start_log_temperature(part.train, logits, labels)) for part in parts]).cpu()
    baseline = holdout_scores(baseline_logits, held_labels, options.n_bins)  # on the CPU: bit-identical on every process
    history: List[Dict[str, Any]] = []
    choice = BestIterate(score=baseline[metric])
    for point in grid:
        pairs = [fit.run(part, point, logits, labels, keep_snapshots=True) for part in parts]
        runs = [run for run, _ in pairs]
        curve = lockstep(runs, [objective for _, objective in pairs], fit.backbone, fit.engine, options,
                         lambda pooled: holdout_scores(torch.cat(pooled).cpu(), held_labels, options.n_bins)[metric])
        for iteration, score in enumerate(curve):
            record = _round_record(runs, iteration, point, held_labels, fit)
            history.append(record)
            if iteration > 0 and score < choice.score:
                choice = BestIterate(score, point, iteration, torch.cat([run.scored[iteration] for run in runs]).cpu(),
                                torch.stack([run.snapshots[iteration] for run in runs]).mean(0), record)
    summary = _summary(fit, folds, len(parts[0].train) if folds == 1 else len(labels), len(held_labels), logits, labels)
    held_groups = content_groups(torch.cat([part.held_logits for part in parts]))  # a row and its copies: one sample
    selection = _paired_difference(choice, baseline_logits, held_labels, held_groups)
    if options.require_significant_gain and not _significant(selection):
        selection["kept_delta"], choice = False, BestIterate()
    _hand_over_held_out(fit, parts, choice, baseline_logits, held_labels)
    summary.update(history=history, selection=selection)
    summary["temperature_scaling"].update(baseline)
    return _apply_choice(fit, choice, parts, logits, labels, folds, summary)


def _significant(selection: Dict[str, Any]) -> bool:
    """Whether the pooled held-out NLL difference (chosen − TS) has its whole 95 % interval below 0."""
    return shown_below_zero(selection.get("nll_difference"))


def _apply_choice(fit: ClampingFit, choice: BestIterate, parts: List[FoldRows], logits: torch.Tensor, labels: torch.Tensor, folds: int,
                  summary: Dict[str, Any]) -> Dict[str, Any]:
    """Set the calibrator: TS on all rows (fallback), the chosen runs' mean θ (one held part: its own), or a refit on all rows."""
    fell_back = choice.pooled is None
    refit = "none" if fell_back or folds == 1 else fit.options.refit
    if fell_back:
        theta, iterations = join_theta(torch.zeros(fit.shape), torch.tensor(summary["temperature_scaling"]["fallback_log_temperature"])), 0
    elif refit == "all":
        theta, iterations = _refit_on_all(fit, choice, logits, labels)
    else:  # one held part: its run's own θ; several folds: their mean
        theta, iterations = choice.theta, choice.iteration
    _set_calibrator(fit.calibrator, theta, fit.shape)
    summary["fell_back_to_temperature_scaling"] = fell_back
    summary["selected"] = {"fallback": "temperature_scaling"} if fell_back else dict(
        choice.record, refit_iterations=iterations if refit == "all" else 0, delta_norm=float(theta[:-1].norm()),
        temperature=math.exp(float(theta[-1])))
    summary["refit"], summary["iterations"] = refit, iterations
    summary["evaluations"] = fit.evaluations
    return summary


def _refit_on_all(fit: ClampingFit, choice: BestIterate, logits: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """``refit="all"``: the chosen grid point on every calibration row from the start, for the chosen iterations: (θ, iterations)."""
    everything = FoldRows(torch.arange(len(labels)), torch.empty(0, dtype=torch.long), fit.data, logits[:0], labels[:0])
    run, objective = fit.run(everything, choice.point, logits, labels, keep_snapshots=False)
    iterations = _iterate(run, objective, choice.iteration)
    return run.state.theta, iterations


def _row_differences(choice: BestIterate, baseline_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(n,) float64 pooled held-out NLL of the choice minus TS's, per held-out row (nats; zeros when nothing was chosen)."""
    if choice.pooled is None:
        return torch.zeros(len(labels), dtype=torch.float64)
    ce = torch.nn.functional.cross_entropy
    return ce(choice.pooled.double(), labels, reduction="none") - ce(baseline_logits.double(), labels, reduction="none")


def _paired_difference(choice: BestIterate, baseline_logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> Dict[str, Any]:
    """The pooled held-out NLL of the choice minus TS's, per sample, with its 95 % normal interval (None: no choice);
    ``groups``: the held rows' content ids (a row and its copies are one sample)."""
    if choice.pooled is None:
        return {"nll_difference": None}
    return {"nll_difference": paired_difference(_row_differences(choice, baseline_logits, labels), groups)}


def _hand_over_held_out(fit: ClampingFit, parts: List[FoldRows], choice: BestIterate, baseline_logits: torch.Tensor, labels: torch.Tensor) -> None:
    """Give :attr:`Engine.held_out_sink` (when set) the calibration rows held out and the chosen fit's NLL difference to
    TS on each (zeros on a fallback); held-out validation data are not calibration rows and are not handed over."""
    if fit.engine.held_out_sink is None or parts[0].held_data is not fit.data:
        return
    rows = torch.cat([part.held.cpu() for part in parts])
    fit.engine.held_out_sink.append((rows, _row_differences(choice, baseline_logits, labels)))


def _round_record(runs: List[LbfgsRun], iteration: int, point: GridPoint, held_labels: torch.Tensor, fit: ClampingFit) -> Dict[str, Any]:
    """One history entry: the grid point, the iteration, every run's ‖δ‖ and T and their means, and every pooled held-out score."""
    traces = [run.trace[iteration] for run in runs]
    record: Dict[str, Any] = {**point.record(), "iteration": iteration,
                              "delta_norm": sum(norm for norm, _ in traces) / len(runs),
                              "temperature": sum(temperature for _, temperature in traces) / len(runs),
                              "run_delta_norms": [norm for norm, _ in traces], "run_temperatures": [temperature for _, temperature in traces]}
    pooled = torch.cat([run.scored[iteration] for run in runs]).cpu()
    record.update(holdout_scores(pooled, held_labels, fit.options.n_bins))
    return record


def _state_record(state: stepwise_lbfgs.LbfgsState, point: GridPoint, iteration: int) -> Dict[str, Any]:
    return {**point.record(), "iteration": iteration, "loss": state.value,
            "delta_norm": float(state.theta[:-1].norm()), "temperature": math.exp(float(state.theta[-1]))}


def _summary(fit: ClampingFit, folds: int, fit_samples: int, holdout_samples: int, logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, Any]:
    """The summary's common part: optimiser, plan, schedule and the temperature-scaling fallback (the temperature method's fit)."""
    log_t = -math.log(temperature_method_beta(logits, labels))
    return {
        "optimizer": "lbfgs", "folds": folds, "fit_samples": fit_samples, "holdout_samples": holdout_samples,
        "max_iterations": fit.options.max_iterations, "patience": fit.options.patience,
        "temperature_scaling": {"fallback_temperature": math.exp(log_t), "fallback_log_temperature": log_t},
        "evaluations": fit.evaluations,
    }


def _set_calibrator(calibrator: NeuralClamping, theta: torch.Tensor, shape: Tuple[int, ...]) -> None:
    with torch.no_grad():
        calibrator.delta.copy_(theta[:-1].reshape(shape).to(calibrator.delta))
        calibrator.log_temperature.copy_(theta[-1].to(calibrator.log_temperature))
