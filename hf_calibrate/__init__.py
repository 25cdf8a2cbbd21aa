"""hf_calibrate: calibration for Hugging Face timm and transformers classifiers.

The names below are imported when first used, so ``import hf_calibrate``, which every ``hf-calibrate`` command runs
first (``--help`` too), stays quick: it imports neither torch, transformers, ``datasets``, ``evaluate`` nor
``matplotlib``. The model's module registers ``CalibratedModel`` with the transformers Auto classes when it is
imported: ``from hf_calibrate import CalibratedModel`` (or ``CalibratedConfig``) makes
``pipeline(task, model="user/calibrated-repo")`` load the calibrated model, and so does
:func:`register_auto_classes`, for a script that names no other hf_calibrate class.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from .version import __version__

# name → the module of the package it is taken from (the model's names from modeling, which registers the model)
_EXPORTS = {
    "ArtifactError": "serialization",
    "CALIBRATORS": "calibrators",
    "CalibratedConfig": "modeling",
    "CalibratedModel": "modeling",
    "EVALUATE_MODULES": "evaluate_modules",
    "EngineOptions": "fitting",
    "TemperatureScalingFallbackWarning": "modeling",
    "evaluate_module_path": "evaluate_modules",
    "fit_and_evaluate": "fit_evaluate",
    "register_auto_classes": "modeling",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        try:
            module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        except AttributeError as error:  # else Python reports it as "cannot import name", hiding the cause
            raise ImportError(f"importing {__name__}.{_EXPORTS[name]} (for {name}) failed: {error}") from error
        return getattr(module, name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a module of the package (hf_calibrate.results, ...)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted({*globals(), *__all__})


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
    "fit_and_evaluate",
    "metrics",
    "register_auto_classes",
]
