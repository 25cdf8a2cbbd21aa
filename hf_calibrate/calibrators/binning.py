"""Non-parametric calibration maps: histogram binning and isotonic regression.

Both fit a monotone-in-spirit map g from a score to a frequency, in one of two modes:
* ``"top_label"`` (default): g maps the confidence c = max_k p_k to P(correct | c); the
  calibrated top probability is g(c) and the other classes share 1 − g(c) in proportion to
  their original probabilities. One map whatever the number of classes.
* ``"one_vs_rest"``: a map g_k per class from p_k to P(y = k | p_k); rows are renormalised.

They output probabilities; as calibrators they return log-probabilities (clamped at 1e-12),
which softmax maps back to the same probabilities. Top-label mode keeps the argmax whenever
g(c) ≥ 1/C (see :func:`_top_label_vector`); one-vs-rest mode can change it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

import numpy as np
import torch

from ..metrics.functional import equal_width_bin_index
from .base import Calibrator, check_fields, chunk_rows, require
from .isotonic_ovr import one_vs_rest_isotonic_knots

MODES = ("top_label", "one_vs_rest")
_LOG_FLOOR = 1e-12
_TIE_MARGIN = 1e-6


def _check_mode(mode: str) -> str:
    require(isinstance(mode, str) and mode in MODES, "mode", mode, f"one of {MODES}")
    return mode


def _scores(probs: torch.Tensor, mode: str) -> torch.Tensor:
    """(maps, N) scores a map is applied to: the confidence (1 map) or each p_k (C maps)."""
    return probs.max(dim=1).values[None] if mode == "top_label" else probs.T.contiguous()


def _targets(probs: torch.Tensor, labels: torch.Tensor, mode: str) -> torch.Tensor:
    """(maps, N) 0/1 targets: correctness (top-label) or [y = k] (one-vs-rest)."""
    if mode == "top_label":
        return (probs.argmax(dim=1) == labels).to(probs.dtype)[None]
    return torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype).T


def _top_label_vector(probs: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Probability rows whose predicted class gets ``top`` and the others share 1 − top.

    The others keep their relative sizes, mixed towards uniform just enough that none
    exceeds ``top``: with m the largest other share and u = 1/(C−1), the mixing weight is
    α = (m − r)/(m − u) for r = top/(1 − top) (clipped to [0, 1]). The argmax is thus kept
    whenever top ≥ 1/C, below which no probability vector can keep it.
    """
    predictions = probs.argmax(dim=1)
    others = probs.shape[1] - 1
    if others == 0:
        return torch.ones_like(probs)
    shares = probs.scatter(1, predictions[:, None], 0.0)
    rest_mass = shares.sum(dim=1)  # not 1 − confidence: that cancels catastrophically near 1
    has_mass = rest_mass > _LOG_FLOOR
    uniform = 1.0 / others
    shares = torch.where(has_mass[:, None], shares / rest_mass.clamp_min(_LOG_FLOOR)[:, None], torch.full_like(shares, uniform))
    shares = shares.scatter(1, predictions[:, None], 0.0)
    largest = shares.max(dim=1).values
    ratio = top / (1 - top).clamp_min(_LOG_FLOOR) * (1 - _TIE_MARGIN)  # strictly below top: no ties
    alpha = ((largest - ratio) / (largest - uniform).clamp_min(_LOG_FLOOR)).clamp(0, 1)
    alpha = torch.where(largest > ratio, alpha, torch.zeros_like(alpha))
    mixed = (1 - alpha[:, None]) * shares + alpha[:, None] * uniform
    calibrated = (1 - top[:, None]) * mixed
    return calibrated.scatter(1, predictions[:, None], top[:, None])


def _assemble(probs: torch.Tensor, mapped: torch.Tensor, mode: str) -> torch.Tensor:
    """Calibrated log-probabilities from the mapped scores (maps, N)."""
    if mode == "one_vs_rest":
        calibrated = mapped.T.clamp_min(0)
        totals = calibrated.sum(dim=1, keepdim=True)
        uniform = torch.full_like(calibrated, 1.0 / calibrated.shape[1])
        calibrated = torch.where(totals > 0, calibrated / totals.clamp_min(_LOG_FLOOR), uniform)
    else:
        calibrated = _top_label_vector(probs, mapped[0].clamp(0, 1))
    return calibrated.clamp_min(_LOG_FLOOR).log()


class HistogramBinning(Calibrator):
    """Equal-width histogram binning (Zadrozny & Elkan, 2001): g(s) = frequency in s's bin.

    Bins are those of the ECE (b/B, (b+1)/B]; an empty bin maps to its midpoint.
    """

    method = "histogram"
    title = "histogram binning"
    description = "Confidences are mapped to the observed frequency of their equal-width bin on the calibration data."
    citation = (
        "@inproceedings{zadrozny2001obtaining, title={Obtaining calibrated probability estimates from decision trees and "
        "naive Bayesian classifiers}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={ICML}, year={2001}}"
    )

    @dataclasses.dataclass
    class Options:
        """Fit options of histogram binning.

        Attributes:
            n_bins: number of equal-width bins over [0, 1] (default 15).
            mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        """

        n_bins: int = 15
        mode: str = "top_label"

        def __post_init__(self) -> None:
            check_fields(self)
            require(self.n_bins >= 1, "n_bins", self.n_bins, "an integer >= 1")
            _check_mode(self.mode)

    def __init__(self, num_classes: int, n_bins: int = 15, mode: str = "top_label") -> None:
        super().__init__(num_classes)
        self.mode = _check_mode(mode)
        if n_bins < 1:
            raise ValueError(f"n_bins must be >= 1, got {n_bins}.")
        maps = 1 if mode == "top_label" else num_classes
        midpoints = (torch.arange(n_bins, dtype=torch.float64) + 0.5) / n_bins
        self.register_buffer("bin_values", midpoints.repeat(maps, 1))

    @classmethod
    def create(cls, num_classes: int, options: "HistogramBinning.Options", **facts: Any) -> "HistogramBinning":
        return cls(num_classes, n_bins=options.n_bins, mode=options.mode)

    @property
    def n_bins(self) -> int:
        return int(self.bin_values.shape[1])

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "n_bins": self.n_bins, "mode": self.mode}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double(), dim=1)
        mapped = self.bin_values.gather(1, equal_width_bin_index(_scores(probs, self.mode), self.n_bins))
        return _assemble(probs, mapped, self.mode).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "HistogramBinning.Options") -> Dict[str, Any]:
        if self.mode == "one_vs_rest":
            counts, hits = _one_vs_rest_counts(logits, labels, self.n_bins)
        else:
            probs = torch.softmax(logits.double(), dim=1)
            scores, targets = _scores(probs, self.mode), _targets(probs, labels, self.mode)
            index = equal_width_bin_index(scores, self.n_bins)
            counts = torch.zeros(1, self.n_bins, dtype=torch.float64, device=probs.device)
            hits = torch.zeros_like(counts)
            counts.scatter_add_(1, index, torch.ones_like(targets))
            hits.scatter_add_(1, index, targets)
        with torch.no_grad():
            self.bin_values.copy_(torch.where(counts > 0, hits / counts.clamp_min(1), self.bin_values))
        return {"empty_bins": int((counts == 0).sum())}


def _one_vs_rest_counts(logits: torch.Tensor, labels: torch.Tensor, n_bins: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(C, B) float64 counts of p_k per bin, and of p_k for samples of class k, chunk by cache-sized chunk.

    Each sample adds one count per class and one hit (for its own class): no (N, C) one-hot,
    transpose or full float64 copy of the probabilities is made.
    """
    classes = logits.shape[1]
    offsets = torch.arange(classes, device=logits.device) * n_bins
    counts = torch.zeros(classes * n_bins, dtype=torch.float64, device=logits.device)
    hits = torch.zeros_like(counts)
    rows = chunk_rows(logits)
    for start in range(0, logits.shape[0], rows):
        y = labels[start : start + rows]
        index = equal_width_bin_index(torch.softmax(logits[start : start + rows].double(), dim=1), n_bins)
        counts += torch.bincount((index + offsets).flatten(), minlength=classes * n_bins)
        hits += torch.bincount(offsets[y] + index.gather(1, y[:, None]).squeeze(1), minlength=classes * n_bins)
    return counts.view(classes, n_bins), hits.view(classes, n_bins)


def _isotonic_knots(scores: np.ndarray, targets: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Knots (x, y) of the increasing isotonic fit of targets on scores (ties merged)."""
    from scipy.optimize import isotonic_regression

    x, inverse = np.unique(scores, return_inverse=True)
    weights = np.bincount(inverse).astype(np.float64)
    means = np.bincount(inverse, weights=targets) / weights
    fitted = isotonic_regression(means, weights=weights, increasing=True).x
    # keep both ends of every constant block: linear interpolation between them is exact
    changes = np.flatnonzero(np.diff(fitted) != 0)
    keep = np.unique(np.concatenate([[0], changes, changes + 1, [len(x) - 1]]))
    return x[keep], fitted[keep]


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
                   "the calibration data.")
    citation = (
        "@inproceedings{zadrozny2002transforming, title={Transforming classifier scores into accurate multiclass "
        "probability estimates}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={KDD}, year={2002}}"
    )

    @dataclasses.dataclass
    class Options:
        """Fit options of isotonic regression.

        Attributes:
            mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        """

        mode: str = "top_label"

        def __post_init__(self) -> None:
            check_fields(self)
            _check_mode(self.mode)

    def __init__(self, num_classes: int, mode: str = "top_label", num_knots: int = 2) -> None:
        super().__init__(num_classes)
        self.mode = _check_mode(mode)
        if num_knots < 2:
            raise ValueError(f"num_knots must be >= 2, got {num_knots}.")
        maps = 1 if mode == "top_label" else num_classes
        identity = torch.linspace(0, 1, num_knots, dtype=torch.float64).repeat(maps, 1)
        self.register_buffer("knots_x", identity)
        self.register_buffer("knots_y", identity.clone())

    @classmethod
    def create(cls, num_classes: int, options: "IsotonicCalibration.Options", **facts: Any) -> "IsotonicCalibration":
        return cls(num_classes, mode=options.mode)

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "mode": self.mode, "num_knots": int(self.knots_x.shape[1])}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double(), dim=1)
        mapped = _interpolate(_scores(probs, self.mode), self.knots_x, self.knots_y)
        return _assemble(probs, mapped, self.mode).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "IsotonicCalibration.Options") -> Dict[str, Any]:
        fits = one_vs_rest_isotonic_knots(logits, labels) if self.mode == "one_vs_rest" else None
        if fits is None:  # top-label, or one-vs-rest with classes too unbalanced for the gap tables
            probs = torch.softmax(logits.double(), dim=1)
            scores, targets = _scores(probs, self.mode).cpu().numpy(), _targets(probs, labels, self.mode).cpu().numpy()
            fits = [_isotonic_knots(score, target) for score, target in zip(scores, targets)]
        length = max(2, max(len(x) for x, _ in fits))  # one distinct score gives one knot; the format needs two
        knots_x = np.stack([np.pad(x, (0, length - len(x)), mode="edge") for x, _ in fits])
        knots_y = np.stack([np.pad(y, (0, length - len(y)), mode="edge") for _, y in fits])
        self.knots_x = torch.from_numpy(knots_x).to(self.knots_x.device)
        self.knots_y = torch.from_numpy(knots_y).to(self.knots_y.device)
        return {"num_knots": length}
