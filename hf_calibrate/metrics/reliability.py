"""Reliability-diagram data: per-bin count, mean confidence and accuracy, computed apart from any drawing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._checks import check_n_bins, prepare_inputs
from .binned import calibration_error_from_statistics, equal_width_statistics, top_label


@dataclass(frozen=True, eq=False)
class ReliabilityBins:
    """Data of a reliability diagram (equal-width bins), computed apart from any drawing.

    Attributes:
        edges: (B+1,) bin edges b/B.
        counts: (B,) number of samples per bin.
        mean_confidence: (B,) mean confidence per bin, NaN for empty bins.
        accuracy: (B,) accuracy per bin, NaN for empty bins.
        ece: the equal-width ECE of the same bins.
    """

    edges: np.ndarray
    counts: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray
    ece: float

    @property
    def n_bins(self) -> int:
        return int(self.counts.shape[0])

    @classmethod
    def from_statistics(cls, stats: torch.Tensor) -> "ReliabilityBins":
        counts, confidence_sums, correct_sums = stats.cpu().numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_confidence = np.where(counts > 0, confidence_sums / counts, np.nan)
            bin_accuracy = np.where(counts > 0, correct_sums / counts, np.nan)
        n_bins = counts.shape[0]
        return cls(
            edges=np.arange(n_bins + 1, dtype=np.float64) / n_bins,
            counts=counts.astype(np.int64),
            mean_confidence=mean_confidence,
            accuracy=bin_accuracy,
            ece=calibration_error_from_statistics(stats, "l1"),
        )

    def to_dict(self) -> dict:
        """JSON-able form (empty bins as None); :meth:`from_dict` inverts it."""
        def listed(values: np.ndarray) -> list:
            return [None if np.isnan(v) else float(v) for v in values]

        return {"counts": self.counts.tolist(), "mean_confidence": listed(self.mean_confidence), "accuracy": listed(self.accuracy)}

    @classmethod
    def from_dict(cls, data: dict) -> "ReliabilityBins":
        counts = torch.tensor(data["counts"], dtype=torch.float64)
        means = [torch.tensor([0.0 if v is None else v for v in data[key]], dtype=torch.float64) for key in ("mean_confidence", "accuracy")]
        return cls.from_statistics(torch.stack([counts, means[0] * counts, means[1] * counts]))


def reliability_bins(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> ReliabilityBins:
    """Per-bin count, mean confidence and accuracy over equal-width confidence bins.

    Example:
        >>> import torch
        >>> bins = reliability_bins(torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 0]), n_bins=5)
        >>> bins.counts.tolist()
        [0, 0, 0, 1, 1]
    """
    n_bins = check_n_bins(n_bins)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    confidences, correct = top_label(probs, labels)
    return ReliabilityBins.from_statistics(equal_width_statistics(confidences, correct, n_bins))
