"""How ``method="auto"`` scores a logit candidate: fitted on all the calibration logits, then cross-fitted on K folds
so that every row's held-out NLL comes from a fit that never saw it (:mod:`.selection` chooses on these scores)."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch

from ..._warnings import relayed, warn_user
from ...calibrators import Calibrator, RegularisedOptions, calibrator_class
from ...calibrators.solvers import lbfgs
from ...calibrators import memory
from ...calibrators.linear import DEFAULT_L2
from ...calibrators.solvers.linear_maps import matrix_cost_bound
from ...calibrators.base import FitContext
from ...calibrators.holdout import Fold
from ...calibrators.requirements import (MORE_DATA_FIX, DataRequirements, absent_classes, absent_classes_phrase,
                                          check_calibration_data)
from ..runtime.engine import Engine
from ..families import fit_on_cached_logits

#: the candidate every other must beat: the simplest, and the one that needs the least data
REFERENCE = "temperature"
#: the options whose None asks a method to select a strength by cross-fitting (its summary says which it chose; None
#: there: the strongest, ∞)
SELECTED_STRENGTHS = ("l2", "prior")
#: what a fold's fit reports: nothing (the refit on all the data reports as any fit does)
QUIET = FitContext(announce=False)


@dataclasses.dataclass
class Scored:
    """One candidate: its fit on all the calibration data and its cross-fitted score.

    Attributes:
        method: the candidate's method name.
        nll: (N,) float64 held-out NLL of every calibration sample (nats), or None when the candidate was left out.
        reason: why it was left out (None when scored).
        seconds: the wall time of its fits (on all the data, then on the folds).
        fitted: (calibrator fitted on all the data, its fit summary, its options, the warnings that are the user's only
            when it is chosen: a head's feature pass's), or None. The warnings its fits raise are said as they happen
            (:func:`candidate_warnings`).
        scoring: how ``nll`` was scored when not on auto's own folds (Neural Clamping's: its own fit's), else None.
    """

    method: str
    nll: Optional[torch.Tensor]
    reason: Optional[str] = None
    seconds: float = 0.0
    fitted: Optional[Tuple[Calibrator, Dict[str, Any], Any, List[warnings.WarningMessage]]] = None
    scoring: Optional[str] = None


def default_options(method: str, engine: Engine) -> Any:
    """``method``'s default options, with the fit's seed where the method has its own (as ``fit(method=..., seed=...)``
    sets it), and a linear map's ridge at its default λ (:data:`~hf_calibrate.calibrators.linear.DEFAULT_L2`) without
    the cross-fitted check against temperature scaling its fit by name makes: auto's paired rule is that check, on
    auto's own folds (it would cost 5 more fits per fit)."""
    cls = calibrator_class(method)
    names = {field.name for field in dataclasses.fields(cls.Options)}
    given = {"seed": engine.options.seed} if "seed" in names else {}
    if issubclass(cls.Options, RegularisedOptions):
        given["l2"] = DEFAULT_L2
    return cls.Options(**given)


def candidate_warnings(method: str, engine: Engine) -> ContextManager[None]:
    """Around a candidate's fit on all the data: each warning it raises is said at once (on the main process), once,
    named as the candidate's with the way to leave it out (a long fit's time warning comes before that fit runs).
    Its fold fits stay silent (:func:`score_folds`): refits of the same method on fewer rows, they would only repeat
    it K times."""
    return relayed(f"auto, candidate {method} (name the other candidates in candidates=[...] to leave it out): ", engine.is_main)


def fit_on_all(method: str, logits: torch.Tensor, labels: torch.Tensor, engine: Engine,
               groups: Optional[torch.Tensor] = None) -> Tuple[Calibrator, Dict[str, Any], Any]:
    """``method`` with its defaults fitted on all the (N, C) ``logits`` and (N,) ``labels`` as a fit of it by name
    would be: (calibrator, fit summary, options). The warnings it raises are said as they happen, named
    (:func:`candidate_warnings`); its summary's warning lines are the user's only when it is chosen. ``groups``: the
    rows' content ids (computed when None)."""
    options = default_options(method, engine)
    calibrator = calibrator_class(method).create(logits.shape[1], options).to(logits.device)
    with candidate_warnings(method, engine):
        summary = fit_on_cached_logits(calibrator, options, logits, labels, engine, groups, announce=method not in TIMED)
    return calibrator, summary, options


#: the candidates whose fits are L-BFGS runs over a C×C map: timed, and their cost said, before they start
TIMED = ("matrix", "dirichlet", "structured_matrix")


def announce_cost(method: str, logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold],
                  engine: Engine) -> None:
    """Before a :data:`TIMED` candidate starts: refuse it (:class:`~hf_calibrate.calibrators.memory.FitTooLargeError`,
    which leaves it out with the reason) when its fit cannot fit in memory, and say about how long its K + 1 fits will
    take when that is more than :data:`~hf_calibrate.calibrators.solvers.lbfgs.WARN_AFTER_SECONDS`, from one timed evaluation
    of its objective (:func:`~hf_calibrate.calibrators.solvers.linear_maps.matrix_cost_bound`)."""
    rows, classes = logits.shape
    if method not in TIMED:
        return
    what = f"{method} on {rows:,} x {classes:,} logits"
    memory.check_fits(calibrator_class(method).footprint, rows, classes, what, logits.device)
    if not engine.is_main or rows * classes**2 < lbfgs.TIME_FROM_WORK:
        return
    bound = matrix_cost_bound(logits.detach().float(), labels, len(folds) + 1, RegularisedOptions().max_iter)
    if bound.typical_seconds > lbfgs.WARN_AFTER_SECONDS:
        warn_user(f"auto, candidate {method}: about {lbfgs.duration(bound.typical_seconds)} for its {len(folds) + 1} fits "
                  f"(on all rows and on {len(folds)} folds; {bound.describe()}); name the other candidates in "
                  "candidates=[...] to leave it out.")


def fold_options(options: Any, summary: Dict[str, Any]) -> Optional[Any]:
    """The options a candidate is fitted with on the folds: a strength its options leave to a cross-fitted selection (a
    linear map's ``l2=None``, a binning's ``prior=None``) held at what its fit on all the data chose (the selection's own
    K-fold path inside each of auto's folds would make them K times dearer), other options as they are. None when a
    linear map's selection chose temperature scaling itself, whose folds are temperature scaling's."""
    for name in SELECTED_STRENGTHS:
        if hasattr(options, name) and getattr(options, name) is None:
            chosen = summary.get(name)
            if chosen is None and isinstance(options, RegularisedOptions):
                return None
            held = copy.copy(options)  # set, not replaced: m = ∞ is a candidate of the selection, not an option value
            setattr(held, name, math.inf if chosen is None else chosen)
            return held
    return options


def score_folds(folds: Sequence[Fold], samples: int, held_out_nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """(``samples``,) float64 per-sample NLL (nats): for each (fitting rows, held rows) of ``folds``,
    ``held_out_nll(fitting rows, held rows)`` fits on the fitting rows and returns the held rows' NLL; a fold's fit
    is not the user's fit, so its warnings are not shown."""
    scores = torch.empty(samples, dtype=torch.float64)
    for fit_rows, held_rows in folds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scores[held_rows.cpu()] = held_out_nll(fit_rows, held_rows).double().cpu()
    return scores


def cross_fitted_nll(method: str, options: Any, logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold],
                     groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N,) float64 per-sample NLL (nats) of ``method`` with ``options`` on (N, C) ``logits`` and (N,) ``labels``, each
    sample scored by the fit on the folds that do not hold it (``groups``: the rows' content ids, handed to each fold's
    fit; None: each computes its own). A fold's fitting rows below the method's least data raise
    :class:`~hf_calibrate.calibrators.InsufficientDataError`."""
    cls = calibrator_class(method)
    needs = getattr(cls, "requirements", DataRequirements())

    def held_out_nll(fit_rows: torch.Tensor, held_rows: torch.Tensor) -> torch.Tensor:
        check_calibration_data(logits[fit_rows], labels[fit_rows], method, needs,
                               where=f"each fold's fitting rows (one of auto's {len(folds)} folds fits on {len(fit_rows)} "
                                     f"of the {len(labels)} rows)")
        calibrator = cls.create(logits.shape[1], options).to(logits.device)
        context = QUIET if groups is None else dataclasses.replace(QUIET, groups=groups[fit_rows.to(groups.device)])
        calibrator.fit_logits(logits[fit_rows], labels[fit_rows], options, context)
        calibrator.is_fitted = True
        with torch.no_grad():
            held = calibrator(logits[held_rows]).double()
        return torch.nn.functional.cross_entropy(held, labels[held_rows], reduction="none")

    return score_folds(folds, len(labels), held_out_nll)


def absent_classes_reason(method: str, num_classes: int, labels: torch.Tensor) -> Optional[str]:
    """Why a method with per-class parameters (a per-class logit map, or a head's output weights) cannot be a
    candidate when classes are absent from the calibration data (None otherwise): no held-out row of an absent class
    exists, so cross-fitting cannot see what the fit does to it."""
    absent = absent_classes(labels, num_classes)
    if not absent or not getattr(calibrator_class(method), "requirements", DataRequirements()).per_class:
        return None
    return (f"{absent_classes_phrase(absent, num_classes)}; {method} has per-class parameters, and no held-out row can "
            "show what it does to those classes")


def score_candidate(method: str, logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold], engine: Engine,
                    reference: Optional[torch.Tensor], groups: Optional[torch.Tensor] = None) -> Scored:
    """One candidate fitted on all the data and scored by cross-fitting (``reference``: temperature scaling's scores,
    which a linear map that chose temperature scaling shares; ``groups``: the rows' content ids). Data below the
    candidate's least, or that its fit refuses (too little data, too little memory: :func:`announce_cost`), leave it
    out with the reason; the reference, temperature scaling, is never excused (its error is the user's)."""
    start = time.perf_counter()
    absent = absent_classes_reason(method, logits.shape[1], labels)
    if absent is not None:
        return Scored(method, None, absent, 0.0)
    try:
        announce_cost(method, logits, labels, folds, engine)
        calibrator, summary, options = fit_on_all(method, logits, labels, engine, groups)
        fold = fold_options(options, summary)
        nll = reference if fold is None else cross_fitted_nll(method, fold, logits, labels, folds, groups)
    except ValueError as error:  # InsufficientDataError is one
        if method == REFERENCE:
            raise
        return Scored(method, None, str(error).replace(f" {MORE_DATA_FIX}", ""), time.perf_counter() - start)
    return Scored(method, nll, None, time.perf_counter() - start, (calibrator, summary, options, []))


def score_candidates(methods: Sequence[str], logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold],
                     engine: Engine, bar: Any, groups: Optional[torch.Tensor] = None) -> List[Scored]:
    """:func:`score_candidate` of every method, temperature scaling (the first) included (``groups``: the rows'
    content ids, computed once by the caller)."""
    scored: List[Scored] = []
    for method in methods:
        reference = scored[0].nll if scored else None
        scored.append(score_candidate(method, logits, labels, folds, engine, reference, groups))
        bar.update(1)
    return scored
