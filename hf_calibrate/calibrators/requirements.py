"""The least calibration data each method needs, checked on the cached logits (or labels) before anything is fitted.

A calibrator class states its :class:`DataRequirements` (its ``requirements`` attribute):
below ``rows`` rows, ``classes`` distinct classes or ``errors`` misclassified rows the data
cannot determine the method's parameters, and the fit is refused (:class:`InsufficientDataError`,
naming the count, the least and the fix); below ``advised_rows``, or with classes absent where
the method has per-class parameters (naming them), it is fitted with a warning; :func:`check_labels`
applies the same rule to the labels alone (the head methods, which see features, not logits).
:func:`check_calibration_data` also names rows whose logits are far larger than the others' (a
corrupted input, e.g. one pixel of 1e6): a handful of such rows decides a temperature alone; and
says when every value lies in [0, 1] — the model likely ends in a sigmoid, and its per-class
probabilities would be calibrated as if they were logits (Neural Clamping, whose fit is not on cached
logits alone, says so as it fits: :func:`warn_if_probabilities`). A model ending in a softmax is read
through the log of its probabilities (:mod:`hf_calibrate._probabilities`). Log-probabilities (a final log_softmax,
rows whose logsumexp is 0) are not warned about: they are the logits up to a per-row constant, which
softmax ignores — temperature scaling, Dirichlet, structured vector scaling and the binning methods
fit them exactly as the logits, and vector and matrix scaling fit their maps on log-probabilities,
as Dirichlet calibration does.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import torch

from .._warnings import warn_user
from ..metrics._checks import describe_positions

#: a row whose logit range (max − min over classes) exceeds this many times the median row's is an outlier
OUTLIER_FACTOR = 20.0
#: ... and exceeds this absolute range (logits): small ranges are never outliers
OUTLIER_MIN_RANGE = 50.0
#: what to do when the calibration data are too few or too easy
MORE_DATA_FIX = ("Calibrate on more held-out rows the model was not trained on — enough that it gets some of them wrong — "
                 "or use method='temperature', which needs the least.")


class InsufficientDataError(ValueError):
    """The calibration data are below what a method needs (too few rows, classes or errors)."""


@dataclasses.dataclass(frozen=True)
class DataRequirements:
    """The least calibration data a method needs.

    Attributes:
        rows: refuse fewer rows (samples).
        classes: refuse fewer distinct classes among the labels.
        errors: refuse fewer misclassified rows (the base's argmax is not the label).
        advised_rows: warn below this many rows: the fit works, but its choice of regularisation is noisy.
        per_class: the method has per-class parameters: warn when a class is absent (its parameters see no data).
    """

    rows: int = 1
    classes: int = 1
    errors: int = 0
    advised_rows: int = 1
    per_class: bool = False


def check_calibration_data(logits: torch.Tensor, labels: torch.Tensor, method: str, needs: DataRequirements,
                           distinct: Optional[int] = None, where: str = "the calibration data") -> List[str]:
    """Refuse (:class:`InsufficientDataError`) (N, C) ``logits`` and (N,) ``labels`` below ``needs``; return one warning
    line per lesser problem (few rows, absent classes, outlier rows, probabilities given as logits). ``distinct``: how
    many of the rows are distinct (copies teach a held-out choice nothing new); ``where``: what the rows are, in the
    refusal's words."""
    errors = int((logits.argmax(dim=1) != labels).sum())
    lines = check_labels(labels, logits.shape[1], method, needs, errors, distinct, where)  # refuses before the values' checks
    return probability_warnings(logits) + lines + outlier_warnings(logits)


def check_labels(labels: torch.Tensor, num_classes: int, method: str, needs: DataRequirements,
                 errors: Optional[int] = None, distinct: Optional[int] = None, where: str = "the calibration data") -> List[str]:
    """Refuse (:class:`InsufficientDataError`) the (N,) ``labels`` of a ``num_classes``-class model below ``needs``' rows
    and distinct classes (and misclassified rows, when the base's count ``errors`` is given); return a line for fewer
    (``distinct``, when given) rows than advised, and one naming the absent classes where ``needs.per_class`` (or only
    one class is present)."""
    rows, present = len(labels), int(torch.unique(labels).numel())
    counts = [(rows, needs.rows, "rows"), (present, needs.classes, "distinct classes")]
    if errors is not None:
        counts.append((errors, needs.errors, "misclassified rows"))
    facts = f"{rows} rows, {present} classes" + ("" if errors is None else f", {errors} misclassified")
    for count, least, what in counts:
        if count < least:
            raise InsufficientDataError(f"{method} needs at least {least} {what} in {where}, which have {count} "
                                        f"({facts}). {MORE_DATA_FIX}")
    lines = []
    unique = rows if distinct is None else distinct
    if unique < needs.advised_rows:
        counted = f"{unique} calibration rows" if unique == rows else f"{unique} distinct calibration rows (of {rows})"
        lines.append(f"{method}: {counted} are fewer than the {needs.advised_rows} it is advised to have; its "
                     f"held-out choice of regularisation is noisy. {MORE_DATA_FIX}")
    absent = absent_classes(labels, num_classes)
    if absent and (needs.per_class or present == 1):
        lines.append(f"{method}: {absent_classes_phrase(absent, num_classes)}, so the fit cannot learn how the model behaves "
                     "on them; calibrate on a sample of the data the model will see, holding every class.")
    return lines


def absent_classes(labels: torch.Tensor, num_classes: int) -> List[int]:
    """The class indices in [0, ``num_classes``) that none of the (N,) ``labels`` holds, ascending."""
    return (torch.bincount(labels.long().cpu(), minlength=num_classes) == 0).nonzero().squeeze(1).tolist()


def absent_classes_phrase(absent: Sequence[int], num_classes: int) -> str:
    """``"2 of the 10 classes are absent from the calibration data (classes 3, 7)"``: the words of a per-class fit's
    warning and of ``method="auto"``'s reason for leaving a per-class candidate out."""
    which = f"class {absent[0]}" if len(absent) == 1 else f"classes {describe_positions(absent)}"
    return f"{len(absent)} of the {num_classes} classes are absent from the calibration data ({which})"


def probability_warnings(logits: torch.Tensor) -> List[str]:
    """A line when the (N, C) ``logits``, C ≥ 2, look like per-class probabilities: every value within [0, 1] (the
    model's forward likely ends in a sigmoid). Else none. (A final softmax never gets here: a fit reads the log of its
    probabilities, :func:`hf_calibrate.fitting.runtime.probing.base_outputs`.)"""
    if float(logits.amin()) < 0 or float(logits.amax()) > 1 or logits.shape[1] < 2:
        return []
    return [f"the model's outputs look like per-class probabilities, not logits: all {logits.numel():,} values of the "
            f"{logits.shape[0]:,} calibration rows lie within [0, 1], so its forward likely ends in a sigmoid, and every "
            "method would read them as logits of a softmax over squashed scores. Calibrate the model without its final "
            "sigmoid (so that it returns its logits), or make it return the sigmoid's input (the log-odds)."]


def warn_if_probabilities(logits: torch.Tensor) -> None:
    """Warn (at the user's line) with :func:`probability_warnings`' line, for fits that warn as they go (Neural Clamping)."""
    for line in probability_warnings(logits):
        warn_user(line)


def outlier_warnings(logits: torch.Tensor) -> List[str]:
    """A line naming the rows whose logit range is over :data:`OUTLIER_FACTOR` times the median row's (and over
    :data:`OUTLIER_MIN_RANGE`), or none."""
    spans = (logits.amax(dim=1) - logits.amin(dim=1)).double()
    median = float(spans.median())
    outliers = ((spans > OUTLIER_FACTOR * median) & (spans > OUTLIER_MIN_RANGE)).nonzero().squeeze(1).tolist()
    if not outliers:
        return []
    return [f"calibration sample(s) {describe_positions(outliers)} (row positions) have logits spanning up to "
            f"{float(spans.max()):.3g}, over {OUTLIER_FACTOR:g}x the median row's {median:.3g}: a few such rows can decide the "
            "fit alone (often a corrupted input). Check these inputs, or remove them."]
