"""Which files in a folder a save may replace or delete: only those it can prove an hf_calibrate save wrote.

**The proof** is a digest: a file is the library's when it is a plain file (not a link), reached through no linked
folder, whose SHA-256 equals the one a sealed record of this folder lists for that path (``files.sha256``). A
sealed record is one whose ``record_sha256`` matches it: the folder's own ``calibration_config.json`` and the staged
record of a save that was killed while installing (its staging folder is kept until the next save, for exactly
this). A file the user edited since, a link, or a file no record lists is not provably the library's, whatever its
name, so a save refuses to replace it and never deletes it. The card is the exception: a ``README.md`` is the
library's when it carries the generated card's marker (users edit cards on the hub, so its digest is checked only
while a save is interrupted). A save deletes an earlier save's stale file only where it writes files at all
(:func:`deletable`).
See docs/artifact.md.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterator, List, Optional, Set

from .._output_files import file_sha256
from .files import (
    BASE_FOLDER, CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, CARD_FILE, CARD_MARKER, DIAGRAM_FILE, STAGING_MARKER, STAGING_PREFIX,
)
from .schema import MAX_RECORD_BYTES, RECORD_DIGEST_KEY, record_digest
from .value_checks import path_list

__all__ = [
    "Proofs", "deletable", "file_sha256", "folder_proofs", "in_the_way", "is_proven", "manifest_files", "sealed_digests",
    "staging_folders",
]

#: relative path -> the SHA-256 digests sealed records of the folder list for it
Proofs = Dict[str, Set[str]]


def read_json_record(path: Path) -> Any:
    """A record file as JSON data (None when missing, a link, too large or unreadable); not validated."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def sealed_manifest(record: Any) -> Optional[List[str]]:
    """The ``files.manifest`` of a record that still matches its digest, else None (unsealed, altered, unreadable)."""
    files = record.get("files") if isinstance(record, dict) else None
    manifest = files.get("manifest") if isinstance(files, dict) else None
    sealed = isinstance(record, dict) and record.get(RECORD_DIGEST_KEY) == record_digest(record)
    return manifest if sealed and isinstance(manifest, list) and not path_list(manifest) else None


def sealed_digests(record: Any) -> Dict[str, str]:
    """``files.sha256`` of a sealed record for the paths its manifest lists (empty for any other record)."""
    manifest = sealed_manifest(record)
    digests = record["files"].get("sha256") if manifest is not None else None
    if not isinstance(digests, dict):
        return {}
    return {name: digest for name, digest in digests.items() if name in manifest and isinstance(digest, str)}


def staging_folders(root: Path) -> Iterator[Path]:
    """The staging folders of earlier saves inside ``root``: real folders (never links) of the reserved name whose
    marker, the first file a save writes into one, holds that name (so a folder a user named alike is not one)."""
    for entry in os.scandir(root):
        if entry.name.startswith(STAGING_PREFIX) and entry.is_dir(follow_symlinks=False):
            marker = Path(entry.path) / STAGING_MARKER
            if not marker.is_symlink() and marker.is_file() and marker.stat().st_size < 256 and marker.read_text(
                    encoding="utf-8", errors="replace") == entry.name:
                yield Path(entry.path)


def folder_proofs(root: Path) -> Proofs:
    """The digests the sealed records of ``root`` list: its record's and those of saves killed while installing."""
    proofs: Proofs = {}
    records = [root / CALIBRATION_CONFIG] + [folder / CALIBRATION_CONFIG for folder in staging_folders(root)]
    for path in records:
        for name, digest in sealed_digests(read_json_record(path)).items():
            proofs.setdefault(name, set()).add(digest)
    return proofs


def linked_parent(root: Path, relative: str) -> Optional[Path]:
    """The first folder on the way from ``root`` to ``relative`` that is a link or not a folder, else None."""
    parts = PurePosixPath(relative).parts
    for depth in range(1, len(parts)):
        parent = root.joinpath(*parts[:depth])
        if parent.is_symlink() or (os.path.lexists(parent) and not parent.is_dir()):
            return parent
    return None


def is_generated_card(path: Path) -> bool:
    """True when ``path`` is a plain file holding the generated card's marker."""
    if path.is_symlink() or not path.is_file():
        return False
    return CARD_MARKER in path.read_text(encoding="utf-8", errors="replace")


def is_proven(root: Path, relative: str, proofs: Proofs) -> bool:
    """Whether ``root / relative`` is a file a save of this library provably wrote (see the module docstring); never
    an empty file (no save writes one, and anyone can state an empty file's digest)."""
    path = root / relative
    if linked_parent(root, relative) is not None or path.is_symlink() or not path.is_file() or path.stat().st_size == 0:
        return False
    if relative == CARD_FILE:
        return is_generated_card(path)
    if relative == CALIBRATION_CONFIG:
        return sealed_manifest(read_json_record(path)) is not None
    return file_sha256(path) in proofs.get(relative, set())


#: the files a save writes at the folder's root: the library's own (files.py, timm's weights) and a preprocessor's
#: (transformers' tokenizer and processor files)
ROOT_NAMES = (CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, "config.json", CARD_FILE, DIAGRAM_FILE, "model.safetensors")
PREPROCESSOR_PATTERNS = ("*tokenizer*", "vocab*", "merges.txt", "*.model", "special_tokens_map.json", "added_tokens.json",
                         "*preprocessor_config.json", "processor_config.json", "chat_template.*", "*.tiktoken")


def deletable(relative: str) -> bool:
    """Whether a save may delete ``relative`` as a stale file of an earlier save (once proven): a name a save writes
    at the root, or a file under ``base/``; never a dot name (``.git/...``) or a file of another folder. A hostile
    record can state the digest of a file whose content anyone can guess (``.git/HEAD``); this keeps such files out
    of reach whatever the record says."""
    parts = PurePosixPath(relative).parts
    if any(part.startswith(".") for part in parts):
        return False
    if len(parts) == 1:
        return parts[0] in ROOT_NAMES or any(fnmatch.fnmatchcase(parts[0], pattern) for pattern in PREPROCESSOR_PATTERNS)
    return parts[0] == BASE_FOLDER


def in_the_way(root: Path, relative: str, proofs: Proofs) -> Optional[Path]:
    """What stops a save writing ``relative`` into ``root``: a linked or non-folder parent, or an entry there that
    is not provably the library's (None when the path is free or proven)."""
    parent = linked_parent(root, relative)
    if parent is not None:
        return parent
    path = root / relative
    if not os.path.lexists(path) or is_proven(root, relative, proofs):
        return None
    return path


def manifest_files(record: Any) -> Set[str]:
    """The files a hub repo's earlier push wrote: its record's manifest when sealed, else none (nothing is deleted)."""
    manifest = sealed_manifest(record)
    return set(manifest) | {CALIBRATION_CONFIG} if manifest is not None else set()
