"""hf_calibrate: calibration for Hugging Face timm and transformers classifiers.

The names below are imported when first used, so ``import hf_calibrate`` (and ``hf-calibrate
--help``) stays quick and imports neither ``datasets``, ``evaluate`` nor ``matplotlib``.
``CalibratedModel`` registers itself with the transformers Auto classes as soon as transformers is
imported (now, if it already is; else right after the user's own import of it, see
:mod:`hf_calibrate._auto_registration`) and when first used through this package, so that
``pipeline(task, model="user/calibrated-repo")`` loads the calibrated model;
:func:`register_auto_classes` does it explicitly.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._auto_registration import register_when_transformers_loads
from .version import __version__

# name → module of the package that defines it
_EXPORTS = {
    "ArtifactError": "serialization",
    "CALIBRATORS": "calibrators",
    "CalibratedConfig": "modeling",
    "CalibratedModel": "modeling",
    "EngineOptions": "fitting",
    "TemperatureScalingFallbackWarning": "modeling",
    "register_auto_classes": "modeling",
}
_SUBPACKAGES = ("calibrators", "metrics")


def _modeling() -> Any:
    """:mod:`hf_calibrate.modeling`, with ``CalibratedModel`` registered with the transformers Auto classes."""
    modeling = importlib.import_module(f"{__name__}.modeling")
    modeling.register_auto_classes()
    return modeling


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _modeling() if _EXPORTS[name] == "modeling" else importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, name)


register_when_transformers_loads()  # pipelines know calibrated repos once transformers is imported, whenever that is

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
