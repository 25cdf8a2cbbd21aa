"""What a fit learns from the first calibration sample: the number of classes, δ's shape, the input contract."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from ..backbones import Backbone
from ..backbones.preprocessing import describe_inputs, warn_if_not_declared
from ..data import CalibrationData
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
