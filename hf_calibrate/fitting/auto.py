"""``method="auto"``: the calibration for this model, chosen by cross-fitted held-out NLL, then refitted on all the data.

One pass of the base model caches the calibration logits; every candidate is a logit method with its defaults.
Each is fitted K times, each time on all folds but one, and scores the fold it did not see, so every calibration
sample is scored once by a fit that never saw it (:func:`cross_fitted_nll`). Temperature scaling, the simplest, is
the reference: another candidate is chosen only when the 95 % interval of its paired per-sample NLL difference to
temperature scaling lies below 0, and among those the simplest whose NLL is not shown worse than the best one's
(:func:`choose`). The chosen method is refitted on all the data, so the result is a model of that method; its
``fit_summary["auto"]`` keeps every candidate's score, interval and the reason for the choice (docs/design.md §3.5).

Neural Clamping and the head methods are not candidates: each fold would need passes of the base model.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..backbones import Backbone
from .._warnings import warn_user
from ..calibrators import Calibrator, InvalidOptionError, RegularisedOptions, calibrator_class
from ..calibrators.base import FitContext, check_fields, check_fit_logits, require
from ..calibrators.holdout import Fold, paired_difference, shown_below_zero, stratified_folds
from ..calibrators.requirements import MORE_DATA_FIX, DataRequirements, check_calibration_data
from ..data import CalibrationData
from ..metrics.interval_options import MIN_INTERVAL_SAMPLES
from .engine import Engine
from .families import fit_on_cached_logits
from .probing import probe

#: the method name that asks for the choice
AUTO = "auto"
#: the candidates, simplest first: one temperature; a scale and a bias per class, of the logits (vector) or of the
#: smoothed log-probabilities (structured vector); a full linear map of the logits (matrix), or of the
#: log-probabilities (Dirichlet); then the non-parametric maps, which may change predictions
CANDIDATES = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "histogram", "isotonic")
#: the candidate every other must beat: the simplest, and the one that needs the least data
REFERENCE = "temperature"
#: what a fold's fit reports: nothing (the refit on all the data reports as any fit does)
QUIET = FitContext(announce=False)


@dataclasses.dataclass
class AutoOptions:
    """Options of ``method="auto"``.

    Attributes:
        candidates: the methods to choose among, any of :data:`CANDIDATES` (default: all of them). Temperature
            scaling is always a candidate: it is the reference the others must beat.
        folds: K of the K-fold cross-fitting that scores the candidates (2 to 20, default 5; at most the number of
            calibration samples).
    """

    candidates: Optional[Sequence[str]] = None
    folds: int = 5

    def __post_init__(self) -> None:
        check_fields(self)
        require(2 <= self.folds <= 20, "folds", self.folds, "an integer from 2 to 20")
        if self.candidates is None:
            return
        require(len(self.candidates) > 0, "candidates", self.candidates,
                f"a non-empty list of methods among {', '.join(CANDIDATES)} (leave it out for all of them)")
        unknown = [name for name in self.candidates if name not in CANDIDATES]
        if unknown:
            raise InvalidOptionError(
                f"option candidates names {unknown}, which auto does not choose among; it chooses among the logit methods "
                f"{', '.join(CANDIDATES)}. Neural Clamping and the head methods would need passes of the base model for "
                "every fold: fit them by name, and compare them with `hf-calibrate compare`."
            )
        require(len(set(self.candidates)) == len(self.candidates), "candidates", list(self.candidates), "distinct method names")
        self.candidates = list(self.candidates)

    def methods(self) -> List[str]:
        """The candidates in :data:`CANDIDATES` order (simplest first), temperature scaling always among them."""
        chosen = set(self.candidates or CANDIDATES) | {REFERENCE}
        return [name for name in CANDIDATES if name in chosen]


@dataclasses.dataclass
class Scored:
    """One candidate: its fit on all the calibration data and its cross-fitted score.

    Attributes:
        method: the candidate's method name.
        nll: (N,) float64 held-out NLL of every calibration sample (nats), or None when the candidate was left out.
        reason: why it was left out (None when scored).
        seconds: the wall time of its fits (on all the data, then on the folds).
        fitted: (calibrator fitted on all the data, its fit summary, its options, the warnings its fit raised), or None.
    """

    method: str
    nll: Optional[torch.Tensor]
    reason: Optional[str] = None
    seconds: float = 0.0
    fitted: Optional[Tuple[Calibrator, Dict[str, Any], Any, List[warnings.WarningMessage]]] = None


def fit_on_all(method: str, logits: torch.Tensor, labels: torch.Tensor, engine: Engine) -> Tuple[Calibrator, Dict[str, Any], Any, List[warnings.WarningMessage]]:
    """``method`` with its defaults fitted on all the (N, C) ``logits`` and (N,) ``labels`` as a fit of it by name
    would be; the warnings it raises are kept, not shown (only the chosen method's are the user's)."""
    cls = calibrator_class(method)
    seeded = {"seed": engine.options.seed} if "seed" in {field.name for field in dataclasses.fields(cls.Options)} else {}
    options = cls.Options(**seeded)  # as fit(method=..., seed=...) sets a method's own seed with the fit's
    calibrator = cls.create(logits.shape[1], options).to(logits.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fit_on_cached_logits(calibrator, options, logits, labels, engine)
    return calibrator, summary, options, list(caught)


def fold_options(options: Any, summary: Dict[str, Any]) -> Optional[Any]:
    """The options a candidate is fitted with on the folds: a linear map's l2 strength held at what its fit on all the
    data chose (its own cross-fitting of that choice would make the folds' fits 5× dearer), other options as they
    are; None when that fit chose temperature scaling itself (no l2), whose folds are temperature scaling's."""
    if not isinstance(options, RegularisedOptions) or options.l2 is not None:
        return options
    return None if summary.get("l2") is None else dataclasses.replace(options, l2=summary["l2"])


def cross_fitted_nll(method: str, options: Any, logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold]) -> torch.Tensor:
    """(N,) float64 per-sample NLL (nats) of ``method`` with ``options`` on (N, C) ``logits`` and (N,) ``labels``, each
    sample scored by the fit on the folds that do not hold it. A fold's fitting rows below the method's least data
    raise :class:`~hf_calibrate.calibrators.InsufficientDataError`."""
    cls = calibrator_class(method)
    needs = getattr(cls, "requirements", DataRequirements())
    scores = torch.empty(len(labels), dtype=torch.float64)
    for fit_rows, held_rows in folds:
        check_calibration_data(logits[fit_rows], labels[fit_rows], method, needs)
        calibrator = cls.create(logits.shape[1], options).to(logits.device)
        with warnings.catch_warnings():  # a fold's fit is not the user's fit
            warnings.simplefilter("ignore")
            calibrator.fit_logits(logits[fit_rows], labels[fit_rows], options, QUIET)
        calibrator.is_fitted = True
        with torch.no_grad():
            held = calibrator(logits[held_rows]).double()
        scores[held_rows] = torch.nn.functional.cross_entropy(held, labels[held_rows], reduction="none").cpu()
    return scores


def absent_classes_reason(method: str, num_classes: int, labels: torch.Tensor) -> Optional[str]:
    """Why a method with per-class parameters cannot be a candidate when classes are absent from the calibration data
    (None otherwise): no held-out row of an absent class exists, so cross-fitting cannot see what the fit does to it."""
    present = int(torch.unique(labels).numel())
    if present == num_classes or not getattr(calibrator_class(method), "requirements", DataRequirements()).per_class:
        return None
    return (f"{num_classes - present} of the {num_classes} classes are absent from the calibration data; {method} has "
            "per-class parameters, and no held-out row can show what it does to those classes")


def score_candidate(method: str, logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold], engine: Engine,
                    reference: Optional[torch.Tensor]) -> Scored:
    """One candidate fitted on all the data and scored by cross-fitting (``reference``: temperature scaling's scores,
    which a linear map that chose temperature scaling shares). Data below the candidate's least, or that its fit
    refuses, leave it out with the reason; the reference, temperature scaling, is never excused (its error is the user's)."""
    start = time.perf_counter()
    absent = absent_classes_reason(method, logits.shape[1], labels)
    if absent is not None:
        return Scored(method, None, absent, 0.0)
    try:
        fitted = fit_on_all(method, logits, labels, engine)
        options = fold_options(fitted[2], fitted[1])
        nll = reference if options is None else cross_fitted_nll(method, options, logits, labels, folds)
    except ValueError as error:  # InsufficientDataError is one
        if method == REFERENCE:
            raise
        return Scored(method, None, str(error).replace(f" {MORE_DATA_FIX}", ""), time.perf_counter() - start)
    return Scored(method, nll, None, time.perf_counter() - start, fitted)


def score_candidates(methods: Sequence[str], logits: torch.Tensor, labels: torch.Tensor, folds: Sequence[Fold],
                     engine: Engine, bar: Any) -> List[Scored]:
    """:func:`score_candidate` of every method, temperature scaling (the first) included."""
    scored: List[Scored] = []
    for method in methods:
        reference = scored[0].nll if scored else None
        scored.append(score_candidate(method, logits, labels, folds, engine, reference))
        bar.update(1)
    return scored


@dataclasses.dataclass
class Choice:
    """What :func:`choose` decided: the method, the reason in words, and each scored candidate's paired NLL difference
    to temperature scaling (:func:`~hf_calibrate.calibrators.holdout.paired_difference`; the reference's is None)."""

    method: str
    reason: str
    versus_reference: Dict[str, Optional[Dict[str, Optional[float]]]]


def _interval(difference: Dict[str, Optional[float]]) -> str:
    return f"{difference['point']:+.4f} nats per sample, 95 % interval [{difference['low']:+.4f}, {difference['high']:+.4f}]"


def choose(scored: Sequence[Scored]) -> Choice:
    """Temperature scaling, unless other candidates' held-out NLL is lower beyond the 95 % interval of the paired
    difference; then the simplest of those (``scored`` is simplest first) not shown worse than the best of them."""
    nll = {entry.method: entry.nll for entry in scored if entry.nll is not None}
    reference = nll[REFERENCE]
    versus = {method: None if method == REFERENCE else paired_difference(scores - reference) for method, scores in nll.items()}
    better = [method for method in nll if shown_below_zero(versus[method])]
    if not better:
        samples = len(reference)
        evidence = ("no other candidate's held-out NLL was lower than temperature scaling's beyond the 95 % interval of "
                    "the paired difference" if samples >= MIN_INTERVAL_SAMPLES else f"{samples} samples are too few for an interval")
        return Choice(REFERENCE, f"{evidence}, so temperature scaling, the simplest, is kept.", versus)
    best = min(better, key=lambda method: float(nll[method].mean()))
    chosen = next(method for method in better if method == best or not _shown_worse(nll[method] - nll[best]))
    reason = f"{chosen}'s held-out NLL minus temperature scaling's: {_interval(versus[chosen])}"
    if chosen != best:
        reason += f"; the simplest of the {len(better)} candidates that beat temperature scaling whose NLL is not shown worse than the best one's ({best})"
    elif len(better) > 1:
        reason += f"; the best of the {len(better)} candidates that beat temperature scaling"
    return Choice(chosen, reason + ".", versus)


def _shown_worse(differences: torch.Tensor) -> bool:
    low = paired_difference(differences)["low"]
    return low is not None and low > 0


def auto_record(scored: Sequence[Scored], choice: Choice, logits: torch.Tensor, labels: torch.Tensor, folds: int) -> Dict[str, Any]:
    """``fit_summary["auto"]``: the choice, its reason, and one row per candidate (held-out NLL, paired difference to
    temperature scaling, seconds, why it was left out, whether its own selection chose temperature scaling itself),
    after a row for the uncalibrated model (not cross-fitted: it has nothing to fit)."""
    uncalibrated = torch.nn.functional.cross_entropy(logits.double(), labels, reduction="none").cpu()
    reference = next(entry.nll for entry in scored if entry.method == REFERENCE)
    rows = [{"method": "uncalibrated", "held_out_nll": float(uncalibrated.mean()),
             "versus_temperature": paired_difference(uncalibrated - reference), "seconds": 0.0, "excluded": None}]
    for entry in scored:
        shares = entry.method != REFERENCE and entry.nll is not None and entry.nll is reference
        rows.append({"method": entry.method, "held_out_nll": None if entry.nll is None else float(entry.nll.mean()),
                     "versus_temperature": None if shares else choice.versus_reference.get(entry.method),
                     "seconds": entry.seconds, "excluded": entry.reason, "is_temperature_scaling": shares})
    return {"chosen": choice.method, "reason": choice.reason, "folds": folds, "samples": len(labels), "candidates": rows}


def fit_auto(backbone: Backbone, data: CalibrationData, options: AutoOptions, engine: Engine) -> Tuple[Calibrator, Dict[str, Any], Any]:
    """Choose among ``options.methods()`` on ``data`` through the frozen ``backbone``; the chosen method's fit on all
    of it is the result.

    Returns the fitted calibrator (on every process the main process's), its fit summary with ``"auto"``
    (:func:`auto_record`), and the chosen method's options (its defaults). The chosen fit's warnings are the user's.
    """
    num_classes, _ = probe(backbone, data, engine)
    logits, labels = engine.collect_logits(backbone, data)
    labels = check_fit_logits(logits, labels, num_classes)
    folds = stratified_folds(labels, options.folds, engine.options.seed)
    methods = options.methods()
    with engine.progress(len(methods), f"auto: {len(methods)} methods, each fitted and {len(folds)}-fold cross-fitted") as bar:
        scored = score_candidates(methods, logits, labels, folds, engine, bar)
    choice = choose(scored)
    calibrator, summary, chosen_options, caught = next(entry.fitted for entry in scored if entry.method == choice.method)
    for warning in caught if engine.is_main else []:
        warn_user(str(warning.message), warning.category)
    if len(folds) < options.folds:
        summary["warnings"] = [*summary.get("warnings", []), f"auto: folds={options.folds} is more than the {len(labels)} "
                               f"calibration rows; {len(folds)} folds were used (one row held out in each)."]
    summary["auto"] = auto_record(scored, choice, logits, labels, len(folds))
    engine.broadcast_module(calibrator)
    return calibrator, summary, chosen_options
