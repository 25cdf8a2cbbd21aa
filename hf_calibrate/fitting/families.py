"""One fit per calibrator family: a calibrator is fitted by the fit of its nearest base class in :data:`FAMILIES`.

* :class:`~hf_calibrate.calibrators.Calibrator` — logit-space methods: one pass caches the base
  logits, then the class's own ``fit_logits``;
* :class:`~hf_calibrate.calibrators.NeuralClamping` — L-BFGS (default) or SGD on δ and log T through
  the frozen base (:mod:`.neural_clamping`);
* :class:`~hf_calibrate.calibrators.HeadCalibrator` — the head loop on cached features
  (:mod:`.heads`), with the per-method hooks of the head classes.

A new method subclasses one of these and names its ``method`` (which registers it); nothing here
changes. The calibrators do not import this package (imports flow one way, docs/design.md §1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple, Type

import torch

from ..backbones import Backbone
from ..calibrators import Calibrator, HeadCalibrator, NeuralClamping, calibrator_class
from ..calibrators.base import FitContext, check_fit_logits
from ..calibrators.requirements import DataRequirements, check_calibration_data
from ..data import CalibrationData
from .engine import Engine
from .heads import fit_head, head_facts
from .neural_clamping import fit_neural_clamping
from .probing import probe

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


def _no_facts(backbone: Backbone) -> Dict[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True)
class Family:
    """How the calibrators of one family are fitted.

    Attributes:
        fit: ``(calibrator, options, inputs) -> summary``: fits the calibrator in place; the summary
            goes into the fit history.
        facts: ``backbone -> dict``: what the family's ``create`` needs of the model beyond the number
            of classes and δ's shape and space (a head's ``feature_dim``).
    """

    fit: Callable[[Any, Any, FitInputs], Dict[str, Any]]
    facts: Callable[[Backbone], Dict[str, Any]] = _no_facts


def _fit_on_logits(calibrator: Calibrator, options: Any, inputs: FitInputs) -> Dict[str, Any]:
    """One pass caches the base logits of all the data, then :func:`fit_on_cached_logits`."""
    logits, labels = inputs.engine.collect_logits(inputs.backbone, inputs.data)
    return fit_on_cached_logits(calibrator, options, logits, labels, inputs.engine)


def fit_on_cached_logits(calibrator: Calibrator, options: Any, logits: torch.Tensor, labels: torch.Tensor,
                         engine: Engine) -> Dict[str, Any]:
    """Fit a logit calibrator on the base's (N, C) ``logits`` and (N,) ``labels``: they are checked against the method's
    :class:`~hf_calibrate.calibrators.requirements.DataRequirements` (refused below them, warned about near them),
    then ``calibrator.fit_logits``. The summary's ``warnings`` hold the data's lines, then the fit's."""
    needs = getattr(calibrator, "requirements", DataRequirements())
    checked_labels = check_fit_logits(logits, labels, calibrator.num_classes)
    data_warnings = check_calibration_data(logits, checked_labels, calibrator.method, needs)
    context = FitContext(progress=engine.progress, interruptible=engine.world == 1, announce=engine.is_main)
    summary = dict(calibrator.fit_logits(logits, labels, options, context))
    summary["fit_samples"] = len(labels)
    summary["warnings"] = data_warnings + list(summary.get("warnings", []))
    return summary


def _fit_clamping(calibrator: NeuralClamping, options: NeuralClamping.Options, inputs: FitInputs) -> Dict[str, Any]:
    return fit_neural_clamping(inputs.backbone, inputs.data, calibrator, options, inputs.engine, inputs.validation)


def _fit_head(calibrator: HeadCalibrator, options: HeadCalibrator.Options, inputs: FitInputs) -> Dict[str, Any]:
    return fit_head(inputs.backbone, inputs.data, inputs.validation, calibrator, options, inputs.engine, inputs.temperature_data)


#: family base class → its fit; a class belongs to the family of the first of its bases (MRO order) listed here
FAMILIES: Dict[Type[Calibrator], Family] = {
    Calibrator: Family(_fit_on_logits),
    NeuralClamping: Family(_fit_clamping),
    HeadCalibrator: Family(_fit_head, facts=head_facts),
}


def family_of(cls: Type[Calibrator]) -> Family:
    """The :class:`Family` fitting ``cls``: that of its nearest base class in :data:`FAMILIES`."""
    return next(FAMILIES[base] for base in cls.__mro__ if base in FAMILIES)


def fit_calibrator(
    backbone: Backbone,
    data: CalibrationData,
    method: str,
    method_options: Any,
    engine: Engine,
    *,
    validation: Optional[CalibrationData] = None,
    temperature_data: Optional[CalibrationData] = None,
) -> Tuple[Calibrator, Dict[str, Any]]:
    """Fit the calibrator of ``method`` on ``data`` through the frozen ``backbone``.

    ``method_options`` is an instance of the method class's ``Options``. ``validation`` is the
    selection split of Neural Clamping and of the head methods (when absent they hold out part of
    ``data``); ``temperature_data`` is where head methods fit their optional temperature.
    Returns the fitted calibrator (on every process the main process's) and the fit summary.
    """
    calibrator = create_calibrator(backbone, data, method, method_options, engine)
    summary = family_of(type(calibrator)).fit(calibrator, method_options, FitInputs(backbone, data, engine, validation, temperature_data))
    engine.broadcast_module(calibrator)
    return calibrator, summary


def create_calibrator(backbone: Backbone, data: CalibrationData, method: str, method_options: Any, engine: Engine) -> Calibrator:
    """An unfitted calibrator of ``method`` for ``backbone`` on the engine's device: sized by the classes and δ's shape
    the first sample of ``data`` shows and its family's facts, its initial weights (heads) drawn from the fit's seed."""
    cls = calibrator_class(method)
    num_classes, delta_shape = probe(backbone, data, engine)
    facts = {"delta_shape": delta_shape, "delta_space": backbone.delta_space, **family_of(cls).facts(backbone)}
    with torch.random.fork_rng(devices=[]):  # seeded initial weights (heads); the user's RNG is untouched
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=engine.generator(INITIAL_WEIGHTS_SALT))))
        calibrator = cls.create(num_classes, method_options, **facts)
    return calibrator.to(engine.device)
