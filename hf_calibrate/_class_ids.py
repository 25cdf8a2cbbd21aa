"""Class ids of an evaluator's references (docs/design.md §7): the label column as read, and its
values mapped to the model's class ids.

Class ids (a ``ClassLabel`` or integer column) are taken as they are, except that a ``ClassLabel``
whose names are the model's in another order is matched by name; class names (a string column)
are mapped by the model's labels, or by ``label_mapping`` when it is given. Every error names the
labels, the model's classes and the fix.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence

import numpy as np


@dataclass
class LabelColumn:
    """The label column as read: its name, its ``ClassLabel`` names (None for other columns) and its values."""

    column: str
    names: Optional[List[str]]
    values: List[Any] = field(default_factory=list)


def class_names(names: Sequence[str], label_mapping: Optional[Mapping[str, Any]]) -> List[str]:
    """The pipeline's labels ordered by class id: ``names`` (the model's order) or by ``label_mapping``'s ids.

    ``label_mapping`` must give each of the C labels a distinct id in 0..C-1 (extra keys are ignored).
    """
    if label_mapping is None:
        return list(names)
    ids = {name: label_mapping.get(name) for name in names}
    valid = all(isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()
                for value in ids.values())
    if not valid or sorted(int(value) for value in ids.values()) != list(range(len(names))):
        raise ValueError(
            f"label_mapping must give each of the model's {len(names)} labels {list(names)} a distinct class id "
            f"0..{len(names) - 1} (the column of its probability in every prediction); it maps them to {ids}."
        )
    return sorted(names, key=lambda name: int(ids[name]))


def _generic(classes: Sequence[str]) -> bool:
    """True when the model names its classes only ``LABEL_i`` (transformers' default): names cannot be matched."""
    return any(name == f"LABEL_{index}" for index, name in enumerate(classes))


def _matched(label_names: Sequence[str], classes: Sequence[str]) -> Optional[np.ndarray]:
    """Class id of each ``ClassLabel`` name, matched exactly or else ignoring case; None if some do not match."""
    for key in (str, str.casefold):
        index = {key(name): position for position, name in enumerate(classes)}
        if len(index) == len(classes) and all(key(name) in index for name in label_names):
            return np.array([index[key(name)] for name in label_names], dtype=np.int64)
    return None


def _ids_of_names(values: Sequence[str], classes: Sequence[str], column: str) -> np.ndarray:
    """Class ids of class names; a ValueError naming the unknown ones, the model's labels and the fix."""
    index = {name: position for position, name in enumerate(classes)}
    unknown = sorted({value for value in values if value not in index})
    if unknown:
        raise ValueError(
            f"the labels {unknown[:5]} of column {column!r} are not among the model's labels {list(classes)}. Pass "
            "label_mapping={model label: class id}, or map the column to the model's labels or to class ids first."
        )
    return np.array([index[value] for value in values], dtype=np.int64)


def _aligned_ids(ids: np.ndarray, labels: LabelColumn, classes: Sequence[str]) -> np.ndarray:
    """``ClassLabel`` ids re-indexed to the model's classes by name, when the names are the model's in another order."""
    if labels.names is None or _generic(classes) or list(labels.names) == list(classes):
        return ids
    matched = _matched(labels.names, classes)
    if matched is None:
        raise ValueError(
            f"the ClassLabel names {labels.names} of column {labels.column!r} are not the model's labels {list(classes)}. "
            f"If the ids already mean the model's classes, drop the names (data.cast_column({labels.column!r}, "
            "datasets.Value('int64'))) or pass label_mapping={model label: class id}."
        )
    if len(ids) and (ids.min() < 0 or ids.max() >= len(matched)):
        raise ValueError(
            f"column {labels.column!r} holds ids from {ids.min()} to {ids.max()}, outside its ClassLabel's 0..{len(matched) - 1}."
        )
    return matched[ids]


def reference_ids(labels: LabelColumn, classes: Sequence[str], mapped: bool) -> np.ndarray:
    """(N,) int64 class ids of the labels read (class ids or class names), checked to lie in 0..C-1.

    ``classes``: the labels by class id; ``mapped``: ids come from ``label_mapping``, so ``ClassLabel`` ids are
    taken as they are (the mapping says what they mean).
    """
    values = labels.values
    if values and all(isinstance(value, str) for value in values):
        return _ids_of_names(values, classes, labels.column)
    if not all(isinstance(value, numbers.Integral) and not isinstance(value, bool) for value in values):
        example = next(value for value in values if not isinstance(value, numbers.Integral) or isinstance(value, bool))
        raise ValueError(
            f"column {labels.column!r} must hold class ids (integers) or class names (strings), all of one kind; it holds "
            f"{example!r} ({type(example).__name__})."
        )
    ids = np.asarray(values, dtype=np.int64)
    ids = ids if mapped else _aligned_ids(ids, labels, classes)
    if len(ids) and (ids.min() < 0 or ids.max() >= len(classes)):
        raise ValueError(
            f"column {labels.column!r} holds class ids from {ids.min()} to {ids.max()}, but the model has {len(classes)} "
            f"classes (ids 0..{len(classes) - 1}: {list(classes)}). Pass label_mapping={{model label: class id}} if the ids "
            "mean other classes."
        )
    return ids
