"""Structured matrix scaling: a full linear map of smoothed, temperature-scaled log-probabilities, ridged towards TS.

**Structured matrix scaling** (Berta, Holzmüller, Jordan & Bach, AISTATS 2026), as probmetrics' ``sms``
calibrator does it by default (its ``bfgs`` optimiser)::

    x = log((1 − ε) softmax(β z) + ε / C),      ε = smoothing / (N + 1)
    calibrated logits = (I + Δ) x + b

with β, ε and x as in :mod:`.structured_vector`, and Δ ∈ R^{C×C}, b ∈ R^C minimising

    mean NLL + λ (C/N) (Σ_c Δ_cc² + ‖b‖₂²) + λ (C(C − 1)/N) Σ_{c≠j} Δ_cj²

a ridge towards (smoothed) temperature scaling, Δ = 0, b = 0, stronger on the C(C − 1) off-diagonal weights
than on the C per-class ones. Convex in (Δ, b); L-BFGS (:func:`.solvers.lbfgs.minimise`) finds the minimum, moving Δ
through :func:`.solvers.linear_maps.isotropic_scale`'s variables (in which that ridge is the same in every direction), after
its :mod:`.memory` footprint has been checked against the memory free. Unlike
:class:`~hf_calibrate.calibrators.DirichletCalibration` (W log softmax(z) + b) the log-probabilities are those of
the temperature-scaled logits, smoothed, so a row's log-sum-exp and the mixture's floor enter the map.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .solvers import lbfgs
from .fit_context import fit_context
from .solvers.linear_maps import MATRIX_FOOTPRINT, Ridge, isotropic_scale, matrix_cost_bound, matrix_objective
from .structured_vector import StructuredVectorScaling


class StructuredMatrixScaling(StructuredVectorScaling):
    """``(I + Δ) x + b`` on the smoothed temperature-scaled log-probabilities ``x``; see the module docstring."""

    method = "structured_matrix"
    title = "structured matrix scaling"
    description = ("The temperature-scaled log-probabilities, smoothed by a small uniform mixture (weight 1/(N + 1) by "
                   "default), go through a full linear map fitted on the NLL with a fixed ridge towards temperature "
                   "scaling, stronger off the diagonal (Berta, Holzmüller, Jordan & Bach, 2026).")
    citation = StructuredVectorScaling.citation
    offset_name = "offset"
    offset_dims = 2
    #: as a full map's fit, with the smoothed log-probabilities' working copies
    footprint = dataclasses.replace(MATRIX_FOOTPRINT, rows=MATRIX_FOOTPRINT.rows + 1)

    def _new_offset(self, classes: int, like: torch.Tensor, options: StructuredVectorScaling.Options) -> torch.Tensor:
        """Δ = 0, (C, C), once a long fit has said how long it may take (:func:`.solvers.lbfgs.warn_if_long`; ``like``: the
        (N, C) features)."""
        what = f"{self.method} on {like.shape[0]:,} x {classes:,} logits"
        if fit_context().announce and like.shape[0] * classes**2 >= lbfgs.TIME_FROM_WORK:
            labels = torch.zeros(like.shape[0], dtype=torch.long, device=like.device)  # the time does not depend on them
            advice = "Use structured_vector (seconds), or a larger l2 (a stronger ridge converges in fewer iterations)."
            lbfgs.warn_if_long(what, matrix_cost_bound(like, labels, 1, options.max_iter), advice)
        return super()._new_offset(classes, like, options)

    @staticmethod
    def _offset(free: torch.Tensor) -> torch.Tensor:
        """Δ = S ⊙ U (:func:`.solvers.linear_maps.isotropic_scale`: the ridge is the same in every direction of U)."""
        return free * isotropic_scale(free.shape[0], free.dtype, free.device)

    @staticmethod
    def _map(x: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x + Δ x + b."""
        return torch.addmm(bias, x, offset.t()) + x

    def _objective(self, x: torch.Tensor, labels: torch.Tensor, free: torch.Tensor, bias: torch.Tensor,
                   ridge: Ridge) -> Callable[[], torch.Tensor]:
        """Matrix scaling's objective (:func:`.solvers.linear_maps.matrix_objective`) on the features ``x``, with Δ = S ⊙ U of the
        (C, C) ``free`` U: λ (C/N) (Σ_c Δ_cc² + ‖b‖₂²) + λ (C(C − 1)/N) Σ_{c≠j} Δ_cj² beside the mean NLL."""
        return matrix_objective(x, labels, free, bias, ridge, isotropic_scale(x.shape[1], x.dtype, x.device))
