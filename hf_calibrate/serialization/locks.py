"""The folder lock that keeps a reader from seeing a save half-installed (an advisory ``flock``; changes nothing on disk)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


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


@contextlib.contextmanager
def reading(root: Path) -> Iterator[None]:
    """Hold a shared lock on a local artifact while it is read: a save installs its files under the exclusive lock,
    so a reader sees the folder before or after a save, never during one. Reading writes nothing."""
    if not root.is_dir():
        yield
        return
    with folder_lock(root, exclusive=False):
        yield
