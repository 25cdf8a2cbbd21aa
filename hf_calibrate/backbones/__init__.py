"""Backbone adapters: one interface over timm, transformers vision/text and plain modules."""

from __future__ import annotations

from typing import Optional

from torch import nn

from .base import Backbone, ClassifierLayerError, Inputs, InputSizeError, format_size
from .timm_models import TimmBackbone, is_timm_model
from .torch_modules import TorchBackbone
from .transformers_models import TransformersTextBackbone, TransformersVisionBackbone, outside_vocabulary, transformers_task

SUPPORTED = (
    "timm classifiers (timm.create_model(...)), transformers AutoModelForImageClassification and "
    "AutoModelForSequenceClassification models, or a plain torch.nn.Module mapping a tensor to "
    "(batch, num_classes) logits"
)


def adapt(model: nn.Module, *, num_classes: Optional[int] = None, classifier: Optional[str] = None) -> Backbone:
    """Pick the adapter for ``model``; raise a clear error for unsupported models.

    ``classifier`` names the classifier layer the head methods replace (a name in
    ``model.named_modules()``); default: the one ``nn.Linear`` with one output per class, or a
    guess that warns when there are several. An unknown name is an error listing the candidates.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}. Supported: {SUPPORTED}.")
    if is_timm_model(model):
        if not getattr(model, "num_classes", 0):
            raise TypeError(
                f"this timm {type(model).__name__} has no classifier (num_classes=0); create it with "
                "num_classes > 0 to calibrate it."
            )
        return TimmBackbone(model, classifier)
    task = transformers_task(model)
    if task == "image-classification":
        return TransformersVisionBackbone(model, classifier)
    if task == "text-classification":
        return TransformersTextBackbone(model, classifier)
    if type(model).__module__.startswith("transformers."):
        raise TypeError(
            f"{type(model).__name__} is not a classification model this library can calibrate. "
            f"Supported: {SUPPORTED}."
        )
    return TorchBackbone(model, num_classes=num_classes, classifier=classifier)


__all__ = [
    "Backbone",
    "ClassifierLayerError",
    "InputSizeError",
    "Inputs",
    "SUPPORTED",
    "TimmBackbone",
    "TorchBackbone",
    "TransformersTextBackbone",
    "TransformersVisionBackbone",
    "adapt",
    "format_size",
    "outside_vocabulary",
]
