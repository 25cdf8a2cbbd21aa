"""Whether evaluation data hold rows of the calibration data: the lineage of ``datasets`` objects.

``select``, ``shuffle``, ``filter``, ``sort``, ``train_test_split`` and ``to_iterable_dataset`` of a
``datasets.Dataset`` make new objects, with new fingerprints, over the *same* Arrow memory: an
index mapping or a slice of the table, never a copy. So a row is known by where it lies: the
address of the memory of its column's array (shared by every object derived from it) and its
position in that array. Two datasets share a row exactly when they share such a place.

:func:`rows_in_memory` gives those places for a ``datasets.Dataset``, or for a
``datasets.IterableDataset`` made by ``to_iterable_dataset`` (and shuffled at most); other data have
no known place (None), e.g. a streamed ``load_dataset``, or an iterable that was mapped, filtered,
skipped or taken, whose rows may be other rows or changed ones.
:func:`shares_rows` compares two such sets.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import numpy as np

#: Places of rows: the address of a column array's memory → the sorted positions of rows in that array.
RowPlaces = Dict[int, np.ndarray]

#: ``datasets`` example iterables that only reorder or regroup the rows of the ones they wrap (a rebatching that drops
#: its last batch does not count)
_REORDERING = ("BufferShuffledExamplesIterable", "InterleavedShardsExamplesIterable", "RebatchedArrowExamplesIterable")
#: the example iterables that read ``datasets.Dataset`` shards (``kwargs["shards"]``)
_SHARD_READERS = ("ArrowExamplesIterable", "ShuffledDataSourcesArrowExamplesIterable")


def rows_in_memory(data: Any) -> Optional[RowPlaces]:
    """Where the rows of a ``datasets.Dataset`` (or of an iterable made from ones) lie in memory; None when unknown."""
    kind = type(data).__name__
    if type(data).__module__.split(".")[0] != "datasets":
        return None
    if kind == "Dataset":
        return _dataset_places(data)
    if kind == "IterableDataset":
        shards = _source_shards(data)
        return None if shards is None else _union(_dataset_places(shard) for shard in shards)
    return None


def holds_rows_of(data: Any, fitted: Iterable[Any]) -> Optional[bool]:
    """Whether ``data`` hold a row of any of the ``fitted`` data objects (None entries: objects gone), as far as
    memory tells: True when they share one, None when ``data`` are a ``datasets.IterableDataset`` whose rows cannot be
    placed, else False (other data, or rows copied elsewhere, as by ``map``: compared by identity and fingerprint only)."""
    places = rows_in_memory(data)
    if places is None:
        return None if type(data).__name__ == "IterableDataset" and type(data).__module__.split(".")[0] == "datasets" else False
    known = (rows_in_memory(item) for item in fitted if item is not None)
    return any(shares_rows(places, other) for other in known if other is not None)


def shares_rows(first: RowPlaces, second: RowPlaces) -> bool:
    """Whether two sets of row places hold a row in common."""
    return any(address in second and np.intersect1d(rows, second[address]).size
               for address, rows in first.items())


def _dataset_places(dataset: Any) -> RowPlaces:
    """The places of the rows of a ``datasets.Dataset`` in every column, through its index mapping when it has one
    (every column: a dataset with a column removed or added still shares the others' memory)."""
    table = dataset.data.table
    indices = getattr(dataset, "_indices", None)
    physical = np.arange(table.num_rows) if indices is None else np.asarray(indices.column(0).to_numpy(), dtype=np.int64)
    return _union(_column_places(column, physical) for column in table.columns)


def _column_places(column: Any, physical: np.ndarray) -> RowPlaces:
    """The places of rows ``physical`` (positions in the table) of one chunked column."""
    bounds = np.cumsum([0, *(len(chunk) for chunk in column.chunks)])
    chunk_of = np.searchsorted(bounds, physical, side="right") - 1
    places: RowPlaces = {}
    for number in np.unique(chunk_of):
        chunk = column.chunk(int(number))
        address = _memory_address(chunk)
        if address:
            places[address] = chunk.offset + physical[chunk_of == number] - bounds[number]
    return places


def _memory_address(array: Any) -> int:
    """The address of the first buffer of an Arrow array, the same for every slice of it (0: it has no buffer)."""
    return next((buffer.address for buffer in array.buffers() if buffer is not None), 0)


def _source_shards(data: Any) -> Optional[list]:
    """The ``datasets.Dataset`` shards an iterable reads, when it only reads (and perhaps reorders) them; else None."""
    examples = getattr(data, "_ex_iterable", None)
    while type(examples).__name__ in _REORDERING and not getattr(examples, "drop_last_batch", False):
        examples = getattr(examples, "ex_iterable", None)
    if type(examples).__name__ not in _SHARD_READERS:
        return None
    shards = (getattr(examples, "kwargs", None) or {}).get("shards")
    if not isinstance(shards, list) or not all(type(shard).__name__ == "Dataset" for shard in shards):
        return None
    return shards


def _union(parts: Iterable[RowPlaces]) -> RowPlaces:
    union: RowPlaces = {}
    for part in parts:
        for address, rows in part.items():
            union[address] = np.union1d(union.get(address, np.empty(0, dtype=np.int64)), rows)
    return union
