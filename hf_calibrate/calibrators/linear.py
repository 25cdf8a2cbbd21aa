"""Linear maps of the logits (or log-probabilities) fitted on the NLL, with a ridge towards temperature scaling.

* vector scaling: ``z' = a ⊙ z + b`` with a > 0 (a = exp(s)) — Guo et al. (2017);
* matrix scaling: ``z' = W z + b`` — Guo et al. (2017);
* Dirichlet calibration: ``z' = W log softmax(z) + b`` — Kull et al. (2019).

On a few hundred rows of a model that is right 95–99 % of the time these maps, fitted on the NLL
alone, run off towards the separating solution (scales in the thousands, every test sample in the
top confidence bin). So each is fitted relative to temperature scaling, as structured matrix scaling
does (Berta, Holzmüller, Jordan & Bach, AISTATS 2026): with β = 1/T the TS optimum and x = z (or
log p for Dirichlet), the map is written W = β (I + Δ), a = β (1 + v), and

    mean NLL + λ (C/N) (Σ_c Δ_cc² + Σ_c b_c²) + λ (C(C − 1)/N) Σ_{c≠j} Δ_cj²

(for vector scaling v takes Δ's diagonal): a ridge on the changes from TS's calibrated logits β x, whose
strength grows with the parameters per class and falls as the N (distinct) rows grow. TS itself is λ = ∞
(for Dirichlet softmax(β log p) = softmax(β z)). By default (``l2=None``) λ = 1, probmetrics' ``svs``/``sms``
default, is checked against TS itself by K-fold cross-fitted NLL (:func:`.holdout.select_by_cross_fitting`:
seeded folds of rows dealt at random, keeping rows of equal logits together; a tie keeps TS), then the choice is refitted
on all the data: K + 1 fits (the ridge alone was worse than TS beyond the paired interval on 100 distinct
rows of the BBC MiniLM, benchmarks/results/safe_defaults.md). K is 5, or 2 from 10⁷ logit values on
(:func:`.holdout.default_folds`), where each fold is a view of the rows arranged fold by fold
(:class:`.holdout.FoldLayout`): 3 fits, 19 logsumexp passes for vector at 50,000 × 1,000. ``l2_grid`` widens
the selection (strongest first, each fold warm-started from its previous candidate, the lowest cross-fitted
NLL); a number ``l2`` is one fit, as ``method="auto"`` fits these maps (its paired rule against TS is the
check). Vector scaling takes block-Newton steps (:mod:`.vector_newton`), matrix and Dirichlet L-BFGS on Δ
through :func:`isotropic_scale`'s variables (:mod:`.lbfgs`: a time warning before a long fit, a progress bar,
Ctrl-C keeps the best state), once their :data:`MATRIX_FOOTPRINT` is known to fit in memory (:mod:`.memory`).
None of these maps is guaranteed to keep the argmax: per-class scales and biases can reorder classes.

The fits are plain functions of (logits, labels) — :func:`fit_vector`, :func:`fit_matrix`,
:func:`fit_dirichlet` — that the calibrators below wrap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .._warnings import warn_user
from . import lbfgs
from .memory import SMALLER_MAP, Footprint, work_dtype
from .base import Calibrator, Range, check_fields, fit_context, ranged, require
from .requirements import DataRequirements
from .holdout import Fold, FoldLayout, cross_fitting_folds, default_folds, distinct_rows, fit_groups, select_by_cross_fitting
from .temperature import GUO_2017_CITATION, fit_inverse_temperature, near_bound, temperature_warnings
from .vector_newton import SCALE_BOUNDS, fit_vector_scaling

#: the ridge's λ of probmetrics' svs/sms default (Berta et al., 2026): the one candidate of the default check
DEFAULT_L2 = 1.0
#: candidate λ of the cross-fitted selection (l2=None) after temperature scaling (λ = ∞), strongest first
DEFAULT_L2_GRID = (DEFAULT_L2,)
#: λ: at 10⁴ the map is temperature scaling's to within what a fit can tell (λ = ∞ is a candidate of the selection)
L2 = Range(0.0, 1e4)
#: what the linear maps need: per-class parameters, and errors to learn a confidence from
LINEAR_REQUIREMENTS = DataRequirements(rows=10, classes=2, errors=1, advised_rows=100, per_class=True)
#: a full map's fit holds (N, C) arrays (the features, β x, the calibrated logits, the cross-entropy's probabilities and
#: gradient, the backward's products: 10 covers the resident peaks measured in benchmarks/results/fit_cost.md) and
#: 2·20 + 15 (C, C) ones (L-BFGS's 20 steps, U, S and Δ = S ⊙ U, their gradients, the best state, Δ's square, the
#: line search's point, gradient and direction, the flat gradient and its previous value, the backward's)
MATRIX_FOOTPRINT = Footprint(rows=10, maps=2 * lbfgs.HISTORY_SIZE + 15, advice=SMALLER_MAP)

Parameters = Dict[str, torch.Tensor]


#: (ρ_diagonal, ρ_off_diagonal) of :func:`ridge_strengths`
Ridge = Tuple[float, float]


def ridge_strengths(l2: float, rows: int, classes: int) -> Ridge:
    """(ρ_diagonal, ρ_off_diagonal) = (λ C/N, λ C(C − 1)/N): the ridge per squared scale offset or bias, and per
    squared off-diagonal weight, of a map fitted on ``rows`` distinct rows (copies add no evidence) of ``classes``
    classes (module docstring)."""
    return l2 * classes / rows, l2 * classes * (classes - 1) / rows


@dataclasses.dataclass
class RegularisedOptions:
    """Fit options of vector scaling, matrix scaling and Dirichlet calibration.

    Attributes:
        l2: λ, the multiplier of the ridge towards temperature scaling, λ C/N per squared scale offset and bias and
            λ C(C − 1)/N per squared off-diagonal weight (module docstring), in [0, 1e4]: one fit; 0 fits the map on
            the NLL alone (unbounded on separable data). None (default) selects λ by cross-fitted NLL among
            temperature scaling itself (λ = ∞) and ``l2_grid``: K · |grid| + 1 fits.
        l2_grid: with ``l2=None``, the candidate λ values, each in (0, 1e4] (default just 1.0, probmetrics' svs/sms
            default, checked against temperature scaling), tried strongest first until two in a row do not improve
            the cross-fitted NLL.
        folds: with ``l2=None``, K of the K-fold cross-fitting (default None: 5, or 2 from 10⁷ logit values
            on, e.g. 10,000 × 1,000: :func:`.holdout.default_folds`; at most the number of samples).
        seed: with ``l2=None``, seed of the folds (default 0); ``CalibratedModel.fit(seed=...)`` sets it with the fit's.
        max_iter: iterations at most per fit (default 1000): Newton for vector scaling, L-BFGS for
            matrix and Dirichlet (on 450 rows of the digits ViT, L-BFGS ends 4e-4 nats above the
            optimum after 200 iterations and reaches it after 600–700).
    """

    l2: Optional[float] = ranged(None, L2)
    l2_grid: Tuple[float, ...] = ranged(DEFAULT_L2_GRID, Range(0.0, L2.high, low_open=True))
    folds: Optional[int] = None
    seed: int = 0
    max_iter: int = 1000

    def __post_init__(self) -> None:
        check_fields(self)
        require(len(self.l2_grid) > 0, "l2_grid", self.l2_grid, "a non-empty list (pass l2=0 for the unregularised fit)")
        require(self.folds is None or self.folds >= 2, "folds", self.folds, "an integer >= 2, or None")
        require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")
        self.l2_grid = tuple(sorted(dict.fromkeys(float(v) for v in self.l2_grid), reverse=True))  # each λ once


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """How one linear map is parametrised and fitted on (features, labels).

    Attributes:
        name: the method's name (progress bars, warnings).
        features: logits → the x the map applies to (z, or log softmax(z)).
        transform: (x, parameters) → calibrated logits.
        at_temperature: (β, classes, dtype, device) → the parameters of temperature scaling.
        fit: (x, labels, β, (ρ_diagonal, ρ_off_diagonal), start, max_iter, description) → (parameters, summary: ``iterations``,
            ``converged``, ``interrupted``, and what the optimiser adds).
    """

    name: str
    features: Callable[[torch.Tensor], torch.Tensor]
    transform: Callable[[torch.Tensor, Parameters], torch.Tensor]
    at_temperature: Callable[[float, int, torch.dtype, torch.device], Parameters]
    fit: Callable[..., Tuple[Parameters, Dict[str, Any]]]


class _Interrupted(Exception):
    """Ctrl-C stopped a fit of the cross-fitted selection (where the fit context allows it)."""


def fit_towards_temperature(linear_map: LinearMap, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> Tuple[Parameters, Dict[str, Any]]:
    """Fit ``linear_map`` on (N, C) logits and (N,) labels with the pull towards temperature scaling.

    λ is ``options.l2``, or selected by cross-fitting (module docstring). Returns the parameters
    and a summary: ``l2`` (None when temperature scaling itself was chosen), ``temperature``,
    ``l2_cv_nll`` (cross-fitted mean NLL of each candidate tried, ``"inf"`` for TS), the refit's
    ``iterations``, ``converged``, and ``warnings`` (one line each: the starting temperature at a bound or without a
    minimum, no convergence, a scale at its bound, Ctrl-C).
    """
    x = linear_map.features(logits.detach().to(work_dtype(*logits.shape)))
    beta = fit_inverse_temperature(x, labels)[0]
    at_temperature = linear_map.at_temperature(beta, x.shape[1], x.dtype, x.device)
    start_lines = temperature_warnings(beta, x, labels, method=linear_map.name, start=True)
    summary: Dict[str, Any] = {"temperature": 1.0 / beta, "warnings": start_lines}
    groups = fit_groups(logits)
    strength = options.l2
    if strength is None:
        try:
            folds = cross_fitting_folds(labels, default_folds(options.folds, *logits.shape), options.seed, groups)
            fold_nll = _held_out_nll(linear_map, x, labels, options, folds, groups)
            selection = select_by_cross_fitting((math.inf, *options.l2_grid), folds, fold_nll)
        except _Interrupted:
            summary["interrupted"] = _interrupted(linear_map.name, "during the l2 selection: temperature scaling's solution is kept")
            return at_temperature, {**summary, "l2": None}
        strength = selection.chosen
        summary["l2_cv_nll"] = selection.scores
    summary["l2"] = None if math.isinf(strength) else strength
    if math.isinf(strength):
        return at_temperature, summary
    description = f"{linear_map.name} fit"
    ridge = ridge_strengths(strength, distinct_rows(groups), x.shape[1])
    parameters, fit = linear_map.fit(x, labels, beta, ridge, at_temperature, options.max_iter, description)
    if fit.pop("interrupted", False):
        summary["interrupted"] = _interrupted(linear_map.name, "during the fit: the best state so far is kept")
    summary["warnings"] += _fit_warnings(linear_map.name, fit, options, scale_named=bool(start_lines) and near_bound(beta))
    return parameters, {**fit, **summary}


def _held_out_nll(
    linear_map: LinearMap, x: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions, folds: List[Fold],
    groups: torch.Tensor,
) -> Callable[[float, int], torch.Tensor]:
    """The ``held_out_nll(λ, k)`` of :func:`.holdout.select_by_cross_fitting` over ``folds``: each fold's TS, then its
    fits warm-started along the path, each ridged by the distinct rows (``groups``) it is fitted on."""
    layout = FoldLayout(folds)
    x, labels, groups = layout.arrange(x), layout.arrange(labels), layout.arrange(groups)
    previous: Dict[int, Tuple[float, Parameters]] = {}

    def held_out_nll(strength: float, fold: int) -> torch.Tensor:
        fit_x, fit_labels = layout.fitting(x, fold), layout.fitting(labels, fold)
        if fold not in previous:
            beta = fit_inverse_temperature(fit_x, fit_labels)[0]
            previous[fold] = (beta, linear_map.at_temperature(beta, x.shape[1], x.dtype, x.device))
        beta, start = previous[fold]
        if not math.isinf(strength):
            description = f"{linear_map.name}: l2 = {strength:g}, fold {fold + 1} of {len(folds)}"
            ridge = ridge_strengths(strength, distinct_rows(layout.fitting(groups, fold)), x.shape[1])
            start, fit = linear_map.fit(fit_x, fit_labels, beta, ridge, start, options.max_iter, description)
            if fit.get("interrupted"):
                raise _Interrupted
            previous[fold] = (beta, start)
        with torch.no_grad():
            return F.cross_entropy(linear_map.transform(layout.held(x, fold), start), layout.held(labels, fold), reduction="none")

    return held_out_nll


def _fit_warnings(name: str, fit: Dict[str, Any], options: RegularisedOptions, scale_named: bool = False) -> List[str]:
    """One line per problem of a fit: it did not converge, or scales ended at their bounds (put down to the temperature
    it starts from when ``scale_named``: that temperature is at its bound, said on its own line with the reason)."""
    lines = []
    if not fit.get("converged", True):
        lines.append(f"{name}: the fit stopped after max_iter={options.max_iter} iterations without converging; pass a "
                     f"larger max_iter, or a larger l2 (or leave l2 unset to select it).")
    if fit.get("classes_at_bound"):
        reason = ("the temperature it starts from is at its bound too (its line says why): fix that first" if scale_named
                  else "the data separate those classes; pass a larger l2 (or leave l2 unset to select it)")
        lines.append(f"{name}: {fit['classes_at_bound']} per-class scale(s) ended at a bound ({SCALE_BOUNDS[0]:.0e} or "
                     f"{SCALE_BOUNDS[1]:.0e}): {reason}.")
    return lines


def _interrupted(method: str, what: str) -> str:
    """Say (a warning at the user's line) that Ctrl-C stopped a fit early, and return ``what`` for the fit summary."""
    warn_user(f"{method}: interrupted (Ctrl-C) {what}; the fit summary records this.")
    return what


# ----------------------------------------------------------------------------- the three maps


def _identity(logits: torch.Tensor) -> torch.Tensor:
    return logits


def _log_probabilities(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=1)


def _vector_transform(x: torch.Tensor, parameters: Parameters) -> torch.Tensor:
    return torch.addcmul(parameters["bias"].to(x.dtype), x, parameters["scale"].to(x.dtype))


def _vector_at_temperature(beta: float, classes: int, dtype: torch.dtype, device: torch.device) -> Parameters:
    return {"scale": torch.full((classes,), beta, dtype=torch.float64, device=device),
            "bias": torch.zeros(classes, dtype=torch.float64, device=device)}


def _vector_fit(x, labels, beta, ridge, start, max_iter, description) -> Tuple[Parameters, Dict[str, Any]]:
    """Block-Newton (:func:`.vector_newton.fit_vector_scaling`) with the ridge's ρ_diagonal; Ctrl-C is not caught (a
    fit is a few passes)."""
    scale, bias, summary = fit_vector_scaling(x, labels, beta, max_iter, ridge[0], start=(start["scale"], start["bias"]))
    return {"scale": scale, "bias": bias}, summary


def _matrix_transform(x: torch.Tensor, parameters: Parameters) -> torch.Tensor:
    return F.linear(x, parameters["weight"], parameters["bias"])


def _matrix_at_temperature(beta: float, classes: int, dtype: torch.dtype, device: torch.device) -> Parameters:
    return {"weight": torch.eye(classes, dtype=dtype, device=device) * beta, "bias": torch.zeros(classes, dtype=dtype, device=device)}


def _matrix_fit(x, labels, beta, ridge, start, max_iter, description) -> Tuple[Parameters, Dict[str, Any]]:
    """L-BFGS (:func:`.lbfgs.minimise`) on Δ (through :func:`isotropic_scale`'s variables) and b of W = β (I + Δ),
    from ``start``'s W and b (copied), on :func:`matrix_objective`."""
    identity = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    scale = isotropic_scale(x.shape[1], x.dtype, x.device)
    free = ((start["weight"].to(x.dtype) / beta - identity) / scale).requires_grad_(True)
    bias = start["bias"].to(x.dtype).clone().requires_grad_(True)
    scaled = beta * x
    summary = lbfgs.minimise([free, bias], matrix_objective(scaled, labels, free, bias, ridge, scale), max_iter, description)
    return {"weight": beta * (identity + free.detach() * scale), "bias": bias.detach()}, summary


def isotropic_scale(classes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(C, C) S: 1 on the diagonal, 1/√(C − 1) off it. L-BFGS moves U with Δ = S ⊙ U, in which the ridge
    ρ_d (Σ Δ_cc² + ‖b‖²) + ρ_o Σ_{c≠j} Δ_cj² is ρ_d (‖U‖² + ‖b‖²) (ρ_o/ρ_d = C − 1 for every λ and N): the same
    curvature in every direction, where L-BFGS's first steps assume it. Structured matrix scaling at 5,000 × 100 took
    84 evaluations on Δ itself, 34 on U (probmetrics' sms: 38)."""
    scale = torch.full((classes, classes), (classes - 1) ** -0.5 if classes > 1 else 1.0, dtype=dtype, device=device)
    return scale.fill_diagonal_(1.0)


def matrix_objective(scaled: torch.Tensor, labels: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor,
                     ridge: Ridge, scale: Optional[torch.Tensor] = None) -> Callable[[], torch.Tensor]:
    """() → mean NLL of softmax(x + Δ x + b) + ρ_d (Σ_c Δ_cc² + ‖b‖²) + ρ_o Σ_{c≠j} Δ_cj², at the current values of
    the (C, C) ``offset`` Δ (or, with a (C, C) ``scale`` S, Δ = S ⊙ ``offset``: :func:`isotropic_scale`) and (C,)
    ``bias`` b; ``scaled`` is the (N, C) temperature-scaled β x, ``ridge`` (ρ_d, ρ_o) (:func:`ridge_strengths`)."""
    diagonal, off_diagonal = ridge

    def objective() -> torch.Tensor:
        delta = offset if scale is None else offset * scale
        calibrated = torch.addmm(bias, scaled, delta.t()).add_(scaled)
        squares = delta.square()
        on_diagonal = squares.diagonal().sum()
        penalty = diagonal * (on_diagonal + bias.square().sum()) + off_diagonal * (squares.sum() - on_diagonal)
        return F.cross_entropy(calibrated, labels) + penalty

    return objective


VECTOR = LinearMap("vector", _identity, _vector_transform, _vector_at_temperature, _vector_fit)
MATRIX = LinearMap("matrix", _identity, _matrix_transform, _matrix_at_temperature, _matrix_fit)
DIRICHLET = LinearMap("dirichlet", _log_probabilities, _matrix_transform, _matrix_at_temperature, _matrix_fit)


def fit_vector(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Vector scaling towards TS on (N, C) logits and (N,) labels: ({"scale", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(VECTOR, logits, labels, options or RegularisedOptions())


def fit_matrix(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Matrix scaling towards TS: ({"weight", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(MATRIX, logits, labels, options or RegularisedOptions())


def fit_dirichlet(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Dirichlet calibration towards TS, W log softmax(z) + b: ({"weight", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(DIRICHLET, logits, labels, options or RegularisedOptions())


def matrix_cost_bound(x: torch.Tensor, labels: torch.Tensor, fits: int, max_iter: int) -> lbfgs.CostBound:
    """The time of ``fits`` L-BFGS fits of a C×C map on (N, C) features ``x`` (in the dtype the fit will use) and (N,)
    ``labels``, from one timed evaluation of :func:`matrix_objective` at Δ = 0."""
    offset = torch.zeros(x.shape[1], x.shape[1], dtype=x.dtype, device=x.device, requires_grad=True)
    bias = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device, requires_grad=True)
    seconds = lbfgs.time_one_evaluation(matrix_objective(x, labels, offset, bias, (1.0, 1.0)), [offset, bias])
    return lbfgs.CostBound(seconds, fits, max_iter)


# ----------------------------------------------------------------------------- the calibrators


class VectorScaling(Calibrator):
    """``a ⊙ z + b`` with a per-class positive scale ``a = exp(log_scale)`` and bias ``b``."""

    method = "vector"
    Options = RegularisedOptions
    title = "vector scaling"
    description = ("Each class logit gets its own positive scale and bias, fitted by Newton steps on the NLL with a ridge "
                   "towards the temperature-scaling solution whose strength grows with the classes and falls with the rows.")
    citation = GUO_2017_CITATION
    requirements = LINEAR_REQUIREMENTS
    #: the logits' working copy, the folds' copies of it and the chunked passes' (benchmarks/results/fit_cost.md)
    footprint = Footprint(rows=4)

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.log_scale = nn.Parameter(torch.zeros(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.log_scale.exp().to(logits.dtype) + self.bias.to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> Dict[str, Any]:
        parameters, summary = fit_vector(logits, labels, options)
        with torch.no_grad():
            self.log_scale.copy_(parameters["scale"].log())
            self.bias.copy_(parameters["bias"])
        return summary


class MatrixScaling(Calibrator):
    """``W z + b`` (C×C weights), regularised towards temperature scaling."""

    method = "matrix"
    Options = RegularisedOptions
    title = "matrix scaling"
    description = ("The logits go through a full linear map W z + b fitted on the NLL with a ridge towards the "
                   "temperature-scaling solution, stronger off the diagonal (Berta et al.'s structured matrix scaling).")
    citation = GUO_2017_CITATION
    requirements = LINEAR_REQUIREMENTS
    footprint = MATRIX_FOOTPRINT
    #: how this map is parametrised and fitted
    linear_map: LinearMap = MATRIX

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.weight = nn.Parameter(torch.eye(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return F.linear(self.linear_map.features(logits), self.weight.to(logits.dtype), self.bias.to(logits.dtype))

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> Dict[str, Any]:
        self._warn_if_long(logits, labels, options)
        parameters, summary = fit_towards_temperature(self.linear_map, logits, labels, options)
        with torch.no_grad():
            self.weight.copy_(parameters["weight"])
            self.bias.copy_(parameters["bias"])
        return summary

    def _warn_if_long(self, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> None:
        """Warn with :meth:`cost_bound` before a fit that may take long (only large ones are timed)."""
        if not fit_context().announce or logits.shape[0] * logits.shape[1] ** 2 < lbfgs.TIME_FROM_WORK:
            return
        advice = ("Pass a number as l2 to skip the selection of l2 (the default), or use structured_vector, vector or "
                  "temperature scaling (seconds)." if options.l2 is None else "Use structured_vector, vector or temperature "
                  "scaling (seconds), or a larger l2 (a stronger ridge converges in fewer iterations).")
        what = f"{self.method} on {logits.shape[0]:,} x {logits.shape[1]:,} logits"
        lbfgs.warn_if_long(what, self.cost_bound(logits.detach().to(work_dtype(*logits.shape)), labels, options), advice)

    def cost_bound(self, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> lbfgs.CostBound:
        """An upper bound of the time of ``fit_logits(logits, labels, options)`` here, from one timed evaluation
        at the identity map (``logits`` (N, C) in the dtype the fit will use; labels (N,))."""
        folds = default_folds(options.folds, *logits.shape)
        fits = 1 if options.l2 is not None else min(folds, len(labels)) * len(options.l2_grid) + 1
        return matrix_cost_bound(self.linear_map.features(logits), labels, fits, options.max_iter)


class DirichletCalibration(MatrixScaling):
    """``W log softmax(z) + b`` (Dirichlet calibration), regularised towards temperature scaling."""

    method = "dirichlet"
    title = "Dirichlet calibration"
    description = ("The log-probabilities go through a linear map W log p + b fitted on the NLL (Kull et al., 2019) with a "
                   "ridge towards the temperature-scaling solution, stronger off the diagonal (as Berta et al., 2026).")
    citation = (
        "@inproceedings{kull2019beyond, title={Beyond temperature scaling: Obtaining well-calibrated multi-class "
        "probabilities with Dirichlet calibration}, author={Kull, Meelis and Perello Nieto, Miquel and "
        "K{\\\"a}ngsepp, Markus and Silva Filho, Telmo and Song, Hao and Flach, Peter}, booktitle={NeurIPS}, year={2019}}"
    )
    linear_map = DIRICHLET
