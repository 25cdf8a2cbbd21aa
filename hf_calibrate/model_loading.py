"""A model named by a string: a local folder, a hub repo id or a timm architecture name, calibrated or not.

What ``hf-calibrate fit / evaluate / compare`` load their ``--model`` with; the plain models come
from :mod:`hf_calibrate.backbones.loading`, calibrations from :meth:`CalibratedModel.from_pretrained`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional

from ._errors import UserError
from .backbones.loading import create_timm_model, load_model_folder


@dataclasses.dataclass
class LoadedModel:
    """A model named by a string, ready for ``fit`` or ``evaluate``.

    Attributes:
        model: the classifier (a ``CalibratedModel`` when ``calibrated``).
        preprocessor: its tokenizer or image processor (None: timm's own data config).
        name: how the user named it.
        calibrated: whether it is an hf_calibrate calibration.
        hub_id: the hub repo its weights came from, when known (the card's ``base_model``).
    """

    model: Any
    preprocessor: Any
    name: str
    calibrated: bool
    hub_id: Optional[str] = None

    @property
    def base(self) -> Any:
        """The uncalibrated classifier (the calibration's base model, or the model itself)."""
        return self.model.base_model if self.calibrated else self.model


def load_model(spec: str, *, revision: Optional[str] = None, token: Optional[str] = None, pretrained: bool = True,
               num_classes: Optional[int] = None) -> LoadedModel:
    """Load ``spec``: a local folder, a timm architecture name, or a hub repo id (calibrated or not).

    ``revision`` and ``token`` apply to hub repos; ``pretrained`` and ``num_classes`` to timm
    architecture names (pretrained weights or random ones; the class count of a new head).
    """
    import timm

    if os.path.isdir(spec):
        return load_folder(Path(spec), spec, token=token)
    if timm.is_model(spec):
        model = create_timm_model(spec, pretrained=pretrained, num_classes=num_classes)
        hub_id = model.pretrained_cfg.get("hf_hub_id") if pretrained else None  # where timm loaded the weights from
        return LoadedModel(model, None, spec, calibrated=False, hub_id=hub_id)
    if num_classes is not None:
        raise UserError(f"--num-classes applies to timm architecture names; {spec!r} is not one.")
    from . import _hub

    try:
        folder = _hub.resolve_folder(spec, revision=revision, token=token)
    except _hub.ArtifactError as error:
        raise UserError(f"unknown model {spec!r} (not a timm architecture name either): {error}") from error
    return dataclasses.replace(load_folder(folder, spec, token=token), hub_id=spec)


def load_folder(folder: Path, name: str, *, token: Optional[str] = None) -> LoadedModel:
    """A calibration, a timm or a transformers model folder, told apart by its JSON files."""
    from .modeling import CalibratedModel
    from .serialization import CALIBRATION_CONFIG

    if (folder / CALIBRATION_CONFIG).is_file():
        model = CalibratedModel.from_pretrained(folder, token=token)
        return LoadedModel(model, model.preprocessor, name, calibrated=True)
    model, preprocessor = load_model_folder(folder, name)
    return LoadedModel(model, preprocessor, name, calibrated=False)
