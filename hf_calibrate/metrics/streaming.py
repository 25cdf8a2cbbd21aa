"""Streaming calibration metrics: a thin stateful accumulator over the functional core.

State (float64, on the device of the first batch):
    equal-width bin statistics (3, B), classwise statistics (3, C, B), Σ NLL, Σ Brier, and,
    only when ``adaptive=True``, the top-label confidence and correctness of each sample
    (needed for equal-mass bins; kept at the input's precision — float32 for float32 and
    narrower inputs — and as a bool: 5 bytes per sample, upcast exactly in ``compute``).
    Full probability rows are never kept.

Across processes (``torch.distributed``, which Accelerate and torchrun initialise), sums are
all-reduced and the per-sample pairs gathered when :meth:`CalibrationMetrics.compute` runs;
the local state is left untouched, so ``compute`` may be called any number of times.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist

from .._distributed import all_gather_variable, all_reduce_sum_, world_size
from ._checks import check_flag, check_n_bins, prepare_inputs
from .functional import (
    ReliabilityBins,
    calibration_error_from_statistics,
    classwise_error_from_statistics,
    classwise_statistics,
    equal_mass_statistics,
    equal_width_statistics,
    nll_and_brier_sums,
    top_label,
)

class CalibrationMetrics:
    """Accumulate calibration metrics over batches, and across processes.

    Args:
        num_classes: number of classes C.
        n_bins: number of bins B for every binned metric.
        adaptive: also compute AdaECE (equal-mass bins), which keeps a confidence and a
            correctness flag per sample (5 bytes for float32 inputs, 9 for float64);
            with ``False`` memory is O(B·C) whatever the number of samples.
        classwise: also compute the classwise ECE, which bins all N·C probabilities (the
            costliest part of an update); with ``False`` the state is O(B).

    ``compute()`` returns a dict with ``accuracy``, ``ece`` (equal-width, l1), ``ada_ece``
    (equal-mass; only with ``adaptive``), ``mce`` (max), ``rms_ce`` (l2), ``classwise_ece`` (only with ``classwise``),
    ``nll`` (nats), ``brier`` (summed over classes) and ``num_samples``.

    Under several processes every process must call ``compute()`` (it communicates), and
    each sample must be passed to ``update`` on exactly one process.

    Example:
        >>> import torch
        >>> metrics = CalibrationMetrics(num_classes=2, n_bins=10)
        >>> metrics.update(torch.tensor([[0.95, 0.05], [0.85, 0.15]]), torch.tensor([0, 1]))
        >>> metrics.update(torch.tensor([[0.35, 0.65]]), torch.tensor([1]))
        >>> result = metrics.compute()
        >>> round(result["ece"], 4), result["num_samples"]
        (0.4167, 3)
    """

    def __init__(self, num_classes: int, n_bins: int = 15, *, adaptive: bool = True, classwise: bool = True) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}.")
        self.num_classes = num_classes
        self.n_bins = check_n_bins(n_bins)
        self.adaptive = check_flag(adaptive, "adaptive")
        self.classwise = check_flag(classwise, "classwise")
        self.reset()

    def reset(self) -> None:
        """Forget every sample seen so far."""
        self._width_stats: torch.Tensor | None = None
        self._class_stats: torch.Tensor | None = None
        self._sums: torch.Tensor | None = None  # (Σ NLL, Σ Brier)
        self._confidences: List[torch.Tensor] = []
        self._correct: List[torch.Tensor] = []

    @property
    def device(self) -> torch.device | None:
        return None if self._width_stats is None else self._width_stats.device

    def update(self, probs: Any, labels: Any, *, from_logits: bool = False, validate: bool = True) -> None:
        """Add a batch: ``probs`` (n, C) probabilities (logits with ``from_logits``), ``labels`` (n,)."""
        probs, labels = prepare_inputs(probs, labels, from_logits=from_logits, validate=check_flag(validate, "validate"))
        if probs.shape[1] != self.num_classes:
            raise ValueError(
                f"this accumulator was built for {self.num_classes} classes but the batch has "
                f"{probs.shape[1]} columns."
            )
        if self._width_stats is None:
            self._width_stats = torch.zeros(3, self.n_bins, dtype=torch.float64, device=probs.device)
            self._class_stats = torch.zeros(
                3, self.num_classes if self.classwise else 0, self.n_bins, dtype=torch.float64, device=probs.device
            )
            self._sums = torch.zeros(2, dtype=torch.float64, device=probs.device)
        elif probs.device != self.device:
            raise ValueError(
                f"this accumulator holds its state on {self.device} but the batch is on "
                f"{probs.device}; keep every batch on one device."
            )
        confidences, correct = top_label(probs, labels)
        self._width_stats += equal_width_statistics(confidences, correct, self.n_bins)
        if self.classwise:
            self._class_stats += classwise_statistics(probs, labels, self.n_bins)
        self._sums += torch.tensor(nll_and_brier_sums(probs, labels), dtype=torch.float64, device=probs.device)
        if self.adaptive:
            # The float64 confidence is an upcast of an entry of probs: storing it at probs'
            # precision (at least float32) and correctness as bool is lossless.
            narrow = probs.dtype in (torch.float32, torch.float16, torch.bfloat16)
            self._confidences.append(confidences.float() if narrow else confidences)
            self._correct.append(correct.bool())

    def _synced_state(self, sync: bool):
        no_samples = "no samples were added: call update() with at least one batch before compute()."
        distributed = sync and world_size() > 1
        if self._width_stats is not None:
            width, classes, sums = self._width_stats.clone(), self._class_stats.clone(), self._sums.clone()
        elif distributed:
            # This process's shard was empty; it still joins the collectives, with zero statistics.
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
            width = torch.zeros(3, self.n_bins, dtype=torch.float64, device=device)
            classes = torch.zeros(3, self.num_classes if self.classwise else 0, self.n_bins, dtype=torch.float64, device=device)
            sums = torch.zeros(2, dtype=torch.float64, device=device)
        else:
            raise ValueError(no_samples)
        confidences = correct = None
        if self.adaptive:
            empty = width.new_zeros(0)
            confidences = torch.cat(self._confidences).double() if self._confidences else empty
            correct = torch.cat(self._correct).double() if self._correct else empty
        if distributed:
            for tensor in (width, classes, sums):
                all_reduce_sum_(tensor)
            if self.adaptive:
                confidences = all_gather_variable(confidences)
                correct = all_gather_variable(correct)
            if not bool(width[0].sum() > 0):
                raise ValueError(no_samples.replace("were added", "were added on any process"))
        return width, classes, sums, confidences, correct

    def compute(self, *, sync: bool = True) -> Dict[str, float]:
        """Metric dict over every sample seen (on every process when ``sync`` and distributed)."""
        width, classes, sums, confidences, correct = self._synced_state(sync)
        num_samples = int(width[0].sum())
        result: Dict[str, Any] = {
            "accuracy": float(width[2].sum()) / num_samples,
            "ece": calibration_error_from_statistics(width, "l1"),
            "mce": calibration_error_from_statistics(width, "max"),
            "rms_ce": calibration_error_from_statistics(width, "l2"),
            "nll": float(sums[0]) / num_samples,
            "brier": float(sums[1]) / num_samples,
            "num_samples": num_samples,
        }
        if self.classwise:
            result["classwise_ece"] = classwise_error_from_statistics(classes)
        if self.adaptive:
            result["ada_ece"] = calibration_error_from_statistics(
                equal_mass_statistics(confidences, correct, self.n_bins), "l1"
            )
        return result

    def reliability(self, *, sync: bool = True) -> ReliabilityBins:
        """Reliability-diagram data (equal-width bins) over every sample seen."""
        return ReliabilityBins.from_statistics(self._synced_state(sync)[0])


def calibration_report(probs: Any, labels: Any, *, n_bins: int = 15, from_logits: bool = False) -> Dict[str, float]:
    """Every metric of :class:`CalibrationMetrics` on one (N, C) array, in one pass.

    Example:
        >>> import torch
        >>> report = calibration_report(torch.tensor([[0.95, 0.05], [0.35, 0.65]]), torch.tensor([0, 1]))
        >>> round(report["accuracy"], 2), round(report["ece"], 2)
        (1.0, 0.2)
    """
    probs, labels = prepare_inputs(probs, labels, from_logits=from_logits)
    metrics = CalibrationMetrics(probs.shape[1], n_bins=n_bins)
    metrics.update(probs, labels, validate=False)
    return metrics.compute(sync=False)
