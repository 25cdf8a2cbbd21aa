"""Fitting: the Accelerate engine and one fit per calibrator family (:mod:`.families`) built on it."""

from __future__ import annotations

from .runtime.engine import Engine, EngineOptions
from .families import fit_calibrator
from .runtime.probing import input_contract

__all__ = ["Engine", "EngineOptions", "fit_calibrator", "input_contract"]
