"""Replacing a file or a folder so that a reader sees the old one or the whole new one, never a part (layer 0: no
imports of ours).

One rule for every writer of the library: write into a temporary entry on the same file system, then
rename it onto the target (``os.replace`` for a file: atomic on POSIX and Windows). The diagrams, the
comparison's files and the demo zoo's model folders (:func:`atomic_folder`) use it; the artifact's save
(:mod:`hf_calibrate.serialization.saving`) stages whole folders and flushes them with :func:`fsync_path`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file or folder to disk (best effort: some platforms cannot open folders)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(stream)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The temporary file is removed when ``write`` (or the rename) fails, so nothing half-written is
    left and an existing ``path`` is untouched. It gets the usual umask permissions (plain ``open``).
    """
    path = Path(path)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "xb") as stream:
            write(stream)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """:func:`write_atomically` of ``text`` as UTF-8."""
    write_atomically(path, lambda stream: stream.write(text.encode("utf-8")))


@contextlib.contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``, renamed to ``target`` when the block succeeds.

    If another process created ``target`` meanwhile, its folder is kept and ours discarded;
    on error nothing is left behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield scratch
        try:
            os.rename(scratch, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
