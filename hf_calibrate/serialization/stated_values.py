"""The values a record states about its calibration (what the model card shows a reader: T, ‖δ‖₂, ε) checked
against the tensors at load. The record's digest proves only that it was sealed, and anyone can seal a record: a
record whose ``fit.summary`` says T = 0.1356 over tensors holding T = 0.0183 is refused rather than shown."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict

import torch

from .schema import _fail

#: relative tolerance: the summary holds the fit's float64 values, the tensors their float32 copies
TOLERANCE = 1e-3

Tensors = Dict[str, torch.Tensor]


def _temperature(tensors: Tensors) -> float:
    return math.exp(float(tensors["log_temperature"]))


def _delta_norm(tensors: Tensors) -> float:
    return float(tensors["delta"].double().norm())


def _structured_temperature(tensors: Tensors) -> float:
    return 1.0 / float(tensors["inverse_temperature"])


def _epsilon(tensors: Tensors) -> float:
    return float(tensors["epsilon"])


_HEAD = {"temperature": _temperature}

#: method -> {key path in fit.summary: the value the tensors give it}
STATED_VALUES: Dict[str, Dict[str, Callable[[Tensors], float]]] = {
    "temperature": _HEAD,
    "tst": _HEAD,
    "vtst": _HEAD,
    "mac_cal": _HEAD,
    "structured_vector": {"temperature": _structured_temperature, "epsilon": _epsilon},
    "structured_matrix": {"temperature": _structured_temperature, "epsilon": _epsilon},
    "neural_clamping": {"selected.temperature": _temperature, "selected.delta_norm": _delta_norm},
}


def _stated(summary: Dict[str, Any], path: str) -> Any:
    value: Any = summary
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _rules(method: str, summary: Dict[str, Any]) -> Dict[str, Callable[[Tensors], float]]:
    """{key path in fit.summary: what the tensors give it} for ``method``; a Neural Clamping fallback states its
    temperature scaling's T (``fallback_temperature``, else ``temperature``, as the card reads it) and ‖δ‖₂ = 0."""
    rules = dict(STATED_VALUES.get(method, {}))
    if method != "neural_clamping":
        return rules
    if not summary.get("fell_back_to_temperature_scaling"):
        return {path: value for path, value in rules.items() if path.startswith("selected.")}
    scaling = summary.get("temperature_scaling") if isinstance(summary.get("temperature_scaling"), dict) else {}
    key = "fallback_temperature" if "fallback_temperature" in scaling else "temperature"
    return {f"temperature_scaling.{key}": _temperature, "fell_back_to_temperature_scaling": _delta_norm}


def _number(file: Any, path: str, value: Any) -> float:
    """A stated value as a float; anything but a finite number is refused (a record states numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(file, f"key 'fit.summary.{path}'", f"is {value!r}, not a finite number")
    return float(value)


def check_stated_values(file: Any, record: Dict[str, Any], tensors: Tensors) -> None:
    """Refuse a record whose ``fit.summary`` states a T, ‖δ‖₂ or ε that its tensors do not hold (an edited and
    re-sealed record, or tensors from another fit), or states one that is not a finite number."""
    summary = (record.get("fit") or {}).get("summary") or {}
    flag = summary.get("fell_back_to_temperature_scaling")
    if flag is not None and not isinstance(flag, bool):
        _fail(file, "key 'fit.summary.fell_back_to_temperature_scaling'", f"is {flag!r}, not true or false")
    for path, actual in _rules(record["method"], summary).items():
        if path == "fell_back_to_temperature_scaling":
            norm = actual(tensors)
            if norm > 1e-6:
                _fail(file, "key 'fit.summary.fell_back_to_temperature_scaling'", f"states that the fit fell back to "
                      f"temperature scaling (δ = 0), but the calibration's δ has ‖δ‖₂ = {norm:.6g}: the record and the "
                      "tensors come from different fits, or the record was edited")
            continue
        stated = _stated(summary, path)
        if stated is None:
            continue
        stated, value = _number(file, path, stated), actual(tensors)
        if not math.isclose(value, stated, rel_tol=TOLERANCE, abs_tol=1e-6):
            _fail(file, f"key 'fit.summary.{path}'", f"states {stated:.6g}, but the calibration's tensors hold {value:.6g}: "
                  "the record and the tensors come from different fits, or the record was edited")
