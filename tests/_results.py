"""Reading evaluation results in tests: nested metric dicts for ``pytest.approx``, and the CLI's table lines."""

from __future__ import annotations

import re
from typing import Any, Dict, List

_INTERVAL = re.compile(r"\[[^\]]*\]")


def flat(metrics: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``metrics`` with nested dicts (intervals) flattened to dotted keys ("intervals.ece.low": value)."""
    result: Dict[str, Any] = {}
    for key, value in metrics.items():
        result.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return result


def table_values(line: str) -> List[float]:
    """The numbers of one row of the CLI's metric table, without their intervals: "ECE 0.07 [0.05, 0.09] ..." → [0.07, ...]."""
    return [float(cell) for cell in _INTERVAL.sub(" ", line).split()[1:] if re.fullmatch(r"[+-]?\d+\.\d+", cell)]
