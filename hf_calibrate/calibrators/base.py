"""The calibrator contract.

A calibrator is an ``nn.Module`` holding every fitted parameter of one method. It maps the
base model's (N, C) logits to calibrated (N, C) logits; a method that also perturbs the
input (Neural Clamping) exposes that perturbation as :attr:`Calibrator.input_perturbation`,
which the backbone adapter adds before the base model runs.

Each calibrator class declares
* ``method``: the name users pass to ``CalibratedModel.fit(..., method=...)``;
* ``Options``: a dataclass of its fit options, with defaults and docs;
* ``preserves_argmax``: whether predictions are guaranteed unchanged;
* :meth:`config` / :meth:`from_config`: the shapes and hyper-parameters needed to rebuild an
  empty instance, before its tensors are loaded from ``calibration.safetensors``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

import torch
from torch import nn


@dataclasses.dataclass
class NoOptions:
    """This method has no fit options."""


class Calibrator(nn.Module):
    """Base class: subclasses implement ``forward`` and a fit (logit-space: :meth:`fit_logits`)."""

    method: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    preserves_argmax: ClassVar[bool] = False
    #: True when fitting needs forward passes through the base model (not just cached logits).
    needs_base_model: ClassVar[bool] = False
    #: True when fitting trains a new head on the base's penultimate features.
    needs_features: ClassVar[bool] = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
        self.num_classes = int(num_classes)
        #: set by a fit or by loading a fitted state; an unfitted calibrator refuses to predict
        self.is_fitted = False

    @classmethod
    def create(cls, num_classes: int, options: Any, **facts: Any) -> "Calibrator":
        """An unfitted instance for ``options``; ``facts`` describe the model (e.g. δ's shape)."""
        return cls(num_classes)

    @property
    def input_perturbation(self) -> Optional[torch.Tensor]:
        """δ added to the base model's input, or None for pure logit-space methods."""
        return None

    @property
    def head(self) -> Optional[nn.Module]:
        """A classifier head (features → logits) replacing the base's, or None."""
        return None

    def fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: Any) -> Dict[str, Any]:
        """Fit on cached (N, C) logits and (N,) labels; return a summary for the fit history."""
        raise NotImplementedError(f"{self.method} is not fitted from cached logits.")

    # ------------------------------------------------------------------ persistence
    def config(self) -> Dict[str, Any]:
        """JSON-able facts needed to rebuild an empty instance of the right shapes."""
        return {"num_classes": self.num_classes}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Calibrator":
        return cls(**config)

    def expected_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Name → shape of every tensor in the saved state (for verified loading)."""
        return {name: tuple(tensor.shape) for name, tensor in self.state_dict().items()}

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}"


def parse_options(options_class: type, options: Mapping[str, Any], method: str) -> Any:
    """Build ``options_class(**options)``; unknown names get an error listing the valid ones."""
    valid = {field.name for field in dataclasses.fields(options_class)}
    unknown = sorted(set(options) - valid)
    if unknown:
        listed = ", ".join(sorted(valid)) or "none"
        raise TypeError(f"unknown option(s) {unknown} for method {method!r}; its options are: {listed}.")
    return options_class(**options)


def options_to_dict(options: Any) -> Dict[str, Any]:
    """JSON-able view of an options dataclass (sequences become lists)."""
    result = {}
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        result[field.name] = list(value) if isinstance(value, tuple) else value
    return result
