"""Base logits a fit computes anyway, kept for an evaluation on the same data.

``hf-calibrate fit`` without ``--eval-split`` evaluates on the data it calibrated on. The fit
has already run the base model over all of that data: the logit methods in one pass, Neural
Clamping over its fit and held-out parts, the head methods in their feature pass (which
computes the logits too). A :class:`KeptLogits` set as the fit engine's ``kept_logits``
receives those base logits (without δ, without a new head) of the one data object it names,
and :meth:`KeptLogits.take` hands them over in dataset order, so the evaluation need not run
the base model again (:func:`hf_calibrate.fit_evaluate.fit_and_evaluate`).
"""

from __future__ import annotations

import torch

from ...data import PreparedData


class KeptLogits:
    """Base logits and labels of the samples of one :class:`PreparedData`, received part by part during a fit.

    Parts of any other data object (a separate validation split, the temperature data) are
    ignored. Parts are referenced, not copied, until :meth:`take`.
    """

    def __init__(self, data: PreparedData) -> None:
        self.data = data
        self._parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def wants(self, data: PreparedData) -> bool:
        """Whether base logits of ``data`` are to be kept (it is the very object this record names)."""
        return data is self.data

    def add(self, data: PreparedData, indices: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Keep the float32 base ``logits`` (n, C) and ``labels`` (n,) of the samples ``indices`` (n,) of ``data``."""
        if self.wants(data):
            self._parts.append((indices.cpu(), logits, labels))

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits (N, C) float32, labels (N,)) of every sample in dataset order, and forget them here.

        None when some sample of the data was not received. One part already in dataset order
        is handed over as it is; several parts are written into one tensor (one copy, each part
        released as soon as it is written).
        """
        parts, self._parts = self._parts, []
        count = len(self.data)
        covered = torch.zeros(count, dtype=torch.bool)
        for indices, _, _ in parts:
            covered[indices] = True
        if not parts or not bool(covered.all()):
            return None
        if len(parts) == 1 and torch.equal(parts[0][0], torch.arange(count)):
            return parts[0][1], parts[0][2]
        logits = parts[0][1].new_empty(count, parts[0][1].shape[1])
        labels = parts[0][2].new_empty(count)
        while parts:
            indices, part_logits, part_labels = parts.pop()
            logits[indices.to(logits.device)] = part_logits
            labels[indices.to(labels.device)] = part_labels
        return logits, labels
