"""Where streamed calibration data come from: the user's object, read as numbered *units*.

A unit is the smallest piece of a stream that one process reads: a batch as the source hands it
over (a pre-batched ``DataLoader``, a list or iterable of batches), or :data:`UNIT_ROWS`
consecutive samples of a source that hands over single samples (a torch ``IterableDataset`` of
samples, a ``datasets.IterableDataset``). Each unit has an integer *key*, the same however many
processes read, that sorts units into the order one process reads them; under several
processes each process reads its own units (docs/design.md §3.0):

* a list of batches, or a ``DataLoader(batch_size=None)`` over a map-style dataset: process r
  loads only batches r, r + W, r + 2W, ... (random access, nothing else is loaded);
* a ``datasets.IterableDataset`` with at least W shards: process r reads shards r, r + W, ...
  (``IterableDataset.shard``), its units keyed (shard, chunk);
* anything else: every process iterates the source and keeps units r, r + W, ...; the others
  are skipped before any collation or preprocessing of ours (as Accelerate's ``IterableDatasetShard``).

A source is re-iterable (a list, a ``DataLoader``, an ``IterableDataset``, a callable that
returns a new iterator) or one-shot (a generator): a one-shot source can be read once.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from .batches import LABEL_KEYS

#: samples of a sample-by-sample source grouped into one unit
UNIT_ROWS = 64
#: a datasets.IterableDataset unit key is ``shard << SHARD_SHIFT | chunk``
SHARD_SHIFT = 40

Unit = Tuple[int, Any]  # (key, a batch as the source gave it, or a list of its samples)


def labels_of(element: Any) -> Any:
    """The labels of a batch or a sample as the user holds it: a dict's label key, or a pair's second item (else None)."""
    if isinstance(element, Mapping):
        return next((element[key] for key in LABEL_KEYS if key in element), None)
    if isinstance(element, (tuple, list)) and len(element) == 2:
        return element[1]
    return None


def is_batch(element: Any) -> bool:
    """Whether ``element`` is a batch (its labels hold several values: a 1-D tensor, array or list), not one sample."""
    labels = labels_of(element)
    if isinstance(labels, (list, tuple)):
        return True
    return getattr(labels, "ndim", 0) >= 1


class UnitSource:
    """A stream's units for one process: ``units(rank, world)`` yields ``(key, unit)`` in key order.

    Attributes:
        reiterable: whether the source can be read more than once.
        of_samples: whether a unit is a list of samples (else it is one batch).
    """

    reiterable: bool = True
    of_samples: bool = False

    def units(self, rank: int, world: int) -> Iterator[Unit]:
        raise NotImplementedError

    def first(self) -> Any:
        """The first element of the stream (a batch, or a sample of a sample stream), for probing the model; read once."""
        if not hasattr(self, "_first"):
            self._first = self._read_first()
        return self._first

    def _read_first(self) -> Any:
        raise NotImplementedError


class SequenceOfBatches(UnitSource):
    """A list (or other sequence) of batches: random access, process r takes batches r, r + W, ...."""

    def __init__(self, batches: Sequence[Any]) -> None:
        self.batches = batches

    def units(self, rank: int, world: int) -> Iterator[Unit]:
        for key in range(rank, len(self.batches), world):
            yield key, self.batches[key]

    def _read_first(self) -> Any:
        return self.batches[0]


class LoaderOfBatches(UnitSource):
    """A ``DataLoader(batch_size=None)`` over a map-style dataset whose items are whole batches.

    One process iterates the loader itself; under W processes, process r builds the same loader
    over its own share of the sampler's indices, so it loads no other process's batch.
    """

    def __init__(self, loader: DataLoader) -> None:
        if isinstance(loader.sampler, RandomSampler):
            raise ValueError(
                "the DataLoader shuffles (shuffle=True), so every pass would read its batches in another order; "
                "pass it with shuffle=False: the fit shuffles with its own seeded generator."
            )
        self.loader = loader

    def units(self, rank: int, world: int) -> Iterator[Unit]:
        if world == 1:
            yield from enumerate(self.loader)
            return
        own = list(self.loader.sampler)[rank::world]
        loader = DataLoader(self.loader.dataset, sampler=own, batch_size=None, collate_fn=self.loader.collate_fn,
                            num_workers=self.loader.num_workers, pin_memory=self.loader.pin_memory)
        yield from zip(itertools.count(rank, world), loader)

    def _read_first(self) -> Any:
        return next(iter(self.loader))


class IterableUnits(UnitSource):
    """Any other iterable of batches or samples: every process iterates it and keeps units r, r + W, ....

    ``make_iterator`` returns a fresh iterator per pass (a re-iterable source) or the one
    iterator a one-shot source has (``reiterable=False``; its first element, read to probe the
    model, is handed back at the start of the one pass).
    """

    def __init__(self, make_iterator: Callable[[], Iterator[Any]], *, reiterable: bool, of_samples: bool) -> None:
        self.make_iterator, self.reiterable, self.of_samples = make_iterator, reiterable, of_samples
        self._peeked: Optional[List[Any]] = None
        self._passes = 0

    def _read_first(self) -> Any:
        if self.reiterable:
            return next(iter(self.make_iterator()))
        self._peeked = list(itertools.islice(self.make_iterator(), 1))
        if not self._peeked:
            raise StopIteration
        return self._peeked[0]

    def _elements(self) -> Iterator[Any]:
        self._passes += 1
        if self.reiterable:
            return iter(self.make_iterator())
        if self._passes > 1:
            raise RuntimeError(
                "this one-shot iterator (e.g. a generator) was already read by an earlier pass; pass a callable that "
                "returns a new iterator, or a re-iterable (a list, a DataLoader, an IterableDataset)."
            )
        return itertools.chain(self._peeked or [], self.make_iterator())

    def units(self, rank: int, world: int) -> Iterator[Unit]:
        elements = self._elements()
        if not self.of_samples:
            for key, batch in enumerate(elements):
                if key % world == rank:
                    yield key, batch
            return
        for key in itertools.count():
            chunk = list(itertools.islice(elements, UNIT_ROWS))
            if not chunk:
                return
            if key % world == rank:
                yield key, chunk


class HFIterableRows(UnitSource):
    """A ``datasets.IterableDataset``: its rows in units of :data:`UNIT_ROWS`, read shard by shard under several processes."""

    of_samples = True

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def _read_first(self) -> Any:
        return next(iter(self.dataset))

    def units(self, rank: int, world: int) -> Iterator[Unit]:
        shards = int(self.dataset.num_shards)
        if world == 1 or shards < world:
            yield from _chunks(self.dataset, 0, rank, world)
            return
        for shard in range(rank, shards, world):
            yield from _chunks(self.dataset.shard(num_shards=shards, index=shard, contiguous=True), shard, 0, 1)


def _chunks(rows: Iterable[Any], shard: int, rank: int, world: int) -> Iterator[Unit]:
    """Units of :data:`UNIT_ROWS` rows of ``rows``, keyed ``shard << SHARD_SHIFT | chunk``; chunk c kept when c % world == rank."""
    iterator = iter(rows)
    for chunk in itertools.count():
        part = list(itertools.islice(iterator, UNIT_ROWS))
        if not part:
            return
        if chunk % world == rank:
            yield shard << SHARD_SHIFT | chunk, part


def is_one_shot(data: Any) -> bool:
    """Whether ``data`` is its own iterator (a generator, ``iter(x)``): it can be read once."""
    try:
        return iter(data) is data
    except TypeError:
        return False


def source_of(data: Any) -> Optional[UnitSource]:
    """The :class:`UnitSource` of ``data`` when it is a stream or holds batches; None for map-style samples.

    Streams: a ``DataLoader`` whose dataset is iterable or that does not batch (``batch_size=None``),
    a torch or ``datasets`` ``IterableDataset``, a callable returning an iterator, any iterator,
    and a list or map-style dataset whose items are whole batches.
    """
    if _is_hf_iterable(data):
        return HFIterableRows(data)
    if isinstance(data, DataLoader):
        return _loader_source(data)
    if isinstance(data, IterableDataset):
        return _iterable_source(lambda: iter(data), probe=data)
    if isinstance(data, (Mapping, str, bytes)):
        return None
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return SequenceOfBatches(data) if len(data) and is_batch(data[0]) else None
    if callable(data) and not isinstance(data, type):
        return _iterable_source(data, probe=data)
    if is_one_shot(data):
        return _one_shot_source(data)
    if isinstance(data, Iterable):
        return _iterable_source(lambda: iter(data), probe=data)
    return None


def _loader_source(loader: DataLoader) -> Optional[UnitSource]:
    batches_items = loader.batch_size is None and loader.batch_sampler is None
    if isinstance(loader.dataset, IterableDataset):
        return _iterable_source(lambda: iter(loader), probe=loader)
    return LoaderOfBatches(loader) if batches_items else None


def _iterable_source(make_iterator: Callable[[], Iterator[Any]], *, probe: Any) -> IterableUnits:
    """A re-iterable source whose units are batches or sample chunks, as its first element shows."""
    try:
        first = next(iter(make_iterator()))
    except StopIteration:
        raise ValueError(f"the calibration data ({type(probe).__name__}) yielded nothing: at least one labelled sample is needed.") from None
    except TypeError as error:
        raise TypeError(f"calling the calibration data ({type(probe).__name__}) did not give an iterator: {error}") from None
    source = IterableUnits(make_iterator, reiterable=True, of_samples=not is_batch(first))
    source._first = first
    return source


def _one_shot_source(iterator: Iterator[Any]) -> IterableUnits:
    """The source of a one-shot iterator; its first element is read now (and handed back at the one pass)."""
    source = IterableUnits(lambda: iterator, reiterable=False, of_samples=False)
    try:
        source.of_samples = not is_batch(source.first())
    except StopIteration:
        raise ValueError(
            f"the calibration data ({type(iterator).__name__}) yielded nothing: it is empty, or a one-shot iterator that an "
            "earlier call already read. Pass a callable that returns a new iterator, or a re-iterable."
        ) from None
    return source


def _is_hf_iterable(data: Any) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(data, datasets.IterableDataset)
