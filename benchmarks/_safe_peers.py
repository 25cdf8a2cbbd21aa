"""Other libraries' logit calibrators, each with its own defaults, beside ours in ``bench_safe_defaults.py`` (the ``bench`` extra).

Each peer is a method another library has and ours has too (temperature, vector, matrix and
Dirichlet scaling, histogram binning, isotonic regression, or probmetrics' structured vector /
matrix scaling, its regularised counterparts). ``fit(logits, labels)`` fits it on float32 logits
the way its documentation shows and returns ``test logits → (N, C) float64 probabilities``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from _logit_peers import warnings_logged_off

Predict = Callable[[torch.Tensor], torch.Tensor]


def _netcal(class_name: str, module: str) -> Callable[[torch.Tensor, torch.Tensor], Predict]:
    """netcal's ``class_name()`` fitted on float64 probabilities (netcal takes probabilities, not logits)."""

    def fit(logits: torch.Tensor, labels: torch.Tensor) -> Predict:
        calibrator = getattr(importlib.import_module(module), class_name)()
        calibrator.fit(torch.softmax(logits.double(), 1).numpy(), labels.numpy())

        def predict(test_logits: torch.Tensor) -> torch.Tensor:
            probabilities = torch.as_tensor(calibrator.transform(torch.softmax(test_logits.double(), 1).numpy())).double()
            return probabilities / probabilities.sum(dim=1, keepdim=True)

        return predict

    return fit


def _probmetrics(name: str) -> Callable[[torch.Tensor, torch.Tensor], Predict]:
    """probmetrics ``get_calibrator(name)`` with its defaults, ``fit_torch`` on ``CategoricalLogits``."""

    def fit(logits: torch.Tensor, labels: torch.Tensor) -> Predict:
        from probmetrics.calibrators import get_calibrator
        from probmetrics.distributions import CategoricalLogits

        calibrator = get_calibrator(name)
        calibrator.fit_torch(CategoricalLogits(logits), labels)
        return lambda test_logits: calibrator.predict_proba_torch(CategoricalLogits(test_logits)).get_probs().double()

    return fit


def _torch_uncertainty(class_name: str, per_class: bool) -> Callable[[torch.Tensor, torch.Tensor], Predict]:
    """torch-uncertainty's ``class_name`` (``num_classes=C`` where it needs it) with ``nn.Identity`` as the model,
    fitted by ``.fit(DataLoader([(logits, labels)], batch_size=None), progress=False)``."""

    def fit(logits: torch.Tensor, labels: torch.Tensor) -> Predict:
        module = importlib.import_module("torch_uncertainty.post_processing")
        extra = {"num_classes": logits.shape[1]} if per_class else {}
        scaler = getattr(module, class_name)(model=nn.Identity(), **extra)
        with warnings_logged_off():
            scaler.fit(DataLoader([(logits, labels)], batch_size=None), progress=False)

        def predict(test_logits: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return torch.softmax(scaler(test_logits).double(), dim=1)

        return predict

    return fit


@dataclasses.dataclass(frozen=True)
class SafePeer:
    """A peer's row: ``label``, the module whose import proves it usable, and its ``fit``."""

    label: str
    module: str
    fit: Callable[[torch.Tensor, torch.Tensor], Predict]


PEERS = (
    SafePeer("netcal: temperature", "netcal.scaling", _netcal("TemperatureScaling", "netcal.scaling")),
    SafePeer("netcal: logistic (matrix)", "netcal.scaling", _netcal("LogisticCalibration", "netcal.scaling")),
    SafePeer("netcal: histogram", "netcal.binning", _netcal("HistogramBinning", "netcal.binning")),
    SafePeer("netcal: isotonic", "netcal.binning", _netcal("IsotonicRegression", "netcal.binning")),
    SafePeer("probmetrics: temperature", "probmetrics.calibrators", _probmetrics("temp-scaling")),
    SafePeer("probmetrics: structured vector (svs)", "probmetrics.calibrators", _probmetrics("svs")),
    SafePeer("probmetrics: structured matrix (sms)", "probmetrics.calibrators", _probmetrics("sms")),
    SafePeer("torch-uncertainty: temperature", "torch_uncertainty.post_processing", _torch_uncertainty("TemperatureScaler", False)),
    SafePeer("torch-uncertainty: vector", "torch_uncertainty.post_processing", _torch_uncertainty("VectorScaler", True)),
    SafePeer("torch-uncertainty: matrix", "torch_uncertainty.post_processing", _torch_uncertainty("MatrixScaler", True)),
    SafePeer("torch-uncertainty: dirichlet", "torch_uncertainty.post_processing", _torch_uncertainty("DirichletScaler", True)),
)


def peer_missing(peer: SafePeer) -> Optional[str]:
    """Why ``peer`` cannot run here (its import error), or None."""
    try:
        importlib.import_module(peer.module)
    except ImportError as error:
        return f"{error}; `pip install -e \".[bench]\"`"
    return None


__all__: Any = ["PEERS", "SafePeer", "peer_missing"]
