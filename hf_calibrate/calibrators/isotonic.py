"""Isotonic regression (Zadrozny & Elkan, 2002) as a calibration map, with the prior towards temperature scaling and
the modes of :mod:`.binning` (whose docstring says how the prior is chosen), and linear interpolation between knots."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch

from .base import NO_FACTS, Calibrator, ModelFacts
from .binning import (BINNING_FOOTPRINT, BINNING_REQUIREMENTS, PriorOptions, assemble, check_mode, floor_of, mode_scores,
                      prior_summary, scored_rows, select_prior)
from .solvers.isotonic_ovr import one_vs_rest_isotonic_knots
from .options import check_fields

#: the most knots an isotonic map keeps (its state is maps × knots × 2 float64 values)
MAX_KNOTS = 2048


def smoothed_isotonic_knots(scores: np.ndarray, targets: np.ndarray, centres: np.ndarray, prior: float, floor: float) -> Tuple[np.ndarray, np.ndarray]:
    """Knots (x, y) of the increasing isotonic fit of targets on scores (ties merged), with the prior towards TS.

    With m = ``prior`` > 0 each distinct score x_j keeps temperature scaling's value t̄_j (the mean
    TS-calibrated score of its samples) plus its isotonic block's correction shrunk by m
    pseudo-samples, y_j = t̄_j + (hits_B − Σ_B t) / (n_B + m), clipped to [floor, 1 − floor] and made
    monotone by a weighted isotonic fit: m = ∞ follows TS (to the extent TS's score is monotone in
    the uncalibrated one), m → 0 the block frequencies. m = 0 is the classic fit. At most
    :data:`MAX_KNOTS` knots are kept (evenly spaced among the changes, both ends always);
    otherwise both ends of every constant block, so linear interpolation between them is exact.
    """
    from scipy.optimize import isotonic_regression

    x, inverse = np.unique(scores, return_inverse=True)
    weights, hits, centre_sums = (np.bincount(inverse, weights=values) for values in (np.ones_like(targets), targets, centres))
    fitted = isotonic_regression(hits / weights, weights=weights, increasing=True).x
    if prior != 0:
        block = np.concatenate([[0], np.cumsum(np.diff(fitted) != 0)])
        residual = np.bincount(block, weights=hits - centre_sums) / (np.bincount(block, weights=weights) + prior)
        values = np.clip(centre_sums / weights + residual[block], floor, 1 - floor)
        fitted = isotonic_regression(values, weights=weights, increasing=True).x
    changes = np.flatnonzero(np.diff(fitted) != 0)
    keep = np.unique(np.concatenate([[0], changes, changes + 1, [len(x) - 1]]))
    if len(keep) > MAX_KNOTS:
        keep = keep[np.unique(np.linspace(0, len(keep) - 1, MAX_KNOTS).round().astype(np.int64))]
    return x[keep], fitted[keep]


def isotonic_knots(logits: torch.Tensor, labels: torch.Tensor, mode: str, prior: float) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Per map, the knots (x, y) of the isotonic fit with the prior m = ``prior`` on (N, C) logits.

    The unsmoothed one-vs-rest fit (m = 0) avoids sorting every class's N scores
    (:func:`.solvers.isotonic_ovr.one_vs_rest_isotonic_knots`) where the classes are balanced enough.
    """
    fits = one_vs_rest_isotonic_knots(logits, labels) if mode == "one_vs_rest" and prior == 0 else None
    if fits is None:
        rows = scored_rows(logits, labels, mode)
        arrays = (rows.scores.cpu().numpy(), rows.targets.cpu().numpy(), rows.centres.cpu().numpy())
        fits = [smoothed_isotonic_knots(*row, prior, floor_of(len(labels))) for row in zip(*arrays)]
    return fits


def padded_knots(fits: List[Tuple[np.ndarray, np.ndarray]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(maps, K) knots_x and knots_y, each map's knots padded to a common length K ≥ 2 by repeating its last."""
    length = max(2, max(len(x) for x, _ in fits))  # one distinct score gives one knot; the format needs two
    knots_x = np.stack([np.pad(x, (0, length - len(x)), mode="edge") for x, _ in fits])
    knots_y = np.stack([np.pad(y, (0, length - len(y)), mode="edge") for _, y in fits])
    return torch.from_numpy(knots_x), torch.from_numpy(knots_y)


def _interpolate(queries: torch.Tensor, knots_x: torch.Tensor, knots_y: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation per row, clipped to the end values; (maps, N)."""
    last = knots_x.shape[1] - 1
    upper_index = torch.searchsorted(knots_x, queries.contiguous(), right=True).clamp(max=last)
    lower_index = (upper_index - 1).clamp(min=0)
    x0, x1 = knots_x.gather(1, lower_index), knots_x.gather(1, upper_index)
    y0, y1 = knots_y.gather(1, lower_index), knots_y.gather(1, upper_index)
    width = x1 - x0
    t = torch.where(width > 0, (queries - x0) / width.clamp_min(torch.finfo(width.dtype).tiny), torch.ones_like(x0))
    return y0 + t.clamp(0, 1) * (y1 - y0)


class IsotonicCalibration(Calibrator):
    """Isotonic regression (Zadrozny & Elkan, 2002) with linear interpolation between knots.

    Knots are padded per map to a common length by repeating the last knot; their count is
    part of :meth:`config` so a saved state loads into buffers of the right shape.
    """

    method = "isotonic"
    title = "isotonic regression"
    description = ("Confidences are mapped through a monotone piecewise-linear function fitted by isotonic regression on "
                   "the calibration data, smoothed towards temperature scaling by a prior whose weight is chosen by "
                   "cross-fitted NLL.")
    citation = (
        "@inproceedings{zadrozny2002transforming, title={Transforming classifier scores into accurate multiclass "
        "probability estimates}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={KDD}, year={2002}}"
    )
    requirements, footprint = BINNING_REQUIREMENTS, BINNING_FOOTPRINT

    @dataclasses.dataclass
    class Options(PriorOptions):
        """Fit options of isotonic regression (and those of :class:`PriorOptions`: ``prior``, ``prior_grid``, ``folds``, ``seed``).

        Attributes:
            mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        """

        mode: str = "top_label"

        def __post_init__(self) -> None:
            check_fields(self)
            check_mode(self.mode)
            self.check_prior()

    def __init__(self, num_classes: int, mode: str = "top_label", num_knots: int = 2) -> None:
        super().__init__(num_classes)
        self.mode = check_mode(mode)
        if num_knots < 2:
            raise ValueError(f"num_knots must be >= 2, got {num_knots}.")
        maps = 1 if mode == "top_label" else num_classes
        identity = torch.linspace(0, 1, num_knots, dtype=torch.float64).repeat(maps, 1)
        self.register_buffer("knots_x", identity)
        self.register_buffer("knots_y", identity.clone())

    @classmethod
    def create(cls, num_classes: int, options: "IsotonicCalibration.Options",
               facts: ModelFacts = NO_FACTS) -> "IsotonicCalibration":
        return cls(num_classes, mode=options.mode)

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "mode": self.mode, "num_knots": int(self.knots_x.shape[1])}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double(), dim=1)
        mapped = _interpolate(mode_scores(probs, self.mode), self.knots_x, self.knots_y)
        return assemble(probs, mapped, self.mode).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "IsotonicCalibration.Options") -> Dict[str, Any]:
        prior, scores = select_prior(logits, labels, self.mode, options, self._fitted_map)
        knots_x, knots_y = padded_knots(isotonic_knots(logits, labels, self.mode, prior))
        self.knots_x, self.knots_y = knots_x.to(self.knots_x.device), knots_y.to(self.knots_y.device)
        return {"num_knots": int(knots_x.shape[1]), **prior_summary(prior, scores, logits, labels, self.method)}

    def _fitted_map(self, logits: torch.Tensor, labels: torch.Tensor, prior: float) -> Callable[[torch.Tensor], torch.Tensor]:
        knots_x, knots_y = (knots.to(logits.device) for knots in padded_knots(isotonic_knots(logits, labels, self.mode, prior)))
        return lambda scores: _interpolate(scores, knots_x, knots_y)
