"""Input validation shared by the functional metrics and the streaming accumulator.

Every public metric funnels its inputs through :func:`prepare_inputs`, so a bad input gets the
same clear ``ValueError`` wherever it enters. The finiteness helpers (:class:`NonFiniteError`,
:func:`nonfinite_rows`, :func:`describe_positions`) are shared with the calibrators and the
fitting engine, so a NaN gets the same kind of error wherever it is found.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Iterator, List, Sequence, Tuple

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


class NonFiniteError(ValueError):
    """NaN or infinite values where a calibration or a metric needs finite numbers."""


def nonfinite_rows(values: torch.Tensor) -> List[int]:
    """Indices along the first dimension of the rows of ``values`` holding NaN or ±inf.

    Non-floating tensors (token ids, masks) are always finite: the answer is ``[]``.
    """
    if not values.is_floating_point() or values.numel() == 0:
        return []
    # NaN and ±inf always reach the sum, so one allocation-free reduction clears the common case;
    # a sum that merely overflows only costs the exact row check below.
    accumulate = torch.float64 if values.dtype == torch.float64 else torch.float32
    if bool(torch.isfinite(values.sum(dtype=accumulate))):
        return []
    finite = torch.isfinite(values.reshape(max(1, values.shape[0] if values.ndim else 1), -1))
    return torch.nonzero(~finite.all(dim=1)).flatten().tolist()


def describe_positions(positions: Sequence[int], limit: int = 10) -> str:
    """``"3, 17"`` or ``"3, 17, … (25 in all)"``: positions for an error message."""
    shown = ", ".join(str(int(p)) for p in positions[:limit])
    return shown if len(positions) <= limit else f"{shown}, … ({len(positions)} in all)"


def _string_labels_message(name: str, example: Any) -> str:
    return (
        f"{name} hold class names (e.g. {str(example)!r}), not class indices; map them to indices with the "
        f"model's label2id, e.g. [model.config.label2id[name] for name in {name}]."
    )


def as_tensor(values: Any, name: str) -> torch.Tensor:
    """Turn a tensor, numpy array or nested list into a tensor without copying tensors."""
    if isinstance(values, torch.Tensor):
        return values
    if not isinstance(values, np.ndarray):
        try:
            values = np.asarray(values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} could not be read as a numeric array: {err}") from None
    if values.dtype.kind in "USO" and values.size:
        example = values.flat[0]
        if isinstance(example, (str, bytes)):
            if name == "labels":
                raise ValueError(_string_labels_message(name, example))
            raise ValueError(f"{name} holds strings (e.g. {str(example)!r}); pass numbers.")
    if values.dtype == object:
        raise ValueError(f"{name} has dtype object; pass a numeric array.")
    try:
        return torch.from_numpy(np.ascontiguousarray(values))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} could not be read as a numeric array: {err}") from None


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a bool; anything but True/False (e.g. the string ``'no'``, which is truthy) is refused."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over classes in at least float32 (half-precision logits are upcast)."""
    return torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=1)


#: the most bins a binned metric takes (as the binning calibrators): its tables are allocated per bin
MAX_METRIC_BINS = 10_000


def check_n_bins(n_bins: Any) -> int:
    """An integer from 1 to :data:`MAX_METRIC_BINS`, checked before any per-bin table is allocated."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or not 1 <= n_bins <= MAX_METRIC_BINS:
        raise ValueError(f"n_bins must be an integer from 1 to {MAX_METRIC_BINS:,}, got {n_bins!r}: pass e.g. n_bins=15 "
                         "(the default).")
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
        rows = describe_positions(nonfinite_rows(probs))
        raise NonFiniteError(
            f"probs contains NaN or infinite values (rows {rows}); every confidence computed from them would be "
            "meaningless. Remove these samples, or fix the model or data that produced them."
        )
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
    from_logits = check_flag(from_logits, "from_logits")
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


def _kind(value: Any) -> str:
    """numpy's dtype kind of one value: ``"i"``/``"u"`` for integers, ``"b"``, ``"f"``, ``"U"``, ..."""
    if type(value) is int:
        return "i"
    return np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value).dtype.kind


def check_references(references: Any) -> None:
    """Refuse references that ``evaluate`` would silently cast to int64: floats (0.9 → 0), bools, strings."""
    if references is None:
        return
    if isinstance(references, torch.Tensor):
        references = references.cpu().numpy()
    if isinstance(references, np.ndarray) and references.dtype != object:
        if references.dtype.kind in "iu" or references.size == 0:
            return
        bad = references.reshape(-1)[0]
    else:
        bad = next((value for value in references if _kind(value) not in "iu"), None)
        if bad is None:
            return
    kind = _kind(bad)
    if kind in "USO" and isinstance(bad, (str, bytes, np.str_)):
        raise ValueError(_string_labels_message("references", bad))
    what = "booleans" if kind == "b" else "floats" if kind == "f" else type(bad).__name__
    raise ValueError(
        f"references must be integer class indices, got {what} (e.g. {bad!r}); evaluate would cast them to "
        "integers silently (0.9 → 0, True → 1). Pass the true class index of each sample (argmax of one-hot targets)."
    )


class EvaluateInputChecks:
    """Mixin for the ``evaluate`` modules: check references before ``evaluate`` casts them to int64.

    Put it before ``evaluate.Metric`` in the bases: ``class Ece(EvaluateInputChecks, evaluate.Metric)``.
    """

    # evaluate appends each module's input description to these docstrings: they must exist.
    def add_batch(self, *, predictions: Any = None, references: Any = None, **kwargs: Any) -> Any:
        """Add a batch of predictions and references (references checked first)."""
        check_references(references)
        return super().add_batch(predictions=predictions, references=references, **kwargs)  # type: ignore[misc]

    def add(self, *, prediction: Any = None, reference: Any = None, **kwargs: Any) -> Any:
        """Add one prediction and reference (the reference checked first)."""
        if reference is not None:
            check_references([reference])
        return super().add(prediction=prediction, reference=reference, **kwargs)  # type: ignore[misc]

    def compute(self, *, predictions: Any = None, references: Any = None, **options: Any) -> Any:
        """Compute the metric over the batches added (and these); an unknown option is a ValueError listing the module's
        options, raised before ``evaluate`` consumes the batches, so a corrected call still has them."""
        known = [name for name in inspect.signature(self._compute).parameters if name not in ("predictions", "references")]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{type(self).__name__.lower()}: unknown option(s) {', '.join(map(repr, unknown))}; the options "
                             f"are {', '.join(known)}. Check the spelling (the batches added so far are kept).")
        return super().compute(predictions=predictions, references=references, **options)  # type: ignore[misc]
