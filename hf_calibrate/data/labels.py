"""Labels as the model counts them: class names matched to the model's ``id2label``, indices checked against its classes."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..backbones import Backbone
from ..backbones.base import model_label_names, recorded_label_names


def data_class_names(data: Any, column: str, backbone: Backbone) -> Optional[List[str]]:
    """The class names a ``datasets.Dataset``'s ``column`` gives (a ``ClassLabel``'s, one per class of the model), when
    the model records none of its own (None otherwise): the calibrated model's labels, so that pipelines show them."""
    import datasets

    feature = data.features.get(column)
    if model_label_names(backbone) is not None or not isinstance(feature, datasets.ClassLabel):
        return None
    names = [str(name) for name in feature.names]
    if len(names) != backbone.num_classes or len(set(names)) != len(names):
        return None
    return names


def label_indices(names: Sequence[Any], backbone: Backbone) -> List[int]:
    """The model's class index of each class name in ``names``, matched exactly with its ``id2label``.

    Raises ValueError listing the model's labels when a name is not one of them, or when the
    model has only generic ``LABEL_i`` names and the labels are other names.
    """
    recorded = recorded_label_names(backbone) or []
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
        mapping = class_label_mapping(feature, column, backbone)
        return data if mapping is None else _relabel(data, column, mapping, model_names)
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


def class_label_mapping(feature: Any, column: str, backbone: Backbone) -> Optional[List[int]]:
    """The model's class index of each class of a ``datasets.ClassLabel`` column, matched by name; None when the
    indices already mean the model's classes (same names, or a model without names)."""
    _check_class_count(len(feature.names), backbone)
    model_names = model_label_names(backbone)
    if model_names is None or feature.names == model_names:
        return None
    mapping = _match_names(feature.names, model_names)
    if mapping is None:
        unknown = sorted(name for name in feature.names if name.casefold() not in {m.casefold() for m in model_names})
        raise ValueError(
            f"the dataset's labels {unknown} are not labels of the model, whose labels are {model_names}. If the "
            f"dataset's class indices already mean the model's classes, drop the names: "
            f"data.cast_column({column!r}, datasets.Value('int64')); otherwise map them with "
            "data.align_labels_with_mapping(label2id, column)."
        )
    return mapping


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
