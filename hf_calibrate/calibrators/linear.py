"""Linear maps of the logits (or log-probabilities) fitted on the NLL.

* vector scaling: ``z' = a ⊙ z + b`` with a > 0 (a = exp(s)) — Guo et al. (2017);
* matrix scaling: ``z' = W z + b`` with ODIR regularisation — Kull et al. (2019);
* Dirichlet calibration: ``z' = W log softmax(z) + b`` with ODIR — Kull et al. (2019).

ODIR ("off-diagonal and intercept regularisation") adds
``λ_od · mean_{i≠j} W_ij² + λ_b · mean_j b_j²`` to the mean NLL; here one λ serves both terms
(λ_od = λ_b) and, as in Kull et al., it is chosen by held-out NLL from a grid (1e-4 … 1e4 by
default): no single value suits both 10 and 1,000 classes (a mean over C(C−1) entries needs a far larger λ to
restrain a 1000×1000 W fitted on a few thousand samples).
Each map starts at the temperature-scaling optimum (a = 1/T, W = I/T, b = 0; for Dirichlet
softmax(β·log p) = softmax(β·z), so W = βI is TS too), so the fit starts where TS ends (along
the λ path, each candidate starts at the previous one's optimum and the refit at the chosen
one's): vector
scaling by block-Newton steps (:mod:`.vector_newton`), matrix and Dirichlet by L-BFGS
(:mod:`.lbfgs`: a time warning before a long fit, a progress bar, Ctrl-C keeps the best state).
None of these maps is guaranteed to keep the argmax: per-class scales and biases can
reorder classes, which may change accuracy (usually slightly).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import lbfgs
from .base import Calibrator, check_fields, fit_context, require
from .holdout import holdout_split
from .temperature import GUO_2017_CITATION, fit_inverse_temperature
from .vector_newton import fit_vector_scaling

# Up to this many logits the fit runs in float64; larger problems use float32 for speed.
_FLOAT64_MAX_ELEMENTS = 1 << 24
#: the λ path stops after this many candidates in a row that do not improve held-out NLL
PATH_PATIENCE = 2


def _work_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.numel() <= _FLOAT64_MAX_ELEMENTS else torch.float32


class _LinearLogitMap(Calibrator):
    """Shared by the linear maps: ``forward`` through :meth:`transform`, an L-BFGS fit on NLL + penalty
    (matrix, Dirichlet; vector scaling has its own Newton fit), parameters copied back."""

    def transform(self, logits: torch.Tensor, parameters: Dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def penalty(self, parameters: Dict[str, torch.Tensor], strength: float) -> torch.Tensor:
        """Regulariser added to the mean NLL (none for vector scaling)."""
        return torch.zeros(())

    def initial_parameters(self, beta: float, dtype: torch.dtype, device: torch.device) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        parameters = {name: tensor.to(logits.dtype) for name, tensor in self.named_parameters()}
        return self.transform(logits, parameters)

    def _fit_parameters(
        self, logits: torch.Tensor, labels: torch.Tensor, start: Dict[str, torch.Tensor], strength: float, max_iter: int,
        description: str,
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
        """L-BFGS from ``start`` (copied) on mean NLL + ``penalty(·, strength)``; see :func:`.lbfgs.minimise`."""
        parameters = {name: tensor.detach().clone().requires_grad_(True) for name, tensor in start.items()}
        objective = self._objective(logits, labels, parameters, strength)
        return parameters, lbfgs.minimise(list(parameters.values()), objective, max_iter, description)

    def _objective(self, logits: torch.Tensor, labels: torch.Tensor, parameters: Dict[str, torch.Tensor], strength: float):
        def objective() -> torch.Tensor:
            return F.cross_entropy(self.transform(logits, parameters), labels) + self.penalty(parameters, strength)

        return objective

    def _store(self, parameters: Dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.named_parameters():
                tensor.copy_(parameters[name].detach().to(tensor.dtype))


@dataclasses.dataclass
class ODIROptions:
    """Fit options of matrix scaling and Dirichlet calibration.

    Attributes:
        l2: λ (= λ_od = λ_b), weight of the mean squared off-diagonal entry of W and of the
            mean squared intercept; None (default) selects it from ``l2_grid``.
        l2_grid: candidate λ values (default 1e-4, 1e-3, …, 1e4), fitted strongest first on the
            calibration data minus a held-out part, each from the previous one's optimum, and
            scored by held-out NLL until two in a row do not improve it; the best is refitted
            on all the data.
        holdout_fraction: share held out for that selection (default 0.2).
        seed: seed of the held-out split (default 0): the split is the fitting engine's hold-out split
            (:func:`.holdout.holdout_split`) for this seed; ``CalibratedModel.fit(seed=...)`` sets both.
        max_iter: L-BFGS iterations at most, per fit (default 200).
    """

    l2: Optional[float] = None
    l2_grid: Tuple[float, ...] = tuple(10.0**k for k in range(-4, 5))
    holdout_fraction: float = 0.2
    seed: int = 0
    max_iter: int = 200

    def __post_init__(self) -> None:
        check_fields(self)
        require(self.l2 is None or self.l2 >= 0, "l2", self.l2, "a finite number >= 0 or None")
        require(len(self.l2_grid) > 0 and all(v >= 0 for v in self.l2_grid), "l2_grid", self.l2_grid,
                "a non-empty list of finite numbers >= 0")
        require(0 <= self.holdout_fraction < 1, "holdout_fraction", self.holdout_fraction, "a number in [0, 1)")
        require(self.l2 is not None or self.holdout_fraction > 0, "holdout_fraction", self.holdout_fraction,
                "> 0 to select l2 on held-out data (or pass l2=<value>)")
        require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")
        self.l2_grid = tuple(dict.fromkeys(float(v) for v in self.l2_grid))  # each λ once


class VectorScaling(_LinearLogitMap):
    """``a ⊙ z + b`` with a per-class positive scale ``a = exp(log_scale)`` and bias ``b``."""

    method = "vector"
    title = "vector scaling"
    description = ("Each class logit gets its own positive scale and bias, fitted by Newton steps on the NLL starting "
                   "from the temperature-scaling optimum.")
    citation = GUO_2017_CITATION

    @dataclasses.dataclass
    class Options:
        """Fit options of vector scaling.

        Attributes:
            max_iter: Newton iterations at most (default 200; 2–15 are typical, more only when
                some class is absent from the calibration data and its bias drifts to −∞).
        """

        max_iter: int = 200

        def __post_init__(self) -> None:
            check_fields(self)
            require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.log_scale = nn.Parameter(torch.zeros(num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def transform(self, logits, parameters):
        return logits * parameters["log_scale"].exp() + parameters["bias"]

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "VectorScaling.Options") -> Dict[str, Any]:
        """Block-Newton from the TS optimum (:mod:`.vector_newton`): a few passes over the logits."""
        work = logits.detach().to(_work_dtype(logits))
        scale, bias, summary = fit_vector_scaling(work, labels, fit_inverse_temperature(work, labels)[0], options.max_iter)
        self._store({"log_scale": scale.log(), "bias": bias})
        return summary


class MatrixScaling(_LinearLogitMap):
    """``W z + b`` (C×C weights) with ODIR regularisation."""

    method = "matrix"
    Options = ODIROptions
    title = "matrix scaling (ODIR)"
    description = ("The logits go through a full linear map W z + b fitted on the NLL with off-diagonal and intercept "
                   "regularisation (Kull et al., 2019).")
    citation = GUO_2017_CITATION

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

    def penalty(self, parameters, strength):
        weight, bias = parameters["weight"], parameters["bias"]
        classes = weight.shape[0]
        off_diagonal = weight.square().sum() - weight.diagonal().square().sum()
        return strength * (off_diagonal / max(classes * (classes - 1), 1) + bias.square().mean())

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions) -> Dict[str, Any]:
        work = logits.detach().to(_work_dtype(logits))
        self._warn_if_long(work, labels, options)
        summary: Dict[str, Any] = {"l2": options.l2}
        if options.l2 is None:
            summary, start = self._select_strength(work, labels, options)
        else:
            start = self.initial_parameters(fit_inverse_temperature(work, labels)[0], work.dtype, work.device)
        if summary.pop("interrupted", False):  # keep the best candidate, fitted on the selection's part
            self._store(start)
            return {**summary, "interrupted": _interrupted(self.method, "during the l2 selection: the best candidate so far "
                                                           "is kept, fitted on the selection's part, not refitted on all data")}
        parameters, fit = self._fit_parameters(work, labels, start, summary["l2"], options.max_iter, f"{self.method} fit")
        self._store(parameters)
        if fit.pop("interrupted"):
            fit["interrupted"] = _interrupted(self.method, "during the fit: the best state so far is kept")
        return {**fit, **summary}

    def _warn_if_long(self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions) -> None:
        """Warn with :meth:`cost_bound` before a fit that may take long (only large ones are timed)."""
        if not fit_context().announce or logits.shape[0] * logits.shape[1] ** 2 < lbfgs.TIME_FROM_WORK:
            return
        advice = "Pass l2=<value> to skip the selection of l2, or use vector or temperature scaling (seconds)."
        what = f"{self.method} on {logits.shape[0]:,} x {logits.shape[1]:,} logits"
        lbfgs.warn_if_long(what, self.cost_bound(logits, labels, options), advice)

    def cost_bound(
        self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions, start: Optional[Dict[str, torch.Tensor]] = None,
    ) -> lbfgs.CostBound:
        """An upper bound of the time of ``fit_logits(logits, labels, options)`` here, from one timed evaluation.

        Args:
            logits: (N, C) logits in the dtype the fit will use; labels: (N,).
            start: parameters to evaluate at (default: the identity map).
        """
        start = start or self.initial_parameters(1.0, logits.dtype, logits.device)
        parameters = {name: tensor.clone().requires_grad_(True) for name, tensor in start.items()}
        seconds = lbfgs.time_one_evaluation(self._objective(logits, labels, parameters, 0.0), list(parameters.values()))
        return lbfgs.CostBound(seconds, 1 if options.l2 is not None else len(options.l2_grid) + 1, options.max_iter)

    def _select_strength(self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions) -> Tuple[Dict[str, Any], Dict[str, torch.Tensor]]:
        """Select λ on held-out NLL along a warm-started path, strongest λ first.

        Each candidate starts at the previous candidate's optimum (the problems are convex, so
        only the iteration count changes) and the path stops once :data:`PATH_PATIENCE`
        candidates in a row have not improved held-out NLL: weaker λ only fit the noise more.
        Returns the summary (``l2``, ``l2_holdout_nll`` of every candidate tried, ``interrupted``)
        and the best candidate's parameters, the refit's start.
        """
        kept, held = self._holdout_split(logits.shape[0], options, logits.device)
        kept_logits, kept_labels = logits[kept], labels[kept]
        start = self.initial_parameters(fit_inverse_temperature(kept_logits, kept_labels)[0], logits.dtype, logits.device)
        candidates = sorted(options.l2_grid, reverse=True)
        scores: Dict[str, float] = {}
        best, worse_in_a_row, interrupted = (math.inf, None, start), 0, False
        for number, strength in enumerate(candidates, 1):
            description = f"{self.method}: l2 = {strength:g} ({number} of at most {len(candidates)})"
            start, fit = self._fit_parameters(kept_logits, kept_labels, start, strength, options.max_iter, description)
            with torch.no_grad():
                scores[repr(strength)] = float(F.cross_entropy(self.transform(logits[held], start), labels[held]))
            improved = scores[repr(strength)] < best[0]  # ties keep the stronger λ, tried first
            best = (scores[repr(strength)], strength, start) if improved else best
            worse_in_a_row = 0 if improved else worse_in_a_row + 1
            interrupted = fit["interrupted"]
            if interrupted or worse_in_a_row == PATH_PATIENCE:
                break
        return {"l2": best[1], "l2_holdout_nll": scores, "interrupted": interrupted}, best[2]

    @staticmethod
    def _holdout_split(count: int, options: ODIROptions, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(kept, held-out) sample indices of the λ selection: the engine's hold-out split for ``options.seed``."""
        try:
            kept, held = holdout_split(count, options.holdout_fraction, options.seed)
        except ValueError:
            raise ValueError(f"{count} calibration samples are too few to hold out a part for selecting l2; pass l2=<value>.") from None
        return kept.to(device), held.to(device)


def _interrupted(method: str, what: str) -> str:
    """Say (a warning) that Ctrl-C stopped a fit early, and return ``what`` for the fit summary."""
    warnings.warn(f"{method}: interrupted (Ctrl-C) {what}; the fit summary records this.", stacklevel=4)
    return what


class DirichletCalibration(MatrixScaling):
    """``W log softmax(z) + b`` with ODIR regularisation (Dirichlet calibration)."""

    method = "dirichlet"
    title = "Dirichlet calibration (ODIR)"
    description = ("The log-probabilities go through a linear map W log p + b fitted on the NLL with off-diagonal and "
                   "intercept regularisation (Kull et al., 2019).")
    citation = (
        "@inproceedings{kull2019beyond, title={Beyond temperature scaling: Obtaining well-calibrated multi-class "
        "probabilities with Dirichlet calibration}, author={Kull, Meelis and Perello Nieto, Miquel and "
        "K{\\\"a}ngsepp, Markus and Silva Filho, Telmo and Song, Hao and Flach, Peter}, booktitle={NeurIPS}, year={2019}}"
    )

    def features(self, logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits, dim=1)
