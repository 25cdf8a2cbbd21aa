"""hf_calibrate: calibration for Hugging Face timm and transformers classifiers."""

from .version import __version__
from . import metrics

__all__ = ["__version__", "metrics"]
