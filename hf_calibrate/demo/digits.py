"""The zoo's two digits models: a timm ``resnet10t`` and a tiny transformers ViT, trained from scratch on 32×32 digits."""

from __future__ import annotations

from typing import Any

import datasets
import torch
from torch import nn

from .training import Trained, fit_and_test, images_of, label_names, pixel_stats


def train_digits_timm_cnn(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """resnet10t on 32×32 digits; the model's ``pretrained_cfg`` holds all preprocessing facts."""
    import timm
    from timm.data import create_transform, resolve_data_config

    mean, std = pixel_stats(dataset["train"])
    registry_cfg = timm.models.get_pretrained_cfg(hparams["architecture"])
    pretrained_cfg = {
        "architecture": hparams["architecture"],
        "input_size": (3, hparams["image_size"], hparams["image_size"]),
        "interpolation": "bilinear",
        "crop_pct": 1.0,
        "crop_mode": "center",
        "mean": (mean,) * 3,
        "std": (std,) * 3,
        "num_classes": len(label_names(dataset)),
        "label_names": tuple(label_names(dataset)),
        "first_conv": registry_cfg.first_conv,
        "classifier": registry_cfg.classifier,
        "description": "hf_calibrate demo zoo: trained from scratch on scikit-learn digits",
    }
    num_classes = pretrained_cfg["num_classes"]
    model = timm.create_model(hparams["architecture"], num_classes=num_classes, pretrained_cfg=pretrained_cfg)
    transform = create_transform(**resolve_data_config(model=model), is_training=False)

    def tensors(split: str) -> torch.Tensor:
        return torch.stack([transform(image) for image in images_of(dataset[split])])

    metrics = fit_and_test(model, tensors, dataset, hparams, desc="digits-timm-cnn", progress=progress)
    return model, resolve_data_config(model=model), metrics


class _LogitsOf(nn.Module):
    """``model(x).logits`` as a plain module (for the shared training loop)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs).logits


def train_digits_vit(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """A tiny ViT trained from scratch on 32×32 digits (4×4 patches)."""
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    names = label_names(dataset)
    mean, std = pixel_stats(dataset["train"])
    processor = ViTImageProcessor(
        size={"height": hparams["image_size"], "width": hparams["image_size"]},
        resample=Image.Resampling.BILINEAR,
        image_mean=[mean] * 3,
        image_std=[std] * 3,
    )
    config = ViTConfig(
        **hparams["config"],
        image_size=hparams["image_size"],
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={name: index for index, name in enumerate(names)},
    )
    model = ViTForImageClassification(config)

    def tensors(split: str) -> torch.Tensor:
        return processor(images=images_of(dataset[split]), return_tensors="pt")["pixel_values"]

    metrics = fit_and_test(_LogitsOf(model), tensors, dataset, hparams, desc="digits-vit", progress=progress)
    return model, processor, metrics
