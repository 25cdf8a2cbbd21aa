"""Writing one file so that a reader sees the old file or the whole new one, never a part (layer 0: no imports of ours)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(stream)`` on a temporary file beside ``path``, then rename it onto ``path``.

    The temporary file is removed when ``write`` fails, so nothing half-written is left and an
    existing ``path`` is untouched. It gets the usual umask permissions (plain ``open``).
    """
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
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
