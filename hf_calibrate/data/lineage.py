"""Whether evaluation data hold rows of the calibration data, and how many: by memory and by content.

**Memory.** ``select``, ``shuffle``, ``filter``, ``sort``, ``train_test_split``, ``rename_column`` and
``to_iterable_dataset`` of a ``datasets.Dataset`` make new objects, with new fingerprints, over the *same*
Arrow memory: an index mapping or a slice of the table, never a copy. So a row is known by where it lies:
the address of the memory of its column's array (shared by every object derived from it) and its position
in that array. Two datasets share a row when they share such a place in any column.

**Content.** ``map``, ``cast``, ``from_pandas`` and reloading copy rows elsewhere. A row is then known by
its content: a 16-byte BLAKE2b digest of its values in the columns the two datasets have in common
(:func:`row_digests`), compared when one dataset's columns are all among the other's with the same Arrow
types (``map`` adding a column: yes; a column cast to another type, or each side with a column the other
lacks: no). Hashing reads the Arrow rows once, never runs a model; a dataset's digests are kept by its
fingerprint (the calibration data are hashed once per session).

**Torch tensors.** The rows of a torch ``TensorDataset`` (or a ``Subset`` of one, as a DataLoader's sampler reads it)
are known by content too: a digest of each row's bytes in every tensor (:func:`tensor_rows`), compared when both sides
hold the same tensors (count, dtypes, per-row shapes).

:func:`shared_rows` counts the rows of ``datasets`` data (a ``datasets.Dataset``, or a
``datasets.IterableDataset`` made by ``to_iterable_dataset`` and shuffled at most) or of tensor data that are rows of
the fitted data by these tests. Other data have no known rows (None): other torch datasets (whose items may be read
from anywhere), a streamed ``load_dataset``, or an iterable that was mapped, filtered, skipped or taken, whose rows
may be other rows or changed ones. :func:`holds_rows_of` turns the count into True, False or None (unknown). The
digests of the calibration rows are kept with a saved model (:mod:`hf_calibrate.serialization.row_digests`).
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Subset, TensorDataset

from .identity import is_datasets_object

#: ``datasets`` example iterables that only reorder or regroup the rows of the ones they wrap (a rebatching that drops
#: its last batch does not count)
_REORDERING = ("BufferShuffledExamplesIterable", "InterleavedShardsExamplesIterable", "RebatchedArrowExamplesIterable")
#: the example iterables that read ``datasets.Dataset`` shards (``kwargs["shards"]``)
_SHARD_READERS = ("ArrowExamplesIterable", "ShuffledDataSourcesArrowExamplesIterable")
#: rows hashed per Arrow batch read
DIGEST_BATCH_ROWS = 1024
#: datasets whose digests are kept (by fingerprint and columns); each costs 16 bytes per row
DIGEST_CACHE_SIZE = 16
_DIGESTS: "OrderedDict[Tuple[str, Tuple[str, ...]], np.ndarray]" = OrderedDict()
#: a TensorDataset's row digests, with its tensors' memory, versions and layout (an in-place change or new tensors make
#: them stale), while it lives
_TENSOR_DIGESTS: "weakref.WeakKeyDictionary[TensorDataset, Tuple[Tuple[Any, ...], np.ndarray]]" = weakref.WeakKeyDictionary()
#: an Arrow array's bytes and where each row's lie in them: row i is ``data[bounds[i]:bounds[i + 1]]``
Segment = Tuple[np.ndarray, np.ndarray]


class KeptRows(NamedTuple):
    """Calibration rows kept by content for the session (:func:`keep_rows`), so that they are still known once the
    data object itself is gone (data passed inline to ``fit``): 16 bytes per row."""

    types: Tuple[Tuple[str, str], ...]  #: (name, Arrow type as text) of every column, by name
    digests: np.ndarray  #: (N,) ``S16`` :func:`row_digests` of the rows over those columns


def keep_rows(data: Any) -> Optional[KeptRows]:
    """The content digests of the rows of ``datasets`` data (a ``Dataset``, or an iterable over ``Dataset`` shards),
    over all their columns, or of a torch ``TensorDataset`` (:func:`tensor_rows`); None for other data, or a stream
    whose rows cannot be traced."""
    tensors = tensor_rows(data)
    if tensors is not None:
        return tensors
    parts = _parts(data)
    if not parts:
        return None
    types = tuple(sorted((field.name, str(field.type)) for field in parts[0].data.table.schema))
    columns = tuple(name for name, _ in types)
    return KeptRows(types, np.concatenate([np.empty(0, dtype="S16"), *(row_digests(part, columns) for part in parts)]))


class NoDigests:
    """A fitted data object that is gone and whose rows had no digests (other torch data, an untraceable stream):
    data it may share rows with cannot be told apart from held-out data (:func:`shared_rows` says None)."""


NO_DIGESTS = NoDigests()


class SharedRows(NamedTuple):
    """How many rows of some data are rows of the calibration data."""

    shared: int  #: rows of the data that are rows of the fitted data
    total: int  #: rows of the data


def shared_rows(data: Any, fitted: Iterable[Any]) -> Optional[SharedRows]:
    """The rows of ``datasets`` ``data`` (or of tensor data: :func:`tensor_rows`) that are rows of the ``fitted`` data
    objects (None entries: objects gone; :data:`NO_DIGESTS`: gone without digests) or of their :class:`KeptRows`, found
    by memory or by content (module docstring).

    None when they cannot be counted: ``data`` are neither ``datasets`` nor tensor data, or a stream whose rows cannot be traced,
    or no row was found and the rows of some fitted ``datasets`` data cannot be compared with theirs (a stream, or
    no columns to compare), or there are no fitted data to compare with (a loaded model: its calibration rows are not
    kept with it).
    """
    fitted = [item for item in fitted if item is not None]
    tensors = tensor_rows(data)
    if tensors is not None:
        return _shared_tensor_rows(tensors, fitted)
    parts = _parts(data)
    if parts is None or not fitted:
        return None
    keys = np.concatenate([_memory_keys(part) for part in parts])
    shared = np.zeros(len(keys), dtype=bool)
    comparable = True
    for item in fitted:
        if isinstance(item, KeptRows):
            columns = _kept_columns(item, parts[0])
            comparable = comparable and columns is not None
            if columns is not None:
                shared |= np.isin(np.concatenate([row_digests(piece, columns) for piece in parts]), item.digests)
            continue
        other = _parts(item) if is_datasets_object(item) or _is_datasets_subset(item) else None
        if other is None:
            comparable = False
            continue
        for part in other:
            places = _memory_keys(part)
            shared |= np.isin(keys, places[places != b""]).any(axis=1)
            columns = _common_columns(parts[0], part)
            if columns is None:
                comparable = False
                continue
            shared |= np.isin(np.concatenate([row_digests(piece, columns) for piece in parts]), row_digests(part, columns))
    if not comparable and not shared.any():
        return None
    return SharedRows(int(shared.sum()), len(shared))


def holds_rows_of(data: Any, fitted: Iterable[Any]) -> Optional[bool]:
    """Whether ``data`` hold a row of any of the ``fitted`` data objects (:func:`shared_rows`): True or False, None
    (unknown) when that cannot be told, as for data other than ``datasets`` data, whose rows have no digests (they are
    compared by identity and fingerprint only, by :meth:`~hf_calibrate.CalibratedModel.fitted_on`)."""
    counted = shared_rows(data, fitted)
    return None if counted is None else counted.shared > 0


def _shared_tensor_rows(rows: KeptRows, fitted: List[Any]) -> Optional[SharedRows]:
    """:func:`shared_rows` of torch tensor rows: by content, against the fitted data's digests with the same tensors
    (count, dtypes, per-row shapes); None when no row was found and some fitted data cannot be compared so."""
    others = [item if isinstance(item, KeptRows) else tensor_rows(item) for item in fitted]
    comparable = [other for other in others if other is not None and other.types == rows.types]
    shared = np.zeros(len(rows.digests), dtype=bool)
    for other in comparable:
        shared |= np.isin(rows.digests, other.digests)
    if not fitted or (len(comparable) < len(others) and not shared.any()):
        return None
    return SharedRows(int(shared.sum()), len(shared))


def tensor_rows(data: Any) -> Optional[KeptRows]:
    """The rows of a torch ``TensorDataset``, or of a ``Subset`` of one, by content: a 16-byte BLAKE2b digest of each
    row's bytes in every tensor, with (``"tensor i"``, dtype and per-row shape) as its columns; None for other data.
    A dataset's digests are kept while it lives and its tensors are not changed in place."""
    base, indices = data, None
    while isinstance(base, Subset):  # a Subset of a Subset (random_split twice): the indices into the tensors
        inner = [int(index) for index in base.indices]
        indices = inner if indices is None else [inner[index] for index in indices]
        base = base.dataset
    if not isinstance(base, TensorDataset):
        return None
    state = tuple((tensor.data_ptr(), tensor._version, tuple(tensor.shape), tensor.stride()) for tensor in base.tensors)
    cached = _TENSOR_DIGESTS.get(base)
    if cached is None or cached[0] != state:
        cached = (state, _tensor_digests(base.tensors))
        _TENSOR_DIGESTS[base] = cached
    types = tuple((f"tensor {index}", f"{tensor.dtype} {list(tensor.shape[1:])}") for index, tensor in enumerate(base.tensors))
    return KeptRows(types, cached[1] if indices is None else cached[1][np.asarray(indices, dtype=np.int64)])


def _tensor_digests(tensors: Sequence[Any]) -> np.ndarray:
    """(N,) ``S16`` digests of the rows of equal-length tensors: each row's bytes in every tensor, in order."""
    rows = [tensor.detach().cpu().contiguous().reshape(len(tensor), -1) for tensor in tensors]
    views = [row.view(torch.uint8).numpy() if row.numel() else np.zeros((len(row), 0), np.uint8) for row in rows]
    digests = np.empty(len(rows[0]) if rows else 0, dtype="S16")
    for index in range(len(digests)):
        digest = hashlib.blake2b(digest_size=16)
        for view in views:
            digest.update(view[index].tobytes())
        digests[index] = digest.digest()
    return digests


def row_digests(dataset: Any, columns: Tuple[str, ...]) -> np.ndarray:
    """A 16-byte BLAKE2b digest of each row of a ``datasets.Dataset`` over ``columns`` (sorted names): (N,) ``S16``,
    in the dataset's row order; the same for the same values whatever the Arrow layout (slices, chunks, copies).
    Kept by the dataset's fingerprint (:data:`DIGEST_CACHE_SIZE` datasets)."""
    key = (dataset._fingerprint, columns)
    if key in _DIGESTS:
        _DIGESTS.move_to_end(key)
        return _DIGESTS[key]
    batches = dataset.select_columns(list(columns)).with_format("arrow").iter(batch_size=DIGEST_BATCH_ROWS)
    digests = np.concatenate([np.empty(0, dtype="S16"), *(_batch_digests(batch) for batch in batches)])
    _DIGESTS[key] = digests
    if len(_DIGESTS) > DIGEST_CACHE_SIZE:
        _DIGESTS.popitem(last=False)
    return digests


def _batch_digests(batch: Any) -> np.ndarray:
    """The digests of the rows of an Arrow table: every column's segments, and their lengths (so that values cannot
    run into the next column's)."""
    segments = [segment for column in batch.columns for segment in _column_segments(column.combine_chunks())]
    lengths = np.stack([np.diff(bounds) for _, bounds in segments], axis=1).astype(np.int64)
    digests = np.empty(batch.num_rows, dtype="S16")
    for row in range(batch.num_rows):
        digest = hashlib.blake2b(lengths[row].tobytes(), digest_size=16)
        for data, bounds in segments:
            digest.update(data[bounds[row]:bounds[row + 1]])
        digests[row] = digest.digest()
    return digests


def _column_segments(array: Any) -> List[Segment]:
    """A column's segments: which rows are null, then its values (:func:`_segments`)."""
    nulls = np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=np.uint8)
    return [(nulls, np.arange(len(array) + 1)), *_segments(array)]


def _segments(array: Any) -> List[Segment]:
    """The bytes of each row of an Arrow array, as segments: one for a flat array (numbers, strings, bytes), those
    of the innermost values for lists (every nesting level), one per field for structs (images: bytes and path)."""
    kind, rows = array.type, np.arange(array.offset, array.offset + len(array) + 1)
    if isinstance(array, pa.ExtensionArray):  # e.g. datasets' Array2D: lists underneath
        return _segments(array.storage)
    if pa.types.is_dictionary(kind):
        return _segments(array.dictionary_decode())
    if pa.types.is_struct(kind):
        return [segment for field in array.flatten() for segment in _segments(field)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return [(data, bounds[np.asarray(array.offsets)]) for data, bounds in _segments(array.values)]
    if pa.types.is_fixed_size_list(kind):
        return [(data, bounds[rows * kind.list_size]) for data, bounds in _segments(array.values)]
    if pa.types.is_boolean(kind):
        return [(np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8), rows - array.offset)]
    if pa.types.is_null(kind):
        return [(np.empty(0, dtype=np.uint8), np.zeros(len(array) + 1, dtype=np.int64))]
    if pa.types.is_binary_view(kind) or pa.types.is_string_view(kind):
        return _segments(array.cast(pa.large_binary()))
    buffers = array.buffers()
    if pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        offsets = np.frombuffer(buffers[1], dtype=np.int64 if kind in (pa.large_binary(), pa.large_string()) else np.int32)
        return [(_bytes(buffers[2]), offsets[rows].astype(np.int64))]
    if pa.types.is_fixed_size_binary(kind) or pa.types.is_decimal(kind) or pa.types.is_primitive(kind):
        width = kind.bit_width // 8 if pa.types.is_primitive(kind) else kind.byte_width
        return [(_bytes(buffers[1]), rows * width)]
    values = [repr(value).encode() for value in array.to_pylist()]  # any other layout (unions, run-end encoded): as read
    return [(np.frombuffer(b"".join(values), dtype=np.uint8), np.cumsum([0, *map(len, values)]))]


def _bytes(buffer: Any) -> np.ndarray:
    """An Arrow buffer as uint8 (an absent one: empty)."""
    return np.empty(0, dtype=np.uint8) if buffer is None else np.frombuffer(buffer, dtype=np.uint8)


def _common_columns(first: Any, second: Any) -> Optional[Tuple[str, ...]]:
    """The columns (sorted names) of two ``datasets.Dataset`` with the same name and Arrow type, when all of one's
    columns are among them (the other may have more: ``map`` adding a column); else None (no content to compare)."""
    types = [{field.name: field.type for field in dataset.data.table.schema} for dataset in (first, second)]
    common = tuple(sorted(name for name, kind in types[0].items() if types[1].get(name) == kind))
    return common if common and len(common) in (len(types[0]), len(types[1])) else None


def _kept_columns(kept: KeptRows, dataset: Any) -> Optional[Tuple[str, ...]]:
    """The kept rows' columns (by name) when ``dataset`` has every one of them with the same Arrow type, else None."""
    types = {field.name: str(field.type) for field in dataset.data.table.schema}
    return tuple(name for name, _ in kept.types) if all(types.get(name) == kind for name, kind in kept.types) else None


def _memory_keys(dataset: Any) -> np.ndarray:
    """(N, K) ``S16`` places of the N rows of a ``datasets.Dataset`` in memory, one per column (K): the address of the
    memory of the column's array and the row's position in it (b"": an array without a buffer, no place)."""
    table = dataset.data.table
    indices = getattr(dataset, "_indices", None)
    physical = np.arange(table.num_rows) if indices is None else np.asarray(indices.column(0).to_numpy(), dtype=np.int64)
    keys = [_column_keys(column, physical) for column in table.columns]
    return np.stack(keys, axis=1) if keys else np.empty((len(physical), 0), dtype="S16")


def _column_keys(column: Any, physical: np.ndarray) -> np.ndarray:
    """(N,) ``S16`` places of rows ``physical`` (positions in the table) of one chunked column."""
    bounds = np.cumsum([0, *(len(chunk) for chunk in column.chunks)])
    chunk_of = np.searchsorted(bounds, physical, side="right") - 1
    addresses = np.array([_memory_address(chunk) for chunk in column.chunks] or [0], dtype=np.int64)[chunk_of]
    offsets = np.array([chunk.offset for chunk in column.chunks] or [0], dtype=np.int64)[chunk_of]
    places = np.stack([addresses, offsets + physical - bounds[chunk_of]], axis=1) * (addresses != 0)[:, None]
    return np.ascontiguousarray(places).view("S16").ravel()


def _memory_address(array: Any) -> int:
    """The address of the first buffer of an Arrow array, the same for every slice of it (0: it has no buffer)."""
    return next((buffer.address for buffer in array.buffers() if buffer is not None), 0)


def _is_datasets_subset(data: Any) -> bool:
    """A torch ``Subset`` of a ``datasets.Dataset`` (e.g. the part of a DataLoader's dataset its sampler reads)."""
    return isinstance(data, Subset) and type(data.dataset).__name__ == "Dataset" and is_datasets_object(data.dataset)


def _parts(data: Any) -> Optional[List[Any]]:
    """The ``datasets.Dataset`` objects whose rows are the rows of ``data`` (itself, or the shards an iterable
    reads); None when unknown (not ``datasets`` data, or a stream that may drop or change rows)."""
    kind = type(data).__name__
    if _is_datasets_subset(data):
        return [data.dataset.select([int(index) for index in data.indices])]  # the same Arrow memory, an index mapping
    if not is_datasets_object(data):
        return None
    if kind == "Dataset":
        return [data]
    return _source_shards(data) if kind == "IterableDataset" else None


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
