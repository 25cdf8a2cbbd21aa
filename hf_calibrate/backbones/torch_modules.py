"""Adapter for a plain ``nn.Module`` mapping one tensor to (N, C) logits."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn

from .base import Backbone, Inputs


class TorchBackbone(Backbone):
    """Any module called as ``model(x) -> logits``; δ has the shape of one sample of ``x``.

    The class count and δ's shape are read off the first batch unless given.
    """

    library = "torch"
    modality = "tensor"
    delta_space = "input"
    input_key = "input"

    def __init__(self, model: nn.Module, num_classes: Optional[int] = None, classifier: Optional[str] = None) -> None:
        self._num_classes = num_classes
        super().__init__(model, classifier)

    @property
    def num_classes(self) -> Optional[int]:
        return self._num_classes

    def default_delta_shape(self) -> None:
        return None

    def forward(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Any]:
        extra = sorted(set(inputs) - {self.input_key})
        if extra:
            raise TypeError(f"a plain module takes one tensor; unexpected inputs {extra}.")
        x = inputs[self.input_key]
        if delta is not None:
            self.check_delta(x, delta, per_sample_dims=delta.ndim)
            x = x + delta.to(x.dtype)
        logits = self.check_logits(self.model(x))
        if self._num_classes is None:
            self._num_classes = int(logits.shape[1])
        return logits, None
