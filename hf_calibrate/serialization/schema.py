"""The record (``calibration_config.json``): :data:`RECORD_SCHEMA`, its cross-field rules and its SHA-256
seal, and :class:`ArtifactError`, the error of every artifact check."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

import torch

from .._probabilities import LOGITS, PROBABILITIES
from ..calibrators import CALIBRATORS
from ..metrics.intervals import HIGHER_IS_BETTER, VERDICTS, Interval, verdict
from ..version import __version__
from .files import CALIBRATION_CONFIG
from .identity import repo_id_problem
from .row_digests import row_digests_problem

FORMAT_VERSION = 3  # 2: manifest and SHA-256 digests; 3: input_contract.outputs; version 1 records still load
#: the format of a record that holds no key of a newer one: every reader since format 2 reads it alike
PLAIN_FORMAT_VERSION = 2
RECORD_DIGEST_KEY = "record_sha256"

# Bounds of the record, checked before anything is allocated.
MAX_RECORD_BYTES = 32 * 2**20
MAX_CLASSES = 1_000_000
MAX_DELTA_ELEMENTS = 2**26  # 3 × 4096 × 4096 images fit

RESAVE = "re-save or re-download the calibration (CalibratedModel.save_pretrained, or from_pretrained(..., force_download=True))."
UPGRADE = "Upgrade hf-calibrate (`pip install -U hf-calibrate`) if the calibration comes from a newer version, else re-save it."


class ArtifactError(ValueError):
    """A saved calibration that cannot be loaded as it is; the message names the file and the fix."""


class UnverifiedArtifactWarning(UserWarning):
    """A format-1 record (written before digests) was loaded on request: nothing proves it is as it was saved."""


def _fail(file: Any, key: str, problem: str, fix: str = RESAVE) -> NoReturn:
    raise ArtifactError(f"{file}: {key} {problem}; {fix}")


# ----------------------------------------------------------------------------- the record schema

Check = Callable[[Any], Optional[str]]  # None when the value is fine, else what it must be


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(low: int, high: int) -> Check:
    return lambda value: None if _is_int(value) and low <= value <= high else f"must be an integer in [{low}, {high}]"


def _text(max_length: int = 256, pattern: str = r"[^\x00-\x1f]*") -> Check:
    compiled = re.compile(pattern)

    def check(value: Any) -> Optional[str]:
        if isinstance(value, str) and len(value) <= max_length and compiled.fullmatch(value):
            return None
        return f"must be a string of at most {max_length} characters matching {pattern}"

    return check


def _boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else "must be true or false"


def _choice(*allowed: str) -> Check:
    return lambda value: None if isinstance(value, str) and value in allowed else f"must be one of {list(allowed)}"


def _registered_method(value: Any) -> Optional[str]:
    """A method of the registry as it is when checked (methods registered after import count too)."""
    problem = _choice(*CALIBRATORS)(value)
    if problem is None or not isinstance(value, str):
        return problem
    return f"{problem} (a method defined outside hf_calibrate is known once the module defining its class is imported)"


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _row_count(value: Any) -> Optional[str]:
    ok = (isinstance(value, dict) and set(value) == {"calibration", "total"} and all(_is_int(v) for v in value.values())
          and 0 <= value["calibration"] <= value["total"])
    return None if ok else "must be {'calibration': k, 'total': n} with integers 0 <= k <= n"


def _mapping(value: Any) -> Optional[str]:
    return None if isinstance(value, dict) else "must be a JSON object"


def _json_problem(value: Any, depth: int) -> Optional[str]:
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
    return next((problem for item in items if (problem := _json_problem(item, depth - 1))), None)


def _json_object(max_depth: int = 4) -> Check:
    """A JSON object of scalars, lists and objects (finite numbers, bounded depth)."""
    return lambda value: _mapping(value) or _json_problem(value, max_depth)


def _int_list(max_length: int, high: int, max_product: int) -> Check:
    def check(value: Any) -> Optional[str]:
        if (
            isinstance(value, list) and 1 <= len(value) <= max_length
            and all(_is_int(item) and 1 <= item <= high for item in value) and math.prod(value) <= max_product
        ):
            return None
        return f"must be a list of 1 to {max_length} positive integers (at most {high} each, product at most {max_product})"

    return check


def _value_range(value: Any) -> Optional[str]:
    if isinstance(value, list) and len(value) == 2 and _number_list(value, -1e12, 1e12, allow_null=False) \
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


def _path_list(value: Any) -> Optional[str]:
    if isinstance(value, list) and len(value) <= 100_000 and not any(path_problem(item) for item in value):
        return None
    return "must be a list of plain relative paths inside the folder"


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(value: Any) -> Optional[str]:
    return None if isinstance(value, str) and _SHA256.fullmatch(value) else "must be a SHA-256 digest (64 hex digits)"


def _sha256_map(value: Any) -> Optional[str]:
    if isinstance(value, dict) and not any(path_problem(name) or _sha256(digest) for name, digest in value.items()):
        return None
    return "must map relative file paths to SHA-256 digests"


def _label_map(value: Any) -> Optional[str]:
    if isinstance(value, dict) and len(value) <= MAX_CLASSES and all(
        re.fullmatch(r"0|[1-9][0-9]{0,6}", key) and isinstance(label, str) and len(label) <= 4096
        for key, label in value.items()
    ):
        return None
    return "must map class indices ('0', '1', ...) to label strings"


def _number_list(value: Any, low: float, high: float, allow_null: bool) -> bool:
    return isinstance(value, list) and all(
        (item is None and allow_null) or (isinstance(item, (int, float)) and not isinstance(item, bool) and low <= item <= high)
        for item in value
    )


def _text_list(max_items: int, max_length: int) -> Check:
    item = _text(max_length)

    def check(value: Any) -> Optional[str]:
        if isinstance(value, list) and len(value) <= max_items and not any(item(entry) for entry in value):
            return None
        return f"must be a list of at most {max_items} strings of at most {max_length} characters"

    return check


def _reliability(value: Any) -> Optional[str]:
    """Reliability bins by side: equal-length lists of counts (≥ 0) and of mean confidence and accuracy (in [0, 1] or null)."""
    if isinstance(value, dict) and len(value) <= 16 and all(
        isinstance(bins, dict) and _number_list(bins.get("counts"), 0, 2.0**53, False)
        and all(_number_list(bins.get(key), 0.0, 1.0 + 1e-9, True) for key in ("mean_confidence", "accuracy"))
        and len(bins["counts"]) == len(bins["mean_confidence"]) == len(bins["accuracy"]) <= 100_000
        for bins in value.values()
    ):
        return None
    return "must map each side to equal-length lists 'counts' (numbers >= 0), 'mean_confidence' and 'accuracy' (in [0, 1] or null)"


def _number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _intervals(value: Any) -> Optional[str]:
    """Intervals by metric name: ``point``, ``low``, ``high`` (finite numbers or null), ``confidence`` in (0, 1)."""
    if isinstance(value, dict) and len(value) <= 64 and all(
        isinstance(name, str) and isinstance(interval, dict)
        and all(key in interval and _number_or_null(interval[key]) for key in ("point", "low", "high"))
        and (None in (interval["low"], interval["high"]) or interval["low"] <= interval["high"])
        and isinstance(interval.get("confidence"), float) and 0.0 < interval["confidence"] < 1.0
        for name, interval in value.items()
    ):
        return None
    return ("must map each metric to an interval with 'point', 'low' <= 'high' (numbers or null) and 'confidence' "
            "in (0, 1)")


def _side_metrics(value: Any) -> Optional[str]:
    """One side of an evaluation: metric name -> a finite number (its ``intervals`` are checked on their own)."""
    if isinstance(value, dict) and len(value) <= 64 and all(
        isinstance(name, str) and (name == "intervals" or (_number_or_null(metric) and metric is not None))
        for name, metric in value.items()
    ):
        return None
    return "must map each metric name to a finite number"


def _bootstrap_settings(value: Any) -> Optional[str]:
    """The settings of an evaluation's intervals: integer ``replicates`` >= 1 and ``seed``, ``confidence`` in (0, 1)."""
    if isinstance(value, dict) and _is_int(value.get("replicates")) and value["replicates"] >= 1 and _is_int(value.get("seed")) \
            and isinstance(value.get("confidence"), float) and 0.0 < value["confidence"] < 1.0:
        return None
    return "must hold an integer 'replicates' >= 1, an integer 'seed' and a 'confidence' in (0, 1)"


def _verdicts_follow(evaluation: Any) -> bool:
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


def _verdicts(value: Any) -> Optional[str]:
    if isinstance(value, dict) and len(value) <= 64 and all(verdict in VERDICTS for verdict in value.values()):
        return None
    return f"must map each metric to one of {list(VERDICTS)}"


@dataclasses.dataclass(frozen=True)
class Field:
    """One key of the record: its check, the format version from which it is required, the fix, and the format
    version that introduced it (a record claiming an older format cannot hold it)."""

    check: Check
    required_since: Optional[int] = None  # None: optional in every version
    fix: str = RESAVE
    since: int = 1


_SPACES = ("pixel_values", "inputs_embeds", "input")
_TASKS = ("image-classification", "text-classification", "tensor-classification")
_FINGERPRINT = r"sha256:[0-9a-f]{64}"
_LIBRARY_TASKS = {"timm": _TASKS[:1], "transformers": _TASKS[:2], "torch": _TASKS[2:]}

#: Every key of ``calibration_config.json`` that loading reads, by dotted path (parents first).
#: Keys not listed are tolerated (format-2 records are covered by ``record_sha256`` anyway).
#: To add a key, add one line.
RECORD_SCHEMA: Dict[str, Field] = {
    "format_version": Field(_integer(1, FORMAT_VERSION), 1, UPGRADE),
    "library_version": Field(_text(64)),
    "method": Field(_registered_method, 1, UPGRADE),
    "calibrator": Field(_mapping, 1),
    "calibrator.num_classes": Field(_integer(1, MAX_CLASSES), 1),
    "calibrator.delta_shape": Field(_int_list(4, 2**24, MAX_DELTA_ELEMENTS)),
    "calibrator.delta_space": Field(_choice(*_SPACES)),
    "calibrator.n_bins": Field(_integer(1, 100_000)),
    "calibrator.mode": Field(_choice("top_label", "one_vs_rest")),
    "calibrator.num_knots": Field(_integer(2, 1_000_000)),
    "calibrator.feature_dim": Field(_integer(1, 1_000_000)),
    "calibrator.latent_dim": Field(_integer(1, 1_000_000)),
    "calibrator.samples": Field(_integer(1, 10_000)),
    "calibrator.prediction": Field(_choice("sample", "mean")),
    "calibrator.shared_hidden": Field(_boolean, since=2),
    "options": Field(_json_object(), 1),
    "base_model": Field(_mapping, 1),
    "base_model.library": Field(_choice("timm", "transformers", "torch"), 1),
    "base_model.task": Field(_choice(*_TASKS), 1),
    "base_model.weights": Field(_choice("included", "reference", "not_saved"), 1),
    "base_model.repo_id": Field(_optional(repo_id_problem)),
    "base_model.revision": Field(_optional(_text(256, r"[A-Za-z0-9._/+=-]+"))),
    "base_model.num_labels": Field(_integer(1, MAX_CLASSES), 1),
    "base_model.id2label": Field(_label_map, 1),
    "base_model.fingerprint": Field(_optional(_text(71, _FINGERPRINT))),
    "base_model.classifier": Field(_optional(_text(512)), since=2),
    "input_contract": Field(_mapping),
    "input_contract.space": Field(_optional(_choice(*_SPACES))),
    "input_contract.shape": Field(_optional(_int_list(4, 2**24, MAX_DELTA_ELEMENTS))),
    "input_contract.input_size": Field(_optional(_int_list(4, 2**24, MAX_DELTA_ELEMENTS)), since=2),
    "input_contract.value_range": Field(_optional(_value_range), since=2),
    "input_contract.preprocessing": Field(_optional(_json_object())),
    "input_contract.outputs": Field(_optional(_choice(LOGITS, PROBABILITIES)), since=3),
    "input_contract.preprocessing.max_length": Field(_optional(_integer(1, 10**12))),
    "preprocessing": Field(_optional(_json_object())),
    "fit": Field(_mapping, 1),
    "fit.summary": Field(_optional(_mapping)),
    "fit.data_fingerprints": Field(_text_list(8, 64), since=2),
    "fit.calibration_rows": Field(row_digests_problem, since=2),
    "evaluation": Field(_optional(_mapping)),
    "evaluation.dataset": Field(_text(1024)),
    "evaluation.split": Field(_optional(_text(256))),
    "evaluation.in_sample": Field(_optional(_boolean), since=2),
    "evaluation.in_sample_rows": Field(_optional(_row_count), since=2),
    "evaluation.calibration_dataset": Field(_optional(_text(1024)), since=2),
    "evaluation.calibration_split": Field(_optional(_text(256)), since=2),
    "evaluation.reliability": Field(_optional(_reliability)),
    "evaluation.uncalibrated": Field(_side_metrics),
    "evaluation.calibrated": Field(_side_metrics),
    "evaluation.uncalibrated.intervals": Field(_intervals, since=2),
    "evaluation.calibrated.intervals": Field(_intervals, since=2),
    "evaluation.difference": Field(_intervals, since=2),
    "evaluation.verdicts": Field(_verdicts, since=2),
    "evaluation.bootstrap": Field(_bootstrap_settings, since=2),
    "files": Field(_mapping, 1),
    "files.weights": Field(path_problem, 1),
    "files.base": Field(_optional(path_problem)),
    "files.manifest": Field(_path_list, 2, since=2),
    "files.sha256": Field(_sha256_map, 2, since=2),
    RECORD_DIGEST_KEY: Field(_sha256, 2, since=2),
}


def _lookup(record: Dict[str, Any], key: str) -> Tuple[bool, Any]:
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _check_version(record: Any, file: Any) -> int:
    version = record.get("format_version") if isinstance(record, dict) else None
    if not _is_int(version):
        raise ArtifactError(f"{file} has no integer format_version; it is not an hf_calibrate record. {RESAVE}")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{file} has format version {version}, newer than this hf_calibrate {__version__} reads "
            f"({FORMAT_VERSION}); upgrade with `pip install -U hf-calibrate`."
        )
    return version


def validate_record(record: Any, file: Any) -> None:
    """Check ``record`` against :data:`RECORD_SCHEMA`, the cross-field rules and (format 2) its digest; a record
    holding a key of a newer format than it claims (:attr:`Field.since`) is refused as tampered."""
    version = _check_version(record, file)
    for key, field in RECORD_SCHEMA.items():
        present, value = _lookup(record, key)
        if not present:
            if field.required_since is not None and version >= field.required_since:
                _fail(file, f"key {key!r}", "is missing", field.fix)
            continue
        if field.since > version:
            _fail(file, f"key {key!r}", f"exists only from format {field.since} on, but the record claims format {version}: "
                  "it was edited to look older (which would skip its digest checks), and edited records are not loaded")
        problem = field.check(value)
        if problem:
            _fail(file, f"key {key!r}", f"{problem}, found {_shown(value)}", field.fix)
    _check_consistency(record, version, file)
    if RECORD_DIGEST_KEY in record and record[RECORD_DIGEST_KEY] != record_digest(record):  # checked in any version
        _fail(
            file, f"key {RECORD_DIGEST_KEY!r}", "does not match the record: the file was changed after it was saved "
            "(edited, corrupted or mixed with another save), and hand-edited records are not loaded",
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def _check_consistency(record: Dict[str, Any], version: int, file: Any) -> None:
    """Rules between keys (each names the key it faults)."""
    base, files, calibrator = record["base_model"], record["files"], record["calibrator"]
    classes, library, weights = calibrator["num_classes"], base["library"], base["weights"]
    contract = record.get("input_contract") or {}
    delta = calibrator.get("delta_shape")
    rules = [
        ("base_model.num_labels", base["num_labels"] == classes, f"is {base['num_labels']} but calibrator.num_classes is {classes}"),
        ("base_model.id2label", set(base["id2label"]) == {str(i) for i in range(classes)}, f"must name each class 0..{classes - 1} once"),
        ("base_model.weights", (library == "torch") == (weights == "not_saved"), f"is {weights!r}, impossible for a {library} base"),
        ("base_model.task", base["task"] in _LIBRARY_TASKS[library], f"must be one of {_LIBRARY_TASKS[library]} for a {library} base"),
        ("base_model.repo_id", weights != "reference" or bool(base.get("repo_id")), "must name the base repo of a reference-only calibration"),
        ("files.base", (library == "transformers" and weights == "included") == bool(files.get("base")),
         "must name the base model folder exactly when a transformers base is included"),
        ("calibrator.delta_space", None in (calibrator.get("delta_space"), contract.get("space"))
         or calibrator.get("delta_space") == contract.get("space"), "differs from input_contract.space"),
        ("input_contract.shape", None in (delta, contract.get("shape")) or delta == contract.get("shape"), f"differs from calibrator.delta_shape {delta}"),
        ("input_contract.input_size", _input_size_fits(base["task"], contract.get("input_size")),
         "must be [channels, height, width] for an image model and null for a text model"),
        ("input_contract.input_size", None in (delta, contract.get("input_size")) or delta == contract.get("input_size"),
         f"differs from calibrator.delta_shape {delta} (δ is shaped like one calibration input)"),
        ("evaluation.verdicts", _verdicts_follow(record.get("evaluation")),
         "must each read their paired interval in evaluation.difference (improved: below 0, made worse: above 0)"),
        ("evaluation.bootstrap", not (record.get("evaluation") or {}).get("difference") or "bootstrap" in record["evaluation"],
         "must say how the intervals in evaluation.difference were made"),
    ]
    if version >= 2:
        rules += [
            ("files.manifest", {CALIBRATION_CONFIG, files["weights"]} <= set(files["manifest"]), "must list the record and the weights file"),
            ("files.sha256", files["weights"] in files["sha256"], f"must hold the digest of {files['weights']}"),
        ]
    for key, ok, problem in rules:
        if not ok:
            _fail(file, f"key {key!r}", problem)


def _input_size_fits(task: str, size: Optional[List[int]]) -> bool:
    """The calibrated input size: [C, H, W] for images, none for text, any shape for plain tensors."""
    if size is None:
        return True
    return {"image-classification": len(size) == 3, "text-classification": False}.get(task, True)


def record_digest(record: Dict[str, Any]) -> str:
    """SHA-256 of the record's canonical JSON (sorted keys, no spaces, ASCII), without ``record_sha256``."""
    body = {key: value for key, value in record.items() if key != RECORD_DIGEST_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def seal_record(record: Dict[str, Any]) -> Dict[str, Any]:
    """The record as JSON will read it back, with its ``record_sha256`` (re)computed."""
    normalised = json.loads(json.dumps(record, default=_json_default))
    normalised[RECORD_DIGEST_KEY] = record_digest(normalised)
    return normalised


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set)):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return repr(value)
