"""Linear maps of the logits (or log-probabilities) fitted by L-BFGS on the NLL.

* vector scaling: ``z' = a ⊙ z + b`` with a > 0 (a = exp(s)) — Guo et al. (2017);
* matrix scaling: ``z' = W z + b`` with ODIR regularisation — Kull et al. (2019);
* Dirichlet calibration: ``z' = W log softmax(z) + b`` with ODIR — Kull et al. (2019).

ODIR ("off-diagonal and intercept regularisation") adds
``λ_od · mean_{i≠j} W_ij² + λ_b · mean_j b_j²`` to the mean NLL.
Each map starts at the temperature-scaling optimum (a = 1/T, W = I/T, b = 0; for Dirichlet
softmax(β·log p) = softmax(β·z), so W = βI is TS too), so L-BFGS starts where TS ends.
None of these maps is guaranteed to keep the argmax: per-class scales and biases can
reorder classes, which may change accuracy (usually slightly).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from .base import Calibrator
from .temperature import fit_inverse_temperature

# Up to this many logits the fit runs in float64; larger problems use float32 for speed.
_FLOAT64_MAX_ELEMENTS = 1 << 24


def _work_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.numel() <= _FLOAT64_MAX_ELEMENTS else torch.float32


def _minimise(parameters: List[torch.Tensor], objective: Callable[[], torch.Tensor], max_iter: int) -> Dict[str, Any]:
    """Minimise ``objective`` over ``parameters`` (leaf tensors) with strong-Wolfe L-BFGS."""
    optimizer = torch.optim.LBFGS(
        parameters, lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
        history_size=20, line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        final_loss = float(objective())
    return {"loss": final_loss, "iterations": int(optimizer.state[parameters[0]].get("n_iter", 0))}


class _LinearLogitMap(Calibrator):
    """Shared fit: copy parameters to a work dtype, L-BFGS on NLL + penalty, copy back."""

    def transform(self, logits: torch.Tensor, parameters: Dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def penalty(self, parameters: Dict[str, torch.Tensor], options: Any) -> torch.Tensor:
        return torch.zeros(())

    def initial_parameters(self, beta: float, dtype: torch.dtype, device: torch.device) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        parameters = {name: tensor.to(logits.dtype) for name, tensor in self.named_parameters()}
        return self.transform(logits, parameters)

    def fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: Any) -> Dict[str, Any]:
        dtype = _work_dtype(logits)
        work_logits = logits.detach().to(dtype)
        beta, _ = fit_inverse_temperature(work_logits, labels)
        parameters = self.initial_parameters(beta, dtype, logits.device)
        for tensor in parameters.values():
            tensor.requires_grad_(True)

        def objective() -> torch.Tensor:
            nll = F.cross_entropy(self.transform(work_logits, parameters), labels)
            return nll + self.penalty(parameters, options)

        summary = _minimise(list(parameters.values()), objective, options.max_iter)
        with torch.no_grad():
            for name, tensor in self.named_parameters():
                tensor.copy_(parameters[name].detach().to(tensor.dtype))
        return summary


def _odir_penalty(weight: torch.Tensor, bias: torch.Tensor, options: Any) -> torch.Tensor:
    classes = weight.shape[0]
    off_diagonal = weight.square().sum() - weight.diagonal().square().sum()
    off_mean = off_diagonal / max(classes * (classes - 1), 1)
    return options.l2_off_diagonal * off_mean + options.l2_bias * bias.square().mean()


@dataclasses.dataclass
class ODIROptions:
    """Fit options of matrix scaling and Dirichlet calibration.

    Attributes:
        l2_off_diagonal: λ_od, weight of the mean squared off-diagonal entry of W (default 1e-2).
        l2_bias: λ_b, weight of the mean squared intercept (default 1e-2).
        max_iter: L-BFGS iterations at most (default 200).
    """

    l2_off_diagonal: float = 1e-2
    l2_bias: float = 1e-2
    max_iter: int = 200


class VectorScaling(_LinearLogitMap):
    """``a ⊙ z + b`` with a per-class positive scale ``a = exp(log_scale)`` and bias ``b``."""

    method = "vector"

    @dataclasses.dataclass
    class Options:
        """Fit options of vector scaling.

        Attributes:
            max_iter: L-BFGS iterations at most (default 200).
        """

        max_iter: int = 200

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.log_scale = nn.Parameter(torch.zeros(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def initial_parameters(self, beta, dtype, device):
        return {
            "log_scale": torch.full((self.num_classes,), math.log(beta), dtype=dtype, device=device),
            "bias": torch.zeros(self.num_classes, dtype=dtype, device=device),
        }

    def transform(self, logits, parameters):
        return logits * parameters["log_scale"].exp() + parameters["bias"]


class MatrixScaling(_LinearLogitMap):
    """``W z + b`` (C×C weights) with ODIR regularisation."""

    method = "matrix"
    Options = ODIROptions

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.weight = nn.Parameter(torch.eye(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def initial_parameters(self, beta, dtype, device):
        return {
            "weight": torch.eye(self.num_classes, dtype=dtype, device=device) * beta,
            "bias": torch.zeros(self.num_classes, dtype=dtype, device=device),
        }

    def transform(self, logits, parameters):
        return F.linear(self.features(logits), parameters["weight"], parameters["bias"])

    def features(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def penalty(self, parameters, options):
        return _odir_penalty(parameters["weight"], parameters["bias"], options)


class DirichletCalibration(MatrixScaling):
    """``W log softmax(z) + b`` with ODIR regularisation (Dirichlet calibration)."""

    method = "dirichlet"

    def features(self, logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits, dim=1)
