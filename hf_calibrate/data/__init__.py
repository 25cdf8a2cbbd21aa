"""Calibration data: whatever the user holds → batches of ``(model inputs, labels)`` (docs/design.md §3.0).

Map-style data are batched by index (:mod:`.mapped`): a ``DataLoader`` that batches samples of a
map-style dataset (its ``dataset`` and ``collate_fn`` are reused with our own index sampling), a
map-style torch ``Dataset`` of ``(input, label)`` pairs or dicts, a ``datasets.Dataset``.

Everything else is a stream, read in order (:mod:`.streams.units`, :mod:`.streams.index`): a pre-batched
``DataLoader`` (``batch_size=None``), a list or map-style dataset of whole batches, a ``DataLoader``
over an ``IterableDataset``, a torch or ``datasets`` ``IterableDataset``, a callable returning a new
iterator per pass, and a one-shot iterator such as a generator (read once: fine for the one-pass
methods and ``evaluate``, refused by Neural Clamping, which reads its data every epoch).

Rows of ``datasets`` datasets hold model inputs, are turned into them by ``preprocess(row)``, or
hold raw ``image``/``text`` columns preprocessed with the model's own preprocessing (:mod:`.rows`).

Data named by a string (a local folder or file, a hub id) are read into splits with the model's
labels by :mod:`.reading` (what the command line's ``--dataset`` goes through).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torch.utils.data import DataLoader

from .._progress import library_progress_bars
from ..backbones import Backbone
from .batches import LABEL_KEYS, Batch, collate_rows, split_batch
from .labels import align_labels, label_indices, label_tensor, model_label_names
from .mapped import DEFAULT_CACHE_BYTES, PreparedData, datasets_rows, loader_samples, map_style_samples
from .reading import LoadedData, align_split_labels, label_column_of, load_splits, read_labelled_splits, select_split
from .rows import RowOptions
from .streams.units import empty_data_message, source_of
from .streams.index import StreamedData, StreamIndex
from .streams.kinds import streamed_data

CalibrationData = Union[PreparedData, StreamedData]


def prepare_data(
    data: Any,
    backbone: Backbone,
    *,
    preprocessor: Any = None,
    preprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    image_column: Optional[str] = None,
    text_column: Optional[str] = None,
    label_column: Optional[str] = None,
    max_length: Optional[int] = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    role: str = "data",
    progress: bool = True,
) -> CalibrationData:
    """``data`` as map-style :class:`PreparedData` (batched by index) or a :class:`StreamedData` (read in order);
    data known to hold no sample are refused (a stream is refused when its first read gives nothing).

    ``role`` names the data in messages: ``"calibration data"``, ``"validation data"``, ``"evaluation data"``, ... (default
    ``"data"``). ``progress`` False: no ``datasets`` progress bar while the data are prepared (matching labels to the
    model's maps a ``datasets.Dataset``).
    """
    if _sized_and_empty(data):
        raise ValueError(empty_data_message(data, role))
    options = RowOptions(preprocessor, preprocess, image_column, text_column, label_column, max_length)
    with library_progress_bars(progress):
        prepared = _prepared(data, backbone, options, cache_bytes, role)
    prepared.token_vocabularies = backbone.token_vocabularies()  # token ids are checked against them as batches are read
    prepared.role = role
    return prepared


def _prepared(data: Any, backbone: Backbone, options: RowOptions, cache_bytes: int, role: str) -> CalibrationData:
    """:func:`prepare_data`'s form of ``data``: map-style or a stream."""
    label_column = options.label_column
    if _is_hf_dataset(data):
        return datasets_rows(data, backbone, options, cache_bytes)
    source = source_of(data, label_column)
    if source is not None:
        return streamed_data(data, source, backbone, options, cache_bytes, role)
    if isinstance(data, DataLoader):
        return loader_samples(data, backbone)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, (dict, str, bytes)):
        return map_style_samples(data, backbone, options, cache_bytes)
    raise TypeError(
        f"data of type {type(data).__name__} are not supported; pass a DataLoader, a torch Dataset or "
        "IterableDataset, a datasets.Dataset or IterableDataset, a list of batches, or a callable returning an iterator "
        "of batches."
    )


def _is_hf_dataset(data: Any) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(data, datasets.Dataset)


def _sized_and_empty(data: Any) -> bool:
    """Whether ``data`` have a length, and it is 0 (a DataLoader: no batch; iterables without a length: False)."""
    try:
        return len(data) == 0
    except TypeError:  # no length (a stream, a callable) or one it cannot tell
        return False


__all__ = [
    "Batch",
    "CalibrationData",
    "DEFAULT_CACHE_BYTES",
    "LABEL_KEYS",
    "LoadedData",
    "PreparedData",
    "StreamIndex",
    "StreamedData",
    "align_labels",
    "align_split_labels",
    "collate_rows",
    "label_indices",
    "label_column_of",
    "label_tensor",
    "load_splits",
    "model_label_names",
    "prepare_data",
    "read_labelled_splits",
    "select_split",
    "split_batch",
]

