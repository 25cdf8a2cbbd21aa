"""Fitting: the Accelerate engine and one fit per calibrator family (:mod:`.families`) built on it."""

from __future__ import annotations

from .engine import Engine, EngineOptions
from .families import fit_calibrator
from .probing import input_contract

# importable from here as before the families split (not the package's API, which is __all__)
from ..metrics import NonFiniteError  # noqa: F401
from .engine import steps_per_epoch  # noqa: F401
from .heads import FeatureStore, collect_features, fit_head  # noqa: F401
from .neural_clamping import fit_neural_clamping, random_crop_flip_cutout  # noqa: F401
from .probing import probe  # noqa: F401

__all__ = ["Engine", "EngineOptions", "fit_calibrator", "input_contract"]
