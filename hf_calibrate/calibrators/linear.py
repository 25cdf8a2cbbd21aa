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
seeded folds of rows dealt at random, keeping rows of equal logits together; a tie keeps TS), with the fit on all the
data: K + 1 fits (the ridge alone was worse than TS beyond the paired interval on 100 distinct rows of the BBC
MiniLM, benchmarks/results/safe_defaults.md). On small data (:meth:`.solvers.linear_maps.LinearMap.fits_jointly`) the
K + 1 fits are one joint fit of stacked problems (:mod:`.solvers.linear_maps`), whose cost is about one fit's; above it the
folds are fitted one by one and the choice refitted on all the data. K is 5, or 2 from 10⁷ logit values on
(:func:`.holdout.default_folds`), where each fold is a view of the rows arranged fold by fold
(:class:`.holdout.FoldLayout`): 3 fits, 19 logsumexp passes for vector at 50,000 × 1,000. ``l2_grid`` widens
the selection (strongest first, each fold warm-started from its previous candidate, the lowest cross-fitted
NLL); a number ``l2`` is one fit, as ``method="auto"`` fits these maps (its paired rule against TS is the
check). Vector scaling takes Newton steps (:mod:`.solvers.vector_newton`), matrix and Dirichlet L-BFGS on Δ
through :func:`.solvers.linear_maps.isotropic_scale`'s variables (:mod:`.solvers.lbfgs`: a time warning before a long fit, a
progress bar, Ctrl-C keeps the best state), once their :data:`.solvers.linear_maps.CHECKED_MATRIX_FOOTPRINT` is known to fit
in memory (:mod:`.memory`).
None of these maps is guaranteed to keep the argmax: per-class scales and biases can reorder classes.

The fits are plain functions of (logits, labels) — :func:`fit_vector`, :func:`fit_matrix`,
:func:`fit_dirichlet` — that the calibrators below wrap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .._warnings import warn_user
from .solvers import lbfgs
from .memory import Footprint, work_dtype
from .base import Calibrator, check_fit_logits
from .options import Range, check_fields, ranged, require
from .fit_context import fit_context
from .requirements import DataRequirements
from .holdout import Fold, FoldLayout, cross_fitting_folds, default_folds, distinct_rows, fit_groups, select_by_cross_fitting
from .temperature import GUO_2017_CITATION, fit_inverse_temperature, near_bound, temperature_warnings
from .solvers.linear_maps import (CHECKED_MATRIX_FOOTPRINT, DIRICHLET, MATRIX, VECTOR, LinearMap, Parameters, Problems, matrix_cost_bound,
                          ridge_strengths)
from .solvers.vector_newton import SCALE_BOUNDS

#: the ridge's λ of probmetrics' svs/sms default (Berta et al., 2026): the one candidate of the default check
DEFAULT_L2 = 1.0
#: candidate λ of the cross-fitted selection (l2=None) after temperature scaling (λ = ∞), strongest first
DEFAULT_L2_GRID = (DEFAULT_L2,)
#: λ: at 10⁴ the map is temperature scaling's to within what a fit can tell (λ = ∞ is a candidate of the selection)
L2 = Range(0.0, 1e4)
#: what the linear maps need: per-class parameters, and errors to learn a confidence from
LINEAR_REQUIREMENTS = DataRequirements(rows=10, classes=2, errors=1, advised_rows=100, per_class=True)
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
            optimum after 200 iterations and reaches it after 600–700). A check's fits run jointly on small data
            (:mod:`.solvers.linear_maps`) take as many each; for matrix and Dirichlet, a joint run that spends
            ``min(max_iter, 70)`` iterations goes on one fit at a time, each with ``max_iter`` more.
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


class _Interrupted(Exception):
    """Ctrl-C stopped a fit of the cross-fitted selection (where the fit context allows it)."""


def fit_towards_temperature(linear_map: LinearMap, logits: torch.Tensor, labels: torch.Tensor, options: RegularisedOptions) -> Tuple[Parameters, Dict[str, Any]]:
    """Fit ``linear_map`` on (N, C) logits and (N,) labels with the pull towards temperature scaling.

    λ is ``options.l2``, or selected by cross-fitting (module docstring). Returns the parameters
    and a summary: ``l2`` (None when temperature scaling itself was chosen), ``temperature``,
    ``l2_cv_nll`` (cross-fitted mean NLL of each candidate tried, ``"inf"`` for TS), the fit's
    ``iterations``, ``converged``, and ``warnings`` (one line each: the starting temperature at a bound or without a
    minimum, no convergence, a scale at its bound, Ctrl-C).
    """
    x = linear_map.features(logits.detach().to(work_dtype(*logits.shape)))
    beta = fit_inverse_temperature(x, labels)[0]
    at_temperature = linear_map.at_temperature(beta, x.shape[1], x.dtype, x.device)
    start_lines = temperature_warnings(beta, x, labels, method=linear_map.name, start=True)
    summary: Dict[str, Any] = {"temperature": 1.0 / beta, "warnings": start_lines}
    groups = fit_groups(logits)
    strength, fitted = options.l2, None
    if strength is None:
        try:
            folds = cross_fitting_folds(labels, default_folds(options.folds, *logits.shape), options.seed, groups)
            check = _Check(linear_map, x, labels, beta, options, folds, groups)
            selection = select_by_cross_fitting((math.inf, *options.l2_grid), folds, check.held_out_nll)
        except _Interrupted:
            summary["interrupted"] = _interrupted(linear_map.name, "during the l2 selection: temperature scaling's solution is kept")
            return at_temperature, {**summary, "l2": None}
        strength, fitted = selection.chosen, check.on_all_rows.get(selection.chosen)
        summary["l2_cv_nll"] = selection.scores
    summary["l2"] = None if math.isinf(strength) else strength
    if math.isinf(strength):
        return at_temperature, summary
    if fitted is None:
        problem = Problems([beta], [ridge_strengths(strength, distinct_rows(groups), x.shape[1])], [at_temperature])
        fitted = _problem(linear_map.fit(x, labels, problem, options.max_iter, f"{linear_map.name} fit"), 0)
    parameters, fit = fitted
    if fit.pop("interrupted", False):
        summary["interrupted"] = _interrupted(linear_map.name, "during the fit: the best state so far is kept")
    summary["warnings"] += _fit_warnings(linear_map.name, fit, options, scale_named=bool(start_lines) and near_bound(beta))
    return parameters, {**fit, **summary}


def _problem(fitted: Tuple[List[Parameters], Dict[str, Any]], index: int) -> Tuple[Parameters, Dict[str, Any]]:
    """Problem ``index``'s parameters and summary (its entry of each per-problem list) of a :class:`Problems` fit."""
    parameters, summary = fitted
    return parameters[index], {key: value[index] if isinstance(value, list) else value for key, value in summary.items()}


class _Check:
    """The fits of the cross-fitted check of λ against TS over ``folds``: each fold's TS, then its fits warm-started
    along the λ path, each ridged by the distinct rows (``groups``) it is fitted on.

    On small data (:meth:`.solvers.linear_maps.LinearMap.fits_jointly`) the K fold fits of a λ and the fit on all rows are one
    joint fit (:class:`Problems`), the latter kept in ``on_all_rows`` so that a chosen λ is not refitted; above it
    each fold is fitted on its own rows (a view when they are one run: :class:`.holdout.FoldLayout`), and the choice
    is refitted after.
    """

    def __init__(self, linear_map: LinearMap, x: torch.Tensor, labels: torch.Tensor, beta: float,
                 options: RegularisedOptions, folds: List[Fold], groups: torch.Tensor) -> None:
        self.map, self.options, self.layout, self.folds = linear_map, options, FoldLayout(folds), len(folds)
        self.x, self.labels, groups = self.layout.arrange(x), self.layout.arrange(labels), self.layout.arrange(groups)
        #: problem 0 is the fit on all rows, problem k + 1 fold k's (each fold's rows copied in turn, when not a view)
        self.betas = [beta] + [fit_inverse_temperature(self.layout.fitting(self.x, fold), self.layout.fitting(self.labels, fold),
                                                       start=beta)[0] for fold in range(self.folds)]
        self.distinct = [distinct_rows(groups)] + [distinct_rows(self.layout.fitting(groups, fold)) for fold in range(self.folds)]
        self.starts = [linear_map.at_temperature(b, x.shape[1], x.dtype, x.device) for b in self.betas]
        self.joint = linear_map.fits_jointly(self.folds + 1, *x.shape)
        self.on_all_rows: Dict[float, Tuple[Parameters, Dict[str, Any]]] = {}

    def held_out_nll(self, strength: float, fold: int) -> torch.Tensor:
        """The (n_k,) NLL of fold ``fold``'s held-out rows under its fit at λ = ``strength`` (TS at ∞)."""
        if not math.isinf(strength) and (not self.joint or strength not in self.on_all_rows):
            self._fit(strength, fold)
        with torch.no_grad():
            calibrated = self.map.transform(self.layout.held(self.x, fold), self.starts[fold + 1])
            return F.cross_entropy(calibrated, self.layout.held(self.labels, fold), reduction="none")

    def _fit(self, strength: float, fold: int) -> None:
        """Fit fold ``fold`` at λ = ``strength`` (jointly: every fold and all rows) from the path's last fit."""
        problems = range(self.folds + 1) if self.joint else [fold + 1]
        rows = None
        if self.joint:
            rows = torch.ones(len(problems), len(self.x), dtype=torch.bool, device=self.x.device)
            for held in range(self.folds):
                rows[held + 1, self.layout.bounds[held]:self.layout.bounds[held + 1]] = False
        ridges = [ridge_strengths(strength, self.distinct[p], self.x.shape[1]) for p in problems]
        batch = Problems([self.betas[p] for p in problems], ridges, [self.starts[p] for p in problems], rows)
        x, labels = (self.x, self.labels) if self.joint else (self.layout.fitting(self.x, fold), self.layout.fitting(self.labels, fold))
        what = f"{self.folds} folds and all rows" if self.joint else f"fold {fold + 1} of {self.folds}"
        fitted = self.map.fit(x, labels, batch, self.options.max_iter, f"{self.map.name}: l2 = {strength:g}, {what}")
        if fitted[1].get("interrupted"):
            raise _Interrupted
        for index, problem in enumerate(problems):
            self.starts[problem] = fitted[0][index]
        if self.joint:
            self.on_all_rows[strength] = _problem(fitted, 0)


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


def fit_vector(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Vector scaling towards TS on (N, C) logits and (N,) labels: ({"scale", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(VECTOR, logits, _checked_labels(logits, labels), options or RegularisedOptions())


def fit_matrix(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Matrix scaling towards TS: ({"weight", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(MATRIX, logits, _checked_labels(logits, labels), options or RegularisedOptions())


def fit_dirichlet(logits: torch.Tensor, labels: torch.Tensor, options: Optional[RegularisedOptions] = None) -> Tuple[Parameters, Dict[str, Any]]:
    """Dirichlet calibration towards TS, W log softmax(z) + b: ({"weight", "bias"}, summary); see :func:`fit_towards_temperature`."""
    return fit_towards_temperature(DIRICHLET, logits, _checked_labels(logits, labels), options or RegularisedOptions())


def _checked_labels(logits: Any, labels: Any) -> torch.Tensor:
    """The labels as (N,) int64, once (N, C) floating, finite ``logits`` and labels in 0 … C − 1 are checked
    (:func:`.base.check_fit_logits`: a ValueError naming what is wrong, as ``Calibrator.fit_logits`` gives)."""
    classes = logits.shape[1] if isinstance(logits, torch.Tensor) and logits.ndim == 2 else 0
    return check_fit_logits(logits, labels, classes)


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
        parameters, summary = fit_towards_temperature(VECTOR, logits, labels, options)
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
    footprint = CHECKED_MATRIX_FOOTPRINT
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
