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

from ... import _distributed
from ...backbones import Inputs
from ...metrics._checks import describe_positions
from ..batches import Batch, BatchBuilder, in_batches, tensor_bytes
from ..mapped import DEFAULT_CACHE_BYTES
from .units import UnitSource

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
    def gather(cls, keys: Sequence[int], sizes: Sequence[int], device: torch.device | str = "cpu") -> "StreamIndex":
        """Collective: the index from every process's (key, size) of the units it read (exchanged on ``device``, the
        process group's: a GPU under NCCL)."""
        table = torch.tensor([list(keys), list(sizes)], dtype=torch.int64, device=device).T.reshape(-1, 2)
        parts = [part.cpu() for part in _distributed.all_gather_parts(table)]
        owners = torch.cat([torch.full((len(part),), rank, dtype=torch.int64) for rank, part in enumerate(parts)])
        table = torch.cat(parts)
        order = torch.argsort(table[:, 0])
        keys_sorted, sizes_sorted = table[order, 0], table[order, 1]
        if len(keys_sorted) > 1 and bool((keys_sorted[1:] == keys_sorted[:-1]).any()):
            raise RuntimeError("two processes read the same unit of the stream; the sources' unit keys must be unique.")
        starts = torch.cumsum(sizes_sorted, 0) - sizes_sorted
        return cls(keys_sorted, starts, sizes_sorted, owners[order], int(sizes_sorted.sum()))

    def unit_and_row(self, index: int) -> Tuple[int, int]:
        """The key of the unit holding the dataset ``index``, and the sample's row in it."""
        unit = int(torch.searchsorted(self.starts, torch.tensor(index), right=True)) - 1
        return int(self.keys[unit]), index - int(self.starts[unit])

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
        source: the units (:mod:`hf_calibrate.data.streams.units`).
        description, name, split, preprocessed_here, role: as for :class:`hf_calibrate.data.PreparedData`.
        class_names: always None (a stream does not carry class names; :class:`hf_calibrate.data.PreparedData` may).
        pad_id: the token id sequences are padded with when batches are joined.
        index: the :class:`StreamIndex`, set by the first pass.
        shuffle_block: shuffled plans permute within blocks of this many samples (None: all of
            them at once, as for map-style data); set by the first pass.
        token_vocabularies: as for :class:`hf_calibrate.data.PreparedData`.
    """

    def __init__(self, source: UnitSource, to_batch: Callable[[Any], Batch], description: str, *, name: Optional[str] = None, split: Optional[str] = None,
                 preprocessed_here: bool = False, cache_bytes: int = DEFAULT_CACHE_BYTES, pad_id: int = 0) -> None:
        self.source, self.to_batch, self.pad_id = source, to_batch, pad_id
        self.description, self.name, self.split, self.preprocessed_here = description, name, split, preprocessed_here
        self.cache_bytes = cache_bytes
        self.index: Optional[StreamIndex] = None
        self.shuffle_block: Optional[int] = None
        self.token_vocabularies: Dict[str, int] = {}
        self.class_names: Optional[List[str]] = None  # streams do not carry class names (PreparedData's do)
        self.role = "data"
        self._fingerprints: Dict[int, Tuple[int, float]] = {}
        self._kept: Optional[Dict[int, Batch]] = None

    @property
    def reiterable(self) -> bool:
        return self.source.reiterable

    def __len__(self) -> int:
        if self.index is None:
            raise RuntimeError("a stream's length is known only after its first pass (Engine.scan).")
        return self.index.count

    def describe_samples(self, positions: Sequence[int]) -> str:
        """The samples at ``positions`` (dataset indices) for a message, with the user's batches when the stream hands
        over batches (its units; a stream of single samples is read in units of the fit's own, not named)."""
        if self.source.of_samples or self.index is None:
            return describe_positions(positions)
        return in_batches(positions, self.index.unit_and_row)

    def first_inputs(self, count: int = 1) -> Inputs:
        """The model inputs of the stream's first ``count`` samples, as one batch: fewer when its first batch holds fewer
        (one, for a stream of samples: a stream is read once, so no more is read ahead)."""
        first = self.source.first()
        inputs, _ = self.to_batch([first] if self.source.of_samples else first)
        return {key: value[:count] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}

    # ------------------------------------------------------------------ the first pass
    def read(self, rank: int, world: int, *, keep: bool) -> Iterator[Tuple[int, Batch]]:
        """This process's units as ``(key, batch)``, read from the source for the first pass.

        With ``keep`` (later passes will follow) each unit's fingerprint is recorded (a later pass must
        read the same samples) and the batches are kept on the CPU while they fit in ``cache_bytes``.
        """
        self._kept = {} if keep else None
        held = 0
        for key, unit in self.source.units(rank, world):
            batch = self.to_batch(unit)
            if keep:  # a later pass may read the source again: it must give these samples
                self._fingerprints[key] = fingerprint(batch)
            if self._kept is not None:
                held += batch_bytes(batch)
                if held <= self.cache_bytes:
                    self._kept[key] = _own_copy(batch)
                else:
                    self._kept = None
            yield key, batch

    def finish_first_pass(self, keys: Sequence[int], sizes: Sequence[int], local_bytes: int, batch_size: int,
                          device: torch.device | str = "cpu") -> None:
        """Collective: build the index and decide whether later passes read the kept units or the source.

        The units are kept only when every process kept all of its units and the stream's inputs fit in
        ``cache_bytes`` over all processes (a decision the same for any number of processes); otherwise
        shuffled plans permute within blocks of samples whose inputs take about ``cache_bytes``.
        """
        self.index = StreamIndex.gather(keys, sizes, device)
        self._check_same_stream_everywhere(device)
        totals = torch.tensor([float(local_bytes), 0.0 if self._kept is not None else 1.0], dtype=torch.float64, device=device)
        total_bytes, incomplete = (float(v) for v in _distributed.all_reduce_sum_(totals))
        if incomplete or total_bytes > self.cache_bytes:
            self._kept = None
            per_sample = total_bytes / max(self.index.count, 1)
            self.shuffle_block = max(batch_size, int(self.cache_bytes // max(per_sample, 1.0)))

    def _check_same_stream_everywhere(self, device: torch.device | str) -> None:
        """Collective: refuse data of which each process holds another part (each must hold the whole stream)."""
        if _distributed.world_size() == 1:
            return
        first = self.source.first()
        probe = torch.tensor(fingerprint(self.to_batch([first] if self.source.of_samples else first)), dtype=torch.float64, device=device)
        if len({tuple(part.flatten().tolist()) for part in _distributed.all_gather_parts(probe[None])}) > 1:
            raise ValueError(
                f"the processes hold different data ({self.description} starts with other samples on each): the data were "
                "split between processes before the fit (e.g. by accelerator.prepare or split_dataset_by_node). Pass the "
                "whole data on every process: the fit gives each process its own part itself."
            )

    # ------------------------------------------------------------------ later passes
    def local_share(self, batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        """The dataset indices of the global ``batch`` that this process reads (its own units' samples)."""
        return batch[self.index.owner_of(batch) == rank]

    def serve(self, micro_batches: Sequence[Sequence[int]], rank: int, world: int) -> Iterator[Batch]:
        """One collated batch per micro-batch of dataset indices (all read by this process), in that order."""
        plan = _Plan(micro_batches, self.pad_id)
        for key, batch in self._units_again(rank, world):
            start = self.index.start_of(key)
            plan.take(start, batch)
            yield from plan.complete()
            if self._kept is None:
                plan.keep_own_copy(start)
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
            found = fingerprint(batch)
            if self._fingerprints.setdefault(key, found) != found:  # recorded by a first pass that expected more passes
                raise ValueError(
                    f"{self.description} gave other samples (or another order) on a later pass than on the first, at its "
                    f"unit (batch) {key}. A fit reads its data several times and needs the same samples in the same order "
                    "each time: pass the data unshuffled (the fit shuffles with its own seeded generator) and without random "
                    "transforms (Neural Clamping's augment=True augments images itself)."
                )
            yield key, batch


class _Plan:
    """The micro-batches a pass hands over, in order, and the units read for them so far.

    Units arrive in dataset order, so the planned indices are walked in sorted order with one
    pointer. A unit is held while a micro-batch still needs one of its rows; the bookkeeping is
    a few integers per planned sample, in tensors.
    """

    def __init__(self, micro_batches: Sequence[Sequence[int]], pad_id: int) -> None:
        self.micro_batches = [torch.as_tensor(micro, dtype=torch.int64) for micro in micro_batches]
        sizes = torch.tensor([len(micro) for micro in self.micro_batches], dtype=torch.int64)
        planned = torch.cat(self.micro_batches) if self.micro_batches else torch.empty(0, dtype=torch.int64)
        self.sorted, order = torch.sort(planned)
        self.micro_of = torch.repeat_interleave(torch.arange(len(sizes)), sizes)[order]
        self.unit_of = torch.full_like(self.sorted, -1)
        self.row_of = torch.zeros_like(self.sorted)
        self.missing = sizes.tolist()
        self.units: Dict[int, Batch] = {}
        self.left: Dict[int, int] = {}  # rows of a held unit not handed over yet
        self.pointer = self.next = 0
        self.pad_id = pad_id

    def take(self, start: int, batch: Batch) -> None:
        """Hold a unit's ``batch`` (dataset indices from ``start``) if the plan needs any of its rows."""
        end = int(torch.searchsorted(self.sorted, torch.tensor(start + len(batch[1]))))
        if end == self.pointer:
            return
        self.unit_of[self.pointer : end] = start
        self.row_of[self.pointer : end] = self.sorted[self.pointer : end] - start
        self.units[start], self.left[start] = batch, end - self.pointer
        micros, counts = torch.unique(self.micro_of[self.pointer : end], return_counts=True)
        for micro, count in zip(micros.tolist(), counts.tolist()):
            self.missing[micro] -= count
        self.pointer = end

    def complete(self) -> Iterator[Batch]:
        """Each next micro-batch whose samples have all been read, as one batch in the plan's order."""
        while self.next < len(self.micro_batches) and self.missing[self.next] == 0:
            where = torch.searchsorted(self.sorted, self.micro_batches[self.next])
            yield self._assemble(self.unit_of[where], self.row_of[where])
            self.next += 1

    def _assemble(self, units: torch.Tensor, rows: torch.Tensor) -> Batch:
        parts, places = [], []
        for unit, count in zip(*(part.tolist() for part in torch.unique(units, return_counts=True))):
            place = torch.nonzero(units == unit).flatten()
            parts.append(select_rows(self.units[unit], rows[place]))
            places.append(place)
            self.left[unit] -= count
            if not self.left[unit]:
                del self.units[unit], self.left[unit]
        builder = BatchBuilder(len(units), self.pad_id)
        for part in parts:
            builder.add(part, 0, len(part[1]))
        merged = builder.take()
        if len(parts) > 1:
            merged = select_rows(merged, torch.argsort(torch.cat(places)))
        return trim_right_padding(merged)

    def keep_own_copy(self, start: int) -> None:
        """Copy the unit starting at ``start`` if it is still held (its source may refill the same buffer next)."""
        if start in self.units:
            self.units[start] = select_rows(self.units[start], torch.arange(len(self.units[start][1])))

    def done(self) -> bool:
        return self.next == len(self.micro_batches)


def select_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The samples ``rows`` (a 1-D index tensor) of a batch, in that order."""
    inputs, labels = batch
    return {key: value[rows.to(value.device)] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}, labels[rows.to(labels.device)]


def trim_right_padding(batch: Batch) -> Batch:
    """A text batch whose ``attention_mask`` pads on the right, cut to its longest sample (as collating unpadded rows does)."""
    inputs, labels = batch
    mask = inputs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or not len(mask):
        return batch
    lengths = mask.sum(dim=1)
    width = int(lengths.max())
    if width == mask.shape[1] or not bool((mask.bool() == (torch.arange(mask.shape[1], device=mask.device) < lengths[:, None])).all()):
        return batch  # nothing to cut, or padded on the left: the model's own business
    trimmed = {key: value[:, :width] if isinstance(value, torch.Tensor) and value.ndim == 2 and value.shape[1] == mask.shape[1] else value
               for key, value in inputs.items()}
    return trimmed, labels


def fingerprint(batch: Batch) -> Tuple[int, float]:
    """(position-weighted sum of the labels and integer inputs, position-weighted sum of the floating inputs): the same
    numbers, bit for bit, when a pass reads the same samples in the same order (the same reductions over the same
    values), other numbers when it reads others or the same in another order."""
    inputs, labels = batch
    weights = torch.arange(1, len(labels) + 1, dtype=torch.int64)
    integers = int(((labels.cpu().long() + 1) * weights).sum())
    floats = 0.0
    for value in inputs.values():
        if not isinstance(value, torch.Tensor) or value.ndim == 0:
            continue
        rows = value.reshape(len(value), -1).sum(dim=1)
        if value.is_floating_point():
            floats += float((rows.double() * weights.to(rows.device)).sum())
        else:
            integers += int((rows.long() * weights.to(rows.device)).sum())
    return integers, floats


def batch_bytes(batch: Batch) -> int:
    return tensor_bytes(batch[0]) + tensor_bytes(batch[1])


def _own_copy(batch: Batch) -> Batch:
    """A copy of the batch on the CPU (the source may refill its own tensors with the next batch)."""
    inputs, labels = batch
    return ({key: value.to("cpu", copy=True) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()},
            labels.to("cpu", copy=True))
