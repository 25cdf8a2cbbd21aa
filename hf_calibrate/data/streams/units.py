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

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from ..batches import LABEL_KEYS
from ..random_state import preserved_random_state

#: samples of a sample-by-sample source grouped into one unit
UNIT_ROWS = 64
#: a datasets.IterableDataset unit key is ``shard << SHARD_SHIFT | chunk``
SHARD_SHIFT = 40

Unit = Tuple[int, Any]  # (key, a batch as the source gave it, or a list of its samples)


def labels_of(element: Any, label_column: Optional[str] = None) -> Any:
    """The labels of a batch or a sample as the user holds it: a dict's label key (``label_column``, else the usual
    ones), or a pair's second item (else None)."""
    if isinstance(element, Mapping):
        return next((element[key] for key in (label_column, *LABEL_KEYS) if key is not None and key in element), None)
    if isinstance(element, (tuple, list)) and len(element) == 2:
        return element[1]
    return None


def is_batch(element: Any, label_column: Optional[str] = None) -> bool:
    """Whether ``element`` is a batch, not one sample: its labels hold several values (a 1-D tensor, array or list)."""
    labels = labels_of(element, label_column)
    return isinstance(labels, (list, tuple)) or getattr(labels, "ndim", 0) >= 1


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
        """The first element of the stream (a batch, or a sample of a sample stream), for probing the model; read once.

        Raises StopIteration when the stream holds nothing (callers say what that means for their data).
        """
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
        return next(iter(self.batches))


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
        if world == 1 or shards < world or not _reads_shard_by_shard(self.dataset):
            yield from _chunks(self.dataset, 0, rank, world)
            return
        for shard in range(rank, shards, world):
            yield from _chunks(self.dataset.shard(num_shards=shards, index=shard, contiguous=True), shard, 0, 1)


#: ``datasets`` example iterables that act row by row within a shard: reading a dataset made of only these shard by
#: shard gives its rows in its own order. ``take``, ``skip``, ``shuffle``, interleaving and the like do not.
_ROW_BY_ROW = {
    "ArrowExamplesIterable", "ExamplesIterable", "RebatchedArrowExamplesIterable", "MappedExamplesIterable",
    "FilteredExamplesIterable", "FormattedExamplesIterable", "SelectColumnsIterable",
}


def _reads_shard_by_shard(dataset: Any) -> bool:
    """Whether the shards of a ``datasets.IterableDataset``, read one after the other, give its own rows in its own order.

    It looks at the dataset's chain of example iterables (a private attribute of ``datasets``); anything it does not
    know as row-by-row, or cannot see, answers False, and every process then reads the whole stream.
    """
    iterable = getattr(dataset, "_ex_iterable", None)
    while iterable is not None:
        if type(iterable).__name__ not in _ROW_BY_ROW:
            return False
        iterable = getattr(iterable, "ex_iterable", None)
    return getattr(dataset, "_ex_iterable", None) is not None


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
    """Whether ``data`` is its own iterator (a generator, ``iter(x)``): it can be read once. A ``DataLoader`` never is
    (and is not iterated to tell: that would start its workers and draw from the user's random state)."""
    if isinstance(data, DataLoader):
        return False
    try:
        return iter(data) is data
    except TypeError:
        return False


def source_of(data: Any, label_column: Optional[str] = None) -> Optional[UnitSource]:
    """The :class:`UnitSource` of ``data`` when it is a stream or holds batches; None for map-style samples.

    Streams: a ``DataLoader`` whose dataset is iterable or that does not batch (``batch_size=None``),
    a torch or ``datasets`` ``IterableDataset``, a callable returning an iterator, any iterator,
    and a list or map-style dataset whose items are whole batches.
    """
    _refuse_pre_split(data)
    if _is_hf_iterable(data):
        return HFIterableRows(data)
    if isinstance(data, DataLoader):
        return _loader_source(data, label_column)
    if isinstance(data, (Mapping, str, bytes)):
        return None
    if isinstance(data, (list, tuple)):  # a torch map-style Dataset holds samples, as a DataLoader reads it
        return SequenceOfBatches(data) if len(data) and is_batch(data[0], label_column) else None
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, IterableDataset):
        return None
    if callable(data) and not isinstance(data, type):
        return _callable_source(data, label_column)
    if is_one_shot(data):
        return _one_shot_source(lambda: data, label_column)
    if isinstance(data, Iterable):
        return _iterable_source(lambda: iter(data), data, label_column)
    return None


def _loader_source(loader: DataLoader, label_column: Optional[str]) -> Optional[UnitSource]:
    """A loader over an iterable dataset, or one that hands over its dataset's items as they are, when they are batches."""
    if isinstance(loader.dataset, IterableDataset):
        if is_one_shot(loader.dataset):  # every pass of the loader would take up the one iterator the dataset is
            return _one_shot_source(lambda: iter(loader), label_column)
        return _iterable_source(lambda: iter(loader), loader, label_column)
    if loader.batch_size is not None or loader.batch_sampler is not None or not len(loader.dataset):
        return None
    with preserved_random_state(loader, loader.sampler):
        first = next(iter(loader))
    if not is_batch(first, label_column):
        return None  # its items are samples: batched by index like any map-style data
    source = LoaderOfBatches(loader)
    source._first = first
    return source


def _callable_source(make_iterator: Callable[[], Iterator[Any]], label_column: Optional[str]) -> IterableUnits:
    """A callable's source: re-iterable when each call gives a new iterator, one-shot when it gives the same one."""
    first = make_iterator()
    if not isinstance(first, Iterable):
        raise TypeError(f"calling the data ({type(make_iterator).__name__}) gave a {type(first).__name__}, "
                        "not an iterator: pass a callable that returns a new iterator of batches each time it is called.")
    if not isinstance(first, Iterator):
        return _iterable_source(lambda: iter(make_iterator()), make_iterator, label_column)
    if make_iterator() is first:
        return _one_shot_source(lambda: first, label_column)
    return _iterable_source(make_iterator, make_iterator, label_column)


def _refuse_pre_split(data: Any) -> None:
    """Refuse data some other code already split between processes: the fit reads each process's own part itself."""
    split = getattr(data, "_distributed", None) is not None and _is_hf_iterable(data)
    prepared = type(data).__name__ in ("DataLoaderShard", "DataLoaderDispatcher") and not _indexable(getattr(data, "dataset", None))
    if split or prepared:
        raise ValueError(
            "these data are already split between processes (datasets' split_dataset_by_node, or an iterable loader "
            "passed through accelerator.prepare), so each process holds only part of them. Pass the whole data on every "
            "process: the fit gives each process its own part itself, and the results are then those of one process."
        )


def empty_data_message(data: Any, role: str, *, one_shot: bool = False) -> str:
    """What to say of data that hold no sample, named by their ``role`` (``"calibration data"``, ``"evaluation data"``, ...);
    ``one_shot``: the data give one iterator only, which an earlier call may have read."""
    if one_shot:
        return (f"the {role} ({type(data).__name__}) yielded nothing: they are empty, or a one-shot iterator that an earlier "
                "call already read. Pass a callable that returns a new iterator, or a re-iterable.")
    return f"the {role} ({type(data).__name__}) hold no samples: at least one labelled sample is needed; pass non-empty data."


def _indexable(dataset: Any) -> bool:
    return dataset is not None and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and not isinstance(dataset, IterableDataset)


def _iterable_source(make_iterator: Callable[[], Iterator[Any]], probe: Any, label_column: Optional[str]) -> IterableUnits:
    """A re-iterable source whose units are batches or sample chunks, as its first element shows (an empty one has no
    first element: its reader says so, naming the data's role)."""
    try:
        first = next(iter(make_iterator()))
    except StopIteration:
        return IterableUnits(make_iterator, reiterable=True, of_samples=False)
    except TypeError as error:
        raise TypeError(f"calling the data ({type(probe).__name__}) did not give an iterator: {error}") from None
    source = IterableUnits(make_iterator, reiterable=True, of_samples=not is_batch(first, label_column))
    source._first = first
    return source


def _one_shot_source(get_iterator: Callable[[], Iterator[Any]], label_column: Optional[str]) -> IterableUnits:
    """The source of data that give one iterator only; its first element is read now (and handed back at the one pass;
    when there is none, its reader says so, naming the data's role)."""
    iterator = get_iterator()
    source = IterableUnits(lambda: iterator, reiterable=False, of_samples=False)
    with contextlib.suppress(StopIteration):
        source.of_samples = not is_batch(source.first(), label_column)
    return source


def _is_hf_iterable(data: Any) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(data, datasets.IterableDataset)
