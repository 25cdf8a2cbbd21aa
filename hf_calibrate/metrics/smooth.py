"""Smooth ECE (smECE) of Błasiok & Nakkiran (2023), on top-label confidences (docs/design.md §2).

smECE_σ is the integral over t ∈ [0, 1] of |Σ_i w_i K_σ(t, c_i)(c_i − a_i)|, normalised by the
total smoothed mass, where K_σ is a Gaussian kernel reflected at 0 and 1. It is computed the way
``relplot`` computes it, so the two agree: the weighted samples are spread linearly onto a grid
of M points, the grid is reflected once at each end and convolved (by FFT here) with the kernel
sampled on the same grid, and the result is interpolated linearly onto T evaluation points:

    M = ⌊max(2000, round(20/σ)) / 2⌋ + 1,   T = max(200, round(10/σ)),
    smECE_σ = Σ_t |R(t)| / (Σ_t D(t) + 10⁻⁴·T)

with R and D the smoothed residual and mass at the points t. The automatic bandwidth is the
fixed point σ* where smECE_σ = σ, located by ten bisections of [0, 1] on the sign of
smECE_σ − σ; the value returned is smECE at the upper end of the last bracket (within 2⁻¹⁰ of σ*).

Where this discretisation departs from the integral we follow relplot, as the 1e-4 agreement
needs: the mass on the end points 0 and 1 is not mirrored, the kernel is cut at ±½ and for even M
sampled half a cell off centre, the sum weighs the end points fully, and the floor 10⁻⁴ is added;
docs/design.md §2 says by how much each moves the value.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, Optional

import torch

from ._checks import NonFiniteError, as_tensor, describe_positions, nonfinite_rows, prepare_inputs
from .functional import top_label

# relplot's discretisation (docs/design.md §2): grid and evaluation points per unit of 1/σ.
_GRID_POINTS_PER_INVERSE_BANDWIDTH, _MIN_GRID_POINTS = 20, 2000
_EVALUATION_POINTS_PER_INVERSE_BANDWIDTH, _MIN_EVALUATION_POINTS = 10, 200
# Added to the smoothed mass at every evaluation point (relplot's floor); moves smECE by a
# relative ≈ 1e-4 / Σw (up to 5e-4 / Σw at σ = 1, where the cut kernel keeps a fifth of the mass).
_DENSITY_FLOOR = 1e-4
# The bandwidth search: halvings of [0, 1]; bandwidths below the floor count as too small.
_BISECTIONS, _SEARCH_FLOOR = 10, 1e-3
#: Smallest explicit bandwidth: its grid holds 10⁶ points (a few tens of MB of FFT buffers).
MIN_BANDWIDTH = 1e-5


# ----------------------------------------------------------------------------- validation


def _check_bandwidth(bandwidth: Any) -> Optional[float]:
    """``None`` (automatic) or a float in [MIN_BANDWIDTH, ∞)."""
    if bandwidth is None:
        return None
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, numbers.Real):
        raise ValueError(f"bandwidth must be a positive number, or None to choose it automatically; got {bandwidth!r}.")
    value = float(bandwidth)
    if not math.isfinite(value):
        raise NonFiniteError(f"bandwidth must be finite, got {value}; pass a positive number, or None to choose it automatically.")
    if value <= 0.0:
        raise ValueError(f"bandwidth must be > 0, got {value:g}; pass a positive number, or None to choose it automatically.")
    if value < MIN_BANDWIDTH:
        raise ValueError(
            f"bandwidth {value:g} is below {MIN_BANDWIDTH:g}: its grid would need {round(10 / value):,} points. "
            f"Pass a bandwidth >= {MIN_BANDWIDTH:g}, or None to choose it automatically."
        )
    return value


def _check_vector(values: Any, name: str, like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A finite real (N,) tensor; with ``like``, of its length and on its device."""
    values = as_tensor(values, name)
    if values.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (N,), got shape {tuple(values.shape)}.")
    if values.is_complex():
        raise ValueError(f"{name} must be real, got dtype {values.dtype}; pass its real part or magnitude.")
    if like is None and values.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one sample is needed.")
    if like is not None and values.shape[0] != like.shape[0]:
        raise ValueError(
            f"confidences has {like.shape[0]} entries but {name} has {values.shape[0]}; they must describe the same samples."
        )
    if like is not None and values.device != like.device:
        raise ValueError(f"confidences is on {like.device} but {name} is on {values.device}; move both to one device.")
    bad = nonfinite_rows(values)
    if bad:
        raise NonFiniteError(
            f"{name} contains NaN or infinite values (positions {describe_positions(bad)}); the smooth ECE would be "
            "meaningless. Remove these samples, or fix the model or data that produced them."
        )
    return values


def _positions(mask: torch.Tensor) -> str:
    return describe_positions(torch.nonzero(mask).flatten().tolist())


def _check_confidences(confidences: Any) -> torch.Tensor:
    confidences = _check_vector(confidences, "confidences")
    if not confidences.is_floating_point():
        raise ValueError(f"confidences must be floating point, got dtype {confidences.dtype}; pass probabilities in [0, 1].")
    outside = (confidences < 0) | (confidences > 1)
    if bool(outside.any()):
        raise ValueError(
            f"confidences must lie in [0, 1] (positions {_positions(outside)} do not); pass the top-label "
            "probability max_k p_ik of each sample, or use smooth_calibration_error(logits, labels, from_logits=True)."
        )
    return confidences.double()


def _check_correct(correct: Any, confidences: torch.Tensor) -> torch.Tensor:
    correct = _check_vector(correct, "correct", like=confidences)
    not_binary = (correct != 0) & (correct != 1)
    if bool(not_binary.any()):
        raise ValueError(
            f"correct must hold 0/1 (or False/True) per sample (positions {_positions(not_binary)} do not); "
            "pass (predictions == labels), the correctness of each top-label prediction."
        )
    return correct.double()


def _check_weights(weights: Any, confidences: torch.Tensor) -> torch.Tensor:
    if weights is None:
        return torch.ones_like(confidences)
    weights = _check_vector(weights, "weights", like=confidences).double()
    negative = weights < 0
    if bool(negative.any()):
        raise ValueError(
            f"weights must be non-negative sample multiplicities (positions {_positions(negative)} are negative); "
            "pass counts such as a bootstrap replicate's, or None for weight 1 each."
        )
    if float(weights.sum()) <= 0.0:
        raise ValueError("weights sum to 0: give at least one sample a positive weight, or pass None for weight 1 each.")
    return weights


# ----------------------------------------------------------------------------- computation


def _spread_onto_grid(confidences: torch.Tensor, masses: torch.Tensor, points: int) -> torch.Tensor:
    """Linear binning: each (2, N) mass split between the two grid points j/(M−1) around its confidence."""
    position = confidences * (points - 1)
    left = position.floor().long().clamp_(0, points - 2)
    right_share = position - left
    grid = torch.zeros(masses.shape[0], points, dtype=torch.float64, device=masses.device)
    grid.index_add_(1, left, masses * (1.0 - right_share))
    grid.index_add_(1, left + 1, masses * right_share)
    return grid


def _reflected_gaussian_smoothing(grid: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """Convolve grid values with the Gaussian sampled on the grid, reflected once at 0 and at 1.

    The kernel is sampled at the M offsets j/(M−1) − ½ (for even M half a cell off centre,
    as relplot samples it) and spans ±½; the reflected grid spans [−1, 2] and, as relplot's, does
    not repeat the end points, so mass on 0 or 1 itself is not mirrored.
    """
    points = grid.shape[-1]
    offsets = torch.linspace(0.0, 1.0, points, dtype=torch.float64, device=grid.device) - 0.5
    kernel = torch.exp(-0.5 * (offsets / bandwidth) ** 2) / (math.sqrt(2.0 * math.pi) * bandwidth)
    flipped = grid.flip(-1)
    extended = torch.cat([flipped[..., :-1], grid, flipped[..., 1:]], dim=-1)
    size = 1 << (extended.shape[-1] + points - 2).bit_length()  # ≥ the full linear convolution
    spectrum = torch.fft.rfft(extended, n=size) * torch.fft.rfft(kernel, n=size)
    start = points - 1 + points // 2
    return torch.fft.irfft(spectrum, n=size)[..., start : start + points]


def _interpolate(grid: torch.Tensor, evaluation_points: int) -> torch.Tensor:
    """Linear interpolation of grid values at ``evaluation_points`` equally spaced t ∈ [0, 1]."""
    points = grid.shape[-1]
    position = torch.linspace(0.0, 1.0, evaluation_points, dtype=torch.float64, device=grid.device) * (points - 1)
    left = position.floor().long().clamp_(0, points - 2)
    right_share = position - left
    return grid[..., left] * (1.0 - right_share) + grid[..., left + 1] * right_share


def _smooth_ece_at(spread: Callable[[int], torch.Tensor], bandwidth: float) -> float:
    """smECE_σ from ``spread(M)``, the (weight, weight·residual) masses (2, M) on an M-point grid."""
    points = max(_MIN_GRID_POINTS, round(_GRID_POINTS_PER_INVERSE_BANDWIDTH / bandwidth)) // 2 + 1
    evaluation_points = max(_MIN_EVALUATION_POINTS, round(_EVALUATION_POINTS_PER_INVERSE_BANDWIDTH / bandwidth))
    smoothed = _reflected_gaussian_smoothing(spread(points), bandwidth)
    density, residual = _interpolate(smoothed, evaluation_points)
    return float(residual.abs().sum() / (density.sum() + _DENSITY_FLOOR * evaluation_points))


def _at_automatic_bandwidth(smooth_ece_at: Callable[[float], float]) -> float:
    """smECE at the bandwidth found by bisecting [0, 1] for the fixed point smECE_σ = σ.

    σ is too small while σ < smECE_σ (or σ < 10⁻³); the answer is the upper end of the last
    bracket. smECE_σ < 1 for every σ (|residual| ≤ 1, plus the density floor), so σ = 1 is never
    too small and needs evaluating only if every midpoint was.
    """
    low, high, value_at_high = 0.0, 1.0, None
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2.0
        value = None if middle < _SEARCH_FLOOR else smooth_ece_at(middle)
        if value is None or middle < value:
            low = middle
        else:
            high, value_at_high = middle, value
    return smooth_ece_at(high) if value_at_high is None else value_at_high


def _smooth_ece(confidences: torch.Tensor, correct: torch.Tensor, weights: torch.Tensor, bandwidth: Optional[float]) -> float:
    masses = torch.stack([weights, weights * (confidences - correct)])
    # Every σ ≥ 0.01 has the same 1001-point grid: the O(N) spreading is done once per grid size.
    spread = functools.lru_cache(maxsize=None)(functools.partial(_spread_onto_grid, confidences, masses))
    smooth_ece_at = functools.partial(_smooth_ece_at, spread)
    return _at_automatic_bandwidth(smooth_ece_at) if bandwidth is None else smooth_ece_at(bandwidth)


# ----------------------------------------------------------------------------- public API


def smooth_ece_from_confidences(
    confidences: Any, correct: Any, *, weights: Any = None, bandwidth: Optional[float] = None
) -> float:
    r"""Smooth ECE of top-label confidences ``c`` (N,) and 0/1 correctness ``a`` (N,).

    .. math:: \mathrm{smECE}_\sigma = \frac{\int_0^1 \bigl|\sum_i w_i K_\sigma(t, c_i)\,(c_i - a_i)\bigr|\,dt}
              {\int_0^1 \sum_i w_i K_\sigma(t, c_i)\,dt}

    with K_σ a Gaussian of standard deviation σ reflected at 0 and 1, discretised as relplot
    does (module docstring, docs/design.md §2). ``bandwidth=None`` picks σ* with smECE_σ* = σ*
    (to 2⁻¹⁰), the paper's automatic choice.

    Args:
        confidences: (N,) floating point values in [0, 1], torch or numpy, any device.
        correct: (N,) 0/1 or bool: whether each top-label prediction is right.
        weights: (N,) non-negative multiplicities (e.g. bootstrap counts), not all zero; a weight
            of k counts as k copies of the sample. ``None``: weight 1 each.
        bandwidth: σ ≥ 1e-5 in confidence units, or ``None`` for the automatic σ*.

    Returns:
        smECE in [0, 1], a Python float (the same units as the ECE).

    Example:
        >>> import torch
        >>> confidences = torch.tensor([0.9, 0.8, 0.6, 0.95])
        >>> round(smooth_ece_from_confidences(confidences, torch.tensor([1, 0, 1, 1])), 4)
        0.1377
        >>> round(smooth_ece_from_confidences(confidences, torch.tensor([1, 0, 1, 1]), bandwidth=0.1), 4)
        0.1747
    """
    sigma = _check_bandwidth(bandwidth)
    confidences = _check_confidences(confidences)
    correct = _check_correct(correct, confidences)
    return _smooth_ece(confidences, correct, _check_weights(weights, confidences), sigma)


def smooth_calibration_error(
    probs: Any, labels: Any, *, from_logits: bool = False, bandwidth: Optional[float] = None
) -> float:
    """Smooth ECE (Błasiok & Nakkiran, 2023) of the top-label confidence.

    :func:`smooth_ece_from_confidences` on ``c_i = max_k p_ik`` and ``a_i = [argmax_k p_ik = y_i]``
    (ties → lowest index), i.e. ``relplot.smECE`` of ``relplot.multiclass_logits_to_confidences``.

    Args:
        probs: (N, C) probabilities, rows summing to 1 (logits with ``from_logits=True``).
        labels: (N,) integer class indices in [0, C).
        from_logits: apply softmax to ``probs`` first.
        bandwidth: kernel σ ≥ 1e-5 in confidence units, or ``None`` for the automatic σ*.

    Returns:
        smECE in [0, 1], a Python float.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.05, 0.95]])
        >>> round(smooth_calibration_error(probs, torch.tensor([0, 0, 0, 1])), 4)
        0.1377
    """
    sigma = _check_bandwidth(bandwidth)
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    confidences, correct = top_label(probs, labels)
    return _smooth_ece(confidences, correct, torch.ones_like(confidences), sigma)
