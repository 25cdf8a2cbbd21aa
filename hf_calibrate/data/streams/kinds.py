"""A :class:`~hf_calibrate.data.streams.index.StreamedData` for each kind of stream: how its units become batches."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from ..._warnings import warn_user
from ...backbones import Backbone
from ..batches import Batch, collate_rows, pad_token_id, relabelled, sample_collate, split_batch
from ..labels import class_label_mapping, model_label_names
from ..rows import RowOptions, label_column, raw_row_converter, row_converter
from .units import HFIterableRows, IterableUnits, LoaderOfBatches, SequenceOfBatches, UnitSource, empty_data_message, labels_of
from .index import StreamedData


def streamed_data(data: Any, source: UnitSource, backbone: Backbone, options: RowOptions, cache_bytes: int,
                  role: str) -> StreamedData:
    """``data`` (whose units ``source`` reads) as a stream of batches for ``backbone``; empty data are refused, named by
    their ``role``."""
    try:
        source.first()
    except StopIteration:
        raise ValueError(empty_data_message(data, role, one_shot=not source.reiterable)) from None
    pad_id = pad_token_id(backbone)

    def collate(rows: List[dict]) -> Batch:
        return split_batch(collate_rows(rows, pad_id), backbone)

    name = split = None
    preprocessed_here = False
    if isinstance(source, HFIterableRows):
        to_batch, preprocessed_here = _rows_to_batch(data, source.first(), backbone, options, collate)
        name = getattr(data.info, "dataset_name", None) or None
        split = str(data.split) if data.split is not None else None
    elif source.of_samples:
        raw = raw_row_converter(source.first(), backbone, options)
        preprocessed_here = raw is not None
        to_batch = (lambda rows: collate([raw(row) for row in rows])) if raw else _samples_to_batch(backbone, options)
    else:
        to_batch = _BatchToBatch(source.first(), backbone, options, collate)
        preprocessed_here = to_batch.preprocessed_here
    description = _describe(data, source, name, split)
    return StreamedData(source, to_batch, description, name=name, split=split, preprocessed_here=preprocessed_here,
                        cache_bytes=cache_bytes, pad_id=pad_id)


def _rows_to_batch(data: Any, first: dict, backbone: Backbone, options: RowOptions, collate: Callable[[List[dict]], Batch]):
    """(rows of a ``datasets.IterableDataset`` (the first is ``first``) → batch, whether raw images or texts are
    preprocessed here)."""
    columns = data.column_names or list(first)
    label_key = label_column(columns, options)
    feature = (data.features or {}).get(label_key)
    label_map = class_label_mapping(feature, label_key, backbone) if type(feature).__name__ == "ClassLabel" else None
    if data.features is None and not isinstance(first[label_key], str) and model_label_names(backbone) is not None:
        warn_user(
            f"this datasets.IterableDataset records no features (e.g. after .map()), so the class names behind its "
            f"{label_key!r} values cannot be matched to the model's labels: the values are taken as the model's class "
            "indices (its id2label order). If they follow another order, map them first, or give the dataset its "
            "features (e.g. .map(..., features=...)) so that its ClassLabel names are matched."
        )
    to_item, preprocessed_here = row_converter(columns, backbone, options, label_map)
    return (lambda rows: collate([to_item(row) for row in rows])), preprocessed_here


def _samples_to_batch(backbone: Backbone, options: RowOptions) -> Callable[[List[Any]], Batch]:
    """Samples as the user holds them (pairs or dicts, ``preprocess``-ed when given) → batch."""
    collate = sample_collate(backbone, options.label_column)
    if options.preprocess is None:
        return collate
    return lambda samples: collate([options.preprocess(sample) for sample in samples])


class _BatchToBatch:
    """A batch as the user holds it → our batch: its label column renamed, dict batches of raw images or texts
    (lists) preprocessed row by row with the model's own preprocessing."""

    def __init__(self, first: Any, backbone: Backbone, options: RowOptions, collate: Callable[[List[dict]], Batch]) -> None:
        if options.preprocess is not None:
            raise ValueError(
                "preprocess=... turns one sample into model inputs, but these data hand over whole batches; preprocess the "
                "batches where they are made (e.g. in the DataLoader's collate_fn) and drop preprocess=."
            )
        self.backbone, self.label_column, self.collate = backbone, options.label_column, collate
        first = self._renamed(first)
        self.raw = raw_row_converter(_rows(first)[0], backbone, options) if isinstance(first, dict) else None
        self.preprocessed_here = self.raw is not None

    def _renamed(self, batch: Any) -> Any:
        return relabelled(batch, self.label_column) if isinstance(batch, dict) else batch

    def __call__(self, batch: Any) -> Batch:
        batch = self._renamed(batch)
        if self.raw is not None:
            return self.collate([self.raw(row) for row in _rows(batch)])
        labels = labels_of(batch)
        return split_batch(batch, self.backbone, len(labels) if getattr(labels, "ndim", 1) and hasattr(labels, "__len__") else None)


def _rows(batch: dict) -> List[dict]:
    """The rows of a dict batch of equal-length columns (lists, tensors, arrays); columns of other lengths are refused."""
    lengths = {key: len(value) for key, value in batch.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"a batch's columns differ in length ({', '.join(f'{key!r}: {count}' for key, count in lengths.items())} "
            "rows); every input needs one row per label. Give each column one row per sample."
        )
    count = next(iter(lengths.values()))
    return [{key: value[row] for key, value in batch.items()} for row in range(count)]


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
