"""Reliability of saved artifacts: no silent wrong confidence, no lost files.

Every case ends in one of :data:`OUTCOMES`: *refused clearly* (an ``ArtifactError`` naming the
file, the key and the fix; for saves, a ``FileExistsError`` naming the file), *handled correctly*,
*silent bad result* (loaded NaN / degenerate / changed values, a wrong preprocessor, a changed
folder mode), *files lost* (a user's file or the artifact itself gone), or *unclear error*
(any other exception, or an error that does not say what and how to fix).

The groups, each a list so it can be counted:

* :data:`LOAD_CASES` — broken records and tensors (NaN δ, ±inf / huge log T, bad
  ``format_version``, missing keys, ``files.base`` pointing at the folder, a huge
  ``delta_shape``, local paths as hub repo ids, ...). All must be refused clearly.
* :data:`SAVE_CASES` — saving over folders holding a user's files, another artifact, an
  artifact whose record carries no digests (format 1), or a dead save's staging folder.
* :data:`OPTION_CASES` — ``from_pretrained``'s ``dtype`` / ``torch_dtype`` / ``device_map`` and
  the carried-over ``label2id``.
* kills — a subprocess saving a ViT artifact over a BERT artifact with a user's files is killed
  (``os._exit``) at every step of the save (``serialization.saving.SAVE_STEP_HOOK``; the step list is
  measured by a dry run, :data:`STEP_KILLS`) and at every ``os.replace`` it makes
  (:data:`REPLACE_KILLS`, which needs no hook and so also runs against older code). Afterwards
  loading must change nothing and give the complete old or new artifact, or refuse the folder as torn;
  every user file must be intact; and saving again must give the new artifact with no temporaries left.
* :data:`HOSTILE_CASES` (``test_hostile_folders.py``) — folders made to attack the loader and the next save:
  journals, links out of the folder, sealed records claiming a user's files, torn folders. Loading writes
  nothing, and nothing outside the target changes.
* fuzz — random mutations (:data:`MUTATIONS`) of a valid record and its tensors (bytes, keys,
  values, shapes, dtypes); each loads identically or is refused with an ``ArtifactError``.
  Half of them are *re-sealed* (digests recomputed, as a consistent but hostile or buggy writer
  would do) so that the schema, not the digest, must catch them; those must load exactly what
  the files say or be refused.

One more test, outside the counted groups because it needs the local hub server, checks the hub
side of the manifest: a push replaces only the previous push's files.

:func:`reliability_counts` runs the groups and returns ``{group: {outcome: count}}``;
``python tests/serialization/test_reliability_artifacts.py`` prints it as JSON (about a minute on two cores).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python tests/serialization/test_reliability_artifacts.py`
import _tiny_models as tm  # noqa: E402
from _files import format_one_artifact  # noqa: E402

from hf_calibrate import CalibratedModel  # noqa: E402
from hf_calibrate.serialization import ArtifactError  # noqa: E402

CONFIG, WEIGHTS, STAGING = "calibration_config.json", "calibration.safetensors", ".hf_calibrate-staging-"
OUTCOMES = ("refused clearly", "handled correctly", "silent bad result", "files lost", "unclear error")
REFUSED, HANDLED, SILENT, LOST, UNCLEAR = OUTCOMES
FIXES = ("re-save", "re-download", "upgrade", "Upgrade", "pass ", "load it with", "load the calibration with", "Restore",
         "Move it", "check ", "Save one", "fit the calibration again")  # what the library's messages tell the user to do
FUZZ_MUTATIONS = 1000  # at least this many fuzzed loads per run
KILLED = 86  # exit status of a child killed by the kill hook


# ----------------------------------------------------------------------------- the test bed


# kind → (base, method, evaluate before saving)
RECIPES: Dict[str, Tuple[str, str, bool]] = {
    "vit": ("vit", "neural_clamping", False),
    "vit-ts": ("vit", "temperature", False),
    "bert": ("bert", "neural_clamping", False),
    "plain": ("plain", "neural_clamping", True),
    "plain-isotonic": ("plain", "isotonic", False),
    "plain-mac_cal": ("plain", "mac_cal", False),
    "plain-matrix": ("plain", "matrix", False),
}


class Bed:
    """Valid tiny artifacts (see :data:`RECIPES`), each fitted and saved once, on first use, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.models: Dict[str, CalibratedModel] = {}
        self._inputs: Dict[str, Dict[str, torch.Tensor]] = {}
        self._references: Dict[str, CalibratedModel] = {}
        self.plain = tm.plain_module()

    def model(self, kind: str) -> CalibratedModel:
        if kind not in self.models:
            source, method, evaluate = RECIPES[kind]
            if source == "plain":
                base, data, preprocessor = self.plain, tm.plain_data(self.plain), None
            else:
                base, data, preprocessor = tm.make_base(source)
            model = tm.fit(base, data, method, preprocessor=preprocessor)
            tm.enlarge_delta(model)
            if evaluate:
                model.evaluate(data, progress=False)
            inputs = tm.batch_of(data, 4)
            self.models[kind] = model
            self._inputs[kind] = {"input": inputs["pixel_values"]} if source == "plain" else inputs
        return self.models[kind]

    def inputs(self, kind: str) -> Dict[str, torch.Tensor]:
        """Four sample inputs of the base of ``kind``."""
        self.model(kind)
        return self._inputs[kind]

    def reference(self, kind: str) -> CalibratedModel:
        """The valid artifact of ``kind`` as loaded (once)."""
        if kind not in self._references:
            self._references[kind] = self.load(self.folder(kind), kind)
        return self._references[kind]

    def folder(self, kind: str) -> Path:
        folder = self.root / "valid" / kind
        if not folder.exists():
            self.model(kind).save_pretrained(folder)
        return folder

    def copy(self, kind: str, destination: Path) -> Path:
        return Path(shutil.copytree(self.folder(kind), destination, symlinks=True))

    def load(self, folder: Path, kind: str, **options: Any) -> CalibratedModel:
        base = self.plain if kind.startswith("plain") else None
        return CalibratedModel.from_pretrained(folder, base_model=base, **options)

    def scratch(self, name: str) -> Path:
        """A fresh empty folder (removed first if a previous case left it)."""
        folder = self.root / "scratch" / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder


def logits(model: CalibratedModel, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    return tm.logits_of(model, inputs)


def clear(error: BaseException, *words: str) -> bool:
    """An error naming a file (the folder, the record or a tensor file), each of ``words``, and a fix."""
    message = str(error)
    names_file = any(name in message for name in (CONFIG, WEIGHTS, "safetensors", "/"))
    return names_file and all(word in message for word in words) and any(fix in message for fix in FIXES)


# ----------------------------------------------------------------------------- editing saved files


def record_digest(record: Dict[str, Any]) -> str:
    """The record digest as docs/artifact.md defines it (recomputed here, independently of the library)."""
    body = {key: value for key, value in record.items() if key != "record_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def reseal(record: Any, weights: bytes) -> Any:
    """``record`` with its digests recomputed for ``weights`` (when it has them): a consistent artifact."""
    if not isinstance(record, dict) or "record_sha256" not in record:
        return record
    files = record.get("files")
    if isinstance(files, dict) and isinstance(files.get("sha256"), dict) and isinstance(files.get("weights"), str):
        files["sha256"][files["weights"]] = hashlib.sha256(weights).hexdigest()
    record["record_sha256"] = record_digest(record)
    return record


def edit_record(folder: Path, edit: Callable[[Dict[str, Any]], None]) -> None:
    """Edit the record and re-seal it, so that the check under test fires (not the digest)."""
    record = json.loads((folder / CONFIG).read_text())
    edit(record)
    (folder / CONFIG).write_text(json.dumps(reseal(record, (folder / WEIGHTS).read_bytes())))


def edit_tensors(folder: Path, edit: Callable[[Dict[str, torch.Tensor]], None]) -> None:
    """Edit the calibration tensors, then re-seal the record for the new file."""
    tensors = load_safetensors((folder / WEIGHTS).read_bytes())
    edit(tensors)
    (folder / WEIGHTS).write_bytes(save_safetensors(tensors))
    edit_record(folder, lambda record: None)


def set_key(path: str, value: Any) -> Callable[[Path], None]:
    def breaks(folder: Path) -> None:
        def edit(record: Dict[str, Any]) -> None:
            *parents, last = path.split(".")
            target = record
            for part in parents:
                target = target[part]
            target[last] = value

        edit_record(folder, edit)

    return breaks


def drop_key(path: str) -> Callable[[Path], None]:
    def breaks(folder: Path) -> None:
        def edit(record: Dict[str, Any]) -> None:
            *parents, last = path.split(".")
            target = record
            for part in parents:
                target = target[part]
            del target[last]

        edit_record(folder, edit)

    return breaks


def set_tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Path], None]:
    return lambda folder: edit_tensors(folder, lambda tensors: tensors.update({name: change(tensors[name])}))


def first_element(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        tensor.view(-1)[0] = value
        return tensor

    return change


def several(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def breaks(folder: Path) -> None:
        for step in steps:
            step(folder)

    return breaks


def deep_json(folder: Path) -> None:
    text = (folder / CONFIG).read_text()
    (folder / CONFIG).write_text(text[:-2] + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}\n")


def truncate(name: str) -> Callable[[Path], None]:
    def breaks(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])

    return breaks


def loop_link(folder: Path) -> None:
    os.symlink(".", folder / "loop")
    set_key("files.base", "loop")(folder)


def downgraded_to_format_one(folder: Path) -> None:
    """The hostile probe: a sealed record edited (label 0 renamed, T = 0.001), claiming format 1, digests deleted."""
    tensors = load_safetensors((folder / WEIGHTS).read_bytes())
    tensors["log_temperature"] = torch.full_like(tensors["log_temperature"], math.log(0.001))
    (folder / WEIGHTS).write_bytes(save_safetensors(tensors))
    record = json.loads((folder / CONFIG).read_text())
    record["base_model"]["id2label"]["0"] = "zebra"
    record["format_version"] = 1
    for key in ("manifest", "sha256"):
        record["files"].pop(key, None)
    record.pop("record_sha256", None)
    (folder / CONFIG).write_text(json.dumps(record))


# ----------------------------------------------------------------------------- load cases


@dataclasses.dataclass(frozen=True)
class LoadCase:
    """A valid artifact of ``kind`` broken by ``breaks``; loading must refuse it naming ``key``."""

    name: str
    kind: str
    key: str
    breaks: Callable[[Path], None]


def _reference_to(path: Callable[[Path], str]) -> Callable[[Path], None]:
    """Make the artifact reference-only, naming a local path (a valid base model folder) as its repo id."""

    def breaks(folder: Path) -> None:
        def edit(record: Dict[str, Any]) -> None:
            record["base_model"].update(weights="reference", repo_id=path(folder), revision=None)
            record["files"]["base"] = None

        shutil.move(str(folder / "base"), str(folder.parent / f"{folder.name}-elsewhere"))
        edit_record(folder, edit)

    return breaks


NAN, INF = float("nan"), float("inf")
LOAD_CASES: List[LoadCase] = [
    LoadCase("delta holds NaN", "vit", "'delta'", set_tensor("delta", first_element(NAN))),
    LoadCase("delta holds inf", "bert", "'delta'", set_tensor("delta", first_element(INF))),
    LoadCase("delta is huge", "vit", "'delta'", set_tensor("delta", first_element(1e30))),
    LoadCase("log T is NaN", "vit", "'log_temperature'", set_tensor("log_temperature", first_element(NAN))),
    LoadCase("log T is +inf", "vit", "'log_temperature'", set_tensor("log_temperature", first_element(INF))),
    LoadCase("log T is -inf", "plain", "'log_temperature'", set_tensor("log_temperature", first_element(-INF))),
    LoadCase("log T is huge (50)", "plain", "'log_temperature'", set_tensor("log_temperature", first_element(50.0))),
    LoadCase("delta saved as int32", "vit", "'delta'", set_tensor("delta", lambda t: (100 * t).to(torch.int32))),
    LoadCase("isotonic knots out of order", "plain-isotonic", "'knots_x'", set_tensor("knots_x", lambda t: t.flip(-1))),
    LoadCase("matrix weights hold NaN", "plain-matrix", "'weight'", set_tensor("weight", first_element(NAN))),
    LoadCase("retention above 1", "plain-mac_cal", "'head_module.retention'", set_tensor("head_module.retention", first_element(3.0))),
    LoadCase("format_version 0", "vit", "format_version", set_key("format_version", 0)),
    LoadCase("format_version -1", "vit", "format_version", set_key("format_version", -1)),
    LoadCase("format_version true", "vit", "format_version", set_key("format_version", True)),
    LoadCase("format_version '2'", "vit", "format_version", set_key("format_version", "2")),
    LoadCase("format_version 99", "vit", "format version 99", set_key("format_version", 99)),
    LoadCase("sealed record edited and downgraded to format 1", "vit", "format_version 1", downgraded_to_format_one),
    LoadCase("format-1 record (no digests, before the first release)", "vit", "format_version 1", format_one_artifact),
    LoadCase("no base_model.library", "vit", "'base_model.library'", drop_key("base_model.library")),
    LoadCase("no base_model.task", "bert", "'base_model.task'", drop_key("base_model.task")),
    LoadCase("no base_model.weights", "vit", "'base_model.weights'", drop_key("base_model.weights")),
    LoadCase("no base_model.id2label", "plain", "'base_model.id2label'", drop_key("base_model.id2label")),
    LoadCase("no calibrator.num_classes", "vit", "'calibrator.num_classes'", drop_key("calibrator.num_classes")),
    LoadCase("no calibrator.delta_shape", "vit", "delta_shape", drop_key("calibrator.delta_shape")),
    LoadCase("no fit", "plain", "'fit'", drop_key("fit")),
    LoadCase("no method", "vit", "'method'", drop_key("method")),
    LoadCase("num_classes is a string", "vit", "'calibrator.num_classes'", set_key("calibrator.num_classes", "4")),
    LoadCase("id2label is a list", "plain", "'base_model.id2label'", set_key("base_model.id2label", ["cat", "dog", "fish", "bird"])),
    LoadCase("num_labels disagrees", "plain", "'base_model.num_labels'", set_key("base_model.num_labels", 7)),
    LoadCase("method is null", "vit", "'method'", set_key("method", None)),
    LoadCase("files.base is '.'", "vit", "'files.base'", set_key("files.base", ".")),
    LoadCase("files.base is './'", "vit", "'files.base'", set_key("files.base", "./")),
    LoadCase("files.base links back to the folder", "vit", "'files.base'", loop_link),
    LoadCase("delta_shape is 1e5 x 1e5 x 100", "vit", "'calibrator.delta_shape'", several(
        set_key("calibrator.delta_shape", [100_000, 100_000, 100]), set_key("input_contract.shape", [100_000, 100_000, 100]))),
    LoadCase("reference repo_id is an absolute path", "vit", "'base_model.repo_id'",
             _reference_to(lambda folder: str(folder.parent / f"{folder.name}-elsewhere"))),
    LoadCase("reference repo_id is a relative path", "vit", "'base_model.repo_id'",
             _reference_to(lambda folder: os.path.relpath(folder.parent / f"{folder.name}-elsewhere"))),
    LoadCase("reference repo_id is a home path", "vit", "'base_model.repo_id'", _reference_to(lambda folder: "~/models/vit")),
    LoadCase("record nested 200,000 deep", "plain", "not valid JSON", deep_json),
    LoadCase("evaluation bins malformed", "plain", "'evaluation.reliability'",
             set_key("evaluation.reliability", {"calibrated": {"counts": "many", "mean_confidence": [], "accuracy": []}})),
    LoadCase("a metric is a string", "plain", "'evaluation.calibrated'", set_key("evaluation.calibrated.ece", "0.05")),
    LoadCase("a metric is NaN", "plain", "'evaluation.uncalibrated'", set_key("evaluation.uncalibrated.nll", float("nan"))),
    LoadCase("interval settings malformed", "plain", "'evaluation.bootstrap'",
             set_key("evaluation.bootstrap", {"replicates": "x", "seed": None, "confidence": "a"})),
    LoadCase("intervals without their settings", "plain", "'evaluation.bootstrap'", drop_key("evaluation.bootstrap")),
    LoadCase("interval low above high", "plain", "'evaluation.calibrated.intervals'",
             several(set_key("evaluation.calibrated.intervals.ece.low", 0.9), set_key("evaluation.calibrated.intervals.ece.high", 0.1))),
    LoadCase("verdict contradicts its interval", "plain", "'evaluation.verdicts'", several(
        set_key("evaluation.difference.ece.low", 0.01), set_key("evaluation.difference.ece.high", 0.02),
        set_key("evaluation.verdicts.ece", "improved"))),
    LoadCase("a verdict over an absent interval", "plain", "'evaluation.verdicts'", several(
        set_key("evaluation.difference.ece.low", None), set_key("evaluation.difference.ece.high", None),
        set_key("evaluation.verdicts.ece", "improved"))),
    LoadCase("fingerprint malformed", "vit", "'base_model.fingerprint'", set_key("base_model.fingerprint", "md5:0")),
    LoadCase("tokenizer.json truncated", "bert", "tokenizer.json is not the file that was saved", truncate("tokenizer.json")),
    LoadCase("record states a T its tensors do not hold (re-sealed)", "vit-ts", "'fit.summary.temperature'",
             set_key("fit.summary.temperature", 0.1356)),
    LoadCase("record states a ‖δ‖₂ its tensors do not hold (re-sealed)", "vit", "'fit.summary.selected.delta_norm'",
             set_key("fit.summary.selected.delta_norm", 7.5)),
    LoadCase("record states T as a string (re-sealed)", "vit-ts", "'fit.summary.temperature'", set_key("fit.summary.temperature", "0.5")),
    LoadCase("record claims a fallback with another T (re-sealed)", "vit", "'fit.summary.temperature_scaling.temperature'",
             several(set_tensor("delta", lambda delta: torch.zeros_like(delta)),
                     set_key("fit.summary.fell_back_to_temperature_scaling", True),
                     set_key("fit.summary.temperature_scaling", {"temperature": 3.0}))),
    LoadCase("record claims a fallback over a non-zero δ (re-sealed)", "vit", "'fit.summary.fell_back_to_temperature_scaling'",
             several(set_key("fit.summary.fell_back_to_temperature_scaling", True),
                     set_key("fit.summary.temperature_scaling", {}))),
    LoadCase("max_length is negative", "bert", "'input_contract.preprocessing.max_length'",
             set_key("input_contract.preprocessing.max_length", -5)),
    LoadCase("image input_size has 1 dimension", "vit", "'input_contract.input_size'", set_key("input_contract.input_size", [16])),
]


@contextlib.contextmanager
def allocation_guard(limit: int = 10**9) -> Iterator[None]:
    """Turn any attempt to allocate a tensor of more than ``limit`` elements into a MemoryError."""
    originals = {name: getattr(torch, name) for name in ("zeros", "empty", "ones")}

    def guarded(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make(*size: Any, **kwargs: Any) -> torch.Tensor:
            shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            if all(isinstance(v, int) for v in shape) and math.prod(shape) > limit:
                raise MemoryError(f"allocation of {math.prod(shape)} elements attempted")
            return factory(*size, **kwargs)

        return make

    for name, factory in originals.items():
        setattr(torch, name, guarded(factory))
    try:
        yield
    finally:
        for name, factory in originals.items():
            setattr(torch, name, factory)


def run_load_case(bed: Bed, case: LoadCase) -> Tuple[str, str]:
    """(outcome, what happened) of loading the broken artifact."""
    scratch = bed.scratch(f"load-{LOAD_CASES.index(case)}")
    folder = bed.copy(case.kind, scratch / "model")
    case.breaks(folder)
    try:
        with allocation_guard():
            model = bed.load(folder, case.kind)
    except ArtifactError as error:
        return (REFUSED if clear(error, case.key) else UNCLEAR), str(error)
    except (Exception, RecursionError) as error:  # noqa: BLE001 - any other exception is the defect
        return UNCLEAR, f"{type(error).__name__}: {str(error)[:300]}"
    output = logits(model, bed.inputs(case.kind))
    return SILENT, f"loaded; logits finite: {bool(torch.isfinite(output).all())}"


# ----------------------------------------------------------------------------- save cases


def user_files(folder: Path) -> Dict[str, Any]:
    """Give ``folder`` a user's note at the root and in base/, an empty folder and a link; return their state."""
    (folder / "notes.txt").write_text("my notes")
    (folder / "base").mkdir(exist_ok=True)
    (folder / "base" / "my_notes.txt").write_text("notes about the base")
    (folder / "empty").mkdir()
    os.symlink("notes.txt", folder / "notes-link")
    return snapshot_user_files(folder)


def snapshot_user_files(folder: Path) -> Dict[str, Any]:
    return {
        "notes.txt": (folder / "notes.txt").read_text() if (folder / "notes.txt").is_file() else None,
        "base/my_notes.txt": (folder / "base" / "my_notes.txt").read_text() if (folder / "base" / "my_notes.txt").is_file() else None,
        "empty": (folder / "empty").is_dir() and not any((folder / "empty").iterdir()),
        "notes-link": os.readlink(folder / "notes-link") if (folder / "notes-link").is_symlink() else None,
    }


def leftovers(folder: Path) -> List[str]:
    """The library's temporaries in and beside ``folder``."""
    inside = [p.name for p in folder.iterdir() if p.name.startswith(".hf_calibrate-")] if folder.is_dir() else []
    beside = [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]
    return sorted(inside + beside)


def save_over_with_user_files(bed: Bed, old: str, new: str) -> Tuple[str, str]:
    """Save artifact ``new`` over ``old`` holding a user's files: every user file must survive."""
    folder = bed.copy(old, bed.scratch(f"over-{old}-{new}") / "model")
    before = user_files(folder)
    bed.model(new).save_pretrained(folder)
    after = snapshot_user_files(folder)
    lost = [name for name in before if after[name] != before[name]]
    if lost:
        return LOST, f"user files lost or changed: {lost}"
    reloaded = bed.load(folder, new)
    if not torch.equal(logits(reloaded, bed.inputs(new)), logits(bed.model(new), bed.inputs(new))):
        return SILENT, "the reloaded model differs from the saved one"
    return HANDLED, "user files kept"


def save_keeps_folder_mode(bed: Bed) -> Tuple[str, str]:
    """A save keeps an existing folder's mode; a new folder gets the umask default (as other libraries)."""
    scratch = bed.scratch("mode")
    fresh = scratch / "fresh"
    bed.model("vit-ts").save_pretrained(fresh)
    umask = os.umask(0o022)
    os.umask(umask)
    existing = bed.copy("vit-ts", scratch / "existing")
    os.chmod(existing, 0o750)
    bed.model("vit").save_pretrained(existing)
    modes = stat.S_IMODE(fresh.stat().st_mode), stat.S_IMODE(existing.stat().st_mode)
    if modes != (0o777 & ~umask, 0o750):
        return SILENT, f"folder modes {oct(modes[0])} (new) and {oct(modes[1])} (existing), expected {oct(0o777 & ~umask)} and 0o750"
    return HANDLED, "modes kept"


def saved_files_get_the_umask_mode(bed: Bed) -> Tuple[str, str]:
    """Every saved file, the .safetensors ones included (safetensors writes 0600), gets the umask's new-file mode."""
    folder = bed.scratch("file-modes") / "model"
    previous = os.umask(0o027)
    try:
        bed.model("vit").save_pretrained(folder)
    finally:
        os.umask(previous)
    modes = {str(path.relative_to(folder)): oct(stat.S_IMODE(path.stat().st_mode)) for path in folder.rglob("*") if path.is_file()}
    odd = {name: mode for name, mode in modes.items() if mode != oct(0o640)}
    return (SILENT, f"modes other than the umask's 0o640: {odd}") if odd else (HANDLED, "every file 0o640 under umask 027")


def vit_over_bert_preprocessor(bed: Bed) -> Tuple[str, str]:
    """After a ViT artifact is saved over a BERT one, the reloaded preprocessor is the ViT's image processor."""
    folder = bed.copy("bert", bed.scratch("vit-over-bert") / "model")
    bed.model("vit").save_pretrained(folder)
    stale = sorted(name for name in ("tokenizer.json", "tokenizer_config.json") if (folder / name).exists())
    kind = type(bed.load(folder, "vit").preprocessor).__name__
    if stale or "ImageProcessor" not in kind:
        return SILENT, f"stale tokenizer files {stale}; reloaded preprocessor {kind}"
    return HANDLED, "the tokenizer of the previous artifact is gone"


def save_over_format_one(bed: Bed) -> Tuple[str, str]:
    """A save over a BERT folder whose record carries no digests (format 1) holding a user's files: nothing proves
    which files the library wrote, so the save is refused naming them, and nothing in the folder changes."""
    folder = bed.copy("bert", bed.scratch("format-one") / "model")
    format_one_artifact(folder)
    before = user_files(folder)
    state = tree_state(folder)
    try:
        bed.model("vit").save_pretrained(folder)
    except FileExistsError as error:
        kept = snapshot_user_files(folder) == before and tree_state(folder) == state
        clear_error = CONFIG in str(error) and "Move it" in str(error) and not leftovers(folder)
        return (REFUSED if clear_error else UNCLEAR) if kept else LOST, str(error)
    return SILENT, "saved over files nothing proves are the library's"


def refuses_to_overwrite_a_users_file(bed: Bed) -> Tuple[str, str]:
    """A user's own config.json where the artifact writes one: the save is refused and the file kept."""
    folder = bed.scratch("users-config") / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"mine": true}')
    try:
        bed.model("vit").save_pretrained(folder)
    except FileExistsError as error:
        intact = (folder / "config.json").read_text() == '{"mine": true}'
        ok = intact and "config.json" in str(error) and "Move it" in str(error) and not leftovers(folder)
        return (REFUSED if ok else UNCLEAR), str(error)
    return (LOST if (folder / "config.json").read_text() != '{"mine": true}' else SILENT), "saved over the user's config.json"


def stale_temporaries_are_cleaned(bed: Bed) -> Tuple[str, str]:
    """The next save removes a dead save's staging folder inside the target (a real folder of the reserved name),
    and touches nothing beside the target, even names older versions used there."""
    scratch = bed.scratch("stale")
    folder = bed.copy("vit-ts", scratch / "model")
    (folder / f"{STAGING}dead" / "base").mkdir(parents=True)
    (folder / f"{STAGING}dead" / ".staged-by-hf_calibrate").write_text(f"{STAGING}dead")  # a save's marker
    (folder / f"{STAGING}dead" / CONFIG).write_text("{}")
    for name in (".model.saving-abcd1234", ".model.old-efgh_678"):
        (scratch / name).mkdir()
    bed.model("vit").save_pretrained(folder)
    left = leftovers(folder)
    if left != [".model.old-efgh_678", ".model.saving-abcd1234"]:
        return SILENT, f"left behind: {left}"
    return HANDLED, "the dead staging folder removed, nothing beside the folder touched"


def tampered_manifest_deletes_nothing(bed: Bed) -> Tuple[str, str]:
    """A record re-sealed to claim a user's file (under a digest that is not its content's) cannot get it deleted."""
    folder = bed.copy("vit", bed.scratch("tampered-manifest") / "model")
    (folder / "notes.txt").write_text("my notes")

    def claim(record: Dict[str, Any]) -> None:
        record["files"]["manifest"].append("notes.txt")
        record["files"]["sha256"]["notes.txt"] = "0" * 64

    edit_record(folder, claim)
    bed.model("vit-ts").save_pretrained(folder)
    if not (folder / "notes.txt").is_file():
        return LOST, "a tampered manifest got the user's notes.txt deleted"
    return HANDLED, "the claim was not proven by the file's content"


@dataclasses.dataclass(frozen=True)
class Case:
    """A scenario ``run(bed) -> (outcome, detail)`` whose correct outcome is ``expected``."""

    name: str
    run: Callable[[Bed], Tuple[str, str]]
    expected: str = HANDLED


SAVE_CASES: List[Case] = [
    Case("ViT over ViT keeps base/my_notes.txt, an empty folder, a link", lambda bed: save_over_with_user_files(bed, "vit-ts", "vit")),
    Case("ViT over BERT keeps the user's files", lambda bed: save_over_with_user_files(bed, "bert", "vit")),
    Case("BERT over ViT keeps the user's files", lambda bed: save_over_with_user_files(bed, "vit", "bert")),
    Case("folder mode kept; new folder gets the umask default", save_keeps_folder_mode),
    Case("saved files, safetensors included, get the umask's file mode", saved_files_get_the_umask_mode),
    Case("ViT over BERT: no stale tokenizer", vit_over_bert_preprocessor),
    Case("format-1 folder (no digests) with a user's files: save refused, nothing changed", save_over_format_one, REFUSED),
    Case("a user's file at an artifact path is not overwritten", refuses_to_overwrite_a_users_file, REFUSED),
    Case("stale temporaries cleaned by the next save", stale_temporaries_are_cleaned),
    Case("a tampered manifest cannot get a user's file deleted", tampered_manifest_deletes_nothing),
]


# ----------------------------------------------------------------------------- load options


def option_case(kind: str, options: Dict[str, Any], check: Callable[[CalibratedModel], bool], refuse: Optional[str] = None) -> Callable[[Bed], Tuple[str, str]]:
    """Load ``kind`` with ``options``: refused with a ``refuse`` message (ValueError/TypeError), or ``check`` holds."""

    def run(bed: Bed) -> Tuple[str, str]:
        try:
            model = bed.load(bed.folder(kind), kind, **options)
        except (ValueError, TypeError) as error:
            ok = refuse is not None and refuse in str(error)
            return (REFUSED if ok else UNCLEAR), str(error)
        if refuse is not None:
            return SILENT, f"loaded with {options} instead of refusing them"
        return (HANDLED if check(model) else SILENT), f"dtype {model.dtype}, device {model.device}, label2id {model.config.label2id}"

    return run


def _dtype(expected: torch.dtype) -> Callable[[CalibratedModel], bool]:
    def check(model: CalibratedModel) -> bool:
        floats = {p.dtype for p in model.base_model.parameters() if p.is_floating_point()}
        return floats == {expected} and model.calibrator.log_temperature.dtype == torch.float32
    return check


def _label2id(model: CalibratedModel) -> bool:
    """``label2id`` is set and inverts ``id2label`` (which the tiny bases name after :data:`tm.LABELS`)."""
    return bool(model.config.label2id) and model.config.label2id == {label: index for index, label in model.config.id2label.items()}


OPTION_CASES: List[Case] = [
    Case("torch_dtype=torch.float64 casts the base", option_case("vit", {"torch_dtype": torch.float64}, _dtype(torch.float64))),
    Case("dtype='bfloat16' (a name) casts the base", option_case("vit", {"dtype": "bfloat16"}, _dtype(torch.bfloat16))),
    Case("dtype='auto' keeps the saved dtype", option_case("vit", {"dtype": "auto"}, _dtype(torch.float32))),
    Case("dtype=torch.int64 is refused", option_case("vit", {"dtype": torch.int64}, _dtype(torch.float32), "floating-point"), REFUSED),
    Case("device_map='cpu' puts the model on the CPU", option_case("vit", {"device_map": "cpu"}, lambda m: m.device.type == "cpu")),
    Case("device_map='auto' puts the model on one device", option_case("bert", {"device_map": "auto"}, lambda m: len({p.device for p in m.parameters()}) == 1)),
    Case("device_map splitting the model is refused", option_case(
        "vit", {"device_map": {"base_model.vit": "cpu", "base_model.classifier": "cuda:0"}}, _label2id, "splits the model"), REFUSED),
    Case("device_map naming an absent device is refused", option_case(
        "vit", {"device_map": f"cuda:{torch.cuda.device_count()}"}, _label2id, "no such device"), REFUSED),
    Case("label2id carried over (ViT)", option_case("vit", {}, _label2id)),
    Case("label2id carried over (BERT)", option_case("bert", {}, _label2id)),
    Case("label2id carried over (plain module)", option_case("plain", {}, _label2id)),
]


# ----------------------------------------------------------------------------- kills

# A fresh interpreter that loads the new model once, then forks one child per kill: the child saves over
# its target and is killed (os._exit) at the chosen step of the save or the chosen os.replace call.
KILL_HELPER = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
from hf_calibrate.serialization import saving  # _step reads saving.SAVE_STEP_HOOK
from hf_calibrate import CalibratedModel

new_folder, jobs = sys.argv[1], json.loads(sys.argv[2])
model = CalibratedModel.from_pretrained(new_folder)
results = []
for target, mode, number in jobs:
    pid = os.fork()
    if pid == 0:
        steps, calls, replace = [], [], os.replace
        def hook(name):
            steps.append(name)
            if mode == "step" and len(steps) == number:
                os._exit(KILLED)
        def killing_replace(source, destination):
            calls.append(destination)
            if mode == "replace" and len(calls) == number:
                os._exit(KILLED)
            replace(source, destination)
        saving.SAVE_STEP_HOOK = hook
        os.replace = killing_replace
        model.save_pretrained(target)
        with open(os.path.join(os.path.dirname(target), "steps.json"), "w") as handle:
            json.dump(steps, handle)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    results.append(os.waitstatus_to_exitcode(status))
print(json.dumps(results))
""".replace("KILLED", str(KILLED))

REPLACE_KILLS: List[int] = list(range(1, 10))  # kill at the n-th os.replace of the save (more than it makes)
STEP_KILLS: List[int] = []  # kill at the n-th step of the save; filled by measuring the steps (see kill_jobs)


def run_helper(bed: Bed, jobs: List[Tuple[str, str, int]]) -> List[int]:
    """Run the kill helper on ``jobs`` (target, "step" | "replace", number); return the children's exit codes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", KILL_HELPER, str(bed.folder("vit")), json.dumps(jobs)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kill helper failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def kill_jobs(bed: Bed) -> List[Tuple[str, Path, Dict[str, Any], int]]:
    """Run every kill: (name, folder, the user's files before, exit code). Measures the save's steps first."""
    dry = bed.copy("bert", bed.scratch("kill-dry") / "model")
    run_helper(bed, [(str(dry), "step", 0)])
    steps = json.loads((dry.parent / "steps.json").read_text())
    STEP_KILLS[:] = list(range(1, len(steps) + 1))
    plan = [(f"step {n}: {steps[n - 1]}", "step", n) for n in STEP_KILLS] + [(f"os.replace #{n}", "replace", n) for n in REPLACE_KILLS]
    prepared = []
    for index, (name, mode, number) in enumerate(plan):
        folder = bed.copy("bert", bed.scratch(f"kill-{index}") / "model")
        prepared.append((name, folder, user_files(folder), (str(folder), mode, number)))
    codes = run_helper(bed, [job for *_, job in prepared])
    return [(name, folder, before, code) for (name, folder, before, _), code in zip(prepared, codes)]


def same_artifact(model: CalibratedModel, reference: CalibratedModel) -> bool:
    """Same calibration, base weights and kind of preprocessor."""
    return (
        model.method == reference.method and tm.state_dicts_equal(model.calibrator, reference.calibrator)
        and tm.state_dicts_equal(model.base_model, reference.base_model)
        and type(model.preprocessor).__name__ == type(reference.preprocessor).__name__
    )


def tree_state(folder: Path) -> Dict[str, Any]:
    """Every entry under ``folder`` (links not followed): kind, bytes or link target, and modification time."""
    state = {}
    for path in [folder, *sorted(folder.rglob("*"))]:
        info = path.lstat()
        content = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
        state[str(path.relative_to(folder))] = (stat.S_IFMT(info.st_mode), content, info.st_mtime_ns)
    return state


def card_matches(folder: Path, kind: str) -> bool:
    """Whether ``folder``'s card is a card of the saved ``kind`` ("bert" or "vit": the model's task tells them apart;
    a card also names the folder it was saved to, so the whole text cannot be compared)."""
    task = {"bert": "text-classification", "vit": "image-classification"}[kind]
    return f"pipeline_tag: {task}" in (folder / "README.md").read_text()


def load_after_kill(bed: Bed, folder: Path) -> Tuple[Optional[str], str]:
    """Load a folder a killed save left: ("old" | "new", "") for a complete artifact, ("torn", message) when refused as
    torn, (None, what went wrong) otherwise, which includes a load that changed anything in the folder."""
    before = tree_state(folder)
    try:
        model = CalibratedModel.from_pretrained(folder)
    except ArtifactError as error:
        torn = "not a complete calibration" in str(error) and "re-save or re-download" in str(error)
        which, detail = ("torn" if torn else None), str(error)[:300]
    else:
        old, new = bed.reference("bert"), bed.reference("vit")
        which = "new" if same_artifact(model, new) else "old" if same_artifact(model, old) else None
        detail = "" if which else "loads as neither the old nor the new artifact"
        if which and not card_matches(folder, "bert" if which == "old" else "vit"):
            which, detail = None, f"loads as the {which} artifact under the other artifact's card"
    if tree_state(folder) != before:
        return None, "loading changed the folder"
    return which, detail


def check_after_kill(bed: Bed, folder: Path, before: Dict[str, Any]) -> Tuple[str, str]:
    """The folder after a killed save: loads as the complete old or new artifact or is refused as torn, changing
    nothing; the user's files are intact; and saving again gives the new artifact with no temporaries left."""
    which, detail = load_after_kill(bed, folder)
    lost = [name for name, value in snapshot_user_files(folder).items() if value != before[name]]
    if lost:
        return LOST, f"user files lost: {lost}"
    if which is None:
        return (SILENT if detail.startswith("loads as") else UNCLEAR), detail
    bed.model("vit").save_pretrained(folder)
    if not same_artifact(CalibratedModel.from_pretrained(folder), bed.reference("vit")) or leftovers(folder):
        return SILENT, f"saving again did not give the new artifact cleanly (left: {leftovers(folder)})"
    if [name for name, value in snapshot_user_files(folder).items() if value != before[name]]:
        return LOST, "saving again lost a user's file"
    return HANDLED, f"loads as the {which} artifact" if which != "torn" else "refused as torn, changing nothing"


# ----------------------------------------------------------------------------- fuzzing


class Chooser:
    """Random choices for a mutation: from ``random.Random`` here, from hypothesis in :class:`DrawChooser`."""

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)

    def integer(self, low: int, high: int) -> int:
        return self.random.randint(low, high)

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.integer(0, len(options) - 1)]


class DrawChooser(Chooser):
    def __init__(self, data: Any) -> None:
        from hypothesis import strategies

        self.data, self.strategies = data, strategies

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(self.strategies.integers(low, high))


VALUES: List[Any] = [
    None, True, False, 0, 1, -1, 4, 2**31, 2**63, 10**400, 1.5, -0.0, 1e308, float("nan"), float("inf"), -float("inf"),
    "", ".", "..", "/etc/passwd", "../base", "base", "x" * 1000, "neural_clamping", "temperature", "timm", "transformers",
    "torch", "included", "reference", "not_saved", "org/model", [], [1], [100_000, 100_000, 100], [3, 16, 16], {}, {"0": "cat"},
]
KEYS: List[str] = ["extra", "method", "files", "base", "manifest", "sha256", "format_version", "weights", "summary", "0"]


def json_paths(value: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Every path (tuple of keys / indices) under ``value``, parents first."""
    paths = [prefix] if prefix else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, item in items:
        paths += json_paths(item, (*prefix, key))
    return paths


def _parent(record: Any, path: Tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        record = record[key]
    return record


def mutate_json(record: Dict[str, Any], chooser: Chooser) -> Dict[str, Any]:
    """One structural change to the record: drop, replace, insert, rename or nudge a value."""
    record = copy.deepcopy(record)
    path = chooser.pick(json_paths(record))
    parent, key = _parent(record, path), path[-1]
    action = chooser.pick(["drop", "replace", "insert", "rename", "nudge"])
    if action == "drop":
        del parent[key]
    elif action == "replace":
        parent[key] = copy.deepcopy(chooser.pick(VALUES))
    elif action == "insert" and isinstance(parent[key], dict):
        parent[key][chooser.pick(KEYS)] = copy.deepcopy(chooser.pick(VALUES))
    elif action == "rename" and isinstance(parent, dict):
        parent[f"{key}_"] = parent.pop(key)
    elif action == "nudge" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + chooser.pick([1, -1]) if isinstance(parent[key], int) else parent[key] * (1 + 1e-6) + 1e-9
    return record


def mutate_bytes(data: bytes, chooser: Chooser) -> bytes:
    """Flip, cut or insert bytes."""
    position = chooser.integer(0, max(len(data) - 1, 0))
    action = chooser.pick(["flip", "truncate", "insert"])
    if action == "flip":
        return data[:position] + bytes([chooser.integer(0, 255)]) + data[position + 1:]
    if action == "truncate":
        return data[:position]
    return data[:position] + bytes(chooser.integer(0, 255) for _ in range(chooser.integer(1, 8))) + data[position:]


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, 1e30, -1e30, 1e-30, 12.0, -12.0, 0.5]
DTYPES = [torch.float16, torch.bfloat16, torch.float64, torch.float32, torch.int32, torch.int64, torch.uint8, torch.bool]


def _reshaped(tensor: torch.Tensor, chooser: Chooser) -> torch.Tensor:
    flat = tensor.reshape(-1)
    options = [flat, tensor.unsqueeze(0), flat[:-1], torch.cat([flat, flat[:1]])]
    if tensor.ndim >= 2:
        options.append(tensor.transpose(0, 1).contiguous())
    return chooser.pick(options).contiguous()


def mutate_tensors(tensors: Dict[str, torch.Tensor], chooser: Chooser) -> Dict[str, torch.Tensor]:
    """One change to the tensors: a value, a dtype, a shape, or a name."""
    tensors = {name: tensor.clone() for name, tensor in tensors.items()}
    name = chooser.pick(sorted(tensors))
    action = chooser.pick(["value", "value", "dtype", "shape", "rename", "drop", "add"])
    if action == "value" and tensors[name].is_floating_point() and tensors[name].numel():
        index = chooser.integer(0, tensors[name].numel() - 1)
        old = float(tensors[name].reshape(-1)[index])
        tensors[name].view(-1)[index] = chooser.pick([*SPECIAL, old + 1e-3, old * 2])
    elif action == "dtype":
        tensors[name] = tensors[name].to(chooser.pick(DTYPES))
    elif action == "shape":
        tensors[name] = _reshaped(tensors[name], chooser)
    elif action == "rename":
        tensors[f"{name}x"] = tensors.pop(name)
    elif action == "drop":
        del tensors[name]
    elif action == "add":
        tensors["extra"] = torch.zeros(2)
    return tensors


@dataclasses.dataclass(frozen=True)
class Mutation:
    """A named change of the (record bytes, weights bytes) pair."""

    name: str
    apply: Callable[[bytes, bytes, Chooser], Tuple[bytes, bytes]]


def _json_text(record: Any) -> bytes:
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


MUTATIONS: List[Mutation] = [
    Mutation("record structure", lambda r, w, c: (_json_text(mutate_json(json.loads(r), c)), w)),
    Mutation("record bytes", lambda r, w, c: (mutate_bytes(r, c), w)),
    Mutation("tensors", lambda r, w, c: (r, save_safetensors(mutate_tensors(load_safetensors(w), c)))),
    Mutation("weights bytes", lambda r, w, c: (r, mutate_bytes(w, c))),
]
FUZZ_KINDS = ["plain", "plain", "plain-isotonic", "plain-mac_cal", "plain-matrix", "vit", "bert"]


def _resealed(record_bytes: bytes, weights: bytes) -> bytes:
    try:
        record = json.loads(record_bytes)
    except (ValueError, RecursionError):
        return record_bytes
    return _json_text(reseal(record, weights)) if isinstance(record, dict) else record_bytes


def _state_as_in_file(model: CalibratedModel, weights: bytes) -> bool:
    """The loaded calibrator holds exactly the file's tensors (cast to its own dtypes)."""
    tensors = load_safetensors(weights)
    state = model.calibrator.state_dict()
    return state.keys() == tensors.keys() and all(torch.equal(state[k], tensors[k].to(state[k].dtype)) for k in state)


def _identical(model: CalibratedModel, reference: CalibratedModel) -> bool:
    return (
        tm.state_dicts_equal(model.calibrator, reference.calibrator) and model.config.id2label == reference.config.id2label
        and model.provenance == reference.provenance and model.fit_summary == reference.fit_summary
        and json.dumps(model.last_evaluation, default=repr) == json.dumps(reference.last_evaluation, default=repr)
    )


class FuzzBed:
    """Pristine files and loaded references per fuzz kind, and one folder per kind that mutations overwrite."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed
        self.pristine: Dict[str, Tuple[bytes, bytes]] = {}
        self.folders: Dict[str, Path] = {}
        for kind in sorted(set(FUZZ_KINDS)):
            folder = bed.copy(kind, bed.scratch(f"fuzz-{kind}") / "model")
            self.folders[kind] = folder
            self.pristine[kind] = ((folder / CONFIG).read_bytes(), (folder / WEIGHTS).read_bytes())

    def once(self, chooser: Chooser) -> Tuple[str, str]:
        """Mutate, write, load: (outcome, description)."""
        kind, mutation, sealed = chooser.pick(FUZZ_KINDS), chooser.pick(MUTATIONS), chooser.integer(0, 1) == 1
        record, weights = mutation.apply(*self.pristine[kind], chooser)
        record = _resealed(record, weights) if sealed else record
        folder = self.folders[kind]
        (folder / CONFIG).write_bytes(record)
        (folder / WEIGHTS).write_bytes(weights)
        described = f"{kind}, {mutation.name}, {'re-sealed' if sealed else 'as mutated'}"
        try:
            model = self.bed.load(folder, kind)
        except ArtifactError as error:
            return (REFUSED if clear(error) else UNCLEAR), f"{described}: {error}"
        except (Exception, RecursionError) as error:  # noqa: BLE001 - any other exception is a finding
            return UNCLEAR, f"{described}: {type(error).__name__}: {str(error)[:300]}"
        if sealed:
            faithful = _state_as_in_file(model, weights) and bool(torch.isfinite(logits(model, self.bed.inputs(kind))).all())
        else:
            faithful = _identical(model, self.bed.reference(kind))
        return (HANDLED if faithful else SILENT), f"{described}: loaded {'faithfully' if faithful else 'CHANGED values'}"


# ----------------------------------------------------------------------------- counting


def _hostile_cases() -> List[Case]:
    from test_hostile_folders import HOSTILE_CASES  # that module imports this one

    return HOSTILE_CASES


def _outcome(case: Any, bed: Bed) -> str:
    """The outcome of a save or option case; an exception the case did not expect is an *unclear error*, counted
    rather than stopping the count."""
    try:
        return case.run(bed)[0]
    except Exception:  # noqa: BLE001 - any exception a case does not classify is the defect
        return UNCLEAR


def reliability_counts(root: Optional[Path] = None, *, fuzz_iterations: int = FUZZ_MUTATIONS, seed: int = 0) -> Dict[str, Dict[str, int]]:
    """Run every case of every group; return ``{group: {outcome: count}}`` (all :data:`OUTCOMES` present).

    ``fuzz`` uses :class:`Chooser` (seeded ``random``) with the same mutations as the hypothesis test.
    """
    with contextlib.ExitStack() as stack, tm.torch_threads(1):
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hf_calibrate_reliability_")))
        bed = Bed(root)
        counts: Dict[str, collections.Counter] = {
            "load": collections.Counter(run_load_case(bed, case)[0] for case in LOAD_CASES),
            "save": collections.Counter(_outcome(case, bed) for case in SAVE_CASES),
            "load options": collections.Counter(_outcome(case, bed) for case in OPTION_CASES),
            "kill": collections.Counter(check_after_kill(bed, folder, before)[0] for _, folder, before, _ in kill_jobs(bed)),
            "hostile": collections.Counter(_outcome(case, bed) for case in _hostile_cases()),
        }
        fuzz, chooser = FuzzBed(bed), Chooser(seed)
        counts["fuzz"] = collections.Counter(fuzz.once(chooser)[0] for _ in range(fuzz_iterations))
    return {group: {outcome: counter.get(outcome, 0) for outcome in OUTCOMES} for group, counter in counts.items()}


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with tm.torch_threads(1):
        yield Bed(tmp_path_factory.mktemp("reliability"))


@pytest.mark.parametrize("case", LOAD_CASES, ids=[case.name for case in LOAD_CASES])
def test_broken_artifacts_are_refused_clearly(bed, case):
    outcome, detail = run_load_case(bed, case)
    assert outcome == REFUSED, detail


@pytest.mark.parametrize("case", SAVE_CASES, ids=[case.name for case in SAVE_CASES])
def test_saving_keeps_the_users_files(bed, case):
    outcome, detail = case.run(bed)
    assert outcome == case.expected, detail


@pytest.mark.parametrize("case", OPTION_CASES, ids=[case.name for case in OPTION_CASES])
def test_load_options_are_honoured_or_refused(bed, case):
    outcome, detail = case.run(bed)
    assert outcome == case.expected, detail


def test_a_push_replaces_only_the_previous_pushs_files(bed, hub_online):
    """The hub side of the manifest: pushing a ViT calibration over a BERT one removes the BERT tokenizer in
    the same commit, and keeps the files a user uploaded to the repo (also inside base/)."""
    from huggingface_hub import HfApi

    repo_id, api = hub_online.unique_repo_id("vit-over-bert"), HfApi()
    bed.model("bert").push_to_hub(repo_id)
    for name in ("notes.txt", "base/my_notes.txt"):
        api.upload_file(path_or_fileobj=b"mine", path_in_repo=name, repo_id=repo_id)
    bed.model("vit").push_to_hub(repo_id)
    files = set(api.list_repo_files(repo_id))
    assert {"notes.txt", "base/my_notes.txt", "preprocessor_config.json"} <= files, files
    assert not {"tokenizer.json", "tokenizer_config.json"} & files, files
    reloaded = CalibratedModel.from_pretrained(repo_id)
    assert "ImageProcessor" in type(reloaded.preprocessor).__name__


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill helper forks")
def test_a_save_killed_at_any_step_leaves_a_loadable_artifact(bed):
    results = kill_jobs(bed)
    assert len(STEP_KILLS) >= 15 and all(code == KILLED for *_, code in results[: len(STEP_KILLS)])
    failures = [(name, check_after_kill(bed, folder, before)) for name, folder, before, _ in results]
    failures = [(name, result) for name, result in failures if result[0] != HANDLED]
    assert not failures, failures


def test_fuzzed_artifacts_load_identically_or_are_refused(bed):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    fuzz, seen = FuzzBed(bed), collections.Counter()
    started = time.perf_counter()

    @settings(max_examples=FUZZ_MUTATIONS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def mutate_and_load(data: Any) -> None:
        outcome, detail = fuzz.once(DrawChooser(data))
        seen[outcome] += 1
        assert outcome in (REFUSED, HANDLED), detail

    mutate_and_load()
    print(f"fuzz: {sum(seen.values())} mutations in {time.perf_counter() - started:.1f} s: {dict(seen)}")
    assert sum(seen.values()) >= FUZZ_MUTATIONS


def test_dtype_and_its_older_name_may_both_be_given_when_they_agree():
    from hf_calibrate.serialization.load_options import load_dtype as _load_dtype

    assert _load_dtype(torch.float16, "float16") is torch.float16
    with pytest.raises(TypeError, match="not both"):
        _load_dtype(torch.float16, "float32")


if __name__ == "__main__":  # used by benchmarks/bench_reliability.py
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    iterations = int(os.environ.get("RELIABILITY_FUZZ_ITERATIONS", FUZZ_MUTATIONS))
    print(json.dumps(reliability_counts(fuzz_iterations=iterations), indent=2))
