"""hf_calibrate: calibration for Hugging Face timm and transformers classifiers.

The names below are imported when first used, so ``import hf_calibrate`` (and ``hf-calibrate
--help``) stays quick and imports neither ``datasets``, ``evaluate`` nor ``matplotlib``.
``CalibratedModel`` registers itself with the transformers Auto classes as soon as transformers is
imported (now, if it already is; else right after the user's own import of it, see
:mod:`hf_calibrate._auto_registration`) and whenever its model module is imported, so that
``pipeline(task, model="user/calibrated-repo")`` loads the calibrated model;
:func:`register_auto_classes` does it explicitly.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from ._auto_registration import register_when_transformers_loads
from .version import __version__

# name → module of the package that defines it
_EXPORTS = {
    "ArtifactError": "serialization",
    "CALIBRATORS": "calibrators",
    "CalibratedConfig": "modeling",
    "CalibratedModel": "modeling",
    "EVALUATE_MODULES": "evaluate_modules",
    "EngineOptions": "fitting",
    "TemperatureScalingFallbackWarning": "modeling",
    "evaluate_module_path": "evaluate_modules",
    "register_auto_classes": "modeling",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a module of the package (hf_calibrate.comparison, ...)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted({*globals(), *__all__})


register_when_transformers_loads()  # pipelines know calibrated repos once transformers is imported, whenever that is

__all__ = [
    "ArtifactError",
    "CALIBRATORS",
    "CalibratedConfig",
    "CalibratedModel",
    "EVALUATE_MODULES",
    "EngineOptions",
    "TemperatureScalingFallbackWarning",
    "__version__",
    "calibrators",
    "evaluate_module_path",
    "metrics",
    "register_auto_classes",
]
