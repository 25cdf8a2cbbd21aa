"""Checks of the record's values, one per kind of field: each takes a value and returns None when it is fine, else
what it must be (:data:`Check`); :data:`.schema.RECORD_SCHEMA` names one per key."""

from __future__ import annotations

import math
import os
import re
from pathlib import PurePosixPath
from typing import Any, Callable, Optional


from ..calibrators import CALIBRATORS
from ..metrics.intervals import HIGHER_IS_BETTER, VERDICTS, Interval, verdict

#: the most classes a record may name (its label map, its calibrator's num_classes)
MAX_CLASSES = 1_000_000


Check = Callable[[Any], Optional[str]]  # None when the value is fine, else what it must be


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int, high: int) -> Check:
    return lambda value: None if is_int(value) and low <= value <= high else f"must be an integer in [{low}, {high}]"


def text(max_length: int = 256, pattern: str = r"[^\x00-\x1f]*") -> Check:
    compiled = re.compile(pattern)

    def check(value: Any) -> Optional[str]:
        if isinstance(value, str) and len(value) <= max_length and compiled.fullmatch(value):
            return None
        return f"must be a string of at most {max_length} characters matching {pattern}"

    return check


def boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else "must be true or false"


def choice(*allowed: str) -> Check:
    return lambda value: None if isinstance(value, str) and value in allowed else f"must be one of {list(allowed)}"


def registered_method(value: Any) -> Optional[str]:
    """A method of the registry as it is when checked (methods registered after import count too)."""
    problem = choice(*CALIBRATORS)(value)
    if problem is None or not isinstance(value, str):
        return problem
    return f"{problem} (a method defined outside hf_calibrate is known once the module defining its class is imported)"


def optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def row_count(value: Any) -> Optional[str]:
    ok = (isinstance(value, dict) and set(value) == {"calibration", "total"} and all(is_int(v) for v in value.values())
          and 0 <= value["calibration"] <= value["total"])
    return None if ok else "must be {'calibration': k, 'total': n} with integers 0 <= k <= n"


def mapping(value: Any) -> Optional[str]:
    return None if isinstance(value, dict) else "must be a JSON object"


def json_problem(value: Any, depth: int) -> Optional[str]:
    """Why ``value`` is not a finite JSON value nested at most ``depth`` levels deep."""
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must hold finite numbers only"
    if depth <= 0:
        return "is nested too deeply"
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    if items is None:
        return "must hold JSON values only"
    return next((problem for item in items if (problem := json_problem(item, depth - 1))), None)


def json_object(max_depth: int = 4) -> Check:
    """A JSON object of scalars, lists and objects (finite numbers, bounded depth)."""
    return lambda value: mapping(value) or json_problem(value, max_depth)


def int_list(max_length: int, high: int, max_product: int) -> Check:
    def check(value: Any) -> Optional[str]:
        if (
            isinstance(value, list) and 1 <= len(value) <= max_length
            and all(is_int(item) and 1 <= item <= high for item in value) and math.prod(value) <= max_product
        ):
            return None
        return f"must be a list of 1 to {max_length} positive integers (at most {high} each, product at most {max_product})"

    return check


def value_range(value: Any) -> Optional[str]:
    if isinstance(value, list) and len(value) == 2 and number_list(value, -1e12, 1e12, allow_null=False) \
            and value[0] <= value[1]:
        return None
    return "must be [min, max]: two finite numbers, min <= max"


def path_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a plain relative path inside a folder, or None."""
    if (
        isinstance(value, str) and 0 < len(value) <= 512 and not os.path.isabs(value) and "\\" not in value
        and "\x00" not in value and ".." not in PurePosixPath(value).parts and os.path.normpath(value) != "."
        and not value.startswith("/")
    ):
        return None
    return "is not a plain relative path inside the folder"


def path_list(value: Any) -> Optional[str]:
    if isinstance(value, list) and len(value) <= 100_000 and not any(path_problem(item) for item in value):
        return None
    return "must be a list of plain relative paths inside the folder"


_SHA256 = re.compile(r"[0-9a-f]{64}")


def sha256(value: Any) -> Optional[str]:
    return None if isinstance(value, str) and _SHA256.fullmatch(value) else "must be a SHA-256 digest (64 hex digits)"


def sha256_map(value: Any) -> Optional[str]:
    if isinstance(value, dict) and not any(path_problem(name) or sha256(digest) for name, digest in value.items()):
        return None
    return "must map relative file paths to SHA-256 digests"


def label_map(value: Any) -> Optional[str]:
    if isinstance(value, dict) and len(value) <= MAX_CLASSES and all(
        re.fullmatch(r"0|[1-9][0-9]{0,6}", key) and isinstance(label, str) and len(label) <= 4096
        for key, label in value.items()
    ):
        return None
    return "must map class indices ('0', '1', ...) to label strings"


def number_list(value: Any, low: float, high: float, allow_null: bool) -> bool:
    return isinstance(value, list) and all(
        (item is None and allow_null) or (isinstance(item, (int, float)) and not isinstance(item, bool) and low <= item <= high)
        for item in value
    )


def text_list(max_items: int, max_length: int) -> Check:
    item = text(max_length)

    def check(value: Any) -> Optional[str]:
        if isinstance(value, list) and len(value) <= max_items and not any(item(entry) for entry in value):
            return None
        return f"must be a list of at most {max_items} strings of at most {max_length} characters"

    return check


def reliability(value: Any) -> Optional[str]:
    """Reliability bins by side: equal-length lists of counts (≥ 0) and of mean confidence and accuracy (in [0, 1] or null)."""
    if isinstance(value, dict) and len(value) <= 16 and all(
        isinstance(bins, dict) and number_list(bins.get("counts"), 0, 2.0**53, False)
        and all(number_list(bins.get(key), 0.0, 1.0 + 1e-9, True) for key in ("mean_confidence", "accuracy"))
        and len(bins["counts"]) == len(bins["mean_confidence"]) == len(bins["accuracy"]) <= 100_000
        for bins in value.values()
    ):
        return None
    return "must map each side to equal-length lists 'counts' (numbers >= 0), 'mean_confidence' and 'accuracy' (in [0, 1] or null)"


def number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def intervals(value: Any) -> Optional[str]:
    """Intervals by metric name: ``point``, ``low``, ``high`` (finite numbers or null), ``confidence`` in (0, 1)."""
    if isinstance(value, dict) and len(value) <= 64 and all(
        isinstance(name, str) and isinstance(interval, dict)
        and all(key in interval and number_or_null(interval[key]) for key in ("point", "low", "high"))
        and (None in (interval["low"], interval["high"]) or interval["low"] <= interval["high"])
        and isinstance(interval.get("confidence"), float) and 0.0 < interval["confidence"] < 1.0
        for name, interval in value.items()
    ):
        return None
    return ("must map each metric to an interval with 'point', 'low' <= 'high' (numbers or null) and 'confidence' "
            "in (0, 1)")


def side_metrics(value: Any) -> Optional[str]:
    """One side of an evaluation: metric name -> a finite number (its ``intervals`` are checked on their own)."""
    if isinstance(value, dict) and len(value) <= 64 and all(
        isinstance(name, str) and (name == "intervals" or (number_or_null(metric) and metric is not None))
        for name, metric in value.items()
    ):
        return None
    return "must map each metric name to a finite number"


def bootstrap_settings(value: Any) -> Optional[str]:
    """The settings of an evaluation's intervals: integer ``replicates`` >= 1 and ``seed``, ``confidence`` in (0, 1)."""
    if isinstance(value, dict) and is_int(value.get("replicates")) and value["replicates"] >= 1 and is_int(value.get("seed")) \
            and isinstance(value.get("confidence"), float) and 0.0 < value["confidence"] < 1.0:
        return None
    return "must hold an integer 'replicates' >= 1, an integer 'seed' and a 'confidence' in (0, 1)"


def verdicts_follow(evaluation: Any) -> bool:
    """Each recorded verdict is what its paired difference reads (improved: the interval below 0; made worse: above;
    accuracy the other way round), or "no detectable change" (what too small a test set is given)."""
    if not isinstance(evaluation, dict) or not evaluation.get("verdicts"):
        return True
    differences = evaluation.get("difference") or {}
    for name, said in evaluation["verdicts"].items():
        interval = differences.get(name)
        if not isinstance(interval, dict):
            return False
        if None in (interval.get("low"), interval.get("high")):  # no interval (too few samples): nothing detected
            if said != VERDICTS[2]:
                return False
            continue
        bounds = Interval(interval["point"], interval["low"], interval["high"], interval["confidence"], 0, 0)
        if said not in (verdict(bounds, name not in HIGHER_IS_BETTER), VERDICTS[2]):
            return False
    return True


def verdicts(value: Any) -> Optional[str]:
    if isinstance(value, dict) and len(value) <= 64 and all(verdict in VERDICTS for verdict in value.values()):
        return None
    return f"must map each metric to one of {list(VERDICTS)}"


