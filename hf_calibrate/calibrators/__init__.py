"""Calibrators: every fitted parameter of one method in one ``nn.Module``.

Method names (``CalibratedModel.fit(..., method=...)``) map to classes in :data:`CALIBRATORS`: a
class registers itself by naming its ``method`` (``Calibrator.__init_subclass__``), so a new
method is one new class in one new module of this package: importing the package imports every
module in it (:func:`_import_method_modules`), so no list here names it (CONTRIBUTING.md). What
lists the methods is derived from :data:`CALIBRATORS`: ``--method``, ``fit``'s docstring,
docs/methods.md (:mod:`hf_calibrate.fitting.method_docs`) and ``method="auto"``'s candidates
(:attr:`Calibrator.auto_role`).
"""

from __future__ import annotations

# isort: off -- the modules are imported in the order CALIBRATORS lists their methods (error messages, --method)
from .base import CALIBRATORS, AutoRole, Calibrator, ModelFacts, calibrator_class
from .options import InvalidOptionError, options_to_dict, parse_options
from .temperature import TemperatureScaling, fit_inverse_temperature
from .linear import DirichletCalibration, MatrixScaling, RegularisedOptions, VectorScaling, fit_dirichlet, fit_matrix, fit_vector
from .structured_vector import StructuredVectorScaling
from .structured_matrix import StructuredMatrixScaling
from .binning import HistogramBinning
from .isotonic import IsotonicCalibration
from .neural_clamping import NeuralClamping, focal_loss
from .heads import HeadCalibrator, TwoStageHead, VariationalTwoStageHead
from .mac_cal import MaskedClassifierHead
# isort: on
from .holdout import cross_fitting_folds, select_by_cross_fitting
from .requirements import DataRequirements, InsufficientDataError

__all__ = [
    "CALIBRATORS",
    "AutoRole",
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
    "ModelFacts",
    "NeuralClamping",
    "RegularisedOptions",
    "StructuredMatrixScaling",
    "StructuredVectorScaling",
    "TemperatureScaling",
    "TwoStageHead",
    "VariationalTwoStageHead",
    "VectorScaling",
    "calibrator_class",
    "cross_fitting_folds",
    "fit_dirichlet",
    "fit_inverse_temperature",
    "fit_matrix",
    "fit_vector",
    "focal_loss",
    "options_to_dict",
    "parse_options",
    "select_by_cross_fitting",
]


def _import_method_modules() -> None:
    """Import every module of this package not imported above: one defining a calibrator class with its own ``method``
    registers it (its methods follow the built-in ones in :data:`CALIBRATORS`, by module name). The built-in modules are
    all imported already, so this only finds a module added to the folder."""
    import importlib
    import pkgutil

    for module in sorted(pkgutil.iter_modules(__path__), key=lambda found: found.name):
        importlib.import_module(f"{__name__}.{module.name}")


_import_method_modules()
