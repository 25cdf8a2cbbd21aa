"""``from_pretrained``'s transformers-style options: which keywords it takes, ``dtype`` / ``torch_dtype`` and ``device_map``.

A calibrated model always loads onto one device (δ is added at its input, the calibration acts on its
output); its base may be cast to another floating dtype after its fingerprint was verified.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

#: what ``Trainer`` and ``PreTrainedModel.push_to_hub`` may pass to ``save_pretrained`` (the calibration always saves
#: in safetensors)
TRANSFORMERS_SAVE_KWARGS = {"state_dict", "safe_serialization", "max_shard_size", "variant", "token", "save_function", "push_to_hub"}
#: what ``AutoModelFor*.from_pretrained`` and ``pipeline(...)`` may pass on and that does not change how we load
#: (device_map, dtype and torch_dtype are arguments of their own)
TRANSFORMERS_LOAD_KWARGS = {
    "config", "trust_remote_code", "adapter_kwargs", "attn_implementation",
    "low_cpu_mem_usage", "use_safetensors", "_from_auto", "_from_pipeline", "_commit_hash", "code_revision", "proxies",
}
#: device_map strategies of transformers; one calibrated model always goes to one device
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def backbone_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a module without parameters)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def load_dtype(dtype: Any, torch_dtype: Any) -> Optional[torch.dtype]:
    """The dtype to cast the loaded base to: None keeps the saved one (``None`` or ``"auto"``).

    ``torch_dtype`` is the older name of ``dtype``; both may be given when they name the same dtype.
    """
    if torch_dtype is not None:
        if dtype is not None and _resolve_dtype(dtype) != _resolve_dtype(torch_dtype):
            raise TypeError(f"pass dtype= or torch_dtype= (its older name), not both: got {dtype!r} and {torch_dtype!r}.")
        dtype = torch_dtype
    return _resolve_dtype(dtype)


def _resolve_dtype(dtype: Any) -> Optional[torch.dtype]:
    """``dtype`` as a floating torch dtype; None for ``None`` or ``"auto"``."""
    if dtype is None or dtype == "auto":
        return None
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(
            f"dtype={dtype!r} is not a floating-point dtype; pass 'auto' (the dtype the base was saved in), a torch "
            "dtype such as torch.bfloat16, or its name ('float16', 'bfloat16', 'float32')."
        )
    return resolved


def load_device(device_map: Any) -> Optional[torch.device]:
    """The one device ``device_map`` puts the whole model on (None: leave it where it loads)."""
    if device_map is None:
        return None
    if isinstance(device_map, dict):
        devices = {str(value) for value in device_map.values()}
        if len(devices) != 1:
            raise ValueError(
                f"device_map={device_map!r} splits the model over {sorted(devices)}; a calibrated model runs on one "
                "device (δ is added at its input, the calibration acts on its output). Pass one device, e.g. "
                "device_map='cuda:0', or 'auto'."
            )
        device_map = next(iter(device_map.values()))
    if device_map in DEVICE_MAP_STRATEGIES:
        return _first_accelerator()
    try:
        device = torch.device(device_map)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device_map={device_map!r} names no device; pass e.g. 'cpu', 'cuda:0', 0 or 'auto'.") from None
    _check_device_available(device)
    return device


def _first_accelerator() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _check_device_available(device: torch.device) -> None:
    if device.type in ("meta", "disk"):
        raise ValueError(f"device_map={str(device)!r} cannot hold a model that must run; load to 'cpu' or an accelerator.")
    if device.type == "cpu":
        return
    module = getattr(torch, device.type, None)
    available = module is not None and hasattr(module, "is_available") and module.is_available()
    count = module.device_count() if available and hasattr(module, "device_count") else 0
    if not available or (device.index is not None and device.index >= count):
        raise ValueError(
            f"device_map={str(device)!r} but this machine has no such device ({device.type} devices available: {count}); "
            "pass device_map='cpu' or 'auto'."
        )
