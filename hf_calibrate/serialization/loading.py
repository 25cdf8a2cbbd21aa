"""Loading an artifact: its record, the calibrator's tensors, their checks against the base, the base
model and the preprocessor; safetensors only, nothing trusted before it is checked."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from torch import nn

from ..backbones import Backbone
from ..backbones.loading import IMAGE_TASK, TEXT_TASK, auto_classes, load_timm_folder
from ..calibrators import Calibrator, calibrator_class
from ..backbones.base import model_label_names
from .files import BASE_FOLDER, CALIBRATION_CONFIG, CARD_FILE
from .identity import weights_fingerprint
from .ownership import file_sha256, staging_folders
from .stated_values import check_stated_values
from .schema import MAX_RECORD_BYTES, REFIT, RESAVE, ArtifactError, _fail, validate_record
from .value_checks import path_problem

# Bounds of the calibration tensors, checked before anything is allocated.
MAX_CALIBRATION_ELEMENTS = 2**30
MAX_TENSOR_HEADER_BYTES = 2**20
MAX_LOG_TEMPERATURE = math.log(1e4)  # T within [1e-4, 1e4]
MAX_ABS_VALUE = 1e6  # any other calibration tensor


# ----------------------------------------------------------------------------- reading the record


def read_record(root: Path) -> Dict[str, Any]:
    """Parse ``calibration_config.json`` and check it (:func:`validate_record`: its format version, schema and digest)
    before anything is built."""
    path = root / CALIBRATION_CONFIG
    if not path.is_file():
        raise ArtifactError(
            f"{root} has no {CALIBRATION_CONFIG}: it is not an hf_calibrate calibration. Save one with "
            "CalibratedModel.save_pretrained(...)."
        )
    if path.stat().st_size > MAX_RECORD_BYTES:
        _fail(path, "the file", f"is larger than {MAX_RECORD_BYTES} bytes, far more than any calibration record")
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArtifactError(f"{path} is not valid JSON ({str(error)[:200]}); re-save or re-download the calibration.") from None
    if not isinstance(record, dict):
        raise ArtifactError(f"{path} is not a JSON object; it is not an hf_calibrate record. {RESAVE}")
    validate_record(record, path)
    return record


def check_complete(root: Path, record: Dict[str, Any]) -> None:
    """Refuse a folder whose files are not those its record lists: a file of the manifest missing, or one whose
    SHA-256 differs from ``files.sha256`` (a save killed while installing its files, a download cut short, files
    edited or mixed from two saves). Reads only: nothing is changed; the next save into the folder replaces them.
    The card (``README.md``), which users edit, is checked only while a save's staging folder shows a save was
    interrupted (the card is installed just before the record, so a card newer than the record means a torn folder).
    """
    digests, problems = record["files"]["sha256"], []
    interrupted = any(True for _ in staging_folders(root))
    for name in record["files"]["manifest"]:
        if name == CALIBRATION_CONFIG or (name == CARD_FILE and not interrupted):
            continue
        path = safe_join(root, name, what="manifest file")
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif name in digests and file_sha256(path) != digests[name]:
            problems.append(f"{path} is not the file that was saved (its SHA-256 is not the one 'files.sha256' records)")
    if problems:
        why = "a save into it was interrupted" if interrupted else (
            "an interrupted save or download, a corrupt or truncated file, or files edited or mixed from two saves")
        raise ArtifactError(
            f"{root} is not a complete calibration: {'; '.join(problems[:8])}{'; and more' if len(problems) > 8 else ''}"
            f" ({why}). Nothing was changed; re-save or re-download the calibration: save_pretrained into this folder "
            "replaces its files, from_pretrained(..., force_download=True) downloads them again."
        )


def safe_join(root: Path, name: str, *, what: str) -> Path:
    """``root / name`` for a file name read from a config; refuse anything leaving ``root``."""
    if path_problem(name):
        raise ArtifactError(
            f"{CALIBRATION_CONFIG} names {what} {name!r}, which is not a plain relative path inside the folder; "
            "the file was tampered with or corrupted — re-save or re-download the calibration."
        )
    # Lexical check only: in a hub cache every file of a snapshot is a symlink into ``blobs/``,
    # so resolving symlinks would put every legitimate file "outside" the snapshot folder.
    path = Path(os.path.abspath(root / name))
    if not path.is_relative_to(Path(os.path.abspath(root))):
        raise ArtifactError(f"{CALIBRATION_CONFIG} names {what} {name!r}, which resolves outside {root}; refusing to read it.")
    return path


# ----------------------------------------------------------------------------- the calibrator tensors

#: Allowed closed value range by the last part of a tensor name; any other float tensor must lie
#: within ±MAX_ABS_VALUE. Every float tensor must be finite.
TENSOR_RANGES: Dict[str, Tuple[float, float]] = {
    "log_temperature": (-MAX_LOG_TEMPERATURE, MAX_LOG_TEMPERATURE),
    "log_scale": (-MAX_LOG_TEMPERATURE, MAX_LOG_TEMPERATURE),
    "bin_values": (0.0, 1.0),
    "knots_x": (0.0, 1.0),
    "knots_y": (0.0, 1.0),
    "retention": (1e-6, 1.0),
}
MONOTONE_TENSORS = ("knots_x", "knots_y")  # non-decreasing along their last dimension
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _expected_tensors(cls: type, config: Dict[str, Any], file: Any) -> Dict[str, torch.Tensor]:
    """The calibrator's state (names, shapes, dtypes) built on the ``meta`` device: nothing is allocated."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = {parameter.name for parameter in parameters}
    required = {parameter.name for parameter in parameters if parameter.default is inspect.Parameter.empty}
    unknown, missing = sorted(set(config) - names), sorted(required - set(config))
    if unknown or missing:
        _fail(file, "key 'calibrator'", f"does not fit method {cls.method!r} (unknown keys {unknown}, missing keys {missing})",
              fix=f"a newer hf-calibrate may have written it (`pip install -U hf-calibrate`); else {REFIT}")
    try:
        with torch.device("meta"):
            probe = cls.from_config(config)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        _fail(file, "key 'calibrator'", f"does not describe a valid {cls.method!r} calibrator ({error})")
    state = probe.state_dict()
    total = sum(tensor.numel() for tensor in state.values())
    if total > MAX_CALIBRATION_ELEMENTS:
        _fail(file, "key 'calibrator'", f"implies {total} calibration values, more than the {MAX_CALIBRATION_ELEMENTS} allowed")
    return state


def _read_tensors(path: Path, expected: Dict[str, torch.Tensor], method: str) -> Tuple[Dict[str, torch.Tensor], bytes]:
    """The tensors of ``path`` (and its bytes), after checking its size, names, shapes and dtypes."""
    if not path.is_file():
        raise ArtifactError(f"{path} is missing; the calibration folder is incomplete — re-save or re-download it.")
    limit = sum(tensor.numel() * 8 for tensor in expected.values()) + MAX_TENSOR_HEADER_BYTES
    if path.stat().st_size > limit:
        _fail(path, "the file", f"is larger ({path.stat().st_size} bytes) than the tensors of this calibration can be")
    data = path.read_bytes()
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ArtifactError(
            f"{path} is not a readable safetensors file ({error}); it is corrupt or truncated — re-download it "
            "(force_download=True) or re-save the calibration."
        ) from None
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ArtifactError(
            f"{path} does not match method {method!r}: missing tensors {missing}, unexpected tensors "
            f"{unexpected}. The file and {CALIBRATION_CONFIG} come from different calibrations — re-save them together."
        )
    for name, reference in expected.items():
        _check_tensor_layout(path, name, tensors[name], reference)
    return tensors, data


def _check_tensor_layout(path: Path, name: str, tensor: torch.Tensor, reference: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(reference.shape):
        _fail(path, f"tensor {name!r}", f"has shape {tuple(tensor.shape)} but {CALIBRATION_CONFIG} implies {tuple(reference.shape)}")
    floating = reference.dtype in _FLOAT_DTYPES
    if (tensor.dtype not in _FLOAT_DTYPES) if floating else tensor.dtype != reference.dtype:
        _fail(path, f"tensor {name!r}", f"has dtype {tensor.dtype} but this method saves {reference.dtype}")


def check_tensor_values(path: Any, tensors: Dict[str, torch.Tensor]) -> None:
    """Every float tensor finite and within its :data:`TENSOR_RANGES` range; monotone knots."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        values = tensor.detach().double().cpu()
        if not torch.isfinite(values).all():
            _fail(path, f"tensor {name!r}", "holds NaN or infinite values, which no fit produces")
        last = name.rsplit(".", 1)[-1]
        low, high = TENSOR_RANGES.get(last, (-MAX_ABS_VALUE, MAX_ABS_VALUE))
        smallest, largest = float(values.min()), float(values.max())
        if smallest < low or largest > high:
            _fail(path, f"tensor {name!r}", f"has values in [{smallest:.6g}, {largest:.6g}], outside [{low:.6g}, {high:.6g}]")
        if last in MONOTONE_TENSORS and values.ndim >= 1 and bool((values.diff(dim=-1) < 0).any()):
            _fail(path, f"tensor {name!r}", "is not non-decreasing along its rows")


def load_calibrator(root: Path, record: Dict[str, Any]) -> Calibrator:
    """Rebuild the calibrator from a checked record: shapes first (on ``meta``), then verified tensors."""
    file = root / CALIBRATION_CONFIG
    cls = calibrator_class(record["method"])
    expected = _expected_tensors(cls, record["calibrator"], file)
    weights_name = record["files"]["weights"]
    path = safe_join(root, weights_name, what="weights file")
    tensors, data = _read_tensors(path, expected, record["method"])
    check_tensor_values(path, tensors)
    check_stated_values(file, record, tensors)
    if hashlib.sha256(data).hexdigest() != record["files"]["sha256"][weights_name]:
        _fail(path, "the file", f"does not match the SHA-256 recorded in {CALIBRATION_CONFIG} (key 'files.sha256'): "
              "it is corrupted or from another save")
    calibrator = cls.from_config(record["calibrator"])
    calibrator.load_state_dict(tensors, strict=True)
    calibrator.is_fitted = True
    return calibrator


def verify_against_base(
    root: Path, record: Dict[str, Any], backbone: Backbone, calibrator: Calibrator, *, base_passed: Optional[bool] = None
) -> None:
    """Check labels, δ's input contract and the base fingerprint against the loaded base.

    ``base_passed`` says whether the caller supplied the base (``base_model=``) rather than
    loading it from the artifact; it only sharpens the error message (None: unknown).
    """
    base = record["base_model"]
    if backbone.num_classes is not None and backbone.num_classes != calibrator.num_classes:
        raise ArtifactError(
            f"the base model has {backbone.num_classes} classes but the calibration in {root} was fitted for "
            f"{calibrator.num_classes}; load it with the base it was fitted on."
        )
    saved_labels = {int(k): v for k, v in (base.get("id2label") or {}).items()}
    named = backbone.id2label and model_label_names(backbone) is not None  # generic LABEL_i: the data may have named them
    if saved_labels and named and saved_labels != backbone.id2label:
        differing = sorted(k for k in saved_labels if saved_labels.get(k) != backbone.id2label.get(k))[:5]
        raise ArtifactError(
            f"the base model's labels differ from those recorded in {root / CALIBRATION_CONFIG} (e.g. class "
            f"{differing[0]}: {backbone.id2label.get(differing[0])!r} vs {saved_labels.get(differing[0])!r}); "
            "load the calibration with the base it was fitted on."
        )
    _verify_delta(root, record, backbone, calibrator)
    recorded = base.get("fingerprint")
    if recorded:
        actual = weights_fingerprint(backbone.model)
        if actual != recorded:
            raise ArtifactError(
                f"the base model's weights ({actual[:19]}…, {_base_source(root, record, base_passed)}) are not "
                f"those the calibration in {root} was fitted on ({recorded[:19]}…); δ and T are only valid for that "
                "base. Restore the original base weights (re-download or re-save the calibration), or refit the "
                "calibration on this base."
            )


def _verify_delta(root: Path, record: Dict[str, Any], backbone: Backbone, calibrator: Calibrator) -> None:
    """δ must live in the base's input space, and have the base's declared input shape unless the record
    says it was calibrated at another input size (``input_contract.input_size``, which equals δ's shape
    by the schema) and records the base's weights fingerprint: a CNN calibrated at 32×32 keeps its
    config's 224×224, and the fingerprint (checked next) ties the calibration to that very base."""
    delta = calibrator.input_perturbation
    if delta is None:
        return
    space = getattr(calibrator, "delta_space", None)
    if space is not None and space != backbone.delta_space:
        raise ArtifactError(
            f"{root / CALIBRATION_CONFIG}: key 'calibrator.delta_space' is {space!r} but the base model takes δ in "
            f"{backbone.delta_space!r}; the calibration belongs to another base — load it with the base it was fitted on."
        )
    expected_shape = backbone.default_delta_shape()
    calibrated_size = (record.get("input_contract") or {}).get("input_size")
    if backbone.modality == "image" and calibrated_size is not None and record["base_model"].get("fingerprint"):
        return  # the weights fingerprint, checked next, ties the calibration to its base
    if expected_shape is not None and tuple(delta.shape) != tuple(expected_shape):
        raise ArtifactError(
            f"the perturbation δ in {root / record['files']['weights']} has shape {tuple(delta.shape)} but the base "
            f"model takes {backbone.delta_space} of shape {tuple(expected_shape)}; the calibration belongs to another "
            "base — load it with the base it was fitted on, or refit it on this one."
        )


def _base_source(root: Path, record: Dict[str, Any], base_passed: Optional[bool]) -> str:
    """Where the base weights came from, for error messages (see :func:`load_base`)."""
    base = record["base_model"]
    if base_passed or base.get("weights") == "not_saved":
        return "the base_model= you passed"
    if base.get("weights") == "reference":
        source = f"the hub repo {base.get('repo_id')} at revision {base.get('revision') or 'main'}"
    elif base.get("library") == "timm":
        source = str(root / "model.safetensors")
    else:
        source = str(root / ((record.get("files") or {}).get("base") or BASE_FOLDER) / "model.safetensors")
    return f"from {source}" + (" unless you passed base_model=" if base_passed is None else "")


# ----------------------------------------------------------------------------- the base model's files


def load_base(root: Path, record: Dict[str, Any], **hub_options: Any) -> nn.Module:
    """Rebuild the base model from its own files (or its pinned hub reference); safetensors only.

    A failure of timm or transformers to build it is an :class:`ArtifactError` naming the source.
    """
    base = record["base_model"]
    if base["weights"] == "not_saved":
        raise ArtifactError(
            f"the calibration in {root} was fitted on a plain PyTorch module, which cannot be rebuilt from files; "
            "pass it as CalibratedModel.from_pretrained(..., base_model=your_module)."
        )
    try:
        return _build_base(root, record, hub_options)
    except ArtifactError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, ImportError) as error:
        raise ArtifactError(
            f"the base model ({_base_source(root, record, False)}) could not be built ({type(error).__name__}: "
            f"{str(error)[:300]}); {RESAVE}"
        ) from None


def _build_base(root: Path, record: Dict[str, Any], hub_options: Dict[str, Any]) -> nn.Module:
    base = record["base_model"]
    if base["library"] == "timm":
        import timm

        if base["weights"] == "reference":
            suffix = f"@{base['revision']}" if base.get("revision") else ""
            return timm.create_model(f"hf-hub:{base['repo_id']}{suffix}", pretrained=True)
        if not (root / "model.safetensors").is_file():
            raise ArtifactError(f"{root / 'model.safetensors'} (the timm base weights) is missing; re-save or re-download.")
        return load_timm_folder(root)
    if base["weights"] == "reference":
        folder = _reference_snapshot(root, base, hub_options)
    else:
        folder = _base_folder(root, record["files"]["base"])
    model_class, _ = auto_classes(base["task"])
    return model_class.from_pretrained(str(folder), use_safetensors=True)


def _base_folder(root: Path, name: str) -> Path:
    """The transformers base folder named by ``files.base``: inside ``root``, never ``root`` itself."""
    folder = safe_join(root, name, what="base folder")
    file = root / CALIBRATION_CONFIG
    if os.path.realpath(folder) == os.path.realpath(root) or Path(os.path.realpath(root)).is_relative_to(os.path.realpath(folder)):
        _fail(file, "key 'files.base'", f"is {name!r}, which is the calibration folder itself (loading it would recurse)")
    if not folder.is_dir():
        raise ArtifactError(f"{folder} (the transformers base model) is missing; re-save or re-download.")
    _refuse_calibrated_base(folder, f"{file}: key 'files.base'")
    return folder


def _refuse_calibrated_base(folder: Path, where: str) -> None:
    """A base folder must hold a plain model: one holding a calibration would recurse into itself."""
    try:
        with open(folder / "config.json", "rb") as handle:
            config = json.loads(handle.read(MAX_RECORD_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        config = None
    calibrated = isinstance(config, dict) and config.get("model_type") == "hf_calibrate"
    if calibrated or os.path.lexists(folder / CALIBRATION_CONFIG):
        raise ArtifactError(f"{where} names {folder}, which holds a calibrated model, not a base model; {RESAVE}")


def _reference_snapshot(root: Path, base: Dict[str, Any], hub_options: Dict[str, Any]) -> Path:
    """The pinned base repo, fetched by the hub protocol only (a repo id is never read as a local path)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    options = {key: value for key, value in hub_options.items() if key in ("token", "cache_dir", "local_files_only")}
    try:
        folder = Path(snapshot_download(
            base["repo_id"], revision=base.get("revision"), allow_patterns=["*.json", "*.safetensors"], **options
        ))
    except (RepositoryNotFoundError, RevisionNotFoundError, LocalEntryNotFoundError, HFValidationError) as error:
        raise ArtifactError(
            f"the base of the reference-only calibration in {root}, hub repo {base['repo_id']!r} at revision "
            f"{base.get('revision') or 'main'}, could not be fetched ({type(error).__name__}); check the connection "
            "and token, or load with base_model=<the base model>."
        ) from None
    _refuse_calibrated_base(folder, f"{root / CALIBRATION_CONFIG}: key 'base_model.repo_id'")
    return folder


def load_preprocessor(root: Path, record: Dict[str, Any]) -> Any:
    """The tokenizer or image processor saved at the root, or None (timm keeps its in config.json).

    It is made to preprocess as the calibration was fitted (the record's ``input_contract``: the calibrated image size,
    the tokenizer's ``max_length``), whatever the saved file says. Only the root files the record's manifest lists are
    read: transformers reads whatever tokenizer or processor files a folder holds (a stray ``special_tokens_map.json``
    re-maps the tokens), so they are read from a temporary folder of copies of the manifest's files, never from the
    folder itself.
    """
    from ..backbones.preprocessing import contract_preprocessor

    with tempfile.TemporaryDirectory(prefix="hf_calibrate_preprocessor_") as copies:
        for name in record["files"]["manifest"]:
            if "/" not in name and not name.endswith(".safetensors") and name not in (CALIBRATION_CONFIG, CARD_FILE):
                shutil.copyfile(safe_join(root, name, what="manifest file"), Path(copies) / name)
        return contract_preprocessor(_preprocessor_in(Path(copies)), record.get("input_contract"))


def _preprocessor_in(folder: Path) -> Any:
    """The tokenizer or image processor saved in ``folder``, or None."""
    if (folder / "tokenizer_config.json").is_file():
        return auto_classes(TEXT_TASK)[1].from_pretrained(str(folder))
    if (folder / "preprocessor_config.json").is_file():
        return auto_classes(IMAGE_TASK)[1].from_pretrained(str(folder))
    return None
