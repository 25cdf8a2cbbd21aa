"""``CalibratedConfig``: the transformers-facing config of a calibrated model (``model_type "hf_calibrate"``).

The full record of a calibration is ``calibration_config.json`` (docs/artifact.md); this config is
what transformers' ``AutoConfig``, the Auto model classes and pipelines read (``config.json``).
"""

from __future__ import annotations

from typing import Any, Dict

from transformers import PreTrainedConfig

#: ``base_task`` of a base of each backbone modality
TASKS: Dict[str, str] = {"image": "image-classification", "text": "text-classification", "tensor": "tensor-classification"}


class CalibratedConfig(PreTrainedConfig):
    """transformers-facing config of a calibrated model (the full record is ``calibration_config.json``).

    Attributes:
        base_library: ``"timm"``, ``"transformers"`` or ``"torch"``.
        base_task: ``"image-classification"``, ``"text-classification"`` or ``"tensor-classification"``.
        calibration_method: the method name, e.g. ``"neural_clamping"``.
    """

    model_type = "hf_calibrate"
    base_library: str = "transformers"
    base_task: str = "image-classification"
    calibration_method: str = "temperature"

    def __post_init__(self, **kwargs: Any) -> None:
        """As transformers' configs, plus ``label2id`` derived from ``id2label`` when not given."""
        super().__post_init__(**kwargs)
        if self.label2id is None and self.id2label:
            self.label2id = {label: index for index, label in self.id2label.items()}
