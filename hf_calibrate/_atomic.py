"""Replacing a file or a folder so that a reader sees the old one or the whole new one, never a part (layer 0: no
imports of ours).

One rule for every writer of the library: write into a temporary entry on the same file system, then
rename it onto the target (``os.replace`` for a file: atomic on POSIX and Windows). The diagrams, the
comparison's files, the artifact's save journal (:mod:`hf_calibrate.serialization.saving`, which adds
``durable`` flushing) and the demo zoo's model folders (:func:`atomic_folder`) use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional


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


def write_atomically(
    path: str | os.PathLike, write: Callable[[BinaryIO], None], *, durable: bool = False,
    scratch_folder: Optional[str | os.PathLike] = None,
) -> None:
    """Call ``write(stream)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The temporary file is removed when ``write`` (or the rename) fails, so nothing half-written is
    left and an existing ``path`` is untouched. It gets the usual umask permissions (plain ``open``).

    Args:
        durable: flush the new file to disk before the rename and ``path``'s folder after it, so that
            after a power loss ``path`` holds the old or the whole new file (the rename is then a commit point).
        scratch_folder: where the temporary file is written instead of beside ``path`` (on the same file
            system, so that the rename stays atomic), e.g. a staging folder a crashed writer's leftovers go with.
    """
    path = Path(path)
    folder = Path(scratch_folder) if scratch_folder is not None else path.parent
    temporary = folder / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(temporary, "xb") as stream:
            write(stream)
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def write_text_atomically(
    path: str | os.PathLike, text: str, *, durable: bool = False, scratch_folder: Optional[str | os.PathLike] = None
) -> None:
    """:func:`write_atomically` of ``text`` as UTF-8."""
    write_atomically(path, lambda stream: stream.write(text.encode("utf-8")), durable=durable, scratch_folder=scratch_folder)


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
