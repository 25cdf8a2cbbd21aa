"""One calibration batch: ``(inputs: dict[str, Tensor], labels: LongTensor)``, from whatever shape the user's batch has.

``inputs`` holds the keyword arguments of the base model (``pixel_values`` for timm and vision
models, ``input_ids``/``attention_mask``/... for text, ``input`` for a plain module); only the
model's own inputs are passed on (a ``text`` or ``idx`` column of pre-tokenized data is not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch.utils.data._utils.collate import default_collate

from ..backbones import Backbone, Inputs
from .labels import label_tensor

LABEL_KEYS = ("labels", "label")

Batch = Tuple[Inputs, torch.Tensor]


def split_batch(batch: Any, backbone: Backbone) -> Batch:
    """Turn one collated batch into (inputs dict, labels); clear errors for other shapes."""
    if isinstance(batch, Mapping):
        inputs, labels = _split_mapping(batch, backbone)
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


def _split_mapping(batch: Mapping, backbone: Backbone) -> Tuple[Dict[str, Any], Any]:
    """(model inputs, labels) of a dict batch: the model's own input keys, or its one tensor under the model's input name."""
    label_key = next((key for key in LABEL_KEYS if key in batch), None)
    if label_key is None:
        raise ValueError(
            f"a calibration batch is a dict with keys {sorted(batch)} but no 'labels' or 'label' key; "
            "calibration needs the true class of every sample."
        )
    inputs = {key: value for key, value in batch.items() if key not in LABEL_KEYS}
    if backbone.input_key in inputs:  # only the model's inputs go on (not a text or idx column)
        return {key: value for key, value in inputs.items() if backbone.takes_input(key)}, batch[label_key]
    tensors = [key for key, value in inputs.items() if isinstance(value, torch.Tensor)]
    if len(tensors) != 1:
        raise ValueError(
            f"a calibration batch has inputs {sorted(inputs)} but this {backbone.library} model "
            f"takes {backbone.input_key!r}; rename the input column to {backbone.input_key!r}."
        )
    return {backbone.input_key: inputs[tensors[0]]}, batch[label_key]


def pad_token_id(backbone: Backbone) -> int:
    """The value token ids are padded with (the model config's ``pad_token_id``, else 0)."""
    return int(getattr(getattr(backbone.model, "config", None), "pad_token_id", None) or 0)


def _pad_value(key: str, pad_id: int) -> int:
    return pad_id if key == "input_ids" else 0


def model_fields(rows: List[Mapping[str, Any]], backbone: Backbone) -> List[Mapping[str, Any]]:
    """Rows holding the model's main input, cut to its inputs and the label (a ``text`` or ``idx`` field of
    pre-tokenized rows is not passed on); other rows unchanged (:func:`split_batch` names their one input)."""
    if backbone.input_key not in rows[0]:
        return rows
    return [{key: value for key, value in row.items() if key in LABEL_KEYS or backbone.takes_input(key)} for row in rows]


def collate_rows(rows: List[Mapping[str, Any]], pad_id: int = 0) -> Dict[str, Any]:
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
            batch[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True, padding_value=_pad_value(key, pad_id))
        else:
            raise ValueError(f"column {key!r} holds tensors of different shapes that cannot be batched.")
    return batch


def concat_batches(batches: List[Batch], pad_id: int) -> Batch:
    """One batch of the samples of ``batches`` in order; token sequences padded on the right to the longest."""
    if len(batches) == 1:
        return batches[0]
    inputs: Dict[str, Any] = {}
    for key, first in batches[0][0].items():
        values = [batch[0][key] for batch in batches]
        if not isinstance(first, torch.Tensor):
            inputs[key] = first
            continue
        if first.ndim == 2 and len({value.shape[1] for value in values}) > 1:
            longest = max(value.shape[1] for value in values)
            values = [torch.nn.functional.pad(value, (0, longest - value.shape[1]), value=_pad_value(key, pad_id)) for value in values]
        inputs[key] = torch.cat(values)
    return inputs, torch.cat([batch[1] for batch in batches])


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``start`` to ``stop - 1`` of a batch."""
    inputs, labels = batch
    return {key: value[start:stop] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}, labels[start:stop]


def sample_collate(backbone: Backbone) -> Callable[[List[Any]], Batch]:
    """Collate samples as the user holds them — dicts (transformers convention) or ``(input, label)`` pairs — into a batch."""
    pad_id = pad_token_id(backbone)

    def collate(items: List[Any]) -> Batch:
        if isinstance(items[0], Mapping):
            return split_batch(collate_rows(model_fields(items, backbone), pad_id), backbone)
        _check_same_input_size(items)
        return split_batch(default_collate(items), backbone)

    return collate


def _check_same_input_size(items: List[Any]) -> None:
    """Refuse (inputs, label) samples whose input tensors differ in shape, naming two of the shapes."""
    inputs = [item[0] for item in items if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor)]
    shapes = sorted({tuple(tensor.shape) for tensor in inputs})
    if len(shapes) > 1:
        raise ValueError(
            f"the calibration samples differ in size: {shapes[0]} and {shapes[1]} in one batch. A calibration holds at "
            "one input size; resize or crop them all to one size (the size you will run the model at)."
        )


def tensor_bytes(item: Any) -> int:
    """Rough memory held by an item: tensor bytes, 8 bytes per other leaf."""
    if isinstance(item, torch.Tensor):
        return item.nbytes
    if isinstance(item, Mapping):
        return sum(tensor_bytes(value) for value in item.values())
    if isinstance(item, (list, tuple)):
        return sum(tensor_bytes(value) for value in item)
    return 8
