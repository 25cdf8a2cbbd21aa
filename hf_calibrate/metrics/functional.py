"""Calibration metrics as pure functions of probabilities and labels: the public one-shot functions.

Every metric is computed in two steps: per-bin *sufficient statistics* (counts, sums of
confidence, sums of correctness, all float64) and a formula over them. The streaming
accumulator in :mod:`hf_calibrate.metrics.streaming` sums the same statistics across
batches and processes and applies the same formulas, so one-shot and streaming results
agree to rounding. The core is split by metric family: :mod:`.binned` (bin statistics and the
calibration errors' formulas), :mod:`.scores` (NLL and Brier terms), :mod:`.reliability`
(reliability-diagram bins); their names are importable from here too.

Notation (docs/design.md §2): probabilities ``p`` (N×C), labels ``y`` (N,), confidence
``c_i = max_k p_ik``, prediction ``ŷ_i = argmax_k p_ik`` (ties → lowest index), correctness
``a_i = [ŷ_i = y_i]``.
"""

from __future__ import annotations

from typing import Any, Dict, Literal

import torch

from ._checks import BINNINGS, NORMS, check_choice, check_n_bins, prepare_inputs
from .binned import (
    Norm,
    calibration_error_from_statistics,
    calibration_errors_from_statistics,
    classwise_error_from_statistics,
    classwise_statistics,
    equal_mass_order,
    equal_mass_statistics,
    equal_width_bin_index,
    equal_width_statistics,
    top_label,
    weighted_equal_mass_statistics,
)
from .reliability import ReliabilityBins, reliability_bins
from .scores import NLL_CLAMP, nll_and_brier_sums, nll_and_brier_terms

__all__ = [
    "NLL_CLAMP",
    "Binning",
    "Norm",
    "ReliabilityBins",
    "accuracy",
    "adaptive_calibration_error",
    "brier_score",
    "calibration_error_from_statistics",
    "calibration_errors_from_statistics",
    "classwise_calibration_error",
    "classwise_error_from_statistics",
    "classwise_statistics",
    "equal_mass_order",
    "equal_mass_statistics",
    "equal_width_bin_index",
    "equal_width_statistics",
    "expected_calibration_error",
    "maximum_calibration_error",
    "metrics_from_statistics",
    "negative_log_likelihood",
    "nll_and_brier_sums",
    "nll_and_brier_terms",
    "reliability_bins",
    "top_label",
    "weighted_equal_mass_statistics",
]

Binning = Literal["equal_width", "equal_mass"]


# ----------------------------------------------------------------------------- all metrics from statistics


def metrics_from_statistics(width: torch.Tensor, sums: torch.Tensor) -> Dict[str, float]:
    """accuracy, ece, mce, rms_ce, nll, brier from equal-width statistics (3, B) and (Σ NLL, Σ Brier) (2,).

    Example:
        >>> import torch
        >>> width = torch.tensor([[0.0, 2.0], [0.0, 1.6], [0.0, 1.0]], dtype=torch.float64)
        >>> metrics_from_statistics(width, torch.tensor([1.2, 0.5], dtype=torch.float64))["accuracy"]
        0.5
    """
    num_samples = int(width[0].sum())
    return {
        "accuracy": float(width[2].sum()) / num_samples,
        "ece": calibration_error_from_statistics(width, "l1"),
        "mce": calibration_error_from_statistics(width, "max"),
        "rms_ce": calibration_error_from_statistics(width, "l2"),
        "nll": float(sums[0]) / num_samples,
        "brier": float(sums[1]) / num_samples,
    }


# ----------------------------------------------------------------------------- public API


def expected_calibration_error(
    probs: Any,
    labels: Any,
    *,
    n_bins: int = 15,
    binning: Binning = "equal_width",
    norm: Norm = "l1",
    from_logits: bool = False,
) -> float:
    r"""Top-label expected calibration error.

    .. math:: \mathrm{ECE} = \sum_b \frac{n_b}{N}\,\bigl|\overline{a}_b - \overline{c}_b\bigr|

    Equal-width bins are (b/B, (b+1)/B] (0 goes in the first bin, 1 in the last);
    ``binning="equal_mass"`` (AdaECE) sorts the confidences and splits them into B bins of
    ⌈N/B⌉ or ⌊N/B⌋ samples. ``norm="l2"`` gives the RMS calibration error and
    ``norm="max"`` the maximum calibration error (MCE).

    Args:
        probs: (N, C) probabilities, rows summing to 1 (logits with ``from_logits=True``).
        labels: (N,) integer class indices in [0, C).
        n_bins: number of bins B (≥ 1).
        binning: ``"equal_width"`` or ``"equal_mass"``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``.
        from_logits: apply softmax to ``probs`` first.

    Returns:
        The error as a Python float in [0, 1].

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]])
        >>> round(expected_calibration_error(probs, torch.tensor([0, 1, 1]), n_bins=10), 4)
        0.4167
    """
    n_bins = check_n_bins(n_bins)
    check_choice(binning, "binning", BINNINGS)
    check_choice(norm, "norm", NORMS)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    confidences, correct = top_label(probs, labels)
    statistics = equal_width_statistics if binning == "equal_width" else equal_mass_statistics
    return calibration_error_from_statistics(statistics(confidences, correct, n_bins), norm)


def adaptive_calibration_error(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> float:
    """AdaECE: :func:`expected_calibration_error` with equal-mass bins.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]])
        >>> round(adaptive_calibration_error(probs, torch.tensor([0, 1, 1]), n_bins=3), 4)
        0.4167
    """
    return expected_calibration_error(probs, labels, n_bins=n_bins, binning="equal_mass", from_logits=from_logits)


def maximum_calibration_error(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> float:
    """MCE: the largest |accuracy − confidence| gap over non-empty equal-width bins.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]])
        >>> round(maximum_calibration_error(probs, torch.tensor([0, 1, 1]), n_bins=10), 4)
        0.85
    """
    return expected_calibration_error(probs, labels, n_bins=n_bins, norm="max", from_logits=from_logits)


def classwise_calibration_error(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> float:
    r"""Classwise ECE (static calibration error, SCE).

    For each class k, the N values p_ik are put in equal-width bins and compared with the
    frequency of y = k in each bin; the per-class ECEs are averaged over the C classes:

    .. math:: \mathrm{SCE} = \frac{1}{C}\sum_k \sum_b \frac{n_{kb}}{N}\,
              \bigl|\overline{[y=k]}_{kb} - \overline{p_k}_{kb}\bigr|

    Memory is O(C·B) plus a bounded chunk of rows.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]])
        >>> round(classwise_calibration_error(probs, torch.tensor([0, 1, 1]), n_bins=10), 4)
        0.4167
    """
    n_bins = check_n_bins(n_bins)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    return classwise_error_from_statistics(classwise_statistics(probs, labels, n_bins))


def negative_log_likelihood(probs: Any, labels: Any, *, from_logits: bool = False) -> float:
    """Mean of −log p_{i,y_i} (nats), with p clamped at ≥ 1e-12 for the log only.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
        >>> round(negative_log_likelihood(probs, torch.tensor([0, 1])), 4)
        0.4904
    """
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    return nll_and_brier_sums(probs, labels)[0] / probs.shape[0]


def brier_score(probs: Any, labels: Any, *, from_logits: bool = False) -> float:
    """Mean over samples of Σ_k (p_ik − [y_i = k])², summed (not averaged) over classes.

    Ranges over [0, 2]. ``sklearn.metrics.brier_score_loss`` (≥ 1.7) gives the same value for
    C ≥ 3 and half of it for C = 2; conventions that average over classes divide it by C.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
        >>> round(brier_score(probs, torch.tensor([0, 1])), 4)
        0.3125
    """
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    return nll_and_brier_sums(probs, labels)[1] / probs.shape[0]


def accuracy(probs: Any, labels: Any, *, from_logits: bool = False) -> float:
    """Fraction of samples whose argmax (lowest index on ties) equals the label.

    Example:
        >>> import torch
        >>> accuracy(torch.tensor([[0.5, 0.5], [0.25, 0.75]]), torch.tensor([1, 1]))
        0.5
    """
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    return float(top_label(probs, labels)[1].mean())
