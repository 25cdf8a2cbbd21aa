"""The first pass over a stream: every process reads its own units once, then the stream is indexed.

Unlike a pass over map-style data, no process knows where its samples stand in the whole stream
until every process has read its units (a process reading its own shards of a
``datasets.IterableDataset`` cannot count the others'). So the first pass runs each process on
its own, with no collective inside the loop: it computes the rows of its units — in the batches
map-style data would have, whatever size the units are — into a :class:`RowBuffer`, and notes bad
data by its own running position. At the end one exchange builds the
:class:`~hf_calibrate.data.StreamIndex`, turns the noted positions into dataset indices, raises any
fault on every process, and puts the rows in dataset order on every process (one process: they
already are), in chunks, so that no more than the rows themselves is ever held.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from ... import _distributed
from ...backbones import Inputs
from ...data import StreamedData
from ...data.batches import Batch, BatchBuilder, slice_batch
from ...data.streams.index import batch_bytes
from .faults import check_finite_outputs, note_bad_inputs
from .collected_rows import RowBuffer, allocate

#: rows each process sends per round of the final exchange
EXCHANGE_ROWS = 1 << 16


@torch.no_grad()
def scan_stream(
    engine, data: StreamedData, compute: Callable[[Inputs], torch.Tensor], *, num_classes: Optional[int], description: str,
    what: str, keep_inputs: bool, spill_dir: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(``compute(inputs)`` rows (N, K) float32, labels (N,)) of every sample of the stream, in dataset order, on every process.

    ``keep_inputs``: later passes will read the stream again (Neural Clamping), so its units are kept in
    memory when they fit (:meth:`StreamedData.finish_first_pass`). Rows past ``spill_bytes`` are
    memory-mapped from a file in ``spill_dir`` (:mod:`hf_calibrate.fitting.runtime.collected_rows`).
    """
    rows, labels, indices = scan_stream_locally(engine, data, compute, num_classes=num_classes, description=description,
                                                keep_inputs=keep_inputs, spill_dir=spill_dir)
    if engine.world > 1:
        rows, labels = _exchange(engine, indices, rows, labels, data.index.count, spill_dir)
    check_finite_outputs(data, rows, torch.arange(data.index.count), what)
    return rows, labels


@torch.no_grad()
def scan_stream_locally(
    engine, data: StreamedData, compute: Callable[[Inputs], torch.Tensor], *, num_classes: Optional[int], description: str,
    keep_inputs: bool = False, spill_dir: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`scan_stream` without its final exchange: (rows (n, K), labels (n,), their dataset indices (n,)) of the n
    samples this process read, in its reading order. The stream is indexed and bad data raised on every process."""
    table = _UnitTable()
    buffer = RowBuffer(engine.options.spill_bytes, spill_dir, engine.device)
    labels: List[torch.Tensor] = []
    seen = 0
    try:
        with engine.progress(None, description) as bar:
            units = table.record(data.read(engine.rank, engine.world, keep=keep_inputs))
            for batch in regroup(units, math.ceil(engine.options.batch_size / engine.world), data.pad_id):
                labels.append(_forward(engine, data, compute, batch, seen, buffer, num_classes))
                seen += len(batch[1])
                bar.update(1)
        rows = buffer.finish()
    except BaseException:
        buffer.close()
        raise
    data.finish_first_pass(table.keys, table.sizes, table.bytes, engine.options.batch_size, engine.device)
    if data.index.count == 0:
        raise ValueError(f"{data.description} holds no samples: at least one labelled sample is needed.")
    indices = _dataset_indices(data, table.keys, table.sizes)
    engine.faults.renumber(lambda position: int(indices[position]))
    engine.sync_faults()
    return rows, torch.cat(labels) if labels else torch.empty(0, dtype=torch.int64, device=engine.device), indices


def _forward(engine, data: StreamedData, compute, batch: Batch, seen: int, buffer: RowBuffer,
             num_classes: Optional[int]) -> torch.Tensor:
    """Rows of one batch into ``buffer`` (micro-batch by micro-batch, bad inputs noted); returns its labels on the device."""
    inputs, labels = batch
    size = engine.options.micro_batch_size or max(len(labels), 1)
    for start in range(0, len(labels), size):
        stop = min(start + size, len(labels))
        part = {key: value[start:stop] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}
        part = note_bad_inputs(engine.faults, data, engine.to_device(part), range(seen + start, seen + stop))
        with engine.autocast():
            buffer.append(compute(part).float())
    labels = labels.to(engine.device, copy=True)  # kept: the batch itself is rebuilt in place
    if num_classes is not None:
        engine.note_label_faults(labels, num_classes)
    return labels


class _UnitTable:
    """The key, sample count and bytes of each unit this process reads, noted as the units pass by."""

    def __init__(self) -> None:
        self.keys: List[int] = []
        self.sizes: List[int] = []
        self.bytes = 0

    def record(self, units: Iterator[Tuple[int, Batch]]) -> Iterator[Batch]:
        for key, batch in units:
            self.keys.append(key)
            self.sizes.append(len(batch[1]))
            self.bytes += batch_bytes(batch)
            yield batch


def regroup(batches: Iterator[Batch], size: int, pad_id: int) -> Iterator[Batch]:
    """The samples of ``batches``, in order, in batches of ``size`` (the last one smaller): a stream's units are
    passed through the model in the batches map-style data would be, whatever batch size the user's units have.

    Whole batches cut from one unit are handed on as views (used before the next unit is read); samples held
    across units are copies (:class:`~hf_calibrate.data.batches.BatchBuilder`).
    """
    builder = BatchBuilder(size, pad_id, reuse=True)  # each batch is used up before the next unit is read
    for batch in batches:
        start, count = 0, len(batch[1])
        while start < count:
            if builder.filled == 0 and count - start >= size:
                yield slice_batch(batch, start, start + size)
                start += size
                continue
            stop = min(count, start + size - builder.filled)
            builder.add(batch, start, stop)
            start = stop
            if builder.filled == size:
                yield builder.take()
    if builder.filled:
        yield builder.take()


def _dataset_indices(data: StreamedData, keys: List[int], sizes: List[int]) -> torch.Tensor:
    """The dataset index of each sample this process read, in the order it read them."""
    parts = [torch.arange(data.index.start_of(key), data.index.start_of(key) + size) for key, size in zip(keys, sizes)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _exchange(engine, indices: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor, count: int,
              spill_dir: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Collective: every process's rows and labels, placed by dataset index, on every process; in rounds of
    :data:`EXCHANGE_ROWS` rows per process, so that no more than the (possibly memory-mapped) result is held."""
    width = torch.tensor([rows.shape[1] if rows.ndim == 2 and len(rows) else 0], device=engine.device)
    rounds = torch.tensor([math.ceil(len(indices) / EXCHANGE_ROWS)], device=engine.device)
    width = int(max(int(part) for part in _distributed.all_gather_parts(width)))
    rounds = int(max(int(part) for part in _distributed.all_gather_parts(rounds)))
    result = allocate(count, width, engine.options.spill_bytes, spill_dir, engine.device)
    result_labels = torch.empty(count, dtype=torch.int64, device=labels.device)
    for number in range(rounds):
        part = slice(number * EXCHANGE_ROWS, (number + 1) * EXCHANGE_ROWS)
        chunk = rows[part].to(engine.device) if len(rows) else torch.empty(0, width, device=engine.device)
        gathered_indices = _distributed.all_gather_variable(indices[part].to(engine.device)).to(result_labels.device)
        result[gathered_indices.to(result.device)] = _distributed.all_gather_variable(chunk).to(result.device)
        result_labels[gathered_indices] = _distributed.all_gather_variable(labels[part])
    return result, result_labels
