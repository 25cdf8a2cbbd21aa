"""The adapter contract: how one code path drives any supported classifier.

An adapter wraps a frozen base model and knows
* how a call to the base model is spelled (positional tensor for timm, keywords for
  transformers) and how to answer it (tensor or ``ModelOutput``),
* where a universal perturbation δ lives (``pixel_values``, word embeddings, plain input),
  its shape, and how to add it,
* how to get (N, C) logits, and which layer is the classifier head (for head retraining):
  the layer the user names (``classifier=``), else the single ``nn.Linear`` with one output
  per class, else a documented guess with a warning naming the candidates.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .._errors import UserError
from .._probabilities import LOGITS, PROBABILITIES, as_logits, rows_not_softmax
from .._warnings import warn_user
from ..metrics._checks import describe_positions

Inputs = Dict[str, Any]


def format_size(shape: Any) -> str:
    """``(1, 8, 8)`` → ``"1×8×8"``."""
    return "×".join(str(int(v)) for v in shape)


class ClassifierLayerError(ValueError):
    """The layer taken as the classifier (named with ``classifier=``, or guessed) does not output the model's logits:
    a head trained in its place would be scored on outputs the model transforms further."""


@dataclasses.dataclass
class ClassifierCapture:
    """What :meth:`Backbone.features_captured` records per forward pass: the classifier layer's inputs (N, d) and its
    outputs (N, C)."""

    inputs: List[torch.Tensor] = dataclasses.field(default_factory=list)
    outputs: List[torch.Tensor] = dataclasses.field(default_factory=list)


class InputSizeError(ValueError):
    """An input whose per-sample shape is not the one the calibration perturbation δ was fitted for.

    Attributes:
        expected: δ's shape (the calibrated per-sample input shape in δ space).
        actual: the per-sample shape of the offending input.
    """

    def __init__(self, message: str, *, expected: Tuple[int, ...], actual: Tuple[int, ...]) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class Backbone(ABC):
    """Adapter over a frozen base classifier. Subclasses set the class attributes."""

    library: str  # "timm" | "transformers" | "torch"
    modality: str  # "image" | "text" | "tensor"
    delta_space: str  # "pixel_values" | "inputs_embeds" | "input"
    input_key: str  # keyword that carries the main input in a batch
    #: what the base returns: LOGITS, or PROBABILITIES (its forward ends in a softmax; :meth:`check_logits` reads their log)
    outputs: str = LOGITS
    #: the ``max_length`` texts were truncated at for the calibration (its ``input_contract``'s), for messages; None: not known
    calibrated_max_length: Optional[int] = None

    def __init__(self, model: nn.Module, classifier: Optional[str] = None) -> None:
        self.model = model
        self._classifier: Optional[Tuple[str, nn.Linear]] = None
        if classifier is not None:
            self._classifier = self._named_classifier(classifier)

    # ------------------------------------------------------------------ facts
    @property
    @abstractmethod
    def num_classes(self) -> Optional[int]:
        """Number of classes, or None when only a forward pass can tell (plain modules)."""

    @property
    def id2label(self) -> Optional[Dict[int, str]]:
        """Class names by index, when the model records them."""
        return None

    @abstractmethod
    def default_delta_shape(self) -> Optional[Tuple[int, ...]]:
        """Shape δ has at the input size the model's config declares, or None when it declares none.

        A calibration's δ takes the shape of the data it is fitted on (:meth:`delta_shape`),
        which may differ from this (a timm CNN used at 32×32 declares 224×224).
        """

    def token_vocabularies(self) -> Dict[str, int]:
        """Each input holding token ids (``input_ids``, ``token_type_ids``) and how many ids the model embeds for it
        (empty for a model of other inputs)."""
        return {}

    def takes_input(self, name: str) -> bool:
        """Whether the model's forward takes an input called ``name`` (other data columns are not passed)."""
        return name == self.input_key

    def input_size(self, inputs: Inputs) -> Optional[Tuple[int, ...]]:
        """Per-sample shape of the main input of the batch ``inputs`` (None for text: no fixed size)."""
        return tuple(int(v) for v in inputs[self.input_key].shape[1:])

    def delta_shape(self, inputs: Inputs) -> Tuple[int, ...]:
        """Shape of δ for inputs like the batch ``inputs``: one tensor shaped like one input."""
        return tuple(int(v) for v in inputs[self.input_key].shape[1:])

    def declared_input_sizes(self, preprocessor: Any = None) -> List[Tuple[str, Tuple[int, ...]]]:
        """(where, size) of every input size the model or ``preprocessor`` declares; trailing
        dimensions only when the source fixes no channel count (an image processor's (H, W))."""
        return []

    def test_time_preprocessing(self) -> Dict[str, Any]:
        """Test-time preprocessing settings the model's config recommends besides its default ones, keyed by the
        setting each would replace (timm: ``test_input_size`` as ``input_size``, ``test_crop_pct`` as ``crop_pct``);
        empty when it recommends none."""
        return {}

    def preprocessing(self, preprocessor: Any = None, *, max_length: Optional[int] = None,
                      input_size: Optional[Tuple[int, ...]] = None) -> Dict[str, Any]:
        """Preprocessing facts of the model's inputs (mean, std, input size, max_length, ...), when known.

        ``preprocessor`` (image processor or tokenizer) and ``max_length`` are those of a fit;
        ``input_size`` is the calibrated input size, which replaces any declared one.
        """
        return {"input_size": list(input_size)} if input_size is not None else {}

    # ------------------------------------------------------------------ calls
    def parse_call(self, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tuple[Inputs, bool]:
        """Turn a call spelled like the base model's into (inputs dict, called positionally)."""
        kwargs = dict(kwargs)
        if args:
            if len(args) > 1 or self.input_key in kwargs:
                raise TypeError(
                    f"pass the input once, either positionally or as {self.input_key}=...; "
                    f"got {len(args)} positional argument(s) and keywords {sorted(kwargs)}."
                )
            kwargs[self.input_key] = args[0]
        if self.input_key not in kwargs:
            raise TypeError(f"missing the model input: call with a tensor or {self.input_key}=....")
        return kwargs, bool(args)

    @abstractmethod
    def forward(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Any]:
        """Run the base model on ``inputs`` with δ added; return ((N, C) logits, raw output)."""

    def logits(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(N, C) logits of the base model with δ added (δ=None: the plain base model)."""
        return self.forward(inputs, delta)[0]

    def wrap_output(self, logits: torch.Tensor, raw_output: Any, positional: bool, loss: Optional[torch.Tensor]) -> Any:
        """Answer in the base model's own convention, with ``logits`` in place of its logits."""
        return logits

    # ------------------------------------------------------------------ head access
    def classifier_candidates(self) -> List[str]:
        """Names of the ``nn.Linear`` layers with one output per class (every one when C is unknown)."""
        num_classes = self.num_classes
        return [name for name, module in self.model.named_modules()
                if isinstance(module, nn.Linear) and (num_classes is None or module.out_features == num_classes)]

    @property
    def classifier_name(self) -> str:
        """Name (in ``model.named_modules()``) of the classifier layer the head methods replace."""
        return self._resolved_classifier()[0]

    def final_layer(self) -> nn.Linear:
        """The classifier layer producing the C logits: the one head retraining replaces."""
        return self._resolved_classifier()[1]

    def declared_classifier(self) -> Optional[str]:
        """The classifier layer the model's own config names, when it names exactly one."""
        return None

    def _resolved_classifier(self) -> Tuple[str, nn.Linear]:
        if self._classifier is None:
            self._classifier = self._guessed_classifier()
        return self._classifier

    def _named_classifier(self, name: str) -> Tuple[str, nn.Linear]:
        """The layer ``name`` the user chose; an error listing the candidates when it cannot be the classifier.

        ``""`` names the model itself: a bare ``nn.Linear`` passed as the model (features in, logits out).
        """
        module = dict(self.model.named_modules()).get(name) if isinstance(name, str) else None
        num_classes = self.num_classes
        if isinstance(module, nn.Linear) and (num_classes is None or module.out_features == num_classes):
            return name, module
        found = "is not a layer of it" if module is None else (
            f"is a {type(module).__name__}" if not isinstance(module, nn.Linear) else f"has {module.out_features} outputs")
        raise ValueError(
            f"classifier={name!r} cannot be the classifier of {type(self.model).__name__}: it {found}. The classifier "
            f"is an nn.Linear with one output per class ({num_classes if num_classes is not None else 'as many as the model has logits'}); "
            f"candidates: {self.classifier_candidates() or 'none'}."
        )

    def _guessed_classifier(self) -> Tuple[str, nn.Linear]:
        """The declared classifier, else the last ``nn.Linear`` with C outputs; warns when several qualify."""
        candidates = self.classifier_candidates()
        if not candidates:
            raise ValueError(
                f"could not find the classifier layer of {type(self.model).__name__}: no nn.Linear "
                f"with {self.num_classes} outputs. Head-retraining methods need a linear classifier head."
            )
        declared = self.declared_classifier()
        name = declared if declared in candidates else candidates[-1]
        if len(candidates) > 1:
            reason = "the one its config names" if name == declared else "the last one"
            outputs = f" with {self.num_classes} outputs" if self.num_classes is not None else ""
            warn_user(
                f"{type(self.model).__name__} has {len(candidates)} nn.Linear layers{outputs} "
                f"({', '.join(candidates)}); the classifier the head methods replace is {name!r} ({reason}). "
                f"Pass classifier='{name}' to keep this choice, or name another of them."
            )
        return name, dict(self.model.named_modules())[name]

    @contextlib.contextmanager
    def head_replaced(self, head: nn.Module) -> Iterator[None]:
        """Within the block, the base's classifier layer outputs ``head(its input)``.

        A forward hook swaps the output, so every model runs unchanged up to its classifier.
        """
        handle = self.final_layer().register_forward_hook(lambda module, args, output: head(args[0]))
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def features_captured(self) -> Iterator[ClassifierCapture]:
        """Within the block, each forward pass appends the classifier's input (N, d) and output (N, C) to the capture."""
        captured = ClassifierCapture()

        def keep(module: nn.Module, args: Tuple[Any, ...], output: torch.Tensor) -> None:
            captured.inputs.append(args[0])
            captured.outputs.append(output)

        handle = self.final_layer().register_forward_hook(keep)
        try:
            yield captured
        finally:
            handle.remove()

    def check_classifier_output(self, output: Optional[torch.Tensor], logits: torch.Tensor) -> None:
        """Raise :class:`ClassifierLayerError` unless the classifier layer's ``output`` of a batch (None: the layer was
        not called) is the model's (N, C) ``logits`` of it: a head replacing a layer the model transforms further would be trained and scored
        on the wrong outputs. A model whose outputs are probabilities (``outputs``) ends in a softmax of that output:
        the softmax is compared with the probabilities, within a bfloat16 softmax's rounding."""
        if output is not None and output.shape == logits.shape and self._gives(output, logits):
            return
        name = self.classifier_name
        layers = [candidate for candidate in self.classifier_candidates() if candidate != name]
        found = ("is not called in its forward pass" if output is None else
                 f"does not output its logits (its output is {format_size(output.shape)}, the logits "
                 f"{format_size(logits.shape)}{'' if output.shape != logits.shape else ', with other values'}): the model "
                 "transforms it further")
        raise ClassifierLayerError(
            f"the layer {name!r} of {type(self.model).__name__} that the head methods would replace {found}. Name the "
            f"layer whose output is the logits with classifier=... (other nn.Linear layers of one output per class: "
            f"{layers or 'none'}), or use a method that needs no classifier layer (e.g. temperature)."
        )

    def _gives(self, output: torch.Tensor, logits: torch.Tensor) -> bool:
        """Whether the classifier layer's (N, C) ``output`` is what the model returns (its ``logits``, as read)."""
        if self.outputs == PROBABILITIES:
            return torch.allclose(torch.softmax(output.float(), dim=1), logits.float().exp(), rtol=1e-2, atol=1e-3, equal_nan=True)
        return torch.allclose(output.float(), logits.float(), rtol=1e-3, atol=1e-4, equal_nan=True)

    # ------------------------------------------------------------------ checks
    def check_logits(self, logits: Any) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(
                f"{type(self.model).__name__} returned {shape}, expected logits of shape "
                "(batch, num_classes). Calibration needs a classifier that outputs one score per class."
            )
        expected = self.num_classes
        if expected is not None and logits.shape[1] != expected:
            raise ValueError(
                f"{type(self.model).__name__} returned {logits.shape[1]} logits per sample but "
                f"declares {expected} classes."
            )
        return self._read_probabilities(logits) if self.outputs == PROBABILITIES else logits

    def _read_probabilities(self, probabilities: torch.Tensor) -> torch.Tensor:
        """log p of a batch of (N, C) softmax ``probabilities`` (the logits up to a per-row constant); a UserError when
        some row is not a softmax's (the calibration was fitted on a model whose outputs are)."""
        rows = rows_not_softmax(probabilities.detach())
        if rows:
            raise UserError(
                f"{type(self.model).__name__}'s outputs were calibrated as probabilities (its forward ended in a softmax: "
                f"the calibration data's outputs were non-negative and summed to 1), but row(s) {describe_positions(rows)} "
                "of this batch are not. If the model returns logits (its first calibration rows only looked like "
                "probabilities), fit with base_outputs='logits'; else use the calibration with the model it was fitted "
                "on, or fit it again on this model."
            )
        return as_logits(probabilities)

    def warn_if_longer_than_calibrated(self, inputs: Inputs) -> None:
        """Warn, once, when a text of ``inputs`` is longer than :attr:`calibrated_max_length` (text backbones; others
        take no texts)."""

    def check_delta(self, target: torch.Tensor, delta: torch.Tensor, per_sample_dims: int) -> None:
        """Raise a clear error when δ does not fit the per-sample part of ``target``.

        Raises:
            InputSizeError: the input's per-sample shape is not δ's (the calibrated input size).
            ValueError: the input and δ are on different devices.
        """
        sample_shape = tuple(target.shape[target.ndim - per_sample_dims :])
        expected = tuple(delta.shape)
        if sample_shape != expected:
            raise InputSizeError(
                f"the calibration perturbation δ has shape {expected} but this input has per-sample shape "
                f"{sample_shape} ({self.delta_space}): the model was calibrated on inputs of size {format_size(expected)} "
                f"and only holds there. Preprocess inputs to {expected} (the input_size recorded in the input_contract "
                "of calibration_config.json; the saved image processor or timm config resizes to it), or refit the "
                "calibration at the size you use.",
                expected=expected, actual=sample_shape,
            )
        if target.device != delta.device:
            raise ValueError(
                f"the input is on {target.device} but the calibrated model is on {delta.device}; "
                "move the inputs (or the model with .to(device)) so both share one device."
            )


def model_label_names(backbone: Backbone) -> Optional[List[str]]:
    """The model's class names in index order, or None when it only has generic ``LABEL_i`` names."""
    names = recorded_label_names(backbone)
    if names is None or any(name == f"LABEL_{index}" for index, name in enumerate(names)):
        return None
    return names


def recorded_label_names(backbone: Backbone) -> Optional[List[str]]:
    """The names the model's ``id2label`` gives its classes (generic ``LABEL_i`` included), None when incomplete."""
    num_classes = backbone.num_classes
    id2label = backbone.id2label or {}
    names = [str(id2label.get(index, "")) for index in range(num_classes or 0)]
    return names if names and all(names) else None
