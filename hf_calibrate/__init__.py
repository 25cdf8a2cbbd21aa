"""hf_calibrate: calibration for Hugging Face timm and transformers classifiers.

Importing the package registers ``CalibratedModel`` with the transformers Auto classes, so
``pipeline(task, model="user/calibrated-repo")`` loads the calibrated model.
"""

from . import calibrators, metrics
from .calibrators import CALIBRATORS
from .fitting import EngineOptions
from .modeling import CalibratedConfig, CalibratedModel, TemperatureScalingFallbackWarning, register_auto_classes
from .serialization import ArtifactError
from .version import __version__

register_auto_classes()

__all__ = [
    "ArtifactError",
    "CALIBRATORS",
    "CalibratedConfig",
    "CalibratedModel",
    "EngineOptions",
    "TemperatureScalingFallbackWarning",
    "__version__",
    "calibrators",
    "metrics",
    "register_auto_classes",
]
