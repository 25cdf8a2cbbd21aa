"""The record (``calibration_config.json``): :data:`RECORD_SCHEMA`, its cross-field rules and its SHA-256
seal, and :class:`ArtifactError`, the error of every artifact check."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, NoReturn, Optional, Tuple

import torch

from .._probabilities import LOGITS, PROBABILITIES
from ..version import __version__
from .files import CALIBRATION_CONFIG
from .identity import repo_id_problem
from .row_digests import row_digests_problem
from .value_checks import (
    MAX_CLASSES,
    Check, boolean, bootstrap_settings, choice, int_list, integer, intervals, is_int,
    json_object, label_map, mapping, optional, path_list, path_problem, registered_method, reliability,
    row_count, sha256, sha256_map, side_metrics, text, text_list, value_range, verdicts,
    verdicts_follow,
)

FORMAT_VERSION = 3  # 3 adds input_contract.outputs to format 2
#: the oldest format this version reads, and the one written for a record that holds no key of a newer format
PLAIN_FORMAT_VERSION = 2
RECORD_DIGEST_KEY = "record_sha256"

# Bounds of the record, checked before anything is allocated.
MAX_RECORD_BYTES = 32 * 2**20
MAX_DELTA_ELEMENTS = 2**26  # 3 × 4096 × 4096 images fit

RESAVE = "re-save or re-download the calibration (CalibratedModel.save_pretrained, or from_pretrained(..., force_download=True))."
UPGRADE = "Upgrade hf-calibrate (`pip install -U hf-calibrate`) if the calibration comes from a newer version, else re-save it."
REFIT = ("fit the calibration again and save it with this version into a new folder "
         "(CalibratedModel.fit(...).save_pretrained(new_folder)).")


class ArtifactError(ValueError):
    """A saved calibration that cannot be loaded as it is; the message names the file and the fix."""


def _fail(file: Any, key: str, problem: str, fix: str = RESAVE) -> NoReturn:
    raise ArtifactError(f"{file}: {key} {problem}; {fix}")


@dataclasses.dataclass(frozen=True)
class Field:
    """One key of the record: its check, whether every record holds it, the fix, and the format version that
    introduced it (a record claiming an older format cannot hold it)."""

    check: Check
    required: bool = False
    fix: str = RESAVE
    since: int = PLAIN_FORMAT_VERSION


_SPACES = ("pixel_values", "inputs_embeds", "input")
_TASKS = ("image-classification", "text-classification", "tensor-classification")
_FINGERPRINT = r"sha256:[0-9a-f]{64}"
_LIBRARY_TASKS = {"timm": _TASKS[:1], "transformers": _TASKS[:2], "torch": _TASKS[2:]}

#: Every key of ``calibration_config.json`` that loading reads, by dotted path (parents first).
#: Keys not listed are tolerated (and covered by ``record_sha256`` anyway).
#: To add a key, add one line.
RECORD_SCHEMA: Dict[str, Field] = {
    "format_version": Field(integer(PLAIN_FORMAT_VERSION, FORMAT_VERSION), True, UPGRADE),
    "library_version": Field(text(64)),
    "method": Field(registered_method, True, UPGRADE),
    "calibrator": Field(mapping, True),
    "calibrator.num_classes": Field(integer(1, MAX_CLASSES), True),
    "calibrator.delta_shape": Field(int_list(4, 2**24, MAX_DELTA_ELEMENTS)),
    "calibrator.delta_space": Field(choice(*_SPACES)),
    "calibrator.n_bins": Field(integer(1, 100_000)),
    "calibrator.mode": Field(choice("top_label", "one_vs_rest")),
    "calibrator.num_knots": Field(integer(2, 1_000_000)),
    "calibrator.feature_dim": Field(integer(1, 1_000_000)),
    "calibrator.latent_dim": Field(integer(1, 1_000_000)),
    "calibrator.samples": Field(integer(1, 10_000)),
    "calibrator.prediction": Field(choice("sample", "mean")),
    "options": Field(json_object(), True),
    "base_model": Field(mapping, True),
    "base_model.library": Field(choice("timm", "transformers", "torch"), True),
    "base_model.task": Field(choice(*_TASKS), True),
    "base_model.weights": Field(choice("included", "reference", "not_saved"), True),
    "base_model.repo_id": Field(optional(repo_id_problem)),
    "base_model.revision": Field(optional(text(256, r"[A-Za-z0-9._/+=-]+"))),
    "base_model.num_labels": Field(integer(1, MAX_CLASSES), True),
    "base_model.id2label": Field(label_map, True),
    "base_model.fingerprint": Field(optional(text(71, _FINGERPRINT))),
    "base_model.classifier": Field(optional(text(512))),
    "input_contract": Field(mapping),
    "input_contract.space": Field(optional(choice(*_SPACES))),
    "input_contract.shape": Field(optional(int_list(4, 2**24, MAX_DELTA_ELEMENTS))),
    "input_contract.input_size": Field(optional(int_list(4, 2**24, MAX_DELTA_ELEMENTS))),
    "input_contract.value_range": Field(optional(value_range)),
    "input_contract.preprocessing": Field(optional(json_object())),
    "input_contract.outputs": Field(optional(choice(LOGITS, PROBABILITIES)), since=3),
    "input_contract.preprocessing.max_length": Field(optional(integer(1, 10**12))),
    "preprocessing": Field(optional(json_object())),
    "fit": Field(mapping, True),
    "fit.summary": Field(optional(mapping)),
    "fit.data_fingerprints": Field(text_list(8, 64)),
    "fit.calibration_rows": Field(row_digests_problem),
    "evaluation": Field(optional(mapping)),
    "evaluation.dataset": Field(text(1024)),
    "evaluation.split": Field(optional(text(256))),
    "evaluation.in_sample": Field(optional(boolean)),
    "evaluation.in_sample_rows": Field(optional(row_count)),
    "evaluation.calibration_dataset": Field(optional(text(1024))),
    "evaluation.calibration_split": Field(optional(text(256))),
    "evaluation.reliability": Field(optional(reliability)),
    "evaluation.uncalibrated": Field(side_metrics),
    "evaluation.calibrated": Field(side_metrics),
    "evaluation.uncalibrated.intervals": Field(intervals),
    "evaluation.calibrated.intervals": Field(intervals),
    "evaluation.difference": Field(intervals),
    "evaluation.verdicts": Field(verdicts),
    "evaluation.bootstrap": Field(bootstrap_settings),
    "files": Field(mapping, True),
    "files.weights": Field(path_problem, True),
    "files.base": Field(optional(path_problem)),
    "files.manifest": Field(path_list, True),
    "files.sha256": Field(sha256_map, True),
    RECORD_DIGEST_KEY: Field(sha256, True),
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
    if not is_int(version):
        raise ArtifactError(f"{file} has no integer format_version; it is not an hf_calibrate record. {RESAVE}")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"{file} has format version {version}, newer than this hf_calibrate {__version__} reads "
            f"({FORMAT_VERSION}); upgrade with `pip install -U hf-calibrate`."
        )
    if version < PLAIN_FORMAT_VERSION:
        raise ArtifactError(
            f"{file} has format_version {version}, older than the formats this hf_calibrate {__version__} reads "
            f"({PLAIN_FORMAT_VERSION} to {FORMAT_VERSION}; format 1 predates the first release and carries no digests to "
            f"verify it). Nothing was loaded or changed; {REFIT}"
        )
    return version


def validate_record(record: Any, file: Any) -> None:
    """Check ``record``'s format version, then the record against :data:`RECORD_SCHEMA`, the cross-field rules and
    its digest; a record holding a key of a newer format than it claims (:attr:`Field.since`) is refused as tampered."""
    version = _check_version(record, file)
    for key, field in RECORD_SCHEMA.items():
        present, value = _lookup(record, key)
        if not present:
            if field.required:
                _fail(file, f"key {key!r}", "is missing", field.fix)
            continue
        if field.since > version:
            _fail(file, f"key {key!r}", f"exists only from format {field.since} on, but the record claims format {version}: "
                  "it was edited to look older (a reader of that format would misread it), and edited records are not loaded")
        problem = field.check(value)
        if problem:
            _fail(file, f"key {key!r}", f"{problem}, found {_shown(value)}", field.fix)
    _check_consistency(record, file)
    if record[RECORD_DIGEST_KEY] != record_digest(record):
        _fail(
            file, f"key {RECORD_DIGEST_KEY!r}", "does not match the record: the file was changed after it was saved "
            "(edited, corrupted or mixed with another save), and hand-edited records are not loaded",
        )


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 300 else shown[:297] + "..."


def _check_consistency(record: Dict[str, Any], file: Any) -> None:
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
        ("evaluation.verdicts", verdicts_follow(record.get("evaluation")),
         "must each read their paired interval in evaluation.difference (improved: below 0, made worse: above 0)"),
        ("evaluation.bootstrap", not (record.get("evaluation") or {}).get("difference") or "bootstrap" in record["evaluation"],
         "must say how the intervals in evaluation.difference were made"),
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
