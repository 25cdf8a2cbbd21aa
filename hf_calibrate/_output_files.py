"""Which existing files a command may replace: only those it can prove it wrote (layer 0: imports only :mod:`._atomic`).

**The proof** (the rule of the artifact save, :mod:`hf_calibrate.serialization.ownership`): a file is ours when it is a
plain file, not a link, whose current bytes match a SHA-256 an earlier write of ours recorded. Where that digest is
kept is the writer's: :func:`hf_calibrate.results.comparison.write` lists its files' digests in ``comparison.json``;
a reliability diagram carries its own, in a PNG text chunk (:func:`signed_png`). A user's file, one edited since, a
link (wherever it points) or a folder is never proven ours, so a writer refuses it (:func:`refuse_unproven`) before
any work, names it and says how to go on. Writers then replace files atomically (:mod:`hf_calibrate._atomic`);
``os.replace`` onto an entry replaces the entry itself, never a file a link points to.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from ._atomic import write_atomically

#: a proof: whether the plain file at a path is one we wrote
Proof = Callable[[Path], bool]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the keyword of the PNG text chunk holding the SHA-256 of the rest of the file
PNG_PROOF_KEYWORD = b"hf_calibrate sha256"
_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # a PNG's last chunk: empty, with its CRC
_PROOF_CHUNK_SIZE = 4 + 4 + len(PNG_PROOF_KEYWORD) + 1 + 64 + 4  # length, type, keyword, NUL, hex digest, CRC


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_proof(digests: Iterable[str]) -> Proof:
    """The proof that a file's SHA-256 is one of ``digests`` (what an earlier write recorded)."""
    known = frozenset(digests)
    return lambda path: file_sha256(path) in known


def why_unproven(path: Path, proof: Proof) -> Optional[str]:
    """Why writing ``path`` would replace something not proven ours: a link, not a file, or a file ``proof`` does not
    accept; None when nothing is there or the file is ours."""
    if path.is_symlink():
        return f"{path} is a symbolic link (to {os.readlink(path)}), which is never written through"
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        return f"{path} is not a file"
    if not proof(path):
        return f"{path} was not written by hf_calibrate, or was changed since"
    return None


def refuse_unproven(entries: Mapping[Path, Proof], instead: str) -> None:
    """Raise FileExistsError naming every entry of ``entries`` (path → its proof) that a write would replace without
    proof (:func:`why_unproven`), and the way out: move it, or ``instead`` (e.g. "write it to another folder")."""
    reasons = [reason for path, proof in entries.items() for reason in [why_unproven(path, proof)] if reason]
    if reasons:
        it = "it" if len(reasons) == 1 else "them"
        raise FileExistsError(f"{'; '.join(reasons)}: writing there would replace {it}, and hf_calibrate replaces only "
                              f"files it can prove it wrote. Move {it} elsewhere, or {instead}.")


def signed_png(data: bytes) -> bytes:
    """The PNG ``data`` with a text chunk, before its last chunk, holding the SHA-256 of ``data``: the file's proof
    that we wrote it (:func:`is_signed_png`); image viewers ignore the chunk."""
    if not data.startswith(PNG_SIGNATURE) or not data.endswith(_IEND):
        raise ValueError("not a whole PNG file: it must start with the PNG signature and end with its IEND chunk.")
    return data[: -len(_IEND)] + _proof_chunk(data) + _IEND


def is_signed_png(path: Path) -> bool:
    """Whether the file at ``path`` is a PNG :func:`signed_png` made, unchanged since: its chunk before the last is
    the proof chunk of the file without it."""
    data = path.read_bytes()
    start = len(data) - len(_IEND) - _PROOF_CHUNK_SIZE
    if start < len(PNG_SIGNATURE) or not data.endswith(_IEND):
        return False
    return data[start: -len(_IEND)] == _proof_chunk(data[:start] + _IEND)


def _proof_chunk(unsigned: bytes) -> bytes:
    """The PNG text chunk of :data:`PNG_PROOF_KEYWORD` and the SHA-256 (hex) of ``unsigned``, with its CRC-32."""
    payload = b"tEXt" + PNG_PROOF_KEYWORD + b"\0" + hashlib.sha256(unsigned).hexdigest().encode("ascii")
    return (len(payload) - 4).to_bytes(4, "big") + payload + zlib.crc32(payload).to_bytes(4, "big")


def write_signed_png(path: Path, data: bytes) -> None:
    """Write the PNG ``data``, signed (:func:`signed_png`), atomically to ``path``."""
    signed = signed_png(data)
    write_atomically(path, lambda stream: stream.write(signed))
