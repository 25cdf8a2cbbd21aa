"""A zoo model's cache folder: written atomically in its library's own format, read back with the library's loader.

timm models are saved with timm's ``save_for_hf`` (also loadable by transformers' ``TimmWrapper``),
transformers models with ``save_pretrained`` beside their preprocessor; both load through
:func:`hf_calibrate.backbones.loading.load_model_folder`, as ``hf-calibrate --model <folder>`` does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch import nn

from .._console import messages_dropped
from ..backbones.loading import load_model_folder


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' loading/saving progress bars and its load report (we check the keys ourselves).

    The report is filtered out rather than the logger's level raised: transformers 5.24 runs
    a tensor-parallel plan check, with its own warnings, when that level is WARNING or above.
    """
    from transformers.utils import logging as hf_logging

    def no_bar(factory: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        return factory(*args, **{**kwargs, "disable": True})

    previous_hook = hf_logging.set_tqdm_hook(no_bar)
    try:
        with messages_dropped("transformers.modeling_utils", "LOAD REPORT"):
            yield
    finally:
        hf_logging.set_tqdm_hook(previous_hook)


def save_timm(model: nn.Module, preprocessor: Any, folder: Path) -> None:
    """timm's own export (``config.json`` + ``model.safetensors``), also loadable by transformers.

    For ``AutoModelForImageClassification`` (``TimmWrapper``) the label names are written at
    the root too, and ``model_args.num_classes`` is dropped: timm 1.0.31 always writes it and
    TimmWrapper 5.24 then passes ``num_classes`` twice. timm reads the root ``num_classes``.
    """
    from timm.models import save_for_hf

    labels = {"label_names": list(model.pretrained_cfg["label_names"])}
    save_for_hf(model, str(folder), model_config=labels, safe_serialization=True)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["model_args"].pop("num_classes")
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def save_transformers(model: nn.Module, preprocessor: Any, folder: Path) -> None:
    """``save_pretrained`` of the model and of its tokenizer or image processor."""
    with quiet_transformers():
        model.save_pretrained(folder)
    preprocessor.save_pretrained(folder)


def load_zoo_folder(folder: Path, library: str) -> tuple[nn.Module, Any]:
    """(model in eval mode, preprocessor) of a zoo folder of ``library`` (``"timm"`` or ``"transformers"``); a timm
    model's preprocessor is its data config (``resolve_data_config(model=model)``)."""
    with quiet_transformers():
        model, preprocessor = load_model_folder(folder, str(folder))
    if library == "timm":
        from timm.data import resolve_data_config

        preprocessor = resolve_data_config(model=model)
    return model, preprocessor
