"""What a fit learns from the first calibration samples: the number of classes, δ's shape, the input contract, and
whether the base's outputs are logits or probabilities."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from ..._probabilities import LOGITS, PROBABILITIES, are_softmax_rows
from ...backbones import Backbone
from ...backbones.preprocessing import describe_inputs, warn_if_not_declared
from ...data import CalibrationData
from .engine import Engine


def probe(backbone: Backbone, data: CalibrationData, engine: Engine) -> Tuple[int, Tuple[int, ...]]:
    """(number of classes, δ's shape) from one sample of the data.

    δ is shaped like one calibration input (for text: one word-embedding vector), whatever
    input size the model's config declares.
    """
    inputs = engine.to_device(data.first_inputs())
    num_classes = backbone.num_classes
    if num_classes is None:
        with torch.no_grad():
            num_classes = backbone.logits(inputs).shape[1]
    return int(num_classes), backbone.delta_shape(inputs)


#: how many leading calibration samples tell whether the base's outputs are probabilities (every one must read so)
OUTPUT_PROBE_ROWS = 16


def base_outputs(backbone: Backbone, data: CalibrationData, engine: Engine) -> str:
    """What the base returns: the engine's ``base_outputs`` when given; else
    :data:`~hf_calibrate._probabilities.PROBABILITIES` when its outputs on the first :data:`OUTPUT_PROBE_ROWS`
    calibration samples (fewer when the data's first batch holds fewer) are all non-negative rows summing to 1 (its
    forward ends in a softmax), else :data:`~hf_calibrate._probabilities.LOGITS`. ``backbone`` reads its base's outputs
    as logits. Samples that fail to batch or to run (sizes that differ, a token id outside the vocabulary) decide nothing:
    the fit's pass over the data fails on them again, naming the samples and the fix."""
    if engine.options.base_outputs is not None:
        return engine.options.base_outputs
    try:
        with torch.no_grad():
            outputs = backbone.logits(engine.to_device(data.first_inputs(OUTPUT_PROBE_ROWS)))
    except Exception:  # noqa: BLE001 -- raised again, with the samples named, by the pass over the data
        return LOGITS
    return PROBABILITIES if are_softmax_rows(outputs.float()) else LOGITS


def input_contract(backbone: Backbone, data: CalibrationData, engine: Engine) -> Dict[str, Any]:
    """The input size and preprocessing of the calibration data: a calibration's ``input_contract``.

    Warns, naming both sizes, when the data's input size is not the one the model's config or
    the fit's image processor declares (the calibration then holds at the data's size only).
    See :mod:`hf_calibrate.backbones.preprocessing` for its keys.
    """
    options = engine.options
    contract = describe_inputs(backbone, data.first_inputs(), preprocessor=options.preprocessor, max_length=options.max_length,
                               preprocessed_here=data.preprocessed_here)
    warn_if_not_declared(backbone, contract, options.preprocessor)
    return contract
