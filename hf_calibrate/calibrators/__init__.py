"""Calibrators: every fitted parameter of one method in one ``nn.Module``.

Method names (``CalibratedModel.fit(..., method=...)``) map to classes in :data:`CALIBRATORS`: a
class registers itself by naming its ``method`` (``Calibrator.__init_subclass__``), so a new
method is one new class in one module.
"""

from __future__ import annotations

# isort: off -- the modules are imported in the order CALIBRATORS lists their methods (error messages, --method)
from .base import CALIBRATORS, Calibrator, InvalidOptionError, calibrator_class, options_to_dict, parse_options
from .temperature import TemperatureScaling, fit_inverse_temperature
from .linear import DirichletCalibration, MatrixScaling, RegularisedOptions, VectorScaling, fit_dirichlet, fit_matrix, fit_vector
from .structured_vector import StructuredVectorScaling
from .binning import HistogramBinning, IsotonicCalibration
from .neural_clamping import NeuralClamping, focal_loss
from .heads import HeadCalibrator, TwoStageHead, VariationalTwoStageHead
from .mac_cal import MaskedClassifierHead
# isort: on
from .holdout import select_by_cross_fitting, stratified_folds
from .requirements import DataRequirements, InsufficientDataError

__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "DataRequirements",
    "DirichletCalibration",
    "HeadCalibrator",
    "HistogramBinning",
    "InsufficientDataError",
    "InvalidOptionError",
    "IsotonicCalibration",
    "MaskedClassifierHead",
    "MatrixScaling",
    "NeuralClamping",
    "RegularisedOptions",
    "StructuredVectorScaling",
    "TemperatureScaling",
    "TwoStageHead",
    "VariationalTwoStageHead",
    "VectorScaling",
    "calibrator_class",
    "fit_dirichlet",
    "fit_inverse_temperature",
    "fit_matrix",
    "fit_vector",
    "focal_loss",
    "options_to_dict",
    "parse_options",
    "select_by_cross_fitting",
    "stratified_folds",
]
