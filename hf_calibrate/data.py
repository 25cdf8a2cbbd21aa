"""Calibration data: whatever the user holds → indexable items + a collate into batches.

Accepted forms (docs/design.md §3.0):
* a ``DataLoader`` over a map-style dataset, yielding ``(inputs, labels)`` tuples or dicts in
  the transformers convention (``labels`` + input keys) — its ``dataset`` and ``collate_fn``
  are reused with our own index sampling (so data can be split, shuffled and sharded);
* a map-style ``torch.utils.data.Dataset`` of ``(input, label)`` pairs or dicts;
* a ``datasets.Dataset``: rows that already hold model inputs, rows turned into model inputs
  by ``preprocess(row) -> dict``, or raw ``image``/``text`` rows preprocessed with the model's
  own preprocessing (timm's data config, a transformers image processor or tokenizer).

Every batch becomes ``(inputs: dict[str, Tensor], labels: LongTensor)`` where ``inputs``
holds the keyword arguments of the base model (``pixel_values`` for timm and vision models,
``input_ids``/``attention_mask``/... for text, ``input`` for a plain module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from .backbones import Backbone, Inputs

LABEL_KEYS = ("labels", "label")
IMAGE_COLUMNS = ("image", "img")
TEXT_COLUMNS = ("text", "sentence", "content")
# Preprocessed items are kept in memory for later epochs up to this many bytes.
DEFAULT_CACHE_BYTES = 2 << 30

Batch = Tuple[Inputs, torch.Tensor]


@dataclass
class PreparedData:
    """Indexable calibration data: ``dataset[i]`` is one item, ``collate(items)`` one batch."""

    dataset: Any
    collate: Callable[[List[Any]], Batch]
    description: str
    name: Optional[str] = None  # dataset name and split, when the data records them
    split: Optional[str] = None
    preprocessed_here: bool = False  # the library turned raw images or texts into inputs (else: the user did)

    def __len__(self) -> int:
        return len(self.dataset)

    def loader(self, index_batches: Sequence[Sequence[int]], num_workers: int = 0) -> DataLoader:
        """A DataLoader that yields one collated batch per list of indices.

        Its own generator seeds the worker processes, so iterating it draws nothing from
        torch's global generator (a fit leaves the user's random state as it found it).
        """
        return DataLoader(self.dataset, batch_sampler=list(index_batches), collate_fn=self.collate, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(0))


class _CachedItems(Dataset):
    """``fn(source[i])`` memoised in memory until ``max_bytes`` of tensors are held."""

    def __init__(self, source: Any, fn: Callable[[Any], Any], max_bytes: int) -> None:
        self.source, self.fn, self.max_bytes = source, fn, max_bytes
        self._items: Dict[int, Any] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        if index in self._items:
            return self._items[index]
        item = self.fn(self.source[index])
        size = _tensor_bytes(item)
        if self._bytes + size <= self.max_bytes:
            self._items[index] = item
            self._bytes += size
        return item


def _tensor_bytes(item: Any) -> int:
    """Rough memory held by an item: tensor bytes, 8 bytes per other leaf."""
    if isinstance(item, torch.Tensor):
        return item.nbytes
    if isinstance(item, Mapping):
        return sum(_tensor_bytes(value) for value in item.values())
    if isinstance(item, (list, tuple)):
        return sum(_tensor_bytes(value) for value in item)
    return 8


# ----------------------------------------------------------------------------- batches


def split_batch(batch: Any, backbone: Backbone) -> Batch:
    """Turn one collated batch into (inputs dict, labels); clear errors for other shapes."""
    if isinstance(batch, Mapping):
        label_key = next((key for key in LABEL_KEYS if key in batch), None)
        if label_key is None:
            raise ValueError(
                f"a calibration batch is a dict with keys {sorted(batch)} but no 'labels' or 'label' key; "
                "calibration needs the true class of every sample."
            )
        inputs = {key: value for key, value in batch.items() if key not in LABEL_KEYS}
        labels = batch[label_key]
        if backbone.input_key in inputs:  # only the model's inputs go on (not a text or idx column)
            inputs = {key: value for key, value in inputs.items() if backbone.takes_input(key)}
        else:
            tensors = [key for key, value in inputs.items() if isinstance(value, torch.Tensor)]
            if len(tensors) != 1:
                raise ValueError(
                    f"a calibration batch has inputs {sorted(inputs)} but this {backbone.library} model "
                    f"takes {backbone.input_key!r}; rename the input column to {backbone.input_key!r}."
                )
            inputs = {backbone.input_key: inputs[tensors[0]]}
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs, labels = {backbone.input_key: batch[0]}, batch[1]
    else:
        raise ValueError(
            f"a calibration batch must be an (inputs, labels) pair or a dict with 'labels'; got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
            + "."
        )
    labels = label_tensor(labels, backbone)
    if labels.ndim != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            f"labels must be a 1-D tensor of integer class indices, got shape {tuple(labels.shape)} and dtype "
            f"{labels.dtype}."
        )
    return dict(inputs), labels.long()


# ----------------------------------------------------------------------------- class names


def model_label_names(backbone: Backbone) -> Optional[List[str]]:
    """The model's class names in index order, or None when it only has generic ``LABEL_i`` names."""
    names = _recorded_label_names(backbone)
    if names is None or any(name == f"LABEL_{index}" for index, name in enumerate(names)):
        return None
    return names


def _recorded_label_names(backbone: Backbone) -> Optional[List[str]]:
    """The names the model's ``id2label`` gives its classes (generic ``LABEL_i`` included), None when incomplete."""
    num_classes = backbone.num_classes
    id2label = backbone.id2label or {}
    names = [str(id2label.get(index, "")) for index in range(num_classes or 0)]
    return names if names and all(names) else None


def label_indices(names: Sequence[Any], backbone: Backbone) -> List[int]:
    """The model's class index of each class name in ``names``, matched exactly with its ``id2label``.

    Raises ValueError listing the model's labels when a name is not one of them, or when the
    model has only generic ``LABEL_i`` names and the labels are other names.
    """
    recorded = _recorded_label_names(backbone) or []
    index = {name: position for position, name in enumerate(recorded)}
    unknown = sorted({str(name) for name in names if name not in index})
    if unknown and model_label_names(backbone) is None:
        raise ValueError(
            f"the labels are class names (e.g. {unknown[0]!r}) but the model records no class names (none, or only generic "
            "LABEL_i ones), so they cannot be matched. Pass class indices, or give the model its labels "
            "(transformers: config.id2label and label2id; timm: pretrained_cfg['label_names'])."
        )
    if unknown:
        raise ValueError(
            f"the dataset's labels {unknown} are not labels of the model, whose labels are {recorded}; "
            "rename them to the model's labels, or pass class indices."
        )
    return [index[name] for name in names]


def label_tensor(labels: Any, backbone: Backbone) -> torch.Tensor:
    """Labels of one batch as a tensor; class names (strings) become the model's class indices."""
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "US":
        labels = labels.tolist()
    if isinstance(labels, (list, tuple)) and any(isinstance(label, str) for label in labels):
        if not all(isinstance(label, str) for label in labels):
            raise ValueError(f"a batch mixes class names and class indices as labels ({list(labels)[:5]}...); use one kind.")
        return torch.tensor(label_indices(labels, backbone), dtype=torch.long)
    return torch.as_tensor(labels)


def align_labels(data: Any, column: str, backbone: Backbone) -> Any:
    """A ``datasets.Dataset`` whose ``column`` holds the model's class indices.

    Class names (a string column, or a ``ClassLabel`` whose names differ from the model's) are
    matched by name with the model's labels; integer labels are checked against the class count.
    """
    import datasets

    feature = data.features[column]
    model_names = model_label_names(backbone)
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        names = sorted(data.unique(column))
        return _relabel(data, column, dict(zip(names, label_indices(names, backbone))), model_names)
    if isinstance(feature, datasets.ClassLabel):
        _check_class_count(len(feature.names), backbone)
        if model_names is None or feature.names == model_names:
            return data
        mapping = _match_names(feature.names, model_names)
        if mapping is None:
            unknown = sorted(name for name in feature.names if name.casefold() not in {m.casefold() for m in model_names})
            raise ValueError(
                f"the dataset's labels {unknown} are not labels of the model, whose labels are {model_names}. If the "
                f"dataset's class indices already mean the model's classes, drop the names: "
                f"data.cast_column({column!r}, datasets.Value('int64')); otherwise map them with "
                "data.align_labels_with_mapping(label2id, column)."
            )
        return _relabel(data, column, mapping, model_names)
    if not (isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))):
        raise ValueError(f"label column {column!r} holds {feature}; it must hold class indices or class names.")
    values = data.unique(column)
    low, high = (min(values), max(values)) if values else (0, 0)
    if backbone.num_classes is not None and (low < 0 or high >= backbone.num_classes):
        raise ValueError(
            f"labels in column {column!r} range from {low} to {high}, but the model has "
            f"{backbone.num_classes} classes (0 to {backbone.num_classes - 1})."
        )
    return data


def _match_names(names: Sequence[str], model_names: List[str]) -> Optional[List[int]]:
    """The model's index of each of ``names``, matched exactly or else ignoring case; None if some do not match."""
    for key in (str, str.casefold):
        index = {key(name): position for position, name in enumerate(model_names)}
        if len(index) == len(model_names) and all(key(name) in index for name in names):
            return [index[key(name)] for name in names]
    return None


def _check_class_count(count: int, backbone: Backbone) -> None:
    if backbone.num_classes is not None and count > backbone.num_classes:
        raise ValueError(f"the dataset has {count} classes but the model has {backbone.num_classes}.")


def _relabel(data: Any, column: str, new_index: Any, model_names: List[str]) -> Any:
    """``data`` with ``column``'s value v replaced by ``new_index[v]``, typed as the model's ClassLabel."""
    import datasets

    features = data.features.copy()
    features[column] = datasets.ClassLabel(names=model_names)

    def relabel(values: List[Any]) -> Dict[str, List[int]]:
        return {column: [new_index[value if isinstance(value, str) else int(value)] for value in values]}

    return data.map(relabel, input_columns=column, batched=True, features=features, desc="Matching labels to the model's")


def _pad_token_id(backbone: Backbone) -> int:
    return int(getattr(getattr(backbone.model, "config", None), "pad_token_id", None) or 0)


def _pad_value(key: str, pad_token_id: int) -> int:
    return pad_token_id if key == "input_ids" else 0


def model_fields(rows: List[Mapping[str, Any]], backbone: Backbone) -> List[Mapping[str, Any]]:
    """Rows holding the model's main input, cut to its inputs and the label (a ``text`` or ``idx`` field of
    pre-tokenized rows is not passed on); other rows unchanged (:func:`split_batch` names their one input)."""
    if backbone.input_key not in rows[0]:
        return rows
    return [{key: value for key, value in row.items() if key in LABEL_KEYS or backbone.takes_input(key)} for row in rows]


def collate_rows(rows: List[Mapping[str, Any]], pad_token_id: int = 0) -> Dict[str, Any]:
    """Stack dict rows into a batch; 1-D token sequences of different lengths are right-padded.

    Labels given as class names stay a list of strings (:func:`split_batch` matches them).
    """
    batch: Dict[str, Any] = {}
    for key in rows[0]:
        if key in LABEL_KEYS and isinstance(rows[0][key], str):
            batch[key] = [row[key] for row in rows]  # class names: matched to the model's in split_batch
            continue
        values = [torch.as_tensor(row[key]) for row in rows]
        if all(value.shape == values[0].shape for value in values):
            batch[key] = torch.stack(values)
        elif all(value.ndim == 1 for value in values):
            batch[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=_pad_value(key, pad_token_id))
        else:
            raise ValueError(f"column {key!r} holds tensors of different shapes that cannot be batched.")
    return batch


# ----------------------------------------------------------------------------- preprocessing


def _find_column(columns: Sequence[str], given: Optional[str], candidates: Sequence[str], what: str) -> str:
    if given is not None:
        if given not in columns:
            raise ValueError(f"{what} column {given!r} is not in the dataset; its columns are {list(columns)}.")
        return given
    found = next((name for name in candidates if name in columns), None)
    if found is None:
        raise ValueError(
            f"could not find the {what} column among {list(columns)}; name it with "
            f"{what}_column=... (looked for {list(candidates)})."
        )
    return found


def _image_preprocessor(backbone: Backbone, preprocessor: Any) -> Callable[[Any], torch.Tensor]:
    """Per-image callable PIL → (C, H, W) tensor from the model's own preprocessing."""
    if preprocessor is not None and hasattr(preprocessor, "preprocess"):  # transformers image processor
        return lambda image: preprocessor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"][0]
    if callable(preprocessor):
        return lambda image: preprocessor(image.convert("RGB"))
    if backbone.library == "timm":
        import timm.data

        transform = timm.data.create_transform(**timm.data.resolve_data_config(model=backbone.model))
        return lambda image: transform(image.convert("RGB"))
    raise ValueError(
        "raw images need the model's image processor: pass preprocessor=AutoImageProcessor.from_pretrained(...)"
        " (or a callable PIL image -> tensor)."
    )


def _text_preprocessor(backbone: Backbone, preprocessor: Any, max_length: Optional[int]) -> Callable[[str], Dict[str, Any]]:
    if preprocessor is None:
        raise ValueError("raw text needs the model's tokenizer: pass preprocessor=AutoTokenizer.from_pretrained(...).")
    return lambda text: dict(preprocessor(text, truncation=True, max_length=max_length))


def _datasets_rows(
    data: Any,
    backbone: Backbone,
    *,
    preprocessor: Any,
    preprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]],
    image_column: Optional[str],
    text_column: Optional[str],
    label_column: Optional[str],
    max_length: Optional[int],
    cache_bytes: int,
) -> PreparedData:
    columns = list(data.column_names)
    label_key = _find_column(columns, label_column, LABEL_KEYS, "label")
    data = align_labels(data, label_key, backbone)
    preprocessed_here = preprocess is None and backbone.input_key not in columns
    if preprocess is not None:
        def to_item(row):
            return {**preprocess(row), "labels": row[label_key]}
    elif backbone.input_key in columns:
        inputs = [key for key in columns if key != label_key and backbone.takes_input(key)]

        def to_item(row):
            return {key: row[key] for key in inputs} | {"labels": row[label_key]}
    elif backbone.modality == "image":
        column = _find_column(columns, image_column, IMAGE_COLUMNS, "image")
        process_image = _image_preprocessor(backbone, preprocessor)

        def to_item(row):
            return {backbone.input_key: process_image(row[column]), "labels": row[label_key]}
    elif backbone.modality == "text":
        column = _find_column(columns, text_column, TEXT_COLUMNS, "text")
        tokenize = _text_preprocessor(backbone, preprocessor, max_length)

        def to_item(row):
            return {**tokenize(row[column]), "labels": row[label_key]}
    else:
        raise ValueError(
            f"rows of this dataset ({columns}) do not hold {backbone.input_key!r}; pass preprocess=... "
            "to turn a row into model inputs."
        )
    pad_token_id = _pad_token_id(backbone)
    name = getattr(data.info, "dataset_name", None) or None
    split = str(data.split) if data.split is not None else None
    return PreparedData(
        _CachedItems(data, to_item, cache_bytes),
        lambda items: split_batch(collate_rows(items, pad_token_id), backbone),
        f"{name or 'datasets.Dataset'}{f' ({split})' if split else ''}, {len(data)} rows",
        name=name,
        split=split,
        preprocessed_here=preprocessed_here,
    )


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
) -> PreparedData:
    """Wrap ``data`` (DataLoader, torch Dataset or datasets.Dataset) for index-based batching."""
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            raise ValueError(
                "the DataLoader wraps an IterableDataset; calibration needs random access to split and shuffle "
                "the data. Pass a map-style dataset (one with __getitem__ and __len__)."
            )
        collate = data.collate_fn or default_collate
        return PreparedData(data.dataset, lambda items: split_batch(collate(items), backbone), f"DataLoader({type(data.dataset).__name__}, {len(data.dataset)} samples)")
    if _is_hf_dataset(data):
        if len(data) == 0:
            raise ValueError("the calibration dataset is empty.")
        return _datasets_rows(
            data, backbone, preprocessor=preprocessor, preprocess=preprocess, image_column=image_column,
            text_column=text_column, label_column=label_column, max_length=max_length, cache_bytes=cache_bytes,
        )
    if isinstance(data, IterableDataset):
        raise ValueError("an IterableDataset cannot be split or shuffled; pass a map-style dataset.")
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        if preprocess is not None:
            data = _CachedItems(data, preprocess, cache_bytes)
        pad_token_id = _pad_token_id(backbone)

        def collate(items: List[Any]) -> Batch:
            if isinstance(items[0], Mapping):
                return split_batch(collate_rows(model_fields(items, backbone), pad_token_id), backbone)
            _check_same_input_size(items)
            return split_batch(default_collate(items), backbone)

        return PreparedData(data, collate, f"{type(data).__name__}({len(data)} samples)")
    raise TypeError(
        f"calibration data of type {type(data).__name__} is not supported; pass a DataLoader, a map-style "
        "torch Dataset, or a datasets.Dataset."
    )


def _check_same_input_size(items: List[Any]) -> None:
    """Refuse (inputs, label) samples whose input tensors differ in shape, naming two of the shapes."""
    inputs = [item[0] for item in items if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor)]
    shapes = sorted({tuple(tensor.shape) for tensor in inputs})
    if len(shapes) > 1:
        raise ValueError(
            f"the calibration samples differ in size: {shapes[0]} and {shapes[1]} in one batch. A calibration holds at "
            "one input size; resize or crop them all to one size (the size you will run the model at)."
        )


def _is_hf_dataset(data: Any) -> bool:
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a core dependency
        return False
    return isinstance(data, datasets.Dataset)
