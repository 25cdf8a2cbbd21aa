"""One fit per calibrator family: a calibrator is fitted by the fit of its nearest base class in :data:`FAMILIES`.

* :class:`~hf_calibrate.calibrators.Calibrator` — logit-space methods: one pass caches the base
  logits, then the class's own ``fit_logits``;
* :class:`~hf_calibrate.calibrators.NeuralClamping` — L-BFGS (default) or SGD on δ and log T through
  the frozen base (:mod:`.clamping.neural_clamping`);
* :class:`~hf_calibrate.calibrators.HeadCalibrator` — the head loop on cached features
  (:mod:`.heads`), with the per-method hooks of the head classes.

A new method subclasses one of these and names its ``method`` (which registers it); nothing here
changes. The calibrators do not import this package (imports flow one way, docs/design.md §1).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable, Dict, Optional, Tuple, Type

import torch

from ..backbones import Backbone
from ..calibrators import Calibrator, HeadCalibrator, NeuralClamping
from ..calibrators.base import FitContext, ModelFacts, check_fit_logits, chunk_rows
from ..calibrators.holdout import content_groups, note_repeated_rows
from ..calibrators.requirements import DataRequirements, check_calibration_data
from ..data import CalibrationData
from .runtime.engine import Engine
from .heads import fit_head, head_facts
from .clamping.neural_clamping import fit_neural_clamping
from .runtime.probing import probe

#: salt of the seeded generator the initial weights (of the heads) are drawn from
INITIAL_WEIGHTS_SALT = 0x1417


@dataclasses.dataclass(frozen=True)
class FitInputs:
    """What a family's fit reads beside the calibrator and its options.

    Attributes:
        backbone: the frozen base model's adapter.
        data: the calibration data.
        engine: batching, processes, seeds and progress of the fit.
        validation: the selection split of Neural Clamping and of the heads (None: they hold out part of ``data``).
        temperature_data: where a head's optional temperature is fitted (None: its validation data).
    """

    backbone: Backbone
    data: CalibrationData
    engine: Engine
    validation: Optional[CalibrationData] = None
    temperature_data: Optional[CalibrationData] = None


def _no_more_facts(backbone: Backbone, facts: ModelFacts) -> ModelFacts:
    """A family whose ``create`` needs nothing more of the model: ``facts`` as they are."""
    return facts


@dataclasses.dataclass(frozen=True)
class Family:
    """How the calibrators of one family are fitted, and what it is called (docs/methods.md, ``fit``'s docstring).

    Attributes:
        name: the family in a few words (``"logits"``).
        fitted_on: what its fit reads of the base model, in words.
        fit: ``(calibrator, options, inputs) -> summary``: fits the calibrator in place; the summary
            goes into the fit history.
        facts: ``(backbone, facts) -> facts``: what the family's ``create`` needs of the model beyond the number
            of classes and δ's shape and space, added to them (a head's ``feature_dim``).
    """

    name: str
    fitted_on: str
    fit: Callable[[Any, Any, FitInputs], Dict[str, Any]]
    facts: Callable[[Backbone, ModelFacts], ModelFacts] = _no_more_facts


def _fit_on_logits(calibrator: Calibrator, options: Any, inputs: FitInputs) -> Dict[str, Any]:
    """One pass caches the base logits of all the data, then :func:`fit_on_cached_logits`."""
    logits, labels = inputs.engine.collect_logits(inputs.backbone, inputs.data)
    return fit_on_cached_logits(calibrator, options, logits, labels, inputs.engine)


def fit_on_cached_logits(calibrator: Calibrator, options: Any, logits: torch.Tensor, labels: torch.Tensor,
                         engine: Engine, groups: Optional[torch.Tensor] = None, announce: bool = True) -> Dict[str, Any]:
    """Fit a logit calibrator on the base's (N, C) ``logits`` and (N,) ``labels``: they are checked against the method's
    :class:`~hf_calibrate.calibrators.requirements.DataRequirements` (refused below them, warned about near them),
    then ``calibrator.fit_logits``. The summary's ``warnings`` hold the data's lines, then the fit's, then
    :func:`interpolation_warning`'s, then how many rows repeat another (``duplicate_rows``: rows of equal logits).
    ``groups``: the rows' content ids when the caller has them (else computed here, once, and handed to the fit);
    ``announce``: whether a long fit says its time first (on the main process; auto says a candidate's itself)."""
    needs = getattr(calibrator, "requirements", DataRequirements())
    checked_labels = check_fit_logits(logits, labels, calibrator.num_classes)
    groups = content_groups(logits) if groups is None else groups
    data_warnings = check_calibration_data(logits, checked_labels, calibrator.method, needs, int(groups.unique().numel()))
    context = FitContext(progress=engine.progress, interruptible=engine.world == 1, announce=engine.is_main and announce,
                         groups=groups)
    summary = dict(calibrator.fit_logits(logits, labels, options, context))
    summary["fit_samples"] = len(labels)
    interpolation = interpolation_warning(calibrator, options, summary, logits, checked_labels)
    summary["warnings"] = data_warnings + list(summary.get("warnings", [])) + ([interpolation] if interpolation else [])
    return note_repeated_rows(summary, groups)


def interpolation_nll(rows: int) -> float:
    """The mean NLL (nats) below which a model right on all ``rows`` calibration rows claims more than they show:
    after ``rows`` correct of ``rows``, Laplace's rule of succession gives the next row a chance of
    (rows + 1)/(rows + 2) of being right, an NLL of log((rows + 2)/(rows + 1)) ≈ 1/rows."""
    return math.log((rows + 2) / (rows + 1))


def _interpolates(model: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor, labels: torch.Tensor,
                  device: torch.device) -> Tuple[bool, float]:
    """(whether ``model`` of the (N, C) ``logits`` classifies every row right with a mean NLL below
    :func:`interpolation_nll`, that NLL), in chunks of rows (:func:`~hf_calibrate.calibrators.base.chunk_rows`) on
    ``device``."""
    total, right = 0.0, True
    with torch.no_grad():
        for rows in torch.split(torch.arange(len(labels)), chunk_rows(logits)):
            outputs = model(logits[rows.to(logits.device)].to(device)).double()
            truth = labels[rows.to(labels.device)].to(device)
            total += float(torch.nn.functional.cross_entropy(outputs, truth, reduction="sum"))
            right = right and bool((outputs.argmax(dim=1) == truth).all())
    nll = total / len(labels)
    return right and nll < interpolation_nll(len(labels)), nll


def interpolation_warning(calibrator: Calibrator, options: Any, summary: Dict[str, Any], logits: torch.Tensor,
                          labels: torch.Tensor) -> Optional[str]:
    """The line saying that a fit interpolates its calibration data, or None: the calibrated model classifies every
    row right with an in-sample NLL below :func:`interpolation_nll` (surer than that many correct rows can show),
    where the base model alone did not (temperature scaling keeps T = 1 on such data, and says so itself). A linear
    map that chose its l2 by cross-fitting also says whether that l2 is the weakest of its grid."""
    device = next(itertools.chain(calibrator.parameters(), calibrator.buffers()), logits).device
    fits, nll = _interpolates(calibrator, logits, labels, device)
    if not fits or _interpolates(torch.nn.Identity(), logits, labels, device)[0]:
        return None
    rows = len(labels)
    return (f"{calibrator.method} fits its calibration data exactly (in-sample NLL {nll:.2g}, all {rows:,} rows correct): "
            f"it is surer of them than {rows:,} correct rows can show (Laplace's rule of succession gives the next row "
            f"a chance of {(rows + 1) / (rows + 2):.4f} of being right, an NLL of {interpolation_nll(rows):.2g})"
            f"{_chosen_strength(options, summary)}; held-out results are what count: compare it with temperature scaling "
            "on rows it was not fitted on (`hf-calibrate compare` on another split, or method=\"auto\"'s cross-fitted "
            "scores), or calibrate on more rows.")


def _chosen_strength(options: Any, summary: Dict[str, Any]) -> str:
    """``"; its cross-fitting chose l2 = …, the weakest of its grid (…)"`` for a fit that chose its l2 by
    cross-fitting among ``options.l2_grid`` (not the weakest, when it is not), else ``""``."""
    grid, chosen = getattr(options, "l2_grid", None), summary.get("l2")
    if grid is None or getattr(options, "l2", None) is not None or chosen is None:
        return ""
    weakest = "the weakest" if chosen <= min(grid) else "not the weakest"
    return f"; its cross-fitting chose l2 = {chosen:g}, {weakest} of its grid ({', '.join(f'{value:g}' for value in grid)})"


def _fit_clamping(calibrator: NeuralClamping, options: NeuralClamping.Options, inputs: FitInputs) -> Dict[str, Any]:
    return fit_neural_clamping(inputs.backbone, inputs.data, calibrator, options, inputs.engine, inputs.validation)


def _fit_head(calibrator: HeadCalibrator, options: HeadCalibrator.Options, inputs: FitInputs) -> Dict[str, Any]:
    return fit_head(inputs.backbone, inputs.data, inputs.validation, calibrator, options, inputs.engine, inputs.temperature_data)


#: family base class → its fit; a class belongs to the family of the first of its bases (MRO order) listed here
FAMILIES: Dict[Type[Calibrator], Family] = {
    Calibrator: Family("logits", "the base's logits, cached in one pass", _fit_on_logits),
    NeuralClamping: Family("input perturbation", "forward and input-gradient passes through the frozen base", _fit_clamping),
    HeadCalibrator: Family("new head", "the base's penultimate features, cached in one pass per split", _fit_head,
                           facts=head_facts),
}


def family_of(cls: Type[Calibrator]) -> Family:
    """The :class:`Family` fitting ``cls``: that of its nearest base class in :data:`FAMILIES`."""
    return next(FAMILIES[base] for base in cls.__mro__ if base in FAMILIES)


def fit_calibrator(
    backbone: Backbone,
    data: CalibrationData,
    cls: Type[Calibrator],
    method_options: Any,
    engine: Engine,
    *,
    validation: Optional[CalibrationData] = None,
    temperature_data: Optional[CalibrationData] = None,
) -> Tuple[Calibrator, Dict[str, Any]]:
    """Fit a calibrator of class ``cls`` (a method's, :func:`~hf_calibrate.calibrators.calibrator_class`) on ``data``
    through the frozen ``backbone``.

    ``method_options`` is an instance of ``cls.Options``. ``validation`` is the
    selection split of Neural Clamping and of the head methods (when absent they hold out part of
    ``data``); ``temperature_data`` is where head methods fit their optional temperature.
    Returns the fitted calibrator (on every process the main process's) and the fit summary.
    """
    calibrator = create_calibrator(backbone, data, cls, method_options, engine)
    summary = family_of(type(calibrator)).fit(calibrator, method_options, FitInputs(backbone, data, engine, validation, temperature_data))
    engine.broadcast_module(calibrator)
    return calibrator, summary


def create_calibrator(backbone: Backbone, data: CalibrationData, cls: Type[Calibrator], method_options: Any,
                      engine: Engine) -> Calibrator:
    """An unfitted calibrator of class ``cls`` for ``backbone`` on the engine's device: sized by the classes and δ's
    shape the first sample of ``data`` shows and its family's facts, its initial weights (heads) drawn from the fit's
    seed."""
    num_classes, delta_shape = probe(backbone, data, engine)
    facts = family_of(cls).facts(backbone, ModelFacts(delta_shape=delta_shape, delta_space=backbone.delta_space))
    with torch.random.fork_rng(devices=[]):  # seeded initial weights (heads); the user's RNG is untouched
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=engine.generator(INITIAL_WEIGHTS_SALT))))
        calibrator = cls.create(num_classes, method_options, facts)
    return calibrator.to(engine.device)
