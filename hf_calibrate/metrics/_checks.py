"""Input validation shared by the functional metrics and the streaming accumulator.

Every public metric funnels its inputs through :func:`prepare_inputs`, so a bad input gets the
same clear ``ValueError`` wherever it enters.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Tuple

import numpy as np
import torch

# Row sums of a probability matrix may drift from 1 by rounding; beyond this it is not one.
_ROW_SUM_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
_DEFAULT_ROW_SUM_TOLERANCE = 1e-3
# Elements (rows × classes) processed at once by the chunked reductions: bounds the float64
# working set (2 MiB per float64 temporary) whatever the number of classes, and keeps it cache-sized.
CHUNK_ELEMENTS = 1 << 18

BINNINGS = ("equal_width", "equal_mass")
NORMS = ("l1", "l2", "max")


def as_tensor(values: Any, name: str) -> torch.Tensor:
    """Turn a tensor, numpy array or nested list into a tensor without copying tensors."""
    if isinstance(values, torch.Tensor):
        return values
    if isinstance(values, np.ndarray):
        if values.dtype == object:
            raise ValueError(f"{name} has dtype object; pass a numeric array.")
        return torch.from_numpy(np.ascontiguousarray(values))
    try:
        return torch.as_tensor(np.asarray(values))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} could not be read as a numeric array: {err}") from None


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over classes in at least float32 (half-precision logits are upcast)."""
    return torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=1)


def check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}.")
    return int(n_bins)


def check_choice(value: str, name: str, choices: Tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}.")
    return value


def check_labels(labels: Any, num_classes: int, num_samples: int | None = None) -> torch.Tensor:
    """Validate integer class labels, shape (N,), values in [0, num_classes)."""
    labels = as_tensor(labels, "labels")
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional (N,), got shape {tuple(labels.shape)}.")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(
            f"labels must be integer class indices, got dtype {labels.dtype}; "
            "convert one-hot targets with argmax and float labels with .long()."
        )
    if num_samples is not None and labels.shape[0] != num_samples:
        raise ValueError(
            f"probs has {num_samples} rows but labels has {labels.shape[0]} entries; "
            "they must describe the same samples."
        )
    if labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"label {bad} is outside the valid range [0, {num_classes - 1}] for "
                f"{num_classes} classes."
            )
    return labels.long()


def check_probabilities(probs: torch.Tensor, *, from_logits: bool) -> torch.Tensor:
    """Validate an (N, C) matrix of probabilities (or logits when ``from_logits``)."""
    if probs.ndim != 2:
        raise ValueError(
            f"probs must be two-dimensional (N samples, C classes), got shape {tuple(probs.shape)}."
        )
    if probs.shape[0] == 0:
        raise ValueError("probs is empty: at least one sample is needed.")
    if probs.shape[1] == 0:
        raise ValueError("probs has zero classes: each row needs at least one class.")
    if not probs.is_floating_point():
        raise ValueError(f"probs must be floating point, got dtype {probs.dtype}.")
    # min/max propagate NaN, so one reduction checks finiteness and range without a mask copy.
    low, high = (float(v) for v in torch.aminmax(probs))
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("probs contains NaN or infinite values.")
    if from_logits:
        return softmax(probs)
    if low < 0.0 or high > 1.0:
        raise ValueError(
            f"probs must lie in [0, 1] (found values in [{low:.4g}, {high:.4g}]). "
            "If these are logits, apply softmax first or pass from_logits=True."
        )
    tolerance = _ROW_SUM_TOLERANCE.get(probs.dtype, _DEFAULT_ROW_SUM_TOLERANCE)
    # float32 row sums are accurate to ~1e-6 for any realistic C, far inside the tolerance.
    row_sums = probs.sum(dim=1, dtype=torch.float64 if probs.dtype == torch.float64 else torch.float32)
    worst = int(torch.argmax((row_sums - 1.0).abs()))
    if abs(float(row_sums[worst]) - 1.0) > tolerance:
        raise ValueError(
            f"each row of probs must sum to 1, but row {worst} sums to {float(row_sums[worst]):.6g}. "
            "If these are logits or scores, apply softmax first or pass from_logits=True."
        )
    return probs


def prepare_inputs(
    probs: Any, labels: Any, *, from_logits: bool = False, validate: bool = True
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validate and convert ``probs`` (N, C) and ``labels`` (N,) to tensors on one device."""
    probs = as_tensor(probs, "probs")
    labels = as_tensor(labels, "labels")
    if probs.device != labels.device:
        raise ValueError(
            f"probs is on {probs.device} but labels is on {labels.device}; move both to one device."
        )
    if not validate:
        return (softmax(probs) if from_logits else probs), labels.long()
    probs = check_probabilities(probs, from_logits=from_logits)
    labels = check_labels(labels, probs.shape[1], probs.shape[0])
    return probs, labels


def row_chunks(probs: torch.Tensor, labels: torch.Tensor) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Yield (probs, labels) in row chunks of about CHUNK_ELEMENTS values so float64 working copies stay small."""
    rows = max(1, CHUNK_ELEMENTS // max(1, probs.shape[1]))
    for start in range(0, probs.shape[0], rows):
        yield probs[start : start + rows], labels[start : start + rows]
