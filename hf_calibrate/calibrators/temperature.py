"""Temperature scaling (Guo et al., 2017): calibrated logits = z / T, one scalar T > 0.

T is stored as log T. The fit minimises the NLL exactly: as a function of β = 1/T the NLL
``f(β) = mean_i [logsumexp(β z_i) − β z_{i,y_i}]`` is convex, with
``f'(β) = mean_i (E_p[z_i] − z_{i,y_i})`` and ``f''(β) = mean_i Var_p[z_i] ≥ 0``, so a
safeguarded Newton iteration on β converges in a handful of passes over the logits — fewer
than a generic L-BFGS on log T, which matters for 50,000 × 1,000 logits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Tuple

import torch
from torch import nn

from .base import Calibrator, check_fields, check_finite_logits, require

# T is kept within [1e-3, 1e3]: beyond this the model is constant or a hard argmax anyway.
BETA_BOUNDS = (1e-3, 1e3)
_CHUNK_ROWS = 1 << 14


def _nll_derivatives(logits: torch.Tensor, labels: torch.Tensor, beta: float) -> Tuple[float, float, float]:
    """f(β), f'(β), f''(β) of the mean NLL of softmax(β·z).

    Each chunk is computed at the logits' precision (float32 for float32 and narrower inputs) with
    fused row reductions; the per-row results are summed in float64.
    """
    value = slope = curvature = 0.0
    for start in range(0, logits.shape[0], _CHUNK_ROWS):
        z = logits[start : start + _CHUNK_ROWS]
        if z.dtype not in (torch.float32, torch.float64):
            z = z.float()
        z_true = z.gather(1, labels[start : start + _CHUNK_ROWS, None]).squeeze(1)
        scaled = z * beta
        top = scaled.amax(dim=1, keepdim=True)
        weights = scaled.sub_(top).exp_()  # unnormalised softmax, in place: one (rows, C) temporary
        total = weights.sum(dim=1)
        mean_z = torch.linalg.vecdot(weights, z) / total
        mean_z2 = torch.linalg.vecdot(weights.mul_(z), z) / total
        log_norm = top.squeeze(1) + total.log()
        value += float((log_norm - beta * z_true).sum(dtype=torch.float64))
        slope += float((mean_z - z_true).sum(dtype=torch.float64))
        curvature += float((mean_z2 - mean_z.square()).clamp_min(0).sum(dtype=torch.float64))
    n = logits.shape[0]
    return value / n, slope / n, curvature / n


def _newton(logits, labels, beta, low, high, tolerance, step_tolerance, max_iter):
    for iteration in range(1, max_iter + 1):
        _, slope, curvature = _nll_derivatives(logits, labels, beta)
        if slope > 0:
            high = beta
        else:
            low = beta
        if abs(slope) <= tolerance or high / low - 1.0 <= tolerance:
            return beta, iteration
        step = beta - slope / curvature if curvature > 0 else math.nan
        new_beta = step if low < step < high else math.sqrt(low * high)
        if abs(new_beta - beta) <= step_tolerance * beta:
            return new_beta, iteration
        beta = new_beta
    return beta, max_iter


# Above this many rows, Newton first runs on a strided subsample of WARM_START_ROWS rows (to 1e-3).
WARM_START_ROWS = 4096


def fit_inverse_temperature(
    logits: torch.Tensor, labels: torch.Tensor, *, tolerance: float = 1e-10, max_iter: int = 100
) -> Tuple[float, int]:
    """β = 1/T minimising the NLL of softmax(β·logits); returns (β, iterations over all the logits).

    Safeguarded Newton: a bracket [lo, hi] with f'(lo) < 0 < f'(hi) is kept, and a Newton
    step that leaves it is replaced by a geometric bisection. Stops when f'(β) ≈ 0 or the step
    is below the precision of the logits (relative 1e-6 in float32, 1e-12 in float64). Large
    inputs start from the optimum of a strided subsample, so few full passes are needed.
    Logits holding NaN or ±inf are refused (:class:`~hf_calibrate.metrics.NonFiniteError`).
    """
    check_finite_logits(logits)
    low, high = BETA_BOUNDS
    step_tolerance = 1e-12 if logits.dtype == torch.float64 else 1e-6
    beta = 1.0
    if logits.shape[0] > 4 * WARM_START_ROWS:
        stride = logits.shape[0] // WARM_START_ROWS
        beta, _ = _newton(logits[::stride], labels[::stride], beta, low, high, tolerance, 1e-3, max_iter)
    return _newton(logits, labels, beta, low, high, tolerance, step_tolerance, max_iter)


class TemperatureScaling(Calibrator):
    """``z / T``: one scalar, predictions unchanged.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
        >>> ts = TemperatureScaling(num_classes=2)
        >>> _ = ts.fit_logits(logits, torch.tensor([0, 1, 1, 0]), ts.Options())
        >>> round(ts.temperature.item(), 3)  # 3 of 4 right: softmax(4/T) → 0.75
        3.641
    """

    method = "temperature"
    preserves_argmax = True

    @dataclasses.dataclass
    class Options:
        """Fit options of temperature scaling.

        Attributes:
            max_iter: Newton iterations at most (default 100; 5–10 are typical).
        """

        max_iter: int = 100

        def __post_init__(self) -> None:
            check_fields(self)
            require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * torch.exp(-self.log_temperature).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: Any) -> Dict[str, Any]:
        beta, iterations = fit_inverse_temperature(logits.detach(), labels, max_iter=options.max_iter)
        with torch.no_grad():
            self.log_temperature.fill_(-math.log(beta))
        return {"temperature": 1.0 / beta, "iterations": iterations}
