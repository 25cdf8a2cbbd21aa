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
softmax(β·log p) = softmax(β·z), so W = βI is TS too), so the fit starts where TS ends: vector
scaling by block-Newton steps (:mod:`.vector_newton`), matrix and Dirichlet by L-BFGS.
None of these maps is guaranteed to keep the argmax: per-class scales and biases can
reorder classes, which may change accuracy (usually slightly).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .base import Calibrator, check_fields, require
from .temperature import fit_inverse_temperature
from .vector_newton import fit_vector_scaling

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
        self, logits: torch.Tensor, labels: torch.Tensor, beta: float, strength: float, max_iter: int
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
        """L-BFGS from the TS optimum β = 1/T (of these logits) on mean NLL + ``penalty(·, strength)``."""
        parameters = self.initial_parameters(beta, logits.dtype, logits.device)
        for tensor in parameters.values():
            tensor.requires_grad_(True)

        def objective() -> torch.Tensor:
            nll = F.cross_entropy(self.transform(logits, parameters), labels)
            return nll + self.penalty(parameters, strength)

        return parameters, _minimise(list(parameters.values()), objective, max_iter)

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
        l2_grid: candidate λ values (default 1e-4, 1e-3, …, 1e4), each fitted on the calibration
            data minus a held-out part and scored by held-out NLL; the best is refitted on all.
        holdout_fraction: share held out for that selection (default 0.2).
        seed: seed of the held-out split (default 0).
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
        self.l2_grid = tuple(float(v) for v in self.l2_grid)


class VectorScaling(_LinearLogitMap):
    """``a ⊙ z + b`` with a per-class positive scale ``a = exp(log_scale)`` and bias ``b``."""

    method = "vector"

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

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: Any) -> Dict[str, Any]:
        """Block-Newton from the TS optimum (:mod:`.vector_newton`): a few passes over the logits."""
        work = logits.detach().to(_work_dtype(logits))
        scale, bias, summary = fit_vector_scaling(work, labels, fit_inverse_temperature(work, labels)[0], options.max_iter)
        self._store({"log_scale": scale.log(), "bias": bias})
        return summary


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

    def penalty(self, parameters, strength):
        weight, bias = parameters["weight"], parameters["bias"]
        classes = weight.shape[0]
        off_diagonal = weight.square().sum() - weight.diagonal().square().sum()
        return strength * (off_diagonal / max(classes * (classes - 1), 1) + bias.square().mean())

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions) -> Dict[str, Any]:
        work = logits.detach().to(_work_dtype(logits))
        summary: Dict[str, Any] = {}
        strength = options.l2
        if strength is None:
            strength, summary["l2_holdout_nll"] = self._select_strength(work, labels, options)
        parameters, fit = self._fit_parameters(work, labels, fit_inverse_temperature(work, labels)[0], strength, options.max_iter)
        self._store(parameters)
        return {**fit, "l2": strength, **summary}

    def _select_strength(self, logits: torch.Tensor, labels: torch.Tensor, options: ODIROptions) -> Tuple[float, Dict[str, float]]:
        """The λ of ``options.l2_grid`` with the lowest held-out NLL, and every λ's held-out NLL."""
        count = logits.shape[0]
        holdout = max(1, int(round(options.holdout_fraction * count)))
        if count - holdout < 1:
            raise ValueError(f"{count} calibration samples are too few to hold out a part for selecting l2; pass l2=<value>.")
        order = torch.randperm(count, generator=torch.Generator().manual_seed(options.seed)).to(logits.device)
        held, kept = order[:holdout], order[holdout:]
        kept_logits, kept_labels = logits[kept], labels[kept]
        beta, _ = fit_inverse_temperature(kept_logits, kept_labels)  # every candidate starts from it
        scores: Dict[str, float] = {}
        for strength in options.l2_grid:
            parameters, _ = self._fit_parameters(kept_logits, kept_labels, beta, strength, options.max_iter)
            with torch.no_grad():
                scores[repr(strength)] = float(F.cross_entropy(self.transform(logits[held], parameters), labels[held]))
        best = min(options.l2_grid, key=lambda strength: (scores[repr(strength)], -strength))  # ties: stronger λ
        return best, scores


class DirichletCalibration(MatrixScaling):
    """``W log softmax(z) + b`` with ODIR regularisation (Dirichlet calibration)."""

    method = "dirichlet"

    def features(self, logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits, dim=1)
