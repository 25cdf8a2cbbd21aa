"""A plain classifier from a folder or a timm architecture name, with its preprocessor.

A folder is told apart by its ``config.json``: transformers writes ``architectures`` /
``model_type``, timm's ``save_for_hf`` writes ``architecture``. A transformers folder loads as an
image or sequence classifier (by its architectures), with its image processor or tokenizer when
the folder holds one; a timm model's preprocessing is its own data config (preprocessor None).
Errors are :class:`~hf_calibrate._errors.UserError` naming what to change (wording of the command line,
whose flags ``--no-pretrained`` and ``--num-classes`` map to the arguments here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from torch import nn

from .._errors import UserError

IMAGE_TASK, TEXT_TASK = "image-classification", "text-classification"
ModelAndPreprocessor = Tuple[nn.Module, Any]  # (classifier in eval mode, tokenizer / image processor / None)


def read_model_config(folder: Path) -> Dict[str, Any]:
    """The folder's ``config.json`` as a dict."""
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{folder} holds no config.json: it is not a timm, transformers or hf_calibrate model folder.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error}).") from error


def load_model_folder(folder: Path, name: str) -> ModelAndPreprocessor:
    """A timm or transformers classifier saved in ``folder`` (``name``: how the user named it, for errors)."""
    config = read_model_config(folder)
    if "architectures" in config or "model_type" in config:
        return load_transformers_folder(folder, name, config)
    if "architecture" in config:
        return load_timm_folder(folder), None
    raise UserError(f"{name}: config.json names neither a transformers model ('architectures') nor a timm one ('architecture').")


def load_timm_folder(folder: Path) -> nn.Module:
    """timm's own export (``config.json`` + weights) in eval mode."""
    import timm

    return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()


def create_timm_model(architecture: str, *, pretrained: bool, num_classes: Optional[int]) -> nn.Module:
    """``timm.create_model`` in eval mode; ``num_classes`` (None: the architecture's own) sizes a new head."""
    import timm

    options = {"num_classes": num_classes} if num_classes else {}
    try:
        return timm.create_model(architecture, pretrained=pretrained, **options).eval()
    except Exception as error:  # noqa: BLE001 - a download or weights problem, explained below
        raise UserError(
            f"could not create the timm model {architecture!r} with pretrained weights ({type(error).__name__}: {error}); "
            "the weights must be in the local hub cache when offline, or pass --no-pretrained."
        ) from error


def auto_classes(task: str) -> Tuple[Any, Any]:
    """(transformers Auto model class, Auto preprocessor class) of ``task`` (:data:`IMAGE_TASK` or :data:`TEXT_TASK`)."""
    from transformers import (
        AutoImageProcessor,
        AutoModelForImageClassification,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    if task == IMAGE_TASK:
        return AutoModelForImageClassification, AutoImageProcessor
    return AutoModelForSequenceClassification, AutoTokenizer


def config_task(config: Dict[str, Any], name: str) -> str:
    """The task of a transformers ``config.json``: its ``architectures`` end in ForImageClassification or
    ForSequenceClassification."""
    architectures = config.get("architectures") or []
    if any(arch.endswith("ForImageClassification") for arch in architectures):
        return IMAGE_TASK
    if any(arch.endswith("ForSequenceClassification") for arch in architectures):
        return TEXT_TASK
    raise UserError(
        f"{name} is a transformers {architectures or config.get('model_type')} model, not an image or sequence "
        "classifier (its config.json 'architectures' must end in ForImageClassification or ForSequenceClassification)."
    )


def load_transformers_folder(folder: Path, name: str, config: Dict[str, Any]) -> ModelAndPreprocessor:
    """An image or sequence classifier (by the config's ``architectures``) and its preprocessor (None when the
    folder has none: :func:`hf_calibrate.data.prepare_data` says what is missing if the data need it)."""
    model_class, preprocessor_class = auto_classes(config_task(config, name))
    model = model_class.from_pretrained(str(folder)).eval()
    try:
        preprocessor = preprocessor_class.from_pretrained(str(folder))
    except (OSError, ValueError):
        preprocessor = None
    return model, preprocessor
