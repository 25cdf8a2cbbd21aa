"""The adapter contract: how one code path drives any supported classifier.

An adapter wraps a frozen base model and knows
* how a call to the base model is spelled (positional tensor for timm, keywords for
  transformers) and how to answer it (tensor or ``ModelOutput``),
* where a universal perturbation δ lives (``pixel_values``, word embeddings, plain input),
  its shape, and how to add it,
* how to get (N, C) logits, and which layer is the classifier head (for head retraining).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

Inputs = Dict[str, Any]


class Backbone(ABC):
    """Adapter over a frozen base classifier. Subclasses set the class attributes."""

    library: str  # "timm" | "transformers" | "torch"
    modality: str  # "image" | "text" | "tensor"
    delta_space: str  # "pixel_values" | "inputs_embeds" | "input"
    input_key: str  # keyword that carries the main input in a batch

    def __init__(self, model: nn.Module) -> None:
        self.model = model

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
        """Shape δ takes for this model, or None when it must be read off the data."""

    def preprocessing(self) -> Dict[str, Any]:
        """Preprocessing facts δ depends on (mean, std, input size), when known."""
        return {}

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
    def final_layer(self) -> nn.Linear:
        """The last ``nn.Linear`` producing the C logits: the classifier head retraining replaces."""
        num_classes = self.num_classes
        final = None
        for module in self.model.modules():
            if isinstance(module, nn.Linear) and (num_classes is None or module.out_features == num_classes):
                final = module
        if final is None:
            raise ValueError(
                f"could not find the classifier layer of {type(self.model).__name__}: no nn.Linear "
                f"with {num_classes} outputs. Head-retraining methods need a linear classifier head."
            )
        return final

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
    def features_captured(self) -> Iterator[List[torch.Tensor]]:
        """Within the block, each forward pass appends the classifier's input (N, d) to the list."""
        captured: List[torch.Tensor] = []
        handle = self.final_layer().register_forward_hook(lambda module, args, output: captured.append(args[0]))
        try:
            yield captured
        finally:
            handle.remove()

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
        return logits

    def check_delta(self, target: torch.Tensor, delta: torch.Tensor, per_sample_dims: int) -> None:
        """Raise a clear error when δ does not fit the per-sample part of ``target``."""
        sample_shape = tuple(target.shape[target.ndim - per_sample_dims :])
        if sample_shape != tuple(delta.shape):
            facts = self.preprocessing()
            hint = f" The model's preprocessing: {facts}." if facts else ""
            raise ValueError(
                f"the calibration perturbation δ has shape {tuple(delta.shape)} but this input has "
                f"per-sample shape {sample_shape} ({self.delta_space}). Preprocess inputs to "
                f"{tuple(delta.shape)} as at calibration time.{hint}"
            )
        if target.device != delta.device:
            raise ValueError(
                f"the input is on {target.device} but the calibrated model is on {delta.device}; "
                "move the inputs (or the model with .to(device)) so both share one device."
            )
