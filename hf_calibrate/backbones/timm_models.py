"""Adapter for timm classifiers: tensor in, logits out; δ lives in normalised pixel space."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from .base import Backbone, Inputs


def is_timm_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("timm.") and hasattr(model, "pretrained_cfg")


class TimmBackbone(Backbone):
    """Any ``timm.create_model(...)`` classifier; ``pretrained_cfg`` supplies preprocessing facts."""

    library = "timm"
    modality = "image"
    delta_space = "pixel_values"
    input_key = "pixel_values"

    @property
    def num_classes(self) -> int:
        return int(self.model.num_classes)

    @property
    def id2label(self) -> Optional[Dict[int, str]]:
        names = self.model.pretrained_cfg.get("label_names")
        if names and len(names) == self.num_classes:
            return {index: str(name) for index, name in enumerate(names)}
        return None

    def default_delta_shape(self) -> Tuple[int, ...]:
        return tuple(int(v) for v in self.model.pretrained_cfg["input_size"])

    def preprocessing(self) -> Dict[str, Any]:
        cfg = self.model.pretrained_cfg
        keys = ("input_size", "mean", "std", "interpolation", "crop_pct", "crop_mode")
        return {key: (list(cfg[key]) if isinstance(cfg[key], tuple) else cfg[key]) for key in keys if key in cfg}

    def forward(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Any]:
        extra = sorted(set(inputs) - {self.input_key})
        if extra:
            raise TypeError(f"timm models take only the image tensor; unexpected inputs {extra}.")
        pixels = inputs[self.input_key]
        if delta is not None:
            self.check_delta(pixels, delta, per_sample_dims=delta.ndim)
            pixels = pixels + delta.to(pixels.dtype)
        logits = self.check_logits(self.model(pixels))
        return logits, None

    def wrap_output(self, logits: torch.Tensor, raw_output: Any, positional: bool, loss: Optional[torch.Tensor]) -> Any:
        if positional:
            return logits
        from transformers.modeling_outputs import ImageClassifierOutput

        return ImageClassifierOutput(loss=loss, logits=logits)
