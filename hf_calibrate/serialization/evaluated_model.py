"""Whose results an evaluation is: the identity of the calibrated model it was computed on, and the check that
results go only into the card of that very model.

A :meth:`CalibratedModel.evaluate` result carries it under :data:`IDENTITY_KEY`: the SHA-256 of the bytes a save
writes to ``calibration.safetensors`` for its calibrator, and its base's weights fingerprint. A saved calibration's
record holds the same two (``files.sha256`` of its weights file, ``base_model.fingerprint``), so results pushed into
a card are compared with the calibration that card describes.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Optional

from ..calibrators import Calibrator
from .identity import calibration_bytes
from .schema import ArtifactError

#: the key of an evaluation that holds the identity of the model it was computed on
IDENTITY_KEY = "model_identity"
#: the parts of an identity that must agree (the description only words them)
_COMPARED = ("calibration_sha256", "base_fingerprint")


def calibration_sha256(calibrator: Calibrator) -> str:
    """SHA-256 (hex) of the bytes a save writes to ``calibration.safetensors`` for ``calibrator``."""
    return hashlib.sha256(calibration_bytes(calibrator)).hexdigest()


def _identity(method: str, digest: str, fingerprint: Optional[str]) -> Dict[str, Any]:
    """An identity: the two compared parts, and a description that names them."""
    base = f"a base with weights fingerprint {fingerprint[:19]}…" if fingerprint else "a base without a recorded fingerprint"
    described = f"a {method} calibration (calibration.safetensors sha256 {digest[:12]}…) of {base}"
    return {"calibration_sha256": digest, "base_fingerprint": fingerprint, "description": described}


def model_identity(model: Any) -> Dict[str, Any]:
    """The identity of a calibrated model (its ``calibrator``, ``method`` and ``provenance``' base fingerprint, which
    the saved record's ``base_model.fingerprint`` is)."""
    return _identity(model.method, calibration_sha256(model.calibrator), model.provenance.get("base_fingerprint"))


def recorded_identity(record: Dict[str, Any]) -> Dict[str, Any]:
    """The identity of the calibration a (validated) record describes."""
    files = record["files"]
    return _identity(record["method"], files["sha256"][files["weights"]], record["base_model"].get("fingerprint"))


def check_results_owner(
    identity: Dict[str, Any], record: Dict[str, Any], target: str, *, evaluated: Optional[str] = None
) -> None:
    """Refuse results of the model ``identity`` names going into the card of ``target``, whose record is ``record``,
    unless they are the same calibration of the same base; ``evaluated``: how the caller names the evaluated model."""
    held = recorded_identity(record)
    if all(identity.get(key) == held[key] for key in _COMPARED):
        return
    named = f"{evaluated} ({identity['description']})" if evaluated else identity["description"]
    raise ArtifactError(
        f"these results were computed on {named}, but {target} holds another model, {held['description']}: results "
        f"go only into the card of the model they were computed on. Push the results of that very model (into the "
        f"folder or repo it was saved to), or evaluate {target} itself and push its results."
    )
