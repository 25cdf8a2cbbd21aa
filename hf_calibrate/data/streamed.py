"""A :class:`~hf_calibrate.data.stream.StreamedData` for each kind of stream: how its units become batches."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from ..backbones import Backbone
from .batches import Batch, collate_rows, pad_token_id, sample_collate, split_batch
from .labels import class_label_mapping
from .rows import RowOptions, label_column, raw_row_converter, row_converter
from .sources import HFIterableRows, IterableUnits, LoaderOfBatches, SequenceOfBatches, UnitSource
from .stream import StreamedData


def streamed_data(data: Any, source: UnitSource, backbone: Backbone, options: RowOptions, cache_bytes: int) -> StreamedData:
    """``data`` (whose units ``source`` reads) as a stream of batches for ``backbone``."""
    pad_id = pad_token_id(backbone)

    def collate(rows: List[dict]) -> Batch:
        return split_batch(collate_rows(rows, pad_id), backbone)

    name = split = None
    preprocessed_here = False
    if isinstance(source, HFIterableRows):
        to_batch, preprocessed_here = _rows_to_batch(data, backbone, options, collate)
        name = getattr(data.info, "dataset_name", None) or None
        split = str(data.split) if data.split is not None else None
    elif source.of_samples:
        raw = raw_row_converter(source.first(), backbone, options)
        preprocessed_here = raw is not None
        to_batch = (lambda rows: collate([raw(row) for row in rows])) if raw else _samples_to_batch(backbone, options.preprocess)
    else:
        to_batch = _batch_to_batch(backbone, options.preprocess)
    description = _describe(data, source, name, split)
    return StreamedData(source, to_batch, collate, description, name=name, split=split, preprocessed_here=preprocessed_here,
                        cache_bytes=cache_bytes, pad_id=pad_id)


def _rows_to_batch(data: Any, backbone: Backbone, options: RowOptions, collate: Callable[[List[dict]], Batch]):
    """(rows of a ``datasets.IterableDataset`` → batch, whether raw images or texts are preprocessed here)."""
    columns = data.column_names or list(next(iter(data)))
    label_key = label_column(columns, options)
    feature = (data.features or {}).get(label_key)
    label_map = class_label_mapping(feature, label_key, backbone) if type(feature).__name__ == "ClassLabel" else None
    to_item, preprocessed_here = row_converter(columns, backbone, options, label_map)
    return (lambda rows: collate([to_item(row) for row in rows])), preprocessed_here


def _samples_to_batch(backbone: Backbone, preprocess: Optional[Callable[[Any], Any]]) -> Callable[[List[Any]], Batch]:
    collate = sample_collate(backbone)
    if preprocess is None:
        return collate
    return lambda samples: collate([preprocess(sample) for sample in samples])


def _batch_to_batch(backbone: Backbone, preprocess: Optional[Callable[[Any], Any]]) -> Callable[[Any], Batch]:
    if preprocess is not None:
        raise ValueError(
            "preprocess=... turns one sample into model inputs, but these data hand over whole batches; preprocess the "
            "batches where they are made (e.g. in the DataLoader's collate_fn) and drop preprocess=."
        )
    return lambda batch: split_batch(batch, backbone)


def _describe(data: Any, source: UnitSource, name: Optional[str], split: Optional[str]) -> str:
    if isinstance(source, HFIterableRows):
        return f"{name or 'datasets.IterableDataset'}{f' ({split})' if split else ''}, streamed"
    if isinstance(source, SequenceOfBatches):
        return f"{type(data).__name__} of {len(data)} batches"
    if isinstance(source, LoaderOfBatches):
        return f"DataLoader(batch_size=None) over {type(data.dataset).__name__} of {len(data.dataset)} batches"
    kind = "samples" if isinstance(source, IterableUnits) and source.of_samples else "batches"
    once = "" if source.reiterable else " (one-shot)"
    return f"{type(data).__name__} of {kind}{once}"
