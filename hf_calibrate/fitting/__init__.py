"""Fitting: the Accelerate engine and the per-method fits built on it."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ..backbones import Backbone
from ..calibrators import Calibrator, calibrator_class
from ..data import PreparedData
from .engine import Engine, EngineOptions, steps_per_epoch
from .heads import FeatureStore, collect_features, fit_head, head_facts
from .neural_clamping import fit_neural_clamping, random_crop_flip_cutout


def probe(backbone: Backbone, data: PreparedData, engine: Engine) -> Tuple[int, Tuple[int, ...]]:
    """(number of classes, per-sample input shape in δ space) from one sample of the data."""
    if len(data) == 0:
        raise ValueError("the calibration data is empty: at least one labelled sample is needed.")
    inputs, _ = data.collate([data.dataset[0]])
    inputs = engine.to_device(inputs)
    num_classes = backbone.num_classes
    if num_classes is None:
        with torch.no_grad():
            num_classes = backbone.logits(inputs).shape[1]
    shape = backbone.default_delta_shape()
    if shape is None:
        shape = tuple(inputs[backbone.input_key].shape[1:])
    return int(num_classes), tuple(shape)


def fit_calibrator(
    backbone: Backbone,
    data: PreparedData,
    method: str,
    method_options: Any,
    engine: Engine,
    *,
    validation: Optional[PreparedData] = None,
    temperature_data: Optional[PreparedData] = None,
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
    calibrator = cls.create(num_classes, method_options, **facts)
    calibrator.to(engine.device)
    if cls.needs_features:
        summary = fit_head(backbone, data, validation, calibrator, method_options, engine, temperature_data)
    elif cls.needs_base_model:
        summary = fit_neural_clamping(backbone, data, calibrator, method_options, engine, validation)
    else:
        indices = torch.arange(len(data))
        logits, labels = engine.collect_logits(backbone, data, indices)
        summary = dict(calibrator.fit_logits(logits, labels, method_options))
        summary["fit_samples"] = len(indices)
    engine.broadcast_module(calibrator)
    return calibrator, summary


__all__ = [
    "Engine",
    "EngineOptions",
    "FeatureStore",
    "collect_features",
    "fit_calibrator",
    "fit_head",
    "fit_neural_clamping",
    "probe",
    "random_crop_flip_cutout",
    "steps_per_epoch",
]
