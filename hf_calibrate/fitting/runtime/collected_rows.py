"""Rows a pass collects (logits, features): float32, in memory, or past a size in a memory-mapped file.

A fit collects one row per sample — C logits, or d features for the head methods — and keeps
nothing else per sample. Past ``spill_bytes`` the rows go to a temporary file in ``directory``
(default: the system's temporary folder, ``TMPDIR``) that is memory-mapped when the pass ends
and removed from the folder at once (the mapping keeps its pages until the rows are released),
so nothing is left behind, whatever happens after.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

#: collected rows above this many bytes go to a memory-mapped file (EngineOptions.spill_bytes)
DEFAULT_SPILL_BYTES = 4 << 30
#: rows in memory are written into chunks of this many bytes: a few large allocations that the allocator maps on
#: their own, rather than many small ones scattered between a pass's short-lived batches (whose freed space it keeps)
CHUNK_BYTES = 16 << 20


class RowBuffer:
    """Float32 rows of one width appended in order; :meth:`finish` gives them as one (n, K) tensor.

    In memory (on ``device``) until they pass ``spill_bytes``, then on the CPU in a file.
    """

    def __init__(self, spill_bytes: int, directory: Optional[str | os.PathLike] = None, device: torch.device | str = "cpu") -> None:
        self.spill_bytes, self.directory, self.device = spill_bytes, directory, torch.device(device)
        self._chunks: List[torch.Tensor] = []  # full in-memory chunks, then the one being filled
        self._in_chunk = 0  # rows written into the last chunk
        self._file = None
        self._path: Optional[Path] = None
        self.count = self.width = 0

    def append(self, rows: torch.Tensor) -> None:
        rows = rows.detach().float()
        if rows.ndim != 2:
            raise ValueError(f"rows must be (n, K), got shape {tuple(rows.shape)}.")
        self.width = self.width or rows.shape[1]
        self.count += rows.shape[0]
        if self._file is None and (self.count * self.width * 4 > self.spill_bytes):
            self._spill()
        if self._file is not None:
            self._file.write(rows.cpu().contiguous().numpy().tobytes())
            return
        while len(rows):
            if not self._chunks or self._in_chunk == len(self._chunks[-1]):
                self._chunks.append(torch.empty(max(1, CHUNK_BYTES // (4 * self.width)), self.width, device=self.device))
                self._in_chunk = 0
            take = min(len(rows), len(self._chunks[-1]) - self._in_chunk)
            self._chunks[-1][self._in_chunk : self._in_chunk + take] = rows[:take]
            self._in_chunk, rows = self._in_chunk + take, rows[take:]

    def _filled(self) -> List[torch.Tensor]:
        return [*self._chunks[:-1], self._chunks[-1][: self._in_chunk]] if self._chunks else []

    def _spill(self) -> None:
        handle, name = tempfile.mkstemp(prefix="hf_calibrate_rows_", suffix=".f32", dir=self.directory)
        self._path, self._file = Path(name), os.fdopen(handle, "wb")
        for part in self._filled():
            self._file.write(part.cpu().contiguous().numpy().tobytes())
        self._chunks = []

    def finish(self) -> torch.Tensor:
        """The rows (n, K) float32: in memory (one chunk: a view of it), or the file memory-mapped and unlinked."""
        if self._file is None:
            parts = self._filled()
            if len(parts) == 1:
                return parts[0]
            return torch.cat(parts) if parts else torch.empty(0, self.width, device=self.device)
        self._file.close()
        try:
            rows = torch.from_numpy(np.memmap(self._path, dtype=np.float32, mode="r+", shape=(self.count, self.width)))
        finally:
            self._path.unlink(missing_ok=True)  # the mapping keeps the pages; no file is left in the folder
        return rows

    def close(self) -> None:
        """Drop an unfinished buffer (a failed pass): its file, if any, is removed."""
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._chunks = []


def allocate(count: int, width: int, spill_bytes: int, directory: Optional[str | os.PathLike] = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """An (count, width) float32 tensor to fill by index: in memory on ``device``, or a memory-mapped file past ``spill_bytes``."""
    if count * width * 4 <= spill_bytes:
        return torch.empty(count, width, device=device)
    handle, name = tempfile.mkstemp(prefix="hf_calibrate_rows_", suffix=".f32", dir=directory)
    os.close(handle)
    try:
        return torch.from_numpy(np.memmap(name, dtype=np.float32, mode="w+", shape=(count, width)))
    finally:
        os.unlink(name)
