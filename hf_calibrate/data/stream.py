"""Streamed calibration data: units read in order, indexed after a first pass, served by plan.

A stream's length and the place of each sample are known only once it has been read. The
first pass (``Engine.scan``) reads every process's own units, and :class:`StreamIndex` then
gives every sample its *dataset index*: its position in the order one process reads the
stream, the same under any number of processes. From then on a stream is used like a
map-style dataset — the hold-out split, shuffled global batches and the bootstrap's sample
keys all work on dataset indices — with two differences (docs/design.md §3.0):

* a process's share of a global batch is the samples of its own units (map-style data: every
  W-th sample of the batch), so the global batches, and so the fit, are those of one process;
* later passes re-read the stream (or this process's units kept in memory, when all of the
  stream's inputs fit in ``cache_bytes``) and hand over the samples of a planned sequence of
  micro-batches, holding only those read before their micro-batch comes: a plan shuffled
  within blocks of ``shuffle_block`` samples holds about a block.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .. import _distributed
from ..backbones import Inputs
from .batches import Batch, tensor_bytes
from .mapped import DEFAULT_CACHE_BYTES
from .sources import UnitSource

Row = Dict[str, Any]  # one sample: model inputs and "labels"


@dataclasses.dataclass
class StreamIndex:
    """Every unit of a stream, sorted by key: where its samples start, how many, and which process reads it.

    Attributes:
        keys, starts, sizes, owners: (U,) int64 tensors; unit u holds dataset indices
            ``starts[u] .. starts[u] + sizes[u] - 1`` and is read by process ``owners[u]``.
        count: the number of samples N.
    """

    keys: torch.Tensor
    starts: torch.Tensor
    sizes: torch.Tensor
    owners: torch.Tensor
    count: int

    @classmethod
    def gather(cls, keys: Sequence[int], sizes: Sequence[int]) -> "StreamIndex":
        """Collective: the index from every process's (key, size) of the units it read."""
        table = torch.tensor([list(keys), list(sizes)], dtype=torch.int64).T.reshape(-1, 2)
        parts = _distributed.all_gather_parts(table)
        owners = torch.cat([torch.full((len(part),), rank, dtype=torch.int64) for rank, part in enumerate(parts)])
        table = torch.cat(parts)
        order = torch.argsort(table[:, 0])
        keys_sorted, sizes_sorted = table[order, 0], table[order, 1]
        if len(keys_sorted) > 1 and bool((keys_sorted[1:] == keys_sorted[:-1]).any()):
            raise RuntimeError("two processes read the same unit of the stream; the sources' unit keys must be unique.")
        starts = torch.cumsum(sizes_sorted, 0) - sizes_sorted
        return cls(keys_sorted, starts, sizes_sorted, owners[order], int(sizes_sorted.sum()))

    def start_of(self, key: int) -> int:
        """The dataset index of the first sample of the unit ``key``."""
        return int(self.starts[int(torch.searchsorted(self.keys, torch.tensor(key)))])

    def owner_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The process that reads each of the dataset ``indices`` (a 1-D int64 tensor)."""
        units = torch.searchsorted(self.starts, indices.cpu(), right=True) - 1
        return self.owners[units]


class StreamedData:
    """Calibration data held as a stream: see the module docstring.

    Attributes:
        source: the units (:mod:`hf_calibrate.streams.sources`).
        description, name, split, preprocessed_here: as for :class:`hf_calibrate.data.PreparedData`.
        pad_id: the token id sequences are padded with when batches are joined.
        index: the :class:`StreamIndex`, set by the first pass.
        shuffle_block: shuffled plans permute within blocks of this many samples (None: all of
            them at once, as for map-style data); set by the first pass.
    """

    def __init__(self, source: UnitSource, to_batch: Callable[[Any], Batch], collate: Callable[[List[Row]], Batch],
                 description: str, *, name: Optional[str] = None, split: Optional[str] = None,
                 preprocessed_here: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES, pad_id: int = 0) -> None:
        self.source, self.to_batch, self.collate, self.pad_id = source, to_batch, collate, pad_id
        self.description, self.name, self.split, self.preprocessed_here = description, name, split, preprocessed_here
        self.cache_bytes = cache_bytes
        self.index: Optional[StreamIndex] = None
        self.shuffle_block: Optional[int] = None
        self._fingerprints: Dict[int, Tuple[int, float]] = {}
        self._kept: Optional[Dict[int, Batch]] = None

    @property
    def reiterable(self) -> bool:
        return self.source.reiterable

    def __len__(self) -> int:
        if self.index is None:
            raise RuntimeError("a stream's length is known only after its first pass (Engine.scan).")
        return self.index.count

    def first_inputs(self) -> Inputs:
        """The model inputs of the stream's first sample, as a batch of one."""
        try:
            first = self.source.first()
        except StopIteration:
            raise ValueError(f"{self.description} holds no samples: at least one labelled sample is needed.") from None
        inputs, _ = self.to_batch([first] if self.source.of_samples else first)
        return {key: value[:1] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}

    # ------------------------------------------------------------------ the first pass
    def read(self, rank: int, world: int, *, keep: bool) -> Iterator[Tuple[int, Batch]]:
        """This process's units as ``(key, batch)``, read from the source for the first pass.

        Each unit's fingerprint is recorded (a later pass must read the same samples); with
        ``keep`` the batches are kept on the CPU while they fit in ``cache_bytes``.
        """
        self._kept = {} if keep else None
        held = 0
        for key, unit in self.source.units(rank, world):
            batch = self.to_batch(unit)
            self._fingerprints[key] = fingerprint(batch)
            if self._kept is not None:
                held += batch_bytes(batch)
                if held <= self.cache_bytes:
                    self._kept[key] = _to_cpu(batch)
                else:
                    self._kept = None
            yield key, batch

    def finish_first_pass(self, keys: Sequence[int], sizes: Sequence[int], local_bytes: int, batch_size: int) -> None:
        """Collective: build the index and decide whether later passes read the kept units or the source.

        The units are kept only when every process kept all of its units and the stream's inputs fit in
        ``cache_bytes`` over all processes (a decision the same for any number of processes); otherwise
        shuffled plans permute within blocks of samples whose inputs take about ``cache_bytes``.
        """
        self.index = StreamIndex.gather(keys, sizes)
        totals = torch.tensor([float(local_bytes), 0.0 if self._kept is not None else 1.0], dtype=torch.float64)
        total_bytes, incomplete = (float(v) for v in _distributed.all_reduce_sum_(totals))
        if incomplete or total_bytes > self.cache_bytes:
            self._kept = None
            per_sample = total_bytes / max(self.index.count, 1)
            self.shuffle_block = max(batch_size, int(self.cache_bytes // max(per_sample, 1.0)))

    # ------------------------------------------------------------------ later passes
    def local_share(self, batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        """The dataset indices of the global ``batch`` that this process reads (its own units' samples)."""
        return batch[self.index.owner_of(batch) == rank]

    def serve(self, micro_batches: Sequence[Sequence[int]], rank: int, world: int) -> Iterator[Batch]:
        """One collated batch per micro-batch of dataset indices (all read by this process), in that order."""
        plan = _Plan(micro_batches)
        for key, batch in self._units_again(rank, world):
            plan.take(self.index.start_of(key), batch)
            yield from (self.collate(rows) for rows in plan.complete())
        if not plan.done():
            raise RuntimeError(
                f"{self.description} gave fewer samples in this pass than in the first; a stream must give the same "
                "samples in the same order every time it is read."
            )

    def _units_again(self, rank: int, world: int) -> Iterator[Tuple[int, Batch]]:
        if self._kept is not None:
            yield from self._kept.items()
            return
        for key, unit in self.source.units(rank, world):
            batch = self.to_batch(unit)
            if self._fingerprints.get(key) != fingerprint(batch):
                raise ValueError(
                    f"{self.description} gave other samples (or another order) on a later pass than on the first, at its "
                    f"unit (batch) {key}. A fit reads its data several times and needs the same samples in the same order "
                    "each time: pass the data unshuffled (the fit shuffles with its own seeded generator) and without random "
                    "transforms (Neural Clamping's augment=True augments images itself)."
                )
            yield key, batch


class _Plan:
    """The micro-batches a pass hands over, in order, and the rows read for them so far.

    Units arrive in dataset order, so the planned indices are walked in sorted order with one
    pointer; only the rows read but not yet handed over are held (a dict), the rest is tensors
    of a few bytes per planned sample.
    """

    def __init__(self, micro_batches: Sequence[Sequence[int]]) -> None:
        self.micro_batches = [list(micro) for micro in micro_batches]
        sizes = torch.tensor([len(micro) for micro in self.micro_batches], dtype=torch.int64)
        planned = torch.tensor([index for micro in self.micro_batches for index in micro], dtype=torch.int64)
        self.sorted, order = torch.sort(planned)
        self.micro_of = torch.repeat_interleave(torch.arange(len(sizes)), sizes)[order]
        self.missing = sizes.tolist()
        self.pointer = 0
        self.rows: Dict[int, Row] = {}
        self.next = 0

    def take(self, start: int, batch: Batch) -> None:
        """Keep the rows of a unit's ``batch`` (dataset indices from ``start``) that the plan needs."""
        stop = start + len(batch[1])
        end = int(torch.searchsorted(self.sorted, torch.tensor(stop)))
        for index, micro in zip(self.sorted[self.pointer : end].tolist(), self.micro_of[self.pointer : end].tolist()):
            self.rows[index] = _row(batch, index - start)
            self.missing[micro] -= 1
        self.pointer = end

    def complete(self) -> Iterator[List[Row]]:
        """The rows of each next micro-batch whose samples have all been read, releasing them."""
        while self.next < len(self.micro_batches) and self.missing[self.next] == 0:
            yield [self.rows.pop(index) for index in self.micro_batches[self.next]]
            self.next += 1

    def done(self) -> bool:
        return self.next == len(self.micro_batches)


def _row(batch: Batch, row: int) -> Row:
    """Sample ``row`` of a collated batch as one dict; token sequences lose the right padding the batch gave them."""
    inputs, labels = batch
    mask = inputs.get("attention_mask")
    length = None
    if isinstance(mask, torch.Tensor) and mask.ndim == 2:
        count = int(mask[row].sum())
        if bool(mask[row, :count].all()):  # right-padded: ones, then zeros
            length = count
    result: Row = {}
    for key, value in inputs.items():
        item = value[row] if isinstance(value, torch.Tensor) else value
        if length is not None and isinstance(item, torch.Tensor) and item.ndim == 1 and len(item) == mask.shape[1]:
            item = item[:length]
        result[key] = item
    result["labels"] = labels[row]
    return result


def fingerprint(batch: Batch) -> Tuple[int, float]:
    """(position-weighted sum of the labels, float64 sum of the floating inputs): equal when a pass reads the same samples."""
    inputs, labels = batch
    weights = torch.arange(1, len(labels) + 1, dtype=torch.int64)
    label_sum = int(((labels.cpu().long() + 1) * weights).sum())
    input_sum = sum(float(value.sum(dtype=torch.float64)) for value in inputs.values()
                    if isinstance(value, torch.Tensor) and value.is_floating_point())
    return label_sum, input_sum


def batch_bytes(batch: Batch) -> int:
    return tensor_bytes(batch[0]) + tensor_bytes(batch[1])


def _to_cpu(batch: Batch) -> Batch:
    inputs, labels = batch
    return {key: value.cpu() if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}, labels.cpu()
