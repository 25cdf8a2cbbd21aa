"""Structured vector scaling: per-class scales and biases on smoothed, temperature-scaled log-probabilities.

**Structured vector scaling** (Berta, Holzmüller, Jordan & Bach, AISTATS 2026), as probmetrics'
``svs`` calibrator does it by default::

    x = log((1 − ε) softmax(β z) + ε / C),      ε = smoothing / (N + 1)
    calibrated logits = (1 + v) ⊙ x + b

β is the temperature-scaling optimum on the same N calibration rows (fitted first, without a
penalty; 1 on separable rows, as the ``temperature`` method keeps it), the uniform mixture ε bounds
every log-probability below by log(ε / C), and v, b ∈ R^C minimise

    mean NLL + λ · (C / N) · (‖v‖₂² + ‖b‖₂²)

a ridge towards (smoothed) temperature scaling, v = b = 0, whose strength falls as the data grow. N counts
distinct rows (:func:`.holdout.content_groups`): copies of a row add no evidence, so they change neither ε nor the
ridge (probmetrics counts every row; the two agree on data without copies).
The objective is convex in (v, b); L-BFGS (:func:`.solvers.lbfgs.minimise`) finds its minimum. Unlike
:class:`~hf_calibrate.calibrators.VectorScaling` (a ⊙ z + b on the logits, with the same ridge) the
map acts on smoothed log-probabilities, so the log-sum-exp of each row enters per class. Why it is here: on the zoo's three models its default beat temperature
scaling on test NLL in every case, where our vector scaling did not (benchmarks/results/safe_defaults.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from .solvers import lbfgs
from .base import Calibrator
from .options import Range, check_fields, ranged, require
from .holdout import distinct_rows, fit_groups
from .solvers.linear_maps import Ridge, ridge_strengths
from .memory import Footprint, work_dtype
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
    #: the working copy, log-softmax and the smoothed x, the map's output, the cross-entropy's probabilities and
    #: gradient, the backward's products: 11 covers the resident peaks measured in benchmarks/results/fit_cost.md
    footprint = Footprint(rows=11)

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
        self.register_parameter(self.offset_name, nn.Parameter(torch.zeros((num_classes,) * self.offset_dims)))
        self.bias = nn.Parameter(torch.zeros(num_classes))
        self.register_buffer("inverse_temperature", torch.ones(()))
        self.register_buffer("epsilon", torch.zeros(()))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        x = smoothed_log_probabilities(logits, self.inverse_temperature.to(logits.dtype), self.epsilon.to(logits.dtype))
        return self._map(x, getattr(self, self.offset_name).to(logits.dtype), self.bias.to(logits.dtype))

    #: the offset's name (its tensor, warnings, the summary's ``largest_<name>``) and its dimensions: (C,)
    offset_name = "scale_offset"
    offset_dims = 1

    def _new_offset(self, classes: int, like: torch.Tensor, options: Any) -> torch.Tensor:
        """The offset at 0, in ``like``'s (the (N, C) features') dtype and device, to be fitted with ``options``."""
        return torch.zeros((classes,) * self.offset_dims, dtype=like.dtype, device=like.device, requires_grad=True)

    @staticmethod
    def _offset(free: torch.Tensor) -> torch.Tensor:
        """The offset from the variables L-BFGS moves (here the offset itself)."""
        return free

    @staticmethod
    def _map(x: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """(1 + v) ⊙ x + b."""
        return x * (1 + offset) + bias

    def _objective(self, x: torch.Tensor, labels: torch.Tensor, free: torch.Tensor, bias: torch.Tensor,
                   ridge: Ridge) -> Callable[[], torch.Tensor]:
        """() → mean NLL of :meth:`_map` + ρ_d (‖v‖₂² + ‖b‖₂²) at the current (C,) ``free`` v and (C,) ``bias`` on the
        (N, C) features ``x`` (``ridge``: :func:`.solvers.linear_maps.ridge_strengths`' (ρ_d, ρ_o))."""

        def objective() -> torch.Tensor:
            return F.cross_entropy(self._map(x, free, bias), labels) + ridge[0] * (free.square().sum() + bias.square().sum())

        return objective

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "StructuredVectorScaling.Options") -> Dict[str, Any]:
        classes = logits.shape[1]
        rows = distinct_rows(fit_groups(logits))  # copies add no evidence: the ridge and ε count a row once
        work = logits.detach().to(work_dtype(*logits.shape))
        fitted_beta, _ = fit_inverse_temperature(work, labels)
        separable = is_separable_fit(fitted_beta, work, labels)
        beta = 1.0 if separable else fitted_beta  # as the temperature method keeps it
        epsilon = torch.tensor(options.smoothing / (rows + 1), dtype=work.dtype, device=work.device)
        x = smoothed_log_probabilities(work, torch.tensor(beta, dtype=work.dtype, device=work.device), epsilon)
        free = self._new_offset(classes, x, options)
        bias = torch.zeros(classes, dtype=x.dtype, device=x.device, requires_grad=True)
        objective = self._objective(x, labels, free, bias, ridge_strengths(options.l2, rows, classes))
        summary = lbfgs.minimise([free, bias], objective, options.max_iter, self.title)
        offset = self._offset(free.detach())
        lines = [separable_message(work, labels)] if separable else temperature_warnings(beta, work, labels, method=self.method, start=True)
        lines += self._fit_lines(offset, bias.detach(), summary, options)
        with torch.no_grad():
            getattr(self, self.offset_name).copy_(offset)
            self.bias.copy_(bias.detach())
            self.inverse_temperature.fill_(beta)
            self.epsilon.fill_(float(epsilon))
        return {**summary, "temperature": 1.0 / beta, "l2": options.l2, "strength": options.l2 * classes / rows,
                "epsilon": float(epsilon), f"largest_{self.offset_name}": float(offset.abs().max()),
                "largest_bias": float(bias.detach().abs().max()), "warnings": lines}

    def _fit_lines(self, offset: torch.Tensor, bias: torch.Tensor, summary: Dict[str, Any], options: Any) -> List[str]:
        """One line per problem of the fit: a parameter ran off (the data separate a class), no convergence, Ctrl-C."""
        lines = []
        largest = float(torch.cat([offset.flatten(), bias]).abs().max())
        if largest > LARGE_PARAMETER:
            lines.append(f"{self.method}: a {self.offset_name.replace('_', ' ')} or bias reached {largest:.3g}: the data "
                         f"(nearly) separate some class at l2={options.l2:g}; pass a larger l2 (the default is 1).")
        if not summary["converged"]:
            lines.append(f"{self.method}: the fit stopped after max_iter={options.max_iter} iterations without converging; "
                         "pass a larger max_iter or a larger l2.")
        if summary.get("interrupted"):
            lines.append(f"{self.method}: interrupted (Ctrl-C) during the fit: the best state so far is kept.")
        return lines

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, epsilon={float(self.epsilon):.3g}"
