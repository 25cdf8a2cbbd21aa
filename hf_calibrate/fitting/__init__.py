"""Fitting: the Accelerate engine and the per-method fits built on it."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ..backbones import Backbone, Inputs
from ..backbones.preprocessing import describe_inputs, warn_if_not_declared
from ..calibrators import Calibrator, calibrator_class
from ..calibrators.base import FitContext
from ..data import CalibrationData, PreparedData
from ..metrics import NonFiniteError
from .engine import Engine, EngineOptions, steps_per_epoch
from .heads import FeatureStore, collect_features, fit_head, head_facts
from .neural_clamping import fit_neural_clamping, random_crop_flip_cutout


def _first_inputs(data: CalibrationData) -> Inputs:
    """The model inputs of the data's first sample, as a batch of one."""
    if isinstance(data, PreparedData) and len(data) == 0:
        raise ValueError("the calibration data is empty: at least one labelled sample is needed.")
    return data.first_inputs()


def probe(backbone: Backbone, data: CalibrationData, engine: Engine) -> Tuple[int, Tuple[int, ...]]:
    """(number of classes, δ's shape) from one sample of the data.

    δ is shaped like one calibration input (for text: one word-embedding vector), whatever
    input size the model's config declares.
    """
    inputs = engine.to_device(_first_inputs(data))
    num_classes = backbone.num_classes
    if num_classes is None:
        with torch.no_grad():
            num_classes = backbone.logits(inputs).shape[1]
    return int(num_classes), backbone.delta_shape(inputs)


def input_contract(backbone: Backbone, data: CalibrationData, engine: Engine) -> Dict[str, Any]:
    """The input size and preprocessing of the calibration data: a calibration's ``input_contract``.

    Warns, naming both sizes, when the data's input size is not the one the model's config or
    the fit's image processor declares (the calibration then holds at the data's size only).
    See :mod:`hf_calibrate.backbones.preprocessing` for its keys.
    """
    options = engine.options
    contract = describe_inputs(backbone, _first_inputs(data), preprocessor=options.preprocessor, max_length=options.max_length,
                               preprocessed_here=data.preprocessed_here)
    warn_if_not_declared(backbone, contract, options.preprocessor)
    return contract


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

    ``validation`` is the selection split of Neural Clamping and of the head methods (when
    absent they hold out part of ``data``); ``temperature_data`` is where head methods fit
    their optional temperature.
    """
    cls = calibrator_class(method)
    num_classes, delta_shape = probe(backbone, data, engine)
    facts = {"delta_shape": delta_shape, "delta_space": backbone.delta_space}
    if cls.needs_features:
        facts.update(head_facts(backbone))
    with torch.random.fork_rng(devices=[]):  # seeded initial weights (heads); the user's RNG is untouched
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=engine.generator(0x1417))))
        calibrator = cls.create(num_classes, method_options, **facts)
    calibrator.to(engine.device)
    if cls.needs_features:
        summary = fit_head(backbone, data, validation, calibrator, method_options, engine, temperature_data)
    elif cls.needs_base_model:
        summary = fit_neural_clamping(backbone, data, calibrator, method_options, engine, validation)
    else:
        logits, labels = engine.collect_logits(backbone, data)
        context = FitContext(progress=engine.progress, interruptible=engine.world == 1, announce=engine.is_main)
        summary = dict(calibrator.fit_logits(logits, labels, method_options, context))
        summary["fit_samples"] = len(labels)
    engine.broadcast_module(calibrator)
    return calibrator, summary


__all__ = [
    "Engine",
    "EngineOptions",
    "FeatureStore",
    "NonFiniteError",
    "collect_features",
    "fit_calibrator",
    "fit_head",
    "fit_neural_clamping",
    "probe",
    "random_crop_flip_cutout",
    "steps_per_epoch",
]
