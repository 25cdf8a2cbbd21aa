"""One calibration batch: ``(inputs: dict[str, Tensor], labels: LongTensor)``, from whatever shape the user's batch has.

``inputs`` holds the keyword arguments of the base model (``pixel_values`` for timm and vision
models, ``input_ids``/``attention_mask``/... for text, ``input`` for a plain module); only the
model's own inputs are passed on (a ``text`` or ``idx`` column of pre-tokenized data is not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data._utils.collate import default_collate

from ..backbones import Backbone, Inputs
from ..metrics._checks import describe_positions
from .labels import label_tensor

LABEL_KEYS = ("labels", "label")

Batch = Tuple[Inputs, torch.Tensor]


def split_batch(batch: Any, backbone: Backbone, user_batch: Optional[int] = None) -> Batch:
    """Turn one collated batch into (inputs dict, labels); clear errors for other shapes.

    ``user_batch``: the samples in one of the user's batches when their data come in batches (the batch itself, or a
    ``DataLoader``'s ``batch_size`` when the fit batches its samples anew), so that a label error speaks of the batches
    the user made, not of those the fit made; None when the user's data are single samples.
    """
    if isinstance(batch, Mapping):
        inputs, labels = _split_mapping(batch, backbone)
    elif isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs, labels = {backbone.input_key: batch[0]}, batch[1]
    else:
        raise ValueError(
            f"a batch must be an (inputs, labels) pair or a dict with 'labels'; got {type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
            + "."
        )
    labels = label_tensor(labels, backbone)
    if labels.ndim != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be one integer class index per sample, but {_labels_described(labels, user_batch)}.")
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) != len(labels):
            raise ValueError(
                f"a batch holds {len(labels)} labels but {len(value)} rows of {key!r}; every input needs one "
                "row per label."
            )
    return dict(inputs), labels.long()


def _labels_described(labels: torch.Tensor, user_batch: Optional[int]) -> str:
    """What is wrong with ``labels``: in the user's batches of ``user_batch`` samples (the batch checked may be one the
    fit made of their samples), and per sample."""
    if labels.ndim == 0:
        return f"a batch holds a single {labels.dtype} label (a 0-d tensor); give one label per sample"
    per_sample = "a scalar" if labels.ndim == 1 else f"a tensor of shape {tuple(labels.shape[1:])}"
    fix = "cast them to integer class indices (e.g. labels.long())" if labels.ndim == 1 else (
        "give one class index per sample (e.g. labels.argmax(-1) of one-hot rows, or labels.squeeze(-1))")
    if user_batch is None:
        return f"each sample's label is {per_sample} of dtype {labels.dtype}; {fix}"
    shape = (user_batch, *labels.shape[1:])
    return (f"a batch of {user_batch} samples of the data holds labels of shape {shape} and dtype {labels.dtype} (each "
            f"sample's label is {per_sample}; one class index per sample is shape ({user_batch},), an integer dtype); {fix}")


def _split_mapping(batch: Mapping, backbone: Backbone) -> Tuple[Dict[str, Any], Any]:
    """(model inputs, labels) of a dict batch: the model's own input keys, or its one tensor under the model's input name."""
    label_key = next((key for key in LABEL_KEYS if key in batch), None)
    if label_key is None:
        raise ValueError(
            f"a batch is a dict with keys {sorted(batch)} but no 'labels' or 'label' key; "
            "calibrating and evaluating need the true class of every sample."
        )
    inputs = {key: value for key, value in batch.items() if key not in LABEL_KEYS}
    if backbone.input_key in inputs:  # only the model's inputs go on (not a text or idx column)
        return {key: value for key, value in inputs.items() if backbone.takes_input(key)}, batch[label_key]
    tensors = [key for key, value in inputs.items() if isinstance(value, torch.Tensor)]
    if len(tensors) != 1:
        raise ValueError(
            f"a batch has inputs {sorted(inputs)} but this {backbone.library} model "
            f"takes {backbone.input_key!r}; rename the input column to {backbone.input_key!r}."
        )
    return {backbone.input_key: inputs[tensors[0]]}, batch[label_key]


def in_batches(positions: Sequence[int], batch_and_row: Callable[[int], Tuple[int, int]]) -> str:
    """``"77 (batch 1, row 27, counted from 0)"``, or ``"77, 120 (in batches 1, 2, counted from 0)"``: sample positions
    in the user's data with the user's batches that hold them (``batch_and_row(position)``: its batch and its row there)."""
    if len(positions) == 1:
        batch, row = batch_and_row(positions[0])
        return f"{positions[0]} (batch {batch}, row {row}, counted from 0)"
    batches = sorted({batch_and_row(position)[0] for position in positions})
    return f"{describe_positions(positions)} (in batch{'es' if len(batches) > 1 else ''} {describe_positions(batches)}, counted from 0)"


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


class BatchBuilder:
    """Samples copied into one batch of ``size`` rows as they arrive, each sample copied once.

    What it holds is its own copy, so a source that refills one buffer for every batch it hands
    over does not change samples already taken. Token sequences of different lengths are padded
    on the right (``pad_id`` for ``input_ids``, 0 otherwise) to the longest of the batch; inputs of
    other differing shapes are refused, naming both shapes. With ``reuse``, every batch is built in
    the same tensors (one allocation for a whole pass, which keeps the allocator from scattering
    long-lived rows between freed batches): a batch from :meth:`take` is valid until the next :meth:`add`.
    """

    def __init__(self, size: int, pad_id: int, *, reuse: bool = False) -> None:
        self.size, self.pad_id, self.reuse = size, pad_id, reuse
        self.filled = 0
        self._inputs: Dict[str, Any] = {}
        self._widths: Dict[str, int] = {}  # the longest token sequence of the batch, per token field
        self._labels: Optional[torch.Tensor] = None

    def add(self, batch: Batch, start: int, stop: int) -> None:
        """Copy samples ``start`` to ``stop - 1`` of ``batch`` in after those already held."""
        inputs, labels = batch
        end = self.filled + stop - start
        for key, value in inputs.items():
            if not isinstance(value, torch.Tensor):
                self._inputs.setdefault(key, value)
                continue
            target = self._room(key, value)
            if _is_token_field(value):
                target[self.filled : end, : value.shape[1]] = value[start:stop]
                target[self.filled : end, value.shape[1] :] = _pad_value(key, self.pad_id)
                self._widths[key] = max(self._widths.get(key, 0), value.shape[1])
            else:
                target[self.filled : end] = value[start:stop]
        if self._labels is None:
            self._labels = torch.empty(self.size, dtype=labels.dtype, device=labels.device)
        self._labels[self.filled : end] = labels[start:stop]
        self.filled = end

    def _room(self, key: str, value: torch.Tensor) -> torch.Tensor:
        """The batch tensor of ``key``, made (or widened, for longer token sequences) to take rows like ``value``."""
        held = self._inputs.get(key)
        if held is None:
            held = torch.empty((self.size, *value.shape[1:]), dtype=value.dtype, device=value.device)
        elif _is_token_field(value) and held.ndim == 2 and value.shape[1] > held.shape[1]:
            wider = torch.empty((self.size, value.shape[1]), dtype=held.dtype, device=held.device)
            wider[: self.filled, : held.shape[1]] = held[: self.filled]
            wider[: self.filled, held.shape[1] :] = _pad_value(key, self.pad_id)
            held = wider
        elif held.shape[1:] != value.shape[1:] and not (_is_token_field(value) and held.ndim == 2):
            raise ValueError(
                f"the samples differ in size: {tuple(held.shape[1:])} and {tuple(value.shape[1:])} for {key!r}. "
                "A calibration holds at one input size; resize or crop them all to one size (the size you will run the model at)."
            )
        self._inputs[key] = held
        return held

    def take(self) -> Batch:
        """The samples held, as one batch (token fields cut to the batch's longest sequence); the builder starts empty again."""
        inputs = {key: (value[: self.filled, : self._widths[key]] if key in self._widths else value[: self.filled])
                  if isinstance(value, torch.Tensor) else value for key, value in self._inputs.items()}
        batch = (inputs, self._labels[: self.filled])
        self.filled, self._widths = 0, {}
        if not self.reuse:
            self._inputs, self._labels = {}, None
        return batch


def _is_token_field(value: torch.Tensor) -> bool:
    """Token ids, masks, type ids: (n, length) integer tensors, padded on the right to join batches."""
    return value.ndim == 2 and not value.is_floating_point()


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``start`` to ``stop - 1`` of a batch."""
    inputs, labels = batch
    return {key: value[start:stop] if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}, labels[start:stop]


def relabelled(row: Mapping[str, Any], column: Optional[str]) -> Mapping[str, Any]:
    """A dict sample or batch with its labels under ``"labels"`` instead of ``column`` (unchanged without that column)."""
    if not column or column not in row:
        return row
    return {key: value for key, value in row.items() if key != column} | {"labels": row[column]}


def sample_collate(backbone: Backbone, label_column: Optional[str] = None) -> Callable[[List[Any]], Batch]:
    """Collate samples as the user holds them — dicts (transformers convention; labels under ``label_column`` or the
    usual keys) or ``(input, label)`` pairs — into a batch."""
    pad_id = pad_token_id(backbone)

    def collate(items: List[Any]) -> Batch:
        if isinstance(items[0], Mapping):
            items = [relabelled(item, label_column) for item in items]
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
            f"the samples differ in size: {shapes[0]} and {shapes[1]} in one batch. A calibration holds at "
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
