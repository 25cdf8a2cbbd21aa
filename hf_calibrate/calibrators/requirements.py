"""The least calibration data each logit method needs, checked on the cached logits before anything is fitted.

A logit calibrator class states its :class:`DataRequirements` (its ``requirements`` attribute):
below ``rows`` rows, ``classes`` distinct classes or ``errors`` misclassified rows the data
cannot determine the method's parameters, and the fit is refused (:class:`InsufficientDataError`,
naming the count, the least and the fix); below ``advised_rows``, or with classes absent where
the method has per-class parameters, it is fitted with a warning. :func:`calibration_data_warnings`
also names rows whose logits are far larger than the others' (a corrupted input, e.g. one pixel
of 1e6): a handful of such rows decides a temperature alone.
"""

from __future__ import annotations

import dataclasses
from typing import List

import torch

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


def check_calibration_data(logits: torch.Tensor, labels: torch.Tensor, method: str, needs: DataRequirements) -> List[str]:
    """Refuse (:class:`InsufficientDataError`) (N, C) ``logits`` and (N,) ``labels`` below ``needs``; return one warning
    line per lesser problem (few rows, absent classes, outlier rows)."""
    rows, num_classes = logits.shape
    present = int(torch.unique(labels).numel())
    errors = int((logits.argmax(dim=1) != labels).sum())
    for count, least, what in ((rows, needs.rows, "rows"), (present, needs.classes, "distinct classes"),
                               (errors, needs.errors, "misclassified rows")):
        if count < least:
            raise InsufficientDataError(f"{method} needs at least {least} {what} in the calibration data, which have {count} "
                                        f"({rows} rows, {present} classes, {errors} misclassified). {MORE_DATA_FIX}")
    lines = []
    if rows < needs.advised_rows:
        lines.append(f"{method}: {rows} calibration rows are fewer than the {needs.advised_rows} it is advised to have; its "
                     f"held-out choice of regularisation is noisy. {MORE_DATA_FIX}")
    if present < num_classes and (needs.per_class or present == 1):
        lines.append(f"{method}: {num_classes - present} of the {num_classes} classes are absent from the calibration data "
                     f"({present} present), so the fit cannot learn how the model behaves on them; calibrate on a sample of "
                     "the data the model will see, holding every class.")
    return lines + outlier_warnings(logits)


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
