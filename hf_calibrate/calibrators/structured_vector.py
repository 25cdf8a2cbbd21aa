"""Structured vector scaling: per-class scales and biases on smoothed, temperature-scaled log-probabilities.

**Structured vector scaling** (Berta, Holzmüller, Jordan & Bach, AISTATS 2026), as probmetrics'
``svs`` calibrator does it by default::

    x = log((1 − ε) softmax(β z) + ε / C),      ε = smoothing / (N + 1)
    calibrated logits = (1 + v) ⊙ x + b

β is the temperature-scaling optimum on the same N calibration rows (fitted first, without a
penalty; 1 on separable rows, as the ``temperature`` method keeps it), the uniform mixture ε bounds
every log-probability below by log(ε / C), and v, b ∈ R^C minimise

    mean NLL + λ · (C / N) · (‖v‖₂² + ‖b‖₂²)

a ridge towards (smoothed) temperature scaling, v = b = 0, whose strength falls as the data grow.
The objective is convex in (v, b); L-BFGS (:func:`.lbfgs.minimise`) finds its minimum. Unlike
:class:`~hf_calibrate.calibrators.VectorScaling` (a ⊙ z + b on the logits, its pull chosen by
cross-fitting) the penalty is fixed, and the map acts on log-probabilities, so the log-sum-exp of
each row enters per class. Why it is here: on the zoo's three models its default beat temperature
scaling on test NLL in every case, where our vector scaling did not (benchmarks/results/safe_defaults.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

import torch
import torch.nn.functional as F
from torch import nn

from . import lbfgs
from .base import Calibrator, Range, check_fields, ranged, require
from .requirements import DataRequirements
from .temperature import fit_inverse_temperature, is_separable_fit, separable_message, temperature_warnings

#: λ: finite and non-negative, at most 1e6 (0: no ridge)
STRENGTH = Range(0.0, 1e6)
#: s of the mixture weight ε = s / (N + 1): at most 1, so that ε < 1 on any data (0: no mixture)
SMOOTHING = Range(0.0, 1.0)
#: a scale offset or bias beyond this, with no ridge, means the data (nearly) separate some class
LARGE_PARAMETER = 100.0


def smoothed_log_probabilities(logits: torch.Tensor, beta: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """(N, C) log((1 − ε) softmax(β z) + ε / C) of (N, C) logits z, computed without forming the probabilities."""
    classes = logits.shape[1]
    log_p = F.log_softmax(logits * beta, dim=1)
    if float(epsilon) == 0.0:
        return log_p
    return torch.logaddexp(log_p + torch.log1p(-epsilon), (epsilon / classes).log().expand_as(log_p))


class StructuredVectorScaling(Calibrator):
    """``(1 + v) ⊙ x + b`` on the smoothed temperature-scaled log-probabilities ``x``; see the module docstring."""

    method = "structured_vector"
    title = "structured vector scaling"
    description = ("Each class's temperature-scaled log-probability, smoothed by a small uniform mixture (weight "
                   "1/(N + 1) by default), gets its own scale and bias, fitted on the NLL with a fixed ridge towards "
                   "temperature scaling (Berta, Holzmüller, Jordan & Bach, 2026).")
    citation = (
        "@inproceedings{berta2026structured, title={Structured Matrix Scaling for Multi-Class Calibration}, author={Berta, "
        "Eug{\\`e}ne and Holzm{\\\"u}ller, David and Jordan, Michael I. and Bach, Francis}, booktitle={AISTATS}, year={2026}}"
    )
    #: as the linear maps', without advised rows: nothing is selected on held-out data
    requirements = DataRequirements(rows=10, classes=2, errors=1, per_class=True)

    @dataclasses.dataclass
    class Options:
        """Fit options of structured vector scaling (defaults: probmetrics' ``svs``).

        Attributes:
            l2: λ of the ridge λ · (C / N) · (‖v‖₂² + ‖b‖₂²) on the per-class scale offsets v and biases b,
                in [0, 1e6] (default 1.0; 0 fits them on the NLL alone, unbounded on separable data).
            smoothing: s of the uniform mixture weight ε = s / (N + 1) applied to the temperature-scaled
                probabilities before their log, in [0, 1] (default 1.0; 0 uses the log-probabilities as they are).
            max_iter: L-BFGS iterations at most, at least 1 (default 500).
        """

        l2: float = ranged(1.0, STRENGTH)
        smoothing: float = ranged(1.0, SMOOTHING)
        max_iter: int = 500

        def __post_init__(self) -> None:
            check_fields(self)
            require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.scale_offset = nn.Parameter(torch.zeros(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.register_buffer("inverse_temperature", torch.ones(()))
        self.register_buffer("epsilon", torch.zeros(()))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        x = smoothed_log_probabilities(logits, self.inverse_temperature.to(logits.dtype), self.epsilon.to(logits.dtype))
        return x * (1 + self.scale_offset.to(logits.dtype)) + self.bias.to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "StructuredVectorScaling.Options") -> Dict[str, Any]:
        rows, classes = logits.shape
        work = logits.detach().double()
        fitted_beta, _ = fit_inverse_temperature(work, labels)
        separable = is_separable_fit(fitted_beta, work, labels)
        beta = 1.0 if separable else fitted_beta  # as the temperature method keeps it
        epsilon = torch.tensor(options.smoothing / (rows + 1), dtype=torch.float64, device=work.device)
        x = smoothed_log_probabilities(work, torch.tensor(beta, dtype=torch.float64, device=work.device), epsilon)
        strength = options.l2 * classes / rows
        offset, bias = (torch.zeros(classes, dtype=torch.float64, device=work.device, requires_grad=True) for _ in range(2))

        def objective() -> torch.Tensor:
            return F.cross_entropy(x * (1 + offset) + bias, labels) + strength * (offset.square().sum() + bias.square().sum())

        summary = lbfgs.minimise([offset, bias], objective, options.max_iter, "structured vector scaling")
        lines = [separable_message(rows)] if separable else temperature_warnings(beta, work, labels, method=self.method, start=True)
        largest = float(torch.cat([offset.detach(), bias.detach()]).abs().max())
        if largest > LARGE_PARAMETER:
            lines.append(f"structured_vector: a per-class scale offset or bias reached {largest:.3g}: the data (nearly) "
                         f"separate some class at l2={options.l2:g}; pass a larger l2 (the default is 1).")
        if not summary["converged"]:
            lines.append(f"structured_vector: the fit stopped after max_iter={options.max_iter} iterations without converging; "
                         "pass a larger max_iter or a larger l2.")
        if summary.get("interrupted"):
            lines.append("structured_vector: interrupted (Ctrl-C) during the fit: the best state so far is kept.")
        with torch.no_grad():
            self.scale_offset.copy_(offset.detach())
            self.bias.copy_(bias.detach())
            self.inverse_temperature.fill_(beta)
            self.epsilon.fill_(float(epsilon))
        return {**summary, "temperature": 1.0 / beta, "l2": options.l2, "strength": strength, "epsilon": float(epsilon),
                "largest_scale_offset": float(offset.detach().abs().max()), "largest_bias": float(bias.detach().abs().max()),
                "warnings": lines}

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, epsilon={float(self.epsilon):.3g}"
