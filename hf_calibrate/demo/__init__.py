"""Demo zoo: real data shipped in PyPI packages and small real models trained on it, cached.

Optional part of hf_calibrate (``pip install 'hf-calibrate[demo]'``); ``import hf_calibrate``
does not import it.
"""

from .data import load_bbc_news, load_digits
from .models import (
    DemoModel,
    bbc_minilm,
    default_cache_dir,
    digits_timm_cnn,
    digits_vit,
)

__all__ = [
    "DemoModel",
    "bbc_minilm",
    "default_cache_dir",
    "digits_timm_cnn",
    "digits_vit",
    "load_bbc_news",
    "load_digits",
]
