"""Calibrators: every fitted parameter of one method in one ``nn.Module``.

Method names (``CalibratedModel.fit(..., method=...)``) map to classes in :data:`CALIBRATORS`.
"""

from __future__ import annotations

from typing import Dict, Type

from .base import Calibrator, InvalidOptionError, options_to_dict, parse_options
from .binning import HistogramBinning, IsotonicCalibration
from .heads import HeadCalibrator, MaskedClassifierHead, TwoStageHead, VariationalTwoStageHead
from .linear import DirichletCalibration, MatrixScaling, VectorScaling
from .neural_clamping import NeuralClamping, focal_loss
from .temperature import TemperatureScaling, fit_inverse_temperature

CALIBRATORS: Dict[str, Type[Calibrator]] = {
    cls.method: cls
    for cls in (
        TemperatureScaling,
        VectorScaling,
        MatrixScaling,
        DirichletCalibration,
        HistogramBinning,
        IsotonicCalibration,
        NeuralClamping,
        TwoStageHead,
        VariationalTwoStageHead,
        MaskedClassifierHead,
    )
}


def calibrator_class(method: str) -> Type[Calibrator]:
    """The calibrator class for a method name, or a ValueError listing the names."""
    try:
        return CALIBRATORS[method]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(CALIBRATORS)}.") from None


__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "DirichletCalibration",
    "HeadCalibrator",
    "HistogramBinning",
    "InvalidOptionError",
    "IsotonicCalibration",
    "MaskedClassifierHead",
    "MatrixScaling",
    "NeuralClamping",
    "TemperatureScaling",
    "TwoStageHead",
    "VariationalTwoStageHead",
    "VectorScaling",
    "calibrator_class",
    "fit_inverse_temperature",
    "focal_loss",
    "options_to_dict",
    "parse_options",
]
