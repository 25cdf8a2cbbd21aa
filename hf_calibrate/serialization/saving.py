"""Saving an artifact: writing its files, which files are the library's, and replacing an older artifact
crash-atomically (folder locks, a journal rolled forward by the next save or load)."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set

from safetensors.torch import save_file
from torch import nn

from .._atomic import fsync_path, write_text_atomically
from ..calibrators import Calibrator
from .files import (
    BASE_FOLDER,
    CALIBRATION_CONFIG,
    CALIBRATION_WEIGHTS,
    CARD_FILE,
    CARD_MARKER,
    DIAGRAM_FILE,
    JOURNAL_FILE,
    STAGING_PREFIX,
)
from .loading import check_tensor_values
from .schema import (
    MAX_RECORD_BYTES,
    RECORD_DIGEST_KEY,
    ArtifactError,
    _json_default,
    _path_list,
    record_digest,
    seal_record,
    validate_record,
)

#: Test hook: called with a step name between the steps of a save (the kill tests set it; see docs/artifact.md).
SAVE_STEP_HOOK: Optional[Callable[[str], None]] = None


# ----------------------------------------------------------------------------- writing files


def save_calibrator(calibrator: Calibrator, path: Path) -> None:
    """The calibrator's tensors as safetensors. One metadata key only: safetensors writes several in a
    random order, and the same calibration must give the same bytes (and SHA-256) every time."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in calibrator.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def is_generated_card(path: Path) -> bool:
    return CARD_MARKER in path.read_text(encoding="utf-8", errors="replace")


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n", encoding="utf-8")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- which files are the library's

#: Files a format-1 artifact (which had no manifest) may have written but need not have: the preprocessor's. A user
#: may have put files of these names there, so they are never deleted, and a save over such a folder is refused.
LEGACY_PREPROCESSOR_FILES = (
    "preprocessor_config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
    "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json",
)
_LEGACY_BASE_WEIGHTS, _LEGACY_BASE_INDEX, _LEGACY_BASE_SHARDS = (
    "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")


def _sealed_manifest(record: Any) -> Optional[List[str]]:
    """The manifest of a record that still matches its digest, else None (format 1, unreadable or altered)."""
    files = record.get("files") if isinstance(record, dict) else None
    manifest = files.get("manifest") if isinstance(files, dict) else None
    intact = isinstance(record, dict) and record.get(RECORD_DIGEST_KEY) == record_digest(record)
    return manifest if intact and isinstance(manifest, list) and not _path_list(manifest) else None


def _legacy_base_files(names: Iterable[str]) -> Set[str]:
    """Which of the files ``names`` of ``base/`` a format-1 save of an included transformers base provably wrote.

    transformers' ``save_pretrained`` into that save's fresh folder wrote ``config.json`` and the weights: one
    ``model.safetensors`` or, for a large base, an index and its shards, never both, and a classifier no
    ``generation_config.json``. So beside ``model.safetensors`` a shard-named file or an index is the user's, and so
    is any other file.
    """
    names = set(names)
    if _LEGACY_BASE_WEIGHTS in names:
        weights = {_LEGACY_BASE_WEIGHTS}
    elif _LEGACY_BASE_INDEX in names:
        weights = {_LEGACY_BASE_INDEX} | set(fnmatch.filter(names, _LEGACY_BASE_SHARDS))
    else:
        weights = set()
    return ({"config.json"} | weights) & names


def owned_files(record: Any, exists: Callable[[str], bool], listing: Callable[[str], Iterable[str]]) -> Set[str]:
    """Relative paths of the files an artifact's own save wrote (not a user's), given its record.

    A format-2 record lists them (``files.manifest``), trusted only while the record matches its
    digest. For a format-1 record, or an unreadable or altered one, they are only the files every
    format-1 save of that record wrote — the record, the calibration weights, ``config.json``, the
    base's own files (:func:`_legacy_base_files`) and (after an evaluation) the diagram — never the
    preprocessor's, which a user may have put there (``exists(path)`` filters them; ``listing(folder)``
    lists the files of a folder, for ``base/``).
    """
    manifest = _sealed_manifest(record)
    if manifest is not None:
        return set(manifest) | {CALIBRATION_CONFIG}
    record = record if isinstance(record, dict) else {}
    base = record.get("base_model") if isinstance(record.get("base_model"), dict) else {}
    included = base.get("weights") == "included"
    owned = {name for name in (CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, "config.json") if exists(name)}
    if isinstance(record.get("evaluation"), dict) and record["evaluation"].get("reliability") and exists(DIAGRAM_FILE):
        owned.add(DIAGRAM_FILE)
    if included and base.get("library") == "timm" and exists("model.safetensors"):
        owned.add("model.safetensors")
    if included and base.get("library") == "transformers":
        owned |= {f"{BASE_FOLDER}/{name}" for name in _legacy_base_files(listing(BASE_FOLDER))}
    return owned


def _read_folder_record(root: Path) -> Any:
    """The record saved in ``root`` as JSON data (None when unreadable); not validated."""
    try:
        return json.loads((root / CALIBRATION_CONFIG).read_bytes()[:MAX_RECORD_BYTES].decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _unproven_files_kept(root: Path, staging: Path) -> Set[str]:
    """Preprocessor files of an artifact without a sealed manifest (format 1, or an altered record) that the new
    save writes byte for byte again (replacing them loses nothing); any other such file stops the save."""
    if not os.path.lexists(root / CALIBRATION_CONFIG) or _sealed_manifest(_read_folder_record(root)) is not None:
        return set()
    present = [name for name in LEGACY_PREPROCESSOR_FILES if os.path.lexists(root / name)]
    same = {name for name in present if _same_bytes(root / name, staging / name)}
    unproven = [name for name in present if name not in same]
    if unproven:
        raise FileExistsError(
            f"{root} holds a calibration saved without a manifest (format 1, or an altered record), so nothing proves "
            f"that {', '.join(unproven)} were written by hf_calibrate rather than by you, and this save would replace "
            "them or leave them beside the new artifact. Move them elsewhere (delete them if they are the old "
            "calibration's own), or save to another folder."
        )
    return same


def _same_bytes(existing: Path, staged: Path) -> bool:
    """Whether ``existing`` is a plain file with exactly the bytes of the staged file ``staged``."""
    if existing.is_symlink() or not existing.is_file() or not staged.is_file() or staged.is_symlink():
        return False
    return existing.stat().st_size == staged.stat().st_size and file_sha256(existing) == file_sha256(staged)


def _owned_in_folder(root: Path) -> Set[str]:
    """:func:`owned_files` of the artifact saved in the local folder ``root`` (empty when it holds none)."""
    if not os.path.lexists(root / CALIBRATION_CONFIG):
        return set()
    record = _read_folder_record(root)

    def listing(folder: str) -> List[str]:
        directory = root / folder
        return [entry.name for entry in os.scandir(directory) if entry.is_file()] if directory.is_dir() and not directory.is_symlink() else []

    return owned_files(record, lambda name: os.path.lexists(root / name), listing)


# ----------------------------------------------------------------------------- crash-atomic saving


def _step(name: str) -> None:
    hook = SAVE_STEP_HOOK
    if hook is not None:
        hook(name)


@contextlib.contextmanager
def folder_lock(folder: Path, *, exclusive: bool) -> Iterator[None]:
    """An advisory ``flock`` on the folder itself (exclusive for a save, shared for a load).

    Released by the kernel when the process dies, so a killed save never leaves a stale lock.
    Where ``flock`` is unavailable (not POSIX, some network file systems) it is skipped.
    """
    try:
        import fcntl

        descriptor = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(descriptor)


def _needs_recovery(root: Path) -> bool:
    return os.path.lexists(root / JOURNAL_FILE) or any(entry.name.startswith(STAGING_PREFIX) for entry in os.scandir(root))


@contextlib.contextmanager
def reading(root: Path) -> Iterator[None]:
    """Hold a shared lock on a local artifact while it is read, after finishing any interrupted save."""
    if not root.is_dir():
        yield
        return
    if _needs_recovery(root):
        try:
            with folder_lock(root, exclusive=True):
                recover(root)
        except OSError as error:
            raise ArtifactError(
                f"{root} holds an interrupted save ({JOURNAL_FILE} or {STAGING_PREFIX}*) that could not be finished "
                f"({error}); load it once with write access to the folder, or re-save the calibration."
            ) from None
    with folder_lock(root, exclusive=False):
        yield


def recover(root: Path) -> None:
    """Finish an interrupted save of ``root`` (roll its journal forward) and drop dead staging folders.

    Call with the folder's exclusive lock held: any staging folder then belongs to a dead save.
    """
    journal = _read_journal(root)
    if journal is not None:
        _apply_journal(root, journal)
    for entry in os.scandir(root):
        if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)


def _read_journal(root: Path) -> Optional[Dict[str, Any]]:
    path = root / JOURNAL_FILE
    if not os.path.lexists(path):
        return None
    try:
        journal = json.loads(path.read_text(encoding="utf-8"))
        staging, lists = journal["staging"], (journal["write"], journal["delete"])
        valid = staging.startswith(STAGING_PREFIX) and "/" not in staging and not any(_path_list(items) for items in lists)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        valid = False
    if not valid:
        raise ArtifactError(
            f"{path} (the journal of an interrupted save) is damaged, so that save cannot be completed; delete it "
            f"and any {STAGING_PREFIX}* folder beside it, then re-save the calibration."
        )
    return journal


def _apply_journal(root: Path, journal: Dict[str, Any]) -> None:
    """Roll a committed save forward; every step is idempotent, so a kill here is recovered by rerunning it."""
    staging = root / journal["staging"]
    for relative in journal["write"]:
        source = staging / relative
        if os.path.lexists(source):
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, root / relative)
        _step(f"install {relative}")
    for relative in journal["delete"]:
        path = root / relative
        if os.path.lexists(path) and (path.is_symlink() or not path.is_dir()):
            path.unlink()
        _prune_empty_parents(root, path.parent)
        _step(f"delete {relative}")
    shutil.rmtree(staging, ignore_errors=True)
    _step("staging removed")
    os.unlink(root / JOURNAL_FILE)
    fsync_path(root)
    _step("journal removed")


def _prune_empty_parents(root: Path, folder: Path) -> None:
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def list_files(folder: Path) -> List[str]:
    """Relative POSIX paths of the files and links under ``folder`` (links are not followed)."""
    found = []
    for directory, subfolders, names in os.walk(folder):
        base = Path(directory).relative_to(folder)
        found += [(base / name).as_posix() for name in names]
        found += [(base / name).as_posix() for name in subfolders if (Path(directory) / name).is_symlink()]
    return sorted(found)


def _blocker(root: Path, relative: str) -> Optional[Path]:
    """What in ``root`` stops the library writing ``relative``: an existing entry there, or a parent that is a link or a file."""
    parts = PurePosixPath(relative).parts
    for depth in range(1, len(parts)):
        parent = root.joinpath(*parts[:depth])
        if parent.is_symlink() or (os.path.lexists(parent) and not parent.is_dir()):
            return parent
    path = root / relative
    return path if os.path.lexists(path) else None


def _check_collisions(root: Path, written: List[str], owned: Set[str]) -> None:
    """Refuse a save that would overwrite, or write through, something that is not the library's."""
    for relative in written:
        blocker = None if relative in owned or relative == CARD_FILE else _blocker(root, relative)
        if blocker is not None:
            raise FileExistsError(
                f"{blocker} exists and was not written by hf_calibrate (it is not in the manifest of the folder's "
                f"{CALIBRATION_CONFIG}); saving would overwrite it. Move it elsewhere, or save to another folder."
            )


def _users_card(card: Path) -> bool:
    """True when ``card`` is a README.md (or a link) that hf_calibrate did not generate."""
    return os.path.lexists(card) and (card.is_symlink() or not card.is_file() or not is_generated_card(card))


def _prepare(root: Path, staging: Path, record: Dict[str, Any], *, keep_user_card: bool) -> Dict[str, Any]:
    """Finish the staging folder (record with manifest and digests) and return the journal to commit."""
    card = root / CARD_FILE
    if keep_user_card and _users_card(card):
        (staging / CARD_FILE).unlink(missing_ok=True)  # the user's own README.md stays
    written = [name for name in list_files(staging) if name != CALIBRATION_CONFIG] + [CALIBRATION_CONFIG]
    owned = _owned_in_folder(root) | _unproven_files_kept(root, staging)
    _check_collisions(root, written, owned)
    files = record["files"]
    files["manifest"] = sorted(written)
    files["sha256"] = {files["weights"]: file_sha256(staging / files["weights"])}
    sealed = seal_record(record)
    validate_record(sealed, staging / CALIBRATION_CONFIG)  # never write a record that would not load
    write_json(staging / CALIBRATION_CONFIG, sealed)
    _step(f"staged {CALIBRATION_CONFIG}")
    stale = sorted(name for name in owned - set(written) - {CARD_FILE} if os.path.lexists(root / name))
    return {"protocol": 1, "staging": staging.name, "write": written, "delete": stale}


def _commit(root: Path, staging: Path, journal: Dict[str, Any]) -> None:
    """Flush the staged files, then atomically publish the journal: from here the save rolls forward."""
    for name in journal["write"]:
        fsync_path(staging / name)
    # written in the staging folder, which a killed save's recovery removes; the rename is the commit point
    write_text_atomically(root / JOURNAL_FILE, json.dumps(journal), durable=True, scratch_folder=staging)
    _step("committed")


def _new_staging(root: Path) -> Path:
    """A fresh staging folder inside ``root`` (same file system: ``os.replace`` stays atomic; umask mode)."""
    while True:
        staging = root / f"{STAGING_PREFIX}{secrets.token_hex(6)}"
        with contextlib.suppress(FileExistsError):
            staging.mkdir()
            return staging


_LEGACY_TEMPORARY = r"\.{name}\.(saving|old)-[a-z0-9_]{{8}}"


def _legacy_temporaries(target: Path) -> List[Path]:
    """Sibling folders left by format-1 saves (``.<name>.saving-*`` / ``.<name>.old-*``) of ``target``."""
    if not target.parent.is_dir():
        return []
    pattern = re.compile(_LEGACY_TEMPORARY.format(name=re.escape(target.name)))
    return [Path(entry.path) for entry in os.scandir(target.parent) if pattern.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)]


def recover_legacy_save(target: Path) -> None:
    """Undo a format-1 save killed between its two renames: ``target`` is missing but its old copy is beside it."""
    target = Path(os.path.abspath(target))
    if os.path.lexists(target) or not target.parent.is_dir():
        return
    with folder_lock(target.parent, exclusive=True):
        backups = [folder / "old" for folder in _legacy_temporaries(target) if (folder / "old" / CALIBRATION_CONFIG).is_file()]
        if backups and not os.path.lexists(target):
            os.replace(max(backups, key=lambda path: path.stat().st_mtime), target)


def _check_target(target: Path) -> None:
    if os.path.lexists(target) and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a folder; save the calibration to a folder path.")


def save_artifact(
    target: Path,
    *,
    record: Dict[str, Any],
    config_json: Dict[str, Any],
    base_model: nn.Module,
    calibrator: Calibrator,
    preprocessor: Any = None,
    reliability: Optional[Dict[str, Any]] = None,
    repo_id: Optional[str] = None,
    overwrite_card: bool = False,
) -> Path:
    """Write the artifact into ``target`` crash-atomically (see docs/artifact.md); return ``target``."""
    target = Path(os.path.abspath(target))
    _check_target(target)
    check_tensor_values(f"the calibration to save ({CALIBRATION_WEIGHTS})", calibrator.state_dict())
    recover_legacy_save(target)
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    with folder_lock(target, exclusive=True):
        _step("locked")
        recover(target)
        for folder in _legacy_temporaries(target):
            shutil.rmtree(folder, ignore_errors=True)
        _step("recovered")
        staging = _new_staging(target)
        try:
            _write_files(staging, record, config_json, base_model, calibrator, preprocessor, reliability, repo_id)
            journal = _prepare(target, staging, record, keep_user_card=not overwrite_card)
            _commit(target, staging, journal)
        except BaseException:
            if not os.path.lexists(target / JOURNAL_FILE):
                shutil.rmtree(staging, ignore_errors=True)
                if created:
                    with contextlib.suppress(OSError):
                        target.rmdir()
            raise
        _apply_journal(target, journal)
    return target


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
    """Give every staged file the mode the umask gives a new file (safetensors writes its files 0600)."""
    probe = staging / ".hf_calibrate-mode-probe"
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = stat.S_IMODE(probe.stat().st_mode)
    probe.unlink()
    for relative in list_files(staging):
        path = staging / relative
        if not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != mode:
            os.chmod(path, mode)
