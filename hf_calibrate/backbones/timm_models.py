"""Adapter for timm classifiers: tensor in, logits out; δ lives in normalised pixel space."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .base import Backbone, Inputs
from .preprocessing import image_preprocessing, processor_sizes, timm_facts, timm_test_time_facts


def is_timm_model(model: nn.Module) -> bool:
    return type(model).__module__.startswith("timm.") and hasattr(model, "pretrained_cfg")


class TimmBackbone(Backbone):
    """Any ``timm.create_model(...)`` classifier; ``pretrained_cfg`` supplies preprocessing facts.

    ``pretrained_cfg["input_size"]`` is the size the model declares; a calibration takes the
    size of its data (a CNN runs at any size), and the saved model's ``pretrained_cfg`` records it. Its
    test-time ``test_input_size`` / ``test_crop_pct`` are not used (:func:`.preprocessing.unused_test_time_settings`).
    """

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

    def declared_input_sizes(self, preprocessor: Any = None) -> List[Tuple[str, Tuple[int, ...]]]:
        return [("its pretrained_cfg['input_size']", self.default_delta_shape()), *processor_sizes(preprocessor)]

    def test_time_preprocessing(self) -> Dict[str, Any]:
        return timm_test_time_facts(self.model.pretrained_cfg)

    def declared_classifier(self) -> Optional[str]:
        name = self.model.pretrained_cfg.get("classifier")
        return name if isinstance(name, str) else None  # distilled models name two: ("head", "head_dist")

    def preprocessing(self, preprocessor: Any = None, *, max_length: Optional[int] = None,
                      input_size: Optional[Tuple[int, ...]] = None) -> Dict[str, Any]:
        model_facts = {"source": "timm pretrained_cfg", **timm_facts(self.model.pretrained_cfg)}
        if input_size is not None:
            _fit_channels(model_facts, int(input_size[0]))
        return image_preprocessing(model_facts, preprocessor, input_size)

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


def _fit_channels(facts: Dict[str, Any], channels: int) -> None:
    """Per-channel mean and std of another channel count become their average, as timm's export does."""
    for key in ("mean", "std"):
        value = facts.get(key)
        if isinstance(value, list) and len(value) not in (1, channels):
            facts[key] = [sum(value) / len(value)]
