"""Saving an artifact: its files are written into a staging folder inside the target, then renamed into place,
the record last. A save replaces or deletes only files it can prove the library wrote (:mod:`.ownership`), never
writes through a link, and a kill at any point leaves the old artifact, the new one, or a folder that loading
recognises as torn (and refuses, changing nothing) until the next save. See docs/artifact.md, *Saving*."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

from torch import nn

from .._atomic import fsync_path
from ..calibrators import Calibrator
from .identity import calibration_bytes
from .files import BASE_FOLDER, CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, CARD_FILE, DIAGRAM_FILE, STAGING_MARKER, STAGING_PREFIX
from .loading import check_tensor_values
from .locks import folder_lock
from .ownership import (
    Proofs, deletable, file_sha256, folder_proofs, in_the_way, is_generated_card, is_proven, linked_parent,
    read_json_record, sealed_digests, sealed_manifest, staging_folders,
)
from .schema import RECORD_DIGEST_KEY, ArtifactError, _json_default, seal_record, validate_record

#: Test hook: called with a step name between the steps of a save (the kill tests set it; see docs/artifact.md).
SAVE_STEP_HOOK: Optional[Callable[[str], None]] = None

#: Files every save writes (the diagram after an evaluation): what :func:`check_save_target` looks at before a fit.
EVERY_SAVE_WRITES = (CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, "config.json", DIAGRAM_FILE)


def _step(name: str) -> None:
    hook = SAVE_STEP_HOOK
    if hook is not None:
        hook(name)


# ----------------------------------------------------------------------------- writing files


def save_calibrator(calibrator: Calibrator, path: Path) -> None:
    """The calibrator's tensors as safetensors (:func:`.identity.calibration_bytes`)."""
    path.write_bytes(calibration_bytes(calibrator))


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n", encoding="utf-8")


def list_files(folder: Path) -> List[str]:
    """Relative POSIX paths of the files and links under ``folder`` (links are not followed)."""
    found = []
    for directory, subfolders, names in os.walk(folder):
        base = Path(directory).relative_to(folder)
        found += [(base / name).as_posix() for name in names]
        found += [(base / name).as_posix() for name in subfolders if (Path(directory) / name).is_symlink()]
    return sorted(found)


# ----------------------------------------------------------------------------- what may be replaced


def check_save_target(target: Path, names: Iterable[str] = EVERY_SAVE_WRITES, *, replace_card: bool = False) -> None:
    """Refuse, before any work, a folder a save could not write: a file in place of the folder, or one of ``names``
    in it that is a link, sits behind a linked folder, or is not provably the library's (``FileExistsError`` naming
    them and the fix); with ``replace_card``, also a ``README.md`` that is not a plain file. A missing folder is fine:
    the save creates it."""
    target = Path(os.path.abspath(target))
    if os.path.lexists(target) and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder; save the calibration to a folder path.")
    if target.is_dir():
        names = [*names, *([CARD_FILE] if replace_card else [])]
        _refuse_blockers(target, names, folder_proofs(target), replace_card=replace_card)


def _refuse_blockers(root: Path, names: List[str], proofs: Proofs, *, replace_card: bool) -> None:
    card = root / CARD_FILE
    plain_card = not os.path.lexists(card) or (card.is_file() and not card.is_symlink())
    exempt = {CARD_FILE} if replace_card and plain_card else set()
    blocked = sorted({str(path) for path in (in_the_way(root, name, proofs) for name in names if name not in exempt) if path})
    if blocked:
        unsealed = str(root / CALIBRATION_CONFIG) in blocked and not (root / CALIBRATION_CONFIG).is_symlink()
        raise FileExistsError(
            f"{', '.join(blocked[:5])}{' and others' if len(blocked) > 5 else ''}: hf_calibrate cannot prove it wrote "
            f"{'this' if len(blocked) == 1 else 'these'} (a link, a folder, a file of yours, or a file changed since "
            f"hf_calibrate saved it: its SHA-256 is not the one the folder's {CALIBRATION_CONFIG} records), and saving "
            "would replace it. Move it elsewhere, or save to another folder." + (
                f" The folder's {CALIBRATION_CONFIG} carries no valid seal (edited by hand, or not written by this "
                "version), so nothing proves which files are the library's: save into a new folder." if unsealed else "")
        )


def _refuse_unwritable(root: Path, names: List[str]) -> None:
    """Refuse, before anything is changed, a save whose files' folders cannot be written (read-only folders or file
    systems): a failure part-way through installing would leave the folder torn."""
    for name in names:
        folder = (root / name).parent
        while not folder.exists() and folder != root:
            folder = folder.parent
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"{folder} is not writable, so the save cannot replace {name} there; nothing was changed. "
                                  "Make it writable, or save to another folder.")


def _users_card(card: Path) -> bool:
    """True when ``card`` is a README.md (or a link) that hf_calibrate did not generate."""
    return os.path.lexists(card) and not is_generated_card(card)


# ----------------------------------------------------------------------------- saving


def save_artifact(
    target: Path, *, record: Dict[str, Any], config_json: Dict[str, Any], base_model: nn.Module, calibrator: Calibrator,
    preprocessor: Any = None, reliability: Optional[Dict[str, Any]] = None, repo_id: Optional[str] = None,
    overwrite_card: bool = False,
) -> Path:
    """Write the artifact into ``target`` (see docs/artifact.md); return ``target``."""
    target = Path(os.path.abspath(target))
    check_save_target(target, EVERY_SAVE_WRITES if reliability else EVERY_SAVE_WRITES[:-1], replace_card=overwrite_card)
    check_tensor_values(f"the calibration to save ({CALIBRATION_WEIGHTS})", calibrator.state_dict())
    created = not os.path.lexists(target)
    target.mkdir(parents=True, exist_ok=True)
    with folder_lock(target, exclusive=True):
        _step("locked")
        staging = _new_staging(target)
        try:
            _write_files(staging, record, config_json, base_model, calibrator, preprocessor, reliability, repo_id)
            if not overwrite_card and _users_card(target / CARD_FILE):
                (staging / CARD_FILE).unlink(missing_ok=True)  # the user's own README.md stays
            plan = _plan(target, staging, record, manifest=_staged(staging) + [CALIBRATION_CONFIG], replace_card=overwrite_card)
        except BaseException:
            _discard(staging, target if created else None)
            raise
        _install(target, staging, plan)
    return target


def update_results(root: Path, staged: Path) -> List[str]:
    """Replace a saved artifact's results in place: its record (only ``evaluation`` may differ), card and diagram.

    Args:
        root: the folder a calibration was saved to (its record sealed, its files as saved).
        staged: a folder holding the new ``calibration_config.json`` (sealed here), ``README.md`` and, if the
            results have one, ``reliability_diagram.png`` (the folder's diagram is removed when absent).

    Returns the relative names replaced or removed. The same rules as a save: only provable files are replaced
    (the card also when it is the user's: its model-index is what changes), never through a link.
    """
    root = Path(os.path.abspath(root))
    with folder_lock(root, exclusive=True):
        old, record = read_json_record(root / CALIBRATION_CONFIG), json.loads((staged / CALIBRATION_CONFIG).read_bytes())
        kept = _unchanged_files(root, old, record)
        staging = _new_staging(root)
        try:
            names = [name for name in (CARD_FILE, DIAGRAM_FILE) if (staged / name).is_file()]
            for name in names:
                shutil.copyfile(staged / name, staging / name)
            _give_new_file_mode(staging)
            digests = {name: digest for name, digest in sealed_digests(old).items() if name in kept}
            plan = _plan(root, staging, record, manifest=kept + names + [CALIBRATION_CONFIG], digests=digests, replace_card=True)
        except BaseException:
            _discard(staging, None)
            raise
        _install(root, staging, plan)
    return plan.written + plan.stale


def _unchanged_files(root: Path, old: Any, record: Dict[str, Any]) -> List[str]:
    """The files of the saved artifact that an update of its results keeps; refuses anything but a results update of a
    complete, sealed artifact."""
    manifest = sealed_manifest(old)
    if manifest is None:
        raise ArtifactError(f"{root / CALIBRATION_CONFIG} is not a sealed hf_calibrate record; save the model there again.")
    unchanged = ("evaluation", "files", RECORD_DIGEST_KEY)
    if {key: value for key, value in old.items() if key not in unchanged} != \
            {key: value for key, value in seal_record(record).items() if key not in unchanged}:
        raise ValueError("update_results replaces the results (the record's 'evaluation') only; the new record differs "
                         "from the saved one elsewhere. Save the model with save_pretrained instead.")
    kept = [name for name in manifest if name not in (CARD_FILE, DIAGRAM_FILE, CALIBRATION_CONFIG)]
    torn = [name for name in kept if not is_proven(root, name, {k: {v} for k, v in sealed_digests(old).items()})]
    if torn:
        raise ArtifactError(f"{root}: {', '.join(torn[:5])} no longer match {CALIBRATION_CONFIG} (an interrupted save, or "
                            "edited files); save the model there again before updating its results.")
    return kept


# ----------------------------------------------------------------------------- staging and installing


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a checked save installs (``written``, the record last) and deletes (``stale``, each proven the library's)."""

    written: List[str]
    stale: List[str]
    proofs: Proofs
    leftovers: List[Path]


def _new_staging(root: Path) -> Path:
    """A fresh staging folder inside ``root`` (same file system: ``os.replace`` stays atomic; umask mode), marked
    as a save's by its first file (:func:`.ownership.staging_folders`)."""
    while True:
        staging = root / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
        with contextlib.suppress(FileExistsError):
            staging.mkdir()
            (staging / STAGING_MARKER).write_text(staging.name, encoding="utf-8")
            return staging


def _staged(staging: Path) -> List[str]:
    """The files staged for installing (the staging folder's marker is not one)."""
    return [name for name in list_files(staging) if name != STAGING_MARKER]


def _discard(staging: Path, created: Optional[Path]) -> None:
    """Undo a save that failed before installing anything: its staging folder, and the target if the save made it."""
    shutil.rmtree(staging, ignore_errors=True)
    if created is not None:
        with contextlib.suppress(OSError):
            created.rmdir()


def _plan(
    root: Path, staging: Path, record: Dict[str, Any], *, manifest: List[str], digests: Optional[Dict[str, str]] = None,
    replace_card: bool = False,
) -> _Plan:
    """Check that nothing in the way is the user's and every folder written is writable, list the stale files the
    save will delete, seal the record (manifest and every file's SHA-256) into the staging folder, and flush."""
    leftovers = [folder for folder in staging_folders(root) if folder != staging]
    proofs = folder_proofs(root)
    names = _staged(staging)
    # the card and the record last: a kill before the record's rename leaves a card that does not match it (torn)
    written = [name for name in names if name not in (CARD_FILE, CALIBRATION_CONFIG)] + \
        [name for name in (CARD_FILE,) if name in names] + [CALIBRATION_CONFIG]
    _refuse_blockers(root, written, proofs, replace_card=replace_card)
    stale = sorted(name for name in set(proofs) - set(manifest) - {CARD_FILE, CALIBRATION_CONFIG}
                   if deletable(name) and is_proven(root, name, proofs))
    _refuse_unwritable(root, written + stale)
    files = record["files"]
    files["manifest"] = sorted(manifest)
    staged = {name: file_sha256(staging / name) for name in written if name != CALIBRATION_CONFIG}
    files["sha256"] = {**(digests or {}), **staged}
    sealed = seal_record(record)
    validate_record(sealed, staging / CALIBRATION_CONFIG)  # never write a record that would not load
    write_json(staging / CALIBRATION_CONFIG, sealed)
    _step(f"staged {CALIBRATION_CONFIG}")
    for name in written:
        fsync_path(staging / name)
    return _Plan(written, stale, proofs, leftovers)


def _install(root: Path, staging: Path, plan: _Plan) -> None:
    """Delete the stale files, rename the staged ones into place (the record last), then drop the staging folders.

    A kill here leaves a folder whose files do not all match its record: loading refuses it as torn, and the next
    save, proving the installed files by the staged record its staging folder still holds, replaces them.
    """
    try:
        for name in plan.stale:
            if is_proven(root, name, plan.proofs):  # still the file the plan proved
                (root / name).unlink()
                _prune_empty_parents(root, (root / name).parent)
            _step(f"delete {name}")
        for name in plan.written:
            _move_into(root, staging, name)
            _step(f"install {name}")
    except OSError as error:
        error.add_note(f"The save into {root} stopped while installing its files: loading refuses the folder as torn "
                       "(changing nothing) until the calibration is saved there again.")
        raise
    fsync_path(root)
    for folder in [staging, *plan.leftovers]:
        shutil.rmtree(folder, ignore_errors=True)  # marked, real folders of the reserved name: ownership.staging_folders
    _step("staging removed")


def _move_into(root: Path, staging: Path, name: str) -> None:
    """``os.replace`` one staged file into ``root``, creating its folders; never through a link."""
    if linked_parent(root, name) is not None:
        raise FileExistsError(f"{linked_parent(root, name)} became a link or a file during the save; nothing is written through it.")
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging / name, root / name)
    fsync_path((root / name).parent)


def _prune_empty_parents(root: Path, folder: Path) -> None:
    """Remove folders a deletion left empty, up to (not including) ``root``."""
    while folder != root and folder.is_relative_to(root) and not folder.is_symlink():
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _write_files(
    staging: Path, record: Dict[str, Any], config_json: Dict[str, Any], base_model: nn.Module, calibrator: Calibrator,
    preprocessor: Any, reliability: Optional[Dict[str, Any]], repo_id: Optional[str],
) -> None:
    """Every file of the artifact except the record, into the staging folder."""
    from ..results import cards
    from ..backbones.preprocessing import timm_export_config

    base = record["base_model"]
    save_calibrator(calibrator, staging / CALIBRATION_WEIGHTS)
    _step(f"staged {CALIBRATION_WEIGHTS}")
    if base["weights"] == "included" and base["library"] == "timm":
        import timm.models

        timm.models.save_for_hf(
            base_model, str(staging), safe_serialization=True,
            model_config={**config_json, "image_processor_type": "TimmWrapperImageProcessor"},
            data_config=timm_export_config(record.get("input_contract")),
        )
    else:
        if base["weights"] == "included" and base["library"] == "transformers":
            base_model.save_pretrained(staging / BASE_FOLDER)
        write_json(staging / "config.json", config_json)
    _step("staged the base model")
    if preprocessor is not None and hasattr(preprocessor, "save_pretrained"):
        preprocessor.save_pretrained(str(staging))
        _step("staged the preprocessor")
    diagram = cards.write_diagram(staging, reliability, cards.method_title(record)) if reliability else None
    cards.render_card(record, repo_id=repo_id, diagram=diagram).save(staging / CARD_FILE)
    _step(f"staged {CARD_FILE}")
    _give_new_file_mode(staging)


def _give_new_file_mode(staging: Path) -> None:
    """Give every staged file the mode the umask gives a new file (safetensors writes its files 0600): the staging
    folder was made with ``mkdir``'s umask mode, whose read and write bits are a new file's."""
    mode = stat.S_IMODE(staging.stat().st_mode) & 0o666
    for relative in _staged(staging):
        path = staging / relative
        if not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != mode:
            os.chmod(path, mode)
