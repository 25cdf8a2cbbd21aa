"""Rows of a ``datasets`` dataset (map-style or iterable) turned into model inputs.

A row already holds model inputs (pre-tokenized text, pixel tensors), is turned into them by
the user's ``preprocess(row)``, or holds a raw ``image``/``text`` column preprocessed with the
model's own preprocessing (timm's data config, a transformers image processor or tokenizer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..backbones import Backbone
from .batches import LABEL_KEYS

IMAGE_COLUMNS = ("image", "img")
TEXT_COLUMNS = ("text", "sentence", "content")

Row = Dict[str, Any]


@dataclasses.dataclass
class RowOptions:
    """How rows become model inputs (the data options of :class:`hf_calibrate.fitting.EngineOptions`)."""

    preprocessor: Any = None
    preprocess: Optional[Callable[[Row], Row]] = None
    image_column: Optional[str] = None
    text_column: Optional[str] = None
    label_column: Optional[str] = None
    max_length: Optional[int] = None


def label_column(columns: Sequence[str], options: RowOptions) -> str:
    """The name of the label column among ``columns``."""
    return find_column(columns, options.label_column, LABEL_KEYS, "label")


def row_converter(
    columns: Sequence[str], backbone: Backbone, options: RowOptions, label_map: Optional[List[int]] = None
) -> Tuple[Callable[[Row], Row], bool]:
    """(a function row → item holding the model inputs and ``labels``, whether it preprocesses raw images or texts).

    ``label_map[i]`` is the model's class index of a label i (None: labels are used as they are).
    """
    label_key = label_column(columns, options)
    to_label = (lambda value: value) if label_map is None else (lambda value: label_map[int(value)])
    to_inputs = _inputs_converter(list(columns), label_key, backbone, options)

    def to_item(row: Row) -> Row:
        return {**to_inputs(row), "labels": to_label(row[label_key])}

    return to_item, options.preprocess is None and backbone.input_key not in columns


def raw_row_converter(first: Any, backbone: Backbone, options: RowOptions) -> Optional[Callable[[Row], Row]]:
    """For samples that are dict rows of raw images or texts (no model input, no ``preprocess``), the converter
    that preprocesses them with the model's own preprocessing, as a ``datasets`` row; else None."""
    if options.preprocess is not None or not isinstance(first, dict) or backbone.input_key in first:
        return None
    raw = IMAGE_COLUMNS if backbone.modality == "image" else TEXT_COLUMNS
    given = options.image_column if backbone.modality == "image" else options.text_column
    if given not in first and not any(column in first for column in raw):
        return None
    return row_converter(list(first), backbone, options)[0]


def _inputs_converter(columns: List[str], label_key: str, backbone: Backbone, options: RowOptions) -> Callable[[Row], Row]:
    if options.preprocess is not None:
        return options.preprocess
    if backbone.input_key in columns:
        inputs = [key for key in columns if key != label_key and backbone.takes_input(key)]
        return lambda row: {key: row[key] for key in inputs}
    if backbone.modality == "image":
        column = find_column(columns, options.image_column, IMAGE_COLUMNS, "image")
        process_image = image_preprocessor(backbone, options.preprocessor)
        return lambda row: {backbone.input_key: process_image(row[column])}
    if backbone.modality == "text":
        column = find_column(columns, options.text_column, TEXT_COLUMNS, "text")
        tokenize = _text_preprocessor(options.preprocessor, options.max_length)
        return lambda row: tokenize(row[column])
    raise ValueError(
        f"rows of this dataset ({columns}) do not hold {backbone.input_key!r}; pass preprocess=... "
        "to turn a row into model inputs."
    )


def find_column(columns: Sequence[str], given: Optional[str], candidates: Sequence[str], what: str) -> str:
    """``given`` when it is one of ``columns``, else the first of ``candidates`` there; errors name the fix."""
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


def image_preprocessor(backbone: Backbone, preprocessor: Any) -> Callable[[Any], torch.Tensor]:
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


def _text_preprocessor(preprocessor: Any, max_length: Optional[int]) -> Callable[[str], Row]:
    if preprocessor is None:
        raise ValueError("raw text needs the model's tokenizer: pass preprocessor=AutoTokenizer.from_pretrained(...).")
    return lambda text: dict(preprocessor(text, truncation=True, max_length=max_length))
