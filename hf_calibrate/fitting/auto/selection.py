"""``method="auto"``: the calibration for this model, chosen by cross-fitted held-out NLL, then refitted on all the data.

One pass of the base model caches the calibration logits; every logit candidate is a logit method with its defaults.
Each is fitted K times, each time on all folds but one, and scores the fold it did not see, so every calibration
sample is scored once by a fit that never saw it (:mod:`.scoring`). Neural Clamping takes part when its
estimated time fits the ``budget`` option, scored by its own cross-fitted fit (:mod:`.clamping`). Temperature
scaling, the simplest, is the reference: another candidate is chosen only when the 95 % interval of its paired
per-sample NLL difference to temperature scaling lies below 0, and among those the simplest whose NLL is not shown
worse than the best one's (:func:`choose`). The chosen method's fit on all the data is the result, a model of that
method; its ``fit_summary["auto"]`` keeps every candidate's score, interval and the reason for the choice, with
the evidence of its last step: each compared candidate's paired difference to the best (docs/design.md §3.5). A
warning a candidate's fit raises is said as it happens, named (:func:`.scoring.candidate_warnings`).

The head methods take part when named among the candidates, each trained on the base's features once per fold
(:mod:`.heads`).

The candidates are the registered methods whose class lets auto try them (:attr:`~hf_calibrate.calibrators.Calibrator.auto_role`,
:func:`all_candidates`): a new logit method is one unless it says otherwise, ranked after the built-in ones
(:data:`SIMPLEST_FIRST`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch

from ...backbones import Backbone
from ... import _distributed
from ..._warnings import warn_user
from ...calibrators import CALIBRATORS, Calibrator, InvalidOptionError, NeuralClamping, options_to_dict
from ...calibrators.base import AutoRole, check_fit_logits
from ...calibrators.options import Range, check_fields, ranged, require
from ...calibrators.holdout import content_groups, cross_fitting_folds, default_folds, paired_difference, repeated_rows, shown_below_zero
from ...data import CalibrationData
from ...metrics.interval_options import MIN_INTERVAL_SAMPLES
from .clamping import CLAMPING, budget_reason, estimated_seconds, score_clamping
from .heads import score_heads
from .scoring import REFERENCE, Scored, score_candidates
from ..runtime.engine import Engine
from ..runtime.probing import probe

#: the method name that asks for the choice
AUTO = "auto"
#: the built-in logit methods, simplest first: one temperature; a scale and a bias per class, of the logits (vector) or
#: of the smoothed log-probabilities (structured vector); a full linear map of the logits (matrix), of the
#: log-probabilities (Dirichlet) or of the smoothed ones (structured matrix); then the non-parametric maps, which may
#: change predictions. It only ranks them (which are candidates is the registry's, :func:`logit_candidates`): a logit
#: method it does not name comes after them, in registration order, so that auto prefers a simpler one it knows
SIMPLEST_FIRST = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix", "histogram",
                  "isotonic")


def _tried(cls: Type[Calibrator]) -> bool:
    """Whether auto may try ``cls``'s method: its ``auto_role`` is not NEVER."""
    return cls.auto_role is not AutoRole.NEVER


def logit_candidates() -> Tuple[str, ...]:
    """Every registered logit method whose class lets auto try it, simplest first: in :data:`SIMPLEST_FIRST` order,
    then the others in registration order."""
    rank = {name: index for index, name in enumerate(SIMPLEST_FIRST)}
    tried = [name for name, cls in CALIBRATORS.items() if cls.fitted_on_logits() and _tried(cls)]
    return tuple(sorted(tried, key=lambda name: rank.get(name, len(rank))))


def clamping_candidates() -> Tuple[str, ...]:
    """Neural Clamping, unless its class opts out: auto scores δ only through Neural Clamping's own fit
    (:mod:`.clamping`), so no other method fitted through the base is a candidate."""
    return (CLAMPING,) if _tried(NeuralClamping) else ()


def head_candidates() -> Tuple[str, ...]:
    """Every registered head method whose class lets auto try it, in registration order (:mod:`.heads`)."""
    return tuple(name for name, cls in CALIBRATORS.items() if cls.needs_features and _tried(cls))


def all_candidates() -> Tuple[str, ...]:
    """Every method auto can try: the logit methods (simplest first), Neural Clamping, the head methods."""
    return logit_candidates() + clamping_candidates() + head_candidates()


def default_candidates() -> Tuple[str, ...]:
    """The methods auto tries when ``candidates`` is left out: those whose class's ``auto_role`` is DEFAULT."""
    return tuple(name for name in all_candidates() if CALIBRATORS[name].auto_role is AutoRole.DEFAULT)


def candidacy(method: str) -> str:
    """Whether and when auto tries ``method``, in words (docs/methods.md): ``"by default"``, ``"when named"``, with
    ``", under a budget"`` for Neural Clamping, or ``"never"``."""
    if method not in all_candidates():
        return "never"
    when = "when named" if CALIBRATORS[method].auto_role is AutoRole.NAMED else "by default"
    return f"{when}, under a budget" if method == CLAMPING else when


def default_logit_candidates() -> Tuple[str, ...]:
    """The logit methods auto tries by default, simplest first, of the methods registered now."""
    defaults = default_candidates()
    return tuple(method for method in logit_candidates() if method in defaults)


#: the budget a user may give, in seconds: up to a week
BUDGET = Range(0.0, 7 * 24 * 3600.0, low_open=True)


@dataclasses.dataclass
class AutoOptions:
    """Options of ``method="auto"``.

    Attributes:
        candidates: the methods to choose among, any of :func:`all_candidates` (the logit methods, ``"neural_clamping"``
            and the head methods ``"tst"``, ``"vtst"``, ``"mac_cal"``; default: :func:`default_candidates`, the logit
            methods and Neural Clamping under a budget; the heads only when named: auto trains K + 1 heads each).
            Temperature scaling is always a candidate: it is the reference the others must beat.
        folds: K of the K-fold cross-fitting that scores the candidates (2 to 20; default None: 5, or 2 from 10⁷ logit
            values on, e.g. 10,000 × 1,000, where auto chose as with 5 in benchmarks/results/fold_count.md; at most the
            number of calibration samples).
        budget: seconds the whole choice may take (default None: no budget, and Neural Clamping does not take part).
            It decides only whether Neural Clamping takes part: when the estimate of its fit (from the timed pass of the
            base model) fits in what the other candidates (logit methods, then the named heads) leave of it; its row
            says why when it does not. A soft limit: the other candidates always run, and the estimate can be off.
        classifier: the layer the head candidates replace, as the head methods' own ``classifier`` option (a name in
            ``model.named_modules()``; default None: the one the model's config names, else its last ``nn.Linear``
            with one output per class). Only with a head method among the candidates.
    """

    candidates: Optional[Sequence[str]] = None
    folds: Optional[int] = None
    budget: Optional[float] = ranged(None, BUDGET)
    classifier: Optional[str] = None

    def __post_init__(self) -> None:
        check_fields(self)
        require(self.folds is None or 2 <= self.folds <= 20, "folds", self.folds, "an integer from 2 to 20, or None")
        if self.candidates is not None:
            self.candidates = _checked_candidates(self.candidates, self.budget)
        require(self.budget is None or self.considers_clamping(), "budget", self.budget,
                f"left out, or {CLAMPING} named among the candidates: the budget decides only whether Neural Clamping "
                "takes part, and these candidates leave it out")
        require(self.classifier is None or bool(self.heads()), "classifier", self.classifier,
                f"left out, or a head method ({', '.join(head_candidates())}) named among the candidates: it names the "
                "layer a head replaces" + (", and the default candidates hold no head" if self.candidates is None else ""))

    def chosen(self) -> Tuple[str, ...]:
        """The methods named among the candidates, else :func:`default_candidates`."""
        return tuple(self.candidates) if self.candidates is not None else default_candidates()

    def methods(self) -> List[str]:
        """The logit candidates in :func:`logit_candidates` order (simplest first), temperature scaling always among them."""
        chosen = set(self.chosen()) | {REFERENCE}
        return [name for name in logit_candidates() if name in chosen]

    def heads(self) -> List[str]:
        """The head candidates, in :func:`head_candidates` order."""
        return [name for name in head_candidates() if name in self.chosen()]

    def considers_clamping(self) -> bool:
        """Whether Neural Clamping has a row (taking part under a budget)."""
        return CLAMPING in self.chosen()


def _checked_candidates(candidates: Sequence[str], budget: Optional[float]) -> List[str]:
    """``candidates`` as a list; refused when empty, naming a method auto cannot try or one twice, or naming Neural
    Clamping without a ``budget``."""
    known = all_candidates()
    require(len(candidates) > 0, "candidates", candidates,
            f"a non-empty list of methods among {', '.join(known)} (leave it out for the default)")
    unknown = [name for name in candidates if name not in known]
    if unknown:
        clamping = f", {CLAMPING} (under a budget)" if clamping_candidates() else ""
        heads = f" and the head methods {', '.join(head_candidates())}" if head_candidates() else ""
        raise InvalidOptionError(
            f"option candidates names {unknown}, which auto does not choose among; it chooses among the logit methods "
            f"{', '.join(logit_candidates())}{clamping}{heads}. Fit another method by name, and compare it with the "
            "others with `hf-calibrate compare`."
        )
    require(len(set(candidates)) == len(candidates), "candidates", list(candidates), "distinct method names")
    require(CLAMPING not in candidates or budget is not None, "candidates", list(candidates),
            f"{CLAMPING} together with budget=<seconds>: its fit takes passes of the base model, and auto runs it "
            "only when its estimated time fits the budget")
    return list(candidates)


#: the last step of the rule, among the candidates that beat temperature scaling (said alike in the reason, the card,
#: docs/choosing-a-method.md and docs/design.md §3.5)
FINAL_STEP = "the simplest whose held-out NLL is not shown worse than the lowest one's"


@dataclasses.dataclass
class AutoChoice:
    """What :func:`choose` decided: the method, the reason in words, and each scored candidate's paired NLL difference
    to temperature scaling (:func:`~hf_calibrate.calibrators.holdout.paired_difference`; the reference's is None).
    ``best`` is the candidate with the lowest held-out NLL of those that beat temperature scaling (None when none
    did), and ``versus_best`` the evidence of the last step: the paired difference to it of each candidate the rule
    looked at before stopping (those that beat temperature scaling, simplest first, up to the chosen one)."""

    method: str
    reason: str
    versus_reference: Dict[str, Optional[Dict[str, Optional[float]]]]
    best: Optional[str] = None
    versus_best: Dict[str, Dict[str, Optional[float]]] = dataclasses.field(default_factory=dict)


def _interval(difference: Dict[str, Optional[float]]) -> str:
    return f"{difference['point']:+.4f} nats per sample, 95 % interval [{difference['low']:+.4f}, {difference['high']:+.4f}]"


def choose(scored: Sequence[Scored], groups: Optional[torch.Tensor] = None) -> AutoChoice:
    """Temperature scaling, unless other candidates' held-out NLL is lower beyond the 95 % interval of the paired
    difference; then, of those (``scored`` is simplest first), :data:`FINAL_STEP`. ``groups``: the (N,) content ids
    of the rows (a row and its copies count as one sample in the intervals)."""
    nll = {entry.method: entry.nll for entry in scored if entry.nll is not None}
    reference = nll[REFERENCE]
    versus = {method: None if method == REFERENCE else paired_difference(scores - reference, groups) for method, scores in nll.items()}
    better = [method for method in nll if shown_below_zero(versus[method])]
    if not better:
        samples = len(reference) - (0 if groups is None else repeated_rows(groups))
        evidence = ("no other candidate's held-out NLL was lower than temperature scaling's beyond the 95 % interval of "
                    "the paired difference" if samples >= MIN_INTERVAL_SAMPLES else f"{samples} samples are too few for an interval")
        return AutoChoice(REFERENCE, f"{evidence}, so temperature scaling, the simplest, is kept.", versus)
    best = min(better, key=lambda method: float(nll[method].mean()))
    to_best = {method: paired_difference(nll[method] - nll[best], groups) for method in better if method != best}
    chosen = next(method for method in better if method == best or not _shown_above_zero(to_best[method]))
    compared = {method: to_best[method] for method in better[: better.index(chosen) + 1] if method != best}
    reason = f"{chosen}'s held-out NLL minus temperature scaling's: {_interval(versus[chosen])}; {_final_step(better, best, chosen, compared)}"
    return AutoChoice(chosen, reason, versus, best, compared)


def _final_step(better: Sequence[str], best: str, chosen: str, compared: Dict[str, Dict[str, Optional[float]]]) -> str:
    """The last step of the rule in words, with its evidence: each compared candidate's paired difference to ``best``."""
    if len(better) == 1:
        return "it is the only candidate that beat temperature scaling."
    step = f"of the {len(better)} candidates that beat temperature scaling ({', '.join(better)}), auto takes {FINAL_STEP}"
    passed = "; ".join(f"{method} minus {best}: {_interval(difference)}" for method, difference in compared.items() if method != chosen)
    passed = passed and f"; shown worse than {best}, so passed over: {passed}"
    if chosen == best:
        return f"{step}: {chosen} has the lowest{passed or ' and is the simplest of them'}."
    return (f"{step}, {best}'s: {chosen} minus {best}: {_interval(compared[chosen])}, not shown worse{passed}; so the "
            f"simpler {chosen} is chosen.")


def _shown_above_zero(difference: Dict[str, Optional[float]]) -> bool:
    """Whether a paired difference has its whole 95 % interval above 0 (False without an interval)."""
    return difference["low"] is not None and difference["low"] > 0


def auto_record(scored: Sequence[Scored], choice: AutoChoice, logits: torch.Tensor, labels: torch.Tensor, folds: int,
                groups: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """``fit_summary["auto"]``: the choice, its reason, the best-scoring candidate of those that beat temperature
    scaling (``best``), and one row per candidate (held-out NLL, paired difference to temperature scaling and, for
    those the rule's last step compared, to ``best``; seconds, why it was left out, whether its own selection chose
    temperature scaling itself, how it was scored when not on auto's folds), after a row for the uncalibrated model
    (not cross-fitted: it has nothing to fit). ``groups``: as :func:`choose`'s."""
    uncalibrated = torch.nn.functional.cross_entropy(logits.double(), labels, reduction="none").cpu()
    reference = next(entry.nll for entry in scored if entry.method == REFERENCE)
    rows = [{"method": "uncalibrated", "held_out_nll": float(uncalibrated.mean()),
             "versus_temperature": paired_difference(uncalibrated - reference, groups), "seconds": 0.0, "excluded": None}]
    for entry in scored:
        shares = entry.method != REFERENCE and entry.nll is not None and entry.nll is reference
        rows.append({"method": entry.method, "held_out_nll": None if entry.nll is None else float(entry.nll.mean()),
                     "versus_temperature": None if shares else choice.versus_reference.get(entry.method),
                     "versus_best": choice.versus_best.get(entry.method),
                     "seconds": entry.seconds, "excluded": entry.reason, "is_temperature_scaling": shares,
                     "scored_by": entry.scoring})
    return {"chosen": choice.method, "reason": choice.reason, "best": choice.best, "folds": folds, "samples": len(labels),
            "candidates": rows}


def fit_auto(backbone: Backbone, data: CalibrationData, options: AutoOptions, engine: Engine) -> Tuple[Calibrator, Dict[str, Any], Any]:
    """Choose among ``options.methods()`` (and Neural Clamping under ``options.budget``) on ``data`` through the frozen
    ``backbone``; the chosen method's fit on all of it is the result.

    Returns the fitted calibrator (on every process the main process's), its fit summary with ``"auto"``
    (:func:`auto_record`), and the chosen method's options (its defaults). Each candidate's fit said its warnings as
    they happened, named (:func:`~.scoring.candidate_warnings`); the chosen fit's summary lines are the user's,
    and so is a chosen head's feature pass's warning.
    """
    started = time.perf_counter()
    num_classes, _ = probe(backbone, data, engine)
    logits, labels = engine.collect_logits(backbone, data)
    pass_seconds = time.perf_counter() - started
    labels = check_fit_logits(logits, labels, num_classes)
    groups = content_groups(logits)  # a row's copies: in one fold, and one sample in the intervals
    asked = default_folds(options.folds, *logits.shape)
    folds = cross_fitting_folds(labels, asked, engine.options.seed, groups)
    methods = options.methods()
    with engine.progress(len(methods), f"auto: {len(methods)} methods, each fitted and {len(folds)}-fold cross-fitted") as bar:
        scored = score_candidates(methods, logits, labels, folds, engine, bar, groups)
    if options.heads():
        scored += score_heads(options.heads(), backbone, data, folds, engine, labels, num_classes, options.classifier)
    estimate = None
    if options.considers_clamping():
        estimate, clamping = _clamping_candidate(backbone, data, options.budget, scored[0].nll, engine,
                                                 (pass_seconds, time.perf_counter() - started))
        scored.insert(len(methods), clamping)  # simpler than a head: δ and T on the frozen model
    choice = choose(scored, groups)
    calibrator, summary, chosen_options, pass_warnings = next(entry.fitted for entry in scored if entry.method == choice.method)
    for warning in pass_warnings if engine.is_main else []:
        warn_user(str(warning.message), warning.category)
    if len(folds) < asked:
        distinct = "" if len(folds) == len(labels) else " that differ (a row and its copies go together)"
        summary["warnings"] = [*summary.get("warnings", []), f"auto: folds={asked} is more than the {len(folds)} "
                               f"calibration rows{distinct}; {len(folds)} folds were used (one "
                               f"{'row' if not distinct else 'distinct row and its copies'} held out in each)."]
    summary["auto"] = auto_record(scored, choice, logits, labels, len(folds), groups)
    summary["auto"].update(budget=options.budget, neural_clamping_estimate=estimate, options=options_to_dict(options))
    engine.broadcast_module(calibrator)
    return calibrator, summary, chosen_options


def _clamping_candidate(backbone: Backbone, data: CalibrationData, budget: Optional[float], reference: torch.Tensor,
                        engine: Engine, seconds: Tuple[float, float]) -> Tuple[float, Scored]:
    """(Neural Clamping's estimated seconds, its row): scored when the estimate fits what is left of ``budget``, else
    left out with the reason. ``seconds`` (the base model's pass, the time auto has taken so far) are the main
    process's on every process, so that all of them decide alike."""
    pass_seconds, elapsed = _distributed.broadcast_(torch.tensor(seconds, dtype=torch.float64, device=engine.device)).tolist()
    estimate = estimated_seconds(pass_seconds)
    reason = budget_reason(budget, estimate, (budget or 0.0) - elapsed)
    if reason is not None:
        return estimate, Scored(CLAMPING, None, reason)
    return estimate, score_clamping(backbone, data, reference, engine)
