"""Who a calibrated model is: the bytes its calibration saves to, the fingerprint of its base's weights and the base's
hub reference (repo id and commit)."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Optional

import torch
from safetensors.torch import save
from torch import nn


def calibration_bytes(calibrator: nn.Module) -> bytes:
    """The calibrator's tensors as the bytes of ``calibration.safetensors``. One metadata key only: safetensors writes
    several in a random order, and the same calibration must give the same bytes (and SHA-256) every time."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in calibrator.state_dict().items()}
    return save(tensors, metadata={"format": "pt"})


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of ``model.state_dict()`` (sorted by name)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def hub_reference(model: nn.Module, library: str) -> Dict[str, Optional[str]]:
    """The base's hub repo id and commit, when the model reliably records where it came from.

    transformers models record it (``config._name_or_path`` and ``_commit_hash``); a name that
    is a local path or not a valid repo id is not a hub reference. timm models do not record it
    (their ``pretrained_cfg`` names a hub id whether or not its weights were loaded), so for
    timm pass ``base_model_id`` when saving.
    """
    if library != "transformers":
        return {"repo_id": None, "revision": None}
    name = getattr(model.config, "_name_or_path", None) or None
    if name is not None and (os.path.isdir(name) or repo_id_problem(name)):
        name = None
    revision = getattr(model.config, "_commit_hash", None)
    return {"repo_id": name, "revision": revision if isinstance(revision, str) else None}


def repo_id_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a hub repo id (``namespace/name``), or None when it is one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(value, str):
        return "must be a hub repo id string"
    try:
        validate_repo_id(value)
    except HFValidationError:
        return "is not a hub repo id ('namespace/name'; a local path is not accepted)"
    return None
