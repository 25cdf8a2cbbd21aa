"""The three linear maps of :mod:`..linear` as plain functions: how each is parametrised, applied and fitted.

Each map's fit solves P problems over the same (N, C) features at once (:class:`Problems`): one problem is a fit on
all rows; a cross-fitted check on small data stacks the fit on all rows and its K folds' fits, each problem holding
its own rows (the others weigh 0), its own temperature β, ridge and start. Their objectives add up without sharing a
parameter, so the sum's minimum is every problem's own minimum, and one run of the optimiser finds them all: vector
scaling's Newton steps (:mod:`.vector_newton`) take each problem's step and line search apart on shared passes;
matrix and Dirichlet calibration run one L-BFGS (:mod:`.lbfgs`) on the stacked (P, C, C) maps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import lbfgs
from ..memory import SMALLER_MAP, Footprint
from .vector_newton import fit_vector_scaling

Parameters = Dict[str, torch.Tensor]
#: (ρ_diagonal, ρ_off_diagonal) of :func:`ridge_strengths`
Ridge = Tuple[float, float]
#: a full map's fit holds (N, C) arrays (the features, β x, the calibrated logits, the cross-entropy's probabilities and
#: gradient, the backward's products: 10 covers the resident peaks measured in benchmarks/results/fit_cost.md) and
#: 2·20 + 15 (C, C) ones (L-BFGS's 20 steps, U, S and Δ = S ⊙ U, their gradients, the best state, Δ's square, the
#: line search's point, gradient and direction, the flat gradient and its previous value, the backward's)
MATRIX_FOOTPRINT = Footprint(rows=10, maps=2 * lbfgs.HISTORY_SIZE + 15, advice=SMALLER_MAP)
#: values (P·N·C) a joint fit of a C×C map stacks at most (:meth:`LinearMap.fits_jointly`)
STACK_MAX_VALUES = 1 << 18
#: a checked C×C map's footprint: a joint fit's stack holds 10 (P, C, N) arrays at most (β x, the calibrated logits,
#: the cross-entropy's log-probabilities and gradient, the backward's products), under 10 × 2¹⁸ values (20 MiB in float64)
CHECKED_MATRIX_FOOTPRINT = dataclasses.replace(MATRIX_FOOTPRINT, stacked=10 * STACK_MAX_VALUES)


def ridge_strengths(l2: float, rows: int, classes: int) -> Ridge:
    """(ρ_diagonal, ρ_off_diagonal) = (λ C/N, λ C(C − 1)/N): the ridge per squared scale offset or bias, and per
    squared off-diagonal weight, of a map fitted on ``rows`` distinct rows (copies add no evidence) of ``classes``
    classes (:mod:`..linear`)."""
    return l2 * classes / rows, l2 * classes * (classes - 1) / rows


@dataclasses.dataclass(frozen=True)
class Problems:
    """P fits of one map over the same (N, C) features, solved together (module docstring).

    Attributes:
        betas: each problem's temperature-scaling β = 1/T on its rows, the centre of its ridge.
        ridges: each problem's (ρ_diagonal, ρ_off_diagonal) (:func:`ridge_strengths`).
        starts: each problem's starting parameters.
        rows: (P, N) 0/1 of the rows each problem is fitted on; None: a single problem on every row.
    """

    betas: Sequence[float]
    ridges: Sequence[Ridge]
    starts: Sequence[Parameters]
    rows: Optional[torch.Tensor] = None


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """How one linear map is parametrised and fitted on (features, labels).

    Attributes:
        name: the method's name (progress bars, warnings).
        features: logits → the x the map applies to (z, or log softmax(z)).
        transform: (x, parameters) → calibrated logits.
        at_temperature: (β, classes, dtype, device) → the parameters of temperature scaling.
        fit: (x, labels, :class:`Problems`, max_iter, description) → (each problem's parameters, a summary of the
            run: ``iterations``, ``interrupted``, and per problem (lists) ``converged`` and what the optimiser adds).
        class_power, joint_max_work: P problems on (N, C) features are fitted jointly up to P·N·C^class_power =
            ``joint_max_work`` (:meth:`fits_jointly`).
    """

    name: str
    features: Callable[[torch.Tensor], torch.Tensor]
    transform: Callable[[torch.Tensor, Parameters], torch.Tensor]
    at_temperature: Callable[[float, int, torch.dtype, torch.device], Parameters]
    fit: Callable[..., Tuple[List[Parameters], Dict[str, Any]]]
    class_power: int
    joint_max_work: float

    def fits_jointly(self, problems: int, rows: int, classes: int) -> bool:
        """Whether ``problems`` fits on (``rows``, ``classes``) features are faster as one joint fit than one by one:
        where a fit's time is the optimiser's overhead per evaluation more than its arithmetic. A joint evaluation
        computes every row for every problem, so above the limit, where the arithmetic dominates, it is slower. A C×C
        map's joint fit holds its stack of (P, C, N) arrays, so that stack is also kept under :data:`STACK_MAX_VALUES`
        (vector scaling's passes read the rows a chunk at a time)."""
        work = problems * rows * classes**self.class_power
        return work <= self.joint_max_work and (self.class_power == 1 or problems * rows * classes <= STACK_MAX_VALUES)


def _identity(logits: torch.Tensor) -> torch.Tensor:
    return logits


def _log_probabilities(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=1)


def _vector_transform(x: torch.Tensor, parameters: Parameters) -> torch.Tensor:
    return torch.addcmul(parameters["bias"].to(x.dtype), x, parameters["scale"].to(x.dtype))


def _vector_at_temperature(beta: float, classes: int, dtype: torch.dtype, device: torch.device) -> Parameters:
    return {"scale": torch.full((classes,), beta, dtype=torch.float64, device=device),
            "bias": torch.zeros(classes, dtype=torch.float64, device=device)}


def _vector_fit(x: torch.Tensor, labels: torch.Tensor, problems: Problems, max_iter: int,
                description: str) -> Tuple[List[Parameters], Dict[str, Any]]:
    """Newton steps (:func:`.vector_newton.fit_vector_scaling`) with each problem's ρ_diagonal; Ctrl-C is not caught
    (a fit is a few passes)."""
    betas = torch.tensor(problems.betas, dtype=torch.float64, device=x.device)
    strengths = torch.tensor([ridge[0] for ridge in problems.ridges], dtype=torch.float64, device=x.device)
    start = tuple(torch.stack([start[key].double() for start in problems.starts]) for key in ("scale", "bias"))
    scale, bias, summary = fit_vector_scaling(x, labels, betas, max_iter, strengths, start, problems.rows)
    return [{"scale": s, "bias": b} for s, b in zip(scale, bias)], summary


def _matrix_transform(x: torch.Tensor, parameters: Parameters) -> torch.Tensor:
    return F.linear(x, parameters["weight"], parameters["bias"])


def _matrix_at_temperature(beta: float, classes: int, dtype: torch.dtype, device: torch.device) -> Parameters:
    return {"weight": torch.eye(classes, dtype=dtype, device=device) * beta, "bias": torch.zeros(classes, dtype=dtype, device=device)}


#: iterations a joint L-BFGS run of stacked problems may take (at most ``max_iter``) before each problem is finished on
#: its own rows from where the run left it: the problems share L-BFGS's 20-step history and line search, which on a
#: weak ridge took up to 10× the iterations of the slowest problem alone (594 against 93 on 300 × 4 logits, λ = 1e-3)
JOINT_LBFGS_ITERATIONS = 2 * lbfgs.TYPICAL_EVALUATIONS


def _matrix_fit(x: torch.Tensor, labels: torch.Tensor, problems: Problems, max_iter: int,
                description: str) -> Tuple[List[Parameters], Dict[str, Any]]:
    """L-BFGS (:func:`.lbfgs.minimise`) on each problem's Δ (through :func:`isotropic_scale`'s variables) and b of
    W = β (I + Δ), from its start's W and b, on :func:`matrix_objective`. Stacked problems (``problems.rows``) run as
    one L-BFGS of at most :data:`JOINT_LBFGS_ITERATIONS` iterations; when it spends them, each problem is finished on
    its own rows, from where it stands, with ``max_iter`` iterations of its own. A problem's ``iterations`` and
    ``evaluations`` count the joint run's with its own."""
    if problems.rows is None:
        return _lbfgs_fit(x, labels, problems, max_iter, description)
    budget = min(max_iter, JOINT_LBFGS_ITERATIONS)
    fitted, joint = _lbfgs_fit(x, labels, problems, budget, description)
    spent = joint["iterations"] >= budget or joint["evaluations"] >= lbfgs.max_evaluations(budget)
    if joint["interrupted"] or not spent:
        return fitted, {**joint, "loss": _objective_values(x, labels, problems, fitted)}
    count = len(problems.betas)
    alone = [_lbfgs_fit(x[rows], labels[rows], Problems([beta], [ridge], [start]), max_iter,
                        f"{description}, problem {number + 1} of {count} alone")
             for number, (rows, beta, ridge, start) in enumerate(zip(problems.rows, problems.betas, problems.ridges, fitted))]
    summary = {key: [joint[key] + own[key] for _, own in alone] for key in ("iterations", "evaluations")}
    summary.update(loss=[own["loss"] for _, own in alone], converged=[own["converged"][0] for _, own in alone],
                   interrupted=any(own["interrupted"] for _, own in alone))
    return [parameters[0] for parameters, _ in alone], summary


def _objective_values(x: torch.Tensor, labels: torch.Tensor, problems: Problems, fitted: List[Parameters]) -> List[float]:
    """Each stacked problem's :func:`matrix_objective` on its own rows at its ``fitted`` W and b."""
    scale = isotropic_scale(x.shape[1], x.dtype, x.device)
    values = []
    with torch.no_grad():
        for rows, beta, ridge, parameters in zip(problems.rows, problems.betas, problems.ridges, fitted):
            free = _free_variables(parameters["weight"], beta)
            values.append(float(matrix_objective(beta * x[rows], labels[rows], free, parameters["bias"], ridge, scale)()))
    return values


def _free_variables(weight: torch.Tensor, beta: Any) -> torch.Tensor:
    """U of W = β (I + S ⊙ U), S :func:`isotropic_scale`'s: of a (C, C) ``weight``, or of stacked (P, C, C) ones with
    (P, 1, 1) ``beta``."""
    classes = weight.shape[-1]
    identity = torch.eye(classes, dtype=weight.dtype, device=weight.device)
    return (weight / beta - identity) / isotropic_scale(classes, weight.dtype, weight.device)


def _lbfgs_fit(x: torch.Tensor, labels: torch.Tensor, problems: Problems, max_iter: int,
               description: str) -> Tuple[List[Parameters], Dict[str, Any]]:
    """One L-BFGS run over every problem at once, from each start's W and b (copied): on the (N, C) features ``x`` of
    a single problem on every row, or on (P, C, N) temperature-scaled copies weighted by each problem's rows (the sum
    of their objectives: its ``loss`` is not any one problem's, and is left out)."""
    identity = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    scale = isotropic_scale(x.shape[1], x.dtype, x.device)
    betas = torch.tensor(problems.betas, dtype=x.dtype, device=x.device)[:, None, None]
    free = _free_variables(torch.stack([start["weight"].to(x.dtype) for start in problems.starts]), betas)
    bias = torch.stack([start["bias"].to(x.dtype) for start in problems.starts])
    if problems.rows is None:
        free, bias = free[0].clone().requires_grad_(True), bias[0].clone().requires_grad_(True)
        objective = matrix_objective(problems.betas[0] * x, labels, free, bias, problems.ridges[0], scale)
    else:
        free, bias = free.requires_grad_(True), bias.requires_grad_(True)
        row_weights = problems.rows.to(x.dtype) / problems.rows.to(x.dtype).sum(dim=1, keepdim=True)
        ridge = tuple(torch.tensor(strengths, dtype=x.dtype, device=x.device) for strengths in zip(*problems.ridges))
        objective = matrix_objective(betas * x.t(), labels, free, bias, ridge, scale, row_weights)
    summary = lbfgs.minimise([free, bias], objective, max_iter, description)
    summary["converged"] = [summary["converged"]] * len(problems.betas)
    if problems.rows is not None:
        summary.pop("loss")
    offsets, biases = free.detach().reshape(-1, *identity.shape), bias.detach().reshape(-1, len(identity))
    return [{"weight": beta * (identity + offset * scale), "bias": b}
            for beta, offset, b in zip(problems.betas, offsets, biases)], summary


def isotropic_scale(classes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(C, C) S: 1 on the diagonal, 1/√(C − 1) off it. L-BFGS moves U with Δ = S ⊙ U, in which the ridge
    ρ_d (Σ Δ_cc² + ‖b‖²) + ρ_o Σ_{c≠j} Δ_cj² is ρ_d (‖U‖² + ‖b‖²) (ρ_o/ρ_d = C − 1 for every λ and N): the same
    curvature in every direction, where L-BFGS's first steps assume it. Structured matrix scaling at 5,000 × 100 took
    84 evaluations on Δ itself, 34 on U (probmetrics' sms: 38)."""
    scale = torch.full((classes, classes), (classes - 1) ** -0.5 if classes > 1 else 1.0, dtype=dtype, device=device)
    return scale.fill_diagonal_(1.0)


def matrix_objective(scaled: torch.Tensor, labels: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor,
                     ridge: Tuple[Any, Any], scale: Optional[torch.Tensor] = None,
                     row_weights: Optional[torch.Tensor] = None) -> Callable[[], torch.Tensor]:
    """() → mean NLL of softmax(x + Δ x + b) + ρ_d (Σ_c Δ_cc² + ‖b‖²) + ρ_o Σ_{c≠j} Δ_cj², at the current values of
    the (C, C) ``offset`` Δ (or, with a (C, C) ``scale`` S, Δ = S ⊙ ``offset``: :func:`isotropic_scale`) and (C,)
    ``bias`` b; ``scaled`` is the (N, C) temperature-scaled β x, ``ridge`` (ρ_d, ρ_o) (:func:`ridge_strengths`).

    Stacked problems (:class:`Problems`): ``scaled`` (P, C, N), classes first (the cross-entropy over a middle class
    dimension took a third of the time at 10 classes), ``offset`` (P, C, C), ``bias`` (P, C), ``ridge`` two (P,)
    tensors and ``row_weights`` (P, N), each problem's weights summing to 1: the sum of the P objectives, each NLL the
    weighted mean over the rows."""
    diagonal, off_diagonal = ridge

    def objective() -> torch.Tensor:
        delta = offset if scale is None else offset * scale
        if row_weights is None:
            calibrated = torch.addmm(bias, scaled, delta.t()).add_(scaled)
            nll = F.cross_entropy(calibrated, labels)
        else:
            calibrated = torch.baddbmm(bias[:, :, None], delta, scaled).add_(scaled)  # (P, C, N)
            nll = (F.cross_entropy(calibrated, labels.expand(len(row_weights), -1), reduction="none") * row_weights).sum()
        squares = delta.square()
        on_diagonal = squares.diagonal(dim1=-2, dim2=-1).sum(-1)
        penalty = diagonal * (on_diagonal + bias.square().sum(-1)) + off_diagonal * (squares.sum((-2, -1)) - on_diagonal)
        return nll + penalty.sum()

    return objective


def matrix_cost_bound(x: torch.Tensor, labels: torch.Tensor, fits: int, max_iter: int) -> lbfgs.CostBound:
    """The time of ``fits`` L-BFGS fits of a C×C map on (N, C) features ``x`` (in the dtype the fit will use) and (N,)
    ``labels``, from one timed evaluation of :func:`matrix_objective` at Δ = 0."""
    offset = torch.zeros(x.shape[1], x.shape[1], dtype=x.dtype, device=x.device, requires_grad=True)
    bias = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device, requires_grad=True)
    seconds = lbfgs.time_one_evaluation(matrix_objective(x, labels, offset, bias, (1.0, 1.0)), [offset, bias])
    return lbfgs.CostBound(seconds, fits, max_iter)


#: P·N·C up to which vector scaling's problems are fitted jointly: a 5-fold check (P = 6) took 0.39–0.49 of the time
#: of the fits one by one at 449 × 10, 0.73–0.83 up to 4,000 × 30, 0.90 at 5,000 × 100 (3·10⁶), 1.00 at 10,000 × 100
#: and 1.10 at 20,000 × 50 (6·10⁶; benchmarks/results/joint_check.md)
VECTOR_JOINT_WORK = 1 << 22
#: P·N·C² (an evaluation's multiply-adds) up to which a C×C map's problems are fitted jointly: 0.47–0.62 of the time at
#: 449 × 10 and 2,000 × 20 (P·N·C² ≤ 4.8·10⁶); matrix 1.10–1.33 from 800 × 100 on (≥ 4.8·10⁷), where Dirichlet, which
#: takes more evaluations, still gained (0.68–0.78) until 5,000 × 100 (1.59) (benchmarks/results/joint_check.md)
MATRIX_JOINT_WORK = 1 << 24

VECTOR = LinearMap("vector", _identity, _vector_transform, _vector_at_temperature, _vector_fit, 1, VECTOR_JOINT_WORK)
MATRIX = LinearMap("matrix", _identity, _matrix_transform, _matrix_at_temperature, _matrix_fit, 2, MATRIX_JOINT_WORK)
DIRICHLET = LinearMap("dirichlet", _log_probabilities, _matrix_transform, _matrix_at_temperature, _matrix_fit, 2,
                      MATRIX_JOINT_WORK)
