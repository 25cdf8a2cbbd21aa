"""The first pass over a stream: every process reads its own units once, then the stream is indexed.

Unlike a pass over map-style data, no process knows where its samples stand in the whole stream
until every process has read its units (a process reading its own shards of a
``datasets.IterableDataset`` cannot count the others'). So the first pass runs each process on
its own, with no collective inside the loop: it computes the rows of its units in micro-batches
and notes bad data by its own running position. At the end one exchange builds the
:class:`~hf_calibrate.data.StreamIndex`, turns the noted positions into dataset indices, raises
any fault on every process, and gathers the rows into dataset order on every process.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from ..backbones import Inputs
from ..data import StreamedData
from ..data.batches import Batch, concat_batches, slice_batch
from ..data.stream import batch_bytes
from .faults import check_finite_outputs, note_nonfinite_inputs


def scan_stream(
    engine, data: StreamedData, compute: Callable[[Inputs], torch.Tensor], *, num_classes: Optional[int], description: str,
    what: str, keep_inputs: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(``compute(inputs)`` rows (N, K) float32, labels (N,)) of every sample of the stream, in dataset order, on every process.

    ``keep_inputs``: later passes will read the stream again (Neural Clamping), so its units are kept in
    memory when they fit (:meth:`StreamedData.finish_first_pass`).
    """
    table = _UnitTable()
    target = math.ceil(engine.options.batch_size / engine.world)  # a process's share of a global batch, as for map-style data
    rows: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    seen = 0
    with engine.progress(None, description) as bar:
        units = table.record(data.read(engine.rank, engine.world, keep=keep_inputs))
        for number, batch in enumerate(regroup(units, target, data.pad_id)):
            for positions, inputs, part_labels in _micro_batches(batch, seen, engine.options.micro_batch_size):
                inputs = note_nonfinite_inputs(engine.faults, data, engine.to_device(inputs), positions, number)
                part_labels = part_labels.to(engine.device)
                with engine.autocast():
                    rows.append(compute(inputs).float())
                if num_classes is not None:
                    engine.note_label_faults(part_labels, num_classes)
                labels.append(part_labels)
            seen += len(batch[1])
            bar.update(1)
    keys, sizes, local_bytes = table.keys, table.sizes, table.bytes
    data.finish_first_pass(keys, sizes, local_bytes, engine.options.batch_size)
    if data.index.count == 0:
        raise ValueError(f"{data.description} holds no samples: at least one labelled sample is needed.")
    dataset_indices = _dataset_indices(data, keys, sizes).to(engine.device)
    engine.faults.renumber(lambda position: int(dataset_indices[position]))
    local_rows = torch.cat(rows) if rows else torch.empty(0, device=engine.device)
    local_labels = torch.cat(labels) if labels else torch.empty(0, dtype=torch.int64, device=engine.device)
    order, gathered_rows, gathered_labels = engine.gather_sorted(dataset_indices, local_rows, local_labels, count=data.index.count)
    check_finite_outputs(data, gathered_rows, order, 0, what)
    return gathered_rows, gathered_labels


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
    passed through the model in the batches map-style data would be, whatever batch size the user's units have."""
    pending: List[Batch] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += len(batch[1])
        while held >= size:
            merged = concat_batches(pending, pad_id)
            yield slice_batch(merged, 0, size)
            pending, held = ([slice_batch(merged, size, held)] if held > size else []), held - size
    if held:
        yield concat_batches(pending, pad_id)


def _micro_batches(batch, first_position: int, size: Optional[int]) -> Iterator[Tuple[List[int], Inputs, torch.Tensor]]:
    """(this process's running positions, inputs, labels) of slices of ``size`` samples of a unit's batch (None: all)."""
    inputs, labels = batch
    count = len(labels)
    size = size or max(count, 1)
    for start in range(0, count, size):
        stop = min(start + size, count)
        part = {key: value[start:stop] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}
        yield list(range(first_position + start, first_position + stop)), part, labels[start:stop]


def _dataset_indices(data: StreamedData, keys: List[int], sizes: List[int]) -> torch.Tensor:
    """The dataset index of each sample this process read, in the order it read them."""
    parts = [torch.arange(data.index.start_of(key), data.index.start_of(key) + size) for key, size in zip(keys, sizes)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
