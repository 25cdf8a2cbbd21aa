"""The values a record states about its calibration (what the model card shows a reader: T, ‖δ‖₂, ε) checked
against the tensors at load. The record's digest proves only that it was sealed, and anyone can seal a record: a
record whose ``fit.summary`` says T = 0.1356 over tensors holding T = 0.0183 is refused rather than shown."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

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
    "neural_clamping": {"selected.temperature": _temperature, "selected.delta_norm": _delta_norm,
                        "temperature_scaling.fallback_temperature": _temperature},
}


def _stated(summary: Dict[str, Any], path: str) -> Any:
    value: Any = summary
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _claims(method: str, summary: Dict[str, Any]) -> List[Tuple[str, float, Callable[[Tensors], float]]]:
    """The numeric values ``summary`` states that the tensors determine (a fallback of Neural Clamping states its
    temperature scaling's T and δ = 0; otherwise its selected state's T and ‖δ‖₂)."""
    rules = dict(STATED_VALUES.get(method, {}))
    if method == "neural_clamping":
        fell_back = bool(summary.get("fell_back_to_temperature_scaling"))
        rules = {path: value for path, value in rules.items() if path.startswith("temperature_scaling.") == fell_back}
        if fell_back:
            rules["fell_back_to_temperature_scaling"] = _delta_norm  # states δ = 0
    claims = []
    for path, actual in rules.items():
        stated = 0.0 if path == "fell_back_to_temperature_scaling" else _stated(summary, path)
        if isinstance(stated, (int, float)) and not isinstance(stated, bool) and math.isfinite(stated):
            claims.append((path, float(stated), actual))
    return claims


def check_stated_values(file: Any, record: Dict[str, Any], tensors: Tensors) -> None:
    """Refuse a record whose ``fit.summary`` states a T, ‖δ‖₂ or ε that its tensors do not hold (an edited and
    re-sealed record, or tensors from another fit)."""
    summary = (record.get("fit") or {}).get("summary") or {}
    for path, stated, actual in _claims(record["method"], summary):
        value = actual(tensors)
        if not math.isclose(value, stated, rel_tol=TOLERANCE, abs_tol=1e-6):
            _fail(file, f"key 'fit.summary.{path}'", f"states {stated:.6g}, but the calibration's tensors hold {value:.6g}: "
                  "the record and the tensors come from different fits, or the record was edited")
