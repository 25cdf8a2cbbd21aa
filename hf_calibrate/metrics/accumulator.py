"""The streaming accumulator :class:`CalibrationMetrics`: a thin stateful class over the functional core.

State (float64, on the device of the first batch):
    equal-width bin statistics (3, B), classwise statistics (3, C, B), Σ NLL, Σ Brier, and,
    only when ``adaptive=True``, the top-label confidence and correctness of each sample
    (needed for equal-mass bins; kept at the input's precision — float32 for float32 and
    narrower inputs — and as a bool: 5 bytes per sample, upcast exactly in ``compute``).
    Full probability rows are never kept.

With ``bootstrap=R`` (docs/design.md §2, "Intervals") the state also holds R Poisson-bootstrap
replicates: weighted equal-width statistics (R, 3, B), weighted Σ NLL and Σ Brier (R, 2) and an
int64 fingerprint of the sample indices — O(R·B) whatever N — plus, only with ``adaptive=True``,
each sample's int64 index, so AdaECE and smECE replicates are regenerated in ``compute``.

Across processes (``torch.distributed``, which Accelerate and torchrun initialise), sums are
all-reduced and the per-sample values gathered when :meth:`CalibrationMetrics.compute` runs;
the local state is left untouched, so ``compute`` may be called any number of times.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .._distributed import all_gather_variable, all_reduce_sum_, rank, world_size
from ._checks import check_flag, check_n_bins, prepare_inputs
from .binned import (
    calibration_error_from_statistics,
    classwise_error_from_statistics,
    classwise_statistics,
    equal_mass_statistics,
    equal_width_statistics,
    top_label,
)
from .bootstrap import bootstrap_statistics, index_fingerprint
from .draws import Draws, Interval, draws_from_statistics
from .functional import metrics_from_statistics
from .interval_options import (
    DEFAULT_CONFIDENCE,
    PER_SAMPLE_METRICS,
    check_confidence,
    check_metrics,
    check_replicates,
    check_sample_index,
    check_seed,
)
from .reliability import ReliabilityBins
from .scores import nll_and_brier_sums, nll_and_brier_terms
from .smooth import smooth_ece_from_confidences


class AccumulatorState(NamedTuple):
    """Copies of an accumulator's state, summed (and gathered) over processes when synced."""

    width: torch.Tensor  # (3, B)
    classes: torch.Tensor  # (3, C, B), C = 0 without classwise
    sums: torch.Tensor  # (Σ NLL, Σ Brier)
    confidences: Optional[torch.Tensor]  # (N,) float64, adaptive only
    correct: Optional[torch.Tensor]  # (N,) float64, adaptive only
    indices: Optional[torch.Tensor]  # (N,) int64, adaptive and bootstrap only
    replicate_width: Optional[torch.Tensor]  # (R, 3, B), bootstrap only
    replicate_sums: Optional[torch.Tensor]  # (R, 2), bootstrap only
    fingerprint: Optional[torch.Tensor]  # Σ h(index), int64, bootstrap only


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
        bootstrap: R Poisson-bootstrap replicates for confidence intervals (0: none, the state
            and ``compute()`` as without it); adds O(R·B) state and O(R·n) work per update.
        seed: seed of the bootstrap weights; a weight depends on (seed, replicate, sample index) only.

    ``compute()`` returns a dict with ``accuracy``, ``ece`` (equal-width, l1), ``ada_ece``
    (equal-mass; only with ``adaptive``), ``mce`` (max), ``rms_ce`` (l2), ``classwise_ece`` (only with ``classwise``),
    ``nll`` (nats), ``brier`` (summed over classes) and ``num_samples``; with ``bootstrap`` also
    ``intervals``: {metric: :meth:`Interval.to_dict`} at 95 % (see :meth:`intervals`).

    Under several processes every process must call ``compute()``, :meth:`intervals` and
    :func:`~hf_calibrate.metrics.streaming.paired_intervals` (they communicate), and each sample
    must be passed to ``update`` on exactly one process. Give each sample its global
    ``sample_index`` to make the intervals independent of how the samples were split.

    Example:
        >>> import torch
        >>> metrics = CalibrationMetrics(num_classes=2, n_bins=10)
        >>> metrics.update(torch.tensor([[0.95, 0.05], [0.85, 0.15]]), torch.tensor([0, 1]))
        >>> metrics.update(torch.tensor([[0.35, 0.65]]), torch.tensor([1]))
        >>> result = metrics.compute()
        >>> round(result["ece"], 4), result["num_samples"]
        (0.4167, 3)
    """

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        *,
        adaptive: bool = True,
        classwise: bool = True,
        bootstrap: int = 0,
        seed: int = 0,
    ) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}.")
        self.num_classes = num_classes
        self.n_bins = check_n_bins(n_bins)
        self.adaptive = check_flag(adaptive, "adaptive")
        self.classwise = check_flag(classwise, "classwise")
        self.bootstrap = check_replicates(bootstrap, "bootstrap", allow_zero=True)
        self.seed = check_seed(seed)
        self.reset()

    def reset(self) -> None:
        """Forget every sample seen so far."""
        self._width_stats: torch.Tensor | None = None
        self._class_stats: torch.Tensor | None = None
        self._sums: torch.Tensor | None = None  # (Σ NLL, Σ Brier)
        self._confidences: List[torch.Tensor] = []
        self._correct: List[torch.Tensor] = []
        # Bootstrap only: replicate statistics, index fingerprint, per-sample indices (adaptive).
        self._replicate_width: torch.Tensor | None = None
        self._replicate_sums: torch.Tensor | None = None
        self._fingerprint: torch.Tensor | None = None
        self._indices: List[torch.Tensor] = []
        self._seen = 0  # samples added on this process: the default indices count them
        self._explicit_index: bool | None = None  # whether the batches came with sample_index

    @property
    def device(self) -> torch.device | None:
        return None if self._width_stats is None else self._width_stats.device

    def update(
        self,
        probs: Any,
        labels: Any,
        *,
        sample_index: Any = None,
        from_logits: bool = False,
        validate: bool = True,
    ) -> None:
        """Add a batch: ``probs`` (n, C) probabilities (logits with ``from_logits``), ``labels`` (n,).

        ``sample_index`` (n,): the samples' global indices (non-negative integers), which key
        their bootstrap weights; default: a running count of the samples this process added
        (rank + world·count under several processes). Used only with ``bootstrap``.
        """
        probs, labels = prepare_inputs(probs, labels, from_logits=from_logits, validate=check_flag(validate, "validate"))
        if probs.shape[1] != self.num_classes:
            raise ValueError(
                f"this accumulator was built for {self.num_classes} classes but the batch has "
                f"{probs.shape[1]} columns."
            )
        if self.device is not None and probs.device != self.device:
            raise ValueError(
                f"this accumulator holds its state on {self.device} but the batch is on "
                f"{probs.device}; keep every batch on one device."
            )
        indices = self._batch_indices(sample_index, probs)
        if self._width_stats is None:
            self._width_stats, self._class_stats, self._sums, *replicates = self._zero_state(probs.device)
            self._replicate_width, self._replicate_sums, self._fingerprint = replicates
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
        if self.bootstrap:
            self._update_replicates(probs, labels, confidences, correct, indices, sample_index is not None)

    def _batch_indices(self, sample_index: Any, probs: torch.Tensor) -> torch.Tensor | None:
        """The batch's global sample indices (n,), checked before any state changes; None without bootstrap."""
        explicit = sample_index is not None
        indices = check_sample_index(sample_index, probs.shape[0]).to(probs.device) if explicit else None
        if not self.bootstrap:
            return None
        if self._explicit_index is not None and explicit != self._explicit_index:
            given = "with" if self._explicit_index else "without"
            raise ValueError(
                f"sample_index must be passed with every batch or with none, but earlier batches came {given} it; "
                "default indices count the samples added and would collide with explicit ones. Pass it with every batch."
            )
        if indices is None:
            count = torch.arange(self._seen, self._seen + probs.shape[0], device=probs.device)
            indices = rank() + world_size() * count
        return indices

    def _zero_state(self, device: torch.device | None) -> List[torch.Tensor | None]:
        """Zero width (3, B), classwise (3, C, B), sums (2,) and, with bootstrap, replicate tensors."""
        float64 = {"dtype": torch.float64, "device": device}
        replicates = self.bootstrap
        return [
            torch.zeros(3, self.n_bins, **float64),
            torch.zeros(3, self.num_classes if self.classwise else 0, self.n_bins, **float64),
            torch.zeros(2, **float64),
            torch.zeros(replicates, 3, self.n_bins, **float64) if replicates else None,
            torch.zeros(replicates, 2, **float64) if replicates else None,
            torch.zeros((), dtype=torch.int64, device=device) if replicates else None,
        ]

    def _update_replicates(
        self, probs: torch.Tensor, labels: torch.Tensor, confidences: torch.Tensor, correct: torch.Tensor,
        indices: torch.Tensor, explicit: bool,
    ) -> None:
        """Add the batch to every bootstrap replicate (weights keyed on seed, replicate, index)."""
        width, sums = bootstrap_statistics(
            confidences, correct, nll_and_brier_terms(probs, labels), indices,
            seed=self.seed, replicates=self.bootstrap, n_bins=self.n_bins,
        )
        self._replicate_width += width
        self._replicate_sums += sums
        self._fingerprint += index_fingerprint(indices)
        if self.adaptive:
            self._indices.append(indices)
        self._seen += probs.shape[0]
        self._explicit_index = explicit

    def _local_state(self, device: torch.device | None) -> AccumulatorState:
        """Copies of this process's state (zeros if it saw no batch), per-sample lists concatenated."""
        if self._width_stats is None:
            tensors = self._zero_state(device)
        else:
            tensors = [self._width_stats, self._class_stats, self._sums]
            tensors += [self._replicate_width, self._replicate_sums, self._fingerprint]
            tensors = [None if tensor is None else tensor.clone() for tensor in tensors]
        width = tensors[0]
        confidences = correct = indices = None
        if self.adaptive:
            empty = width.new_zeros(0)
            confidences = torch.cat(self._confidences).double() if self._confidences else empty
            correct = torch.cat(self._correct).double() if self._correct else empty
            if self.bootstrap:
                indices = torch.cat(self._indices) if self._indices else empty.long()
        width, classes, sums, replicate_width, replicate_sums, fingerprint = tensors
        return AccumulatorState(width, classes, sums, confidences, correct, indices, replicate_width, replicate_sums, fingerprint)

    def _synced_state(self, sync: bool) -> AccumulatorState:
        no_samples = "no samples were added: call update() with at least one batch before compute()."
        distributed = sync and world_size() > 1
        if self._width_stats is None and not distributed:
            raise ValueError(no_samples)
        # A process whose shard was empty still joins the collectives, with zero statistics.
        device = torch.device("cuda", torch.cuda.current_device()) if distributed and dist.get_backend() == "nccl" else None
        state = self._local_state(device if self.device is None else self.device)
        if not distributed:
            return state
        summed = (state.width, state.classes, state.sums, state.replicate_width, state.replicate_sums, state.fingerprint)
        for tensor in summed:
            if tensor is not None:
                all_reduce_sum_(tensor)
        gathered = [None if values is None else all_gather_variable(values) for values in state[3:6]]
        if not bool(state.width[0].sum() > 0):
            raise ValueError(no_samples.replace("were added", "were added on any process"))
        return state._replace(confidences=gathered[0], correct=gathered[1], indices=gathered[2])

    def compute(self, *, sync: bool = True) -> Dict[str, Any]:
        """Metric dict over every sample seen (on every process when ``sync`` and distributed)."""
        state = self._synced_state(sync)
        result: Dict[str, Any] = metrics_from_statistics(state.width, state.sums)
        result["num_samples"] = int(state.width[0].sum())
        if self.classwise:
            result["classwise_ece"] = classwise_error_from_statistics(state.classes)
        if self.adaptive:
            result["ada_ece"] = calibration_error_from_statistics(
                equal_mass_statistics(state.confidences, state.correct, self.n_bins), "l1"
            )
        if self.bootstrap:
            intervals = self._draws(state, self._metric_names(None)).intervals(DEFAULT_CONFIDENCE)
            result["intervals"] = {name: interval.to_dict() for name, interval in intervals.items()}
        return result

    def _metric_names(self, metrics: Optional[Sequence[str]]) -> Tuple[str, ...]:
        """Validated metric names for intervals of this accumulator (defaults for ``None``)."""
        if not self.bootstrap:
            raise ValueError(
                "intervals need bootstrap replicates, but this accumulator has bootstrap=0; "
                "build it with CalibrationMetrics(..., bootstrap=1000)."
            )
        reason = "it needs each sample's confidence: build the accumulator with adaptive=True."
        return check_metrics(metrics, {} if self.adaptive else dict.fromkeys(PER_SAMPLE_METRICS, reason))

    def _draws(self, state: AccumulatorState, names: Sequence[str]) -> Draws:
        statistics = (state.width, state.sums, state.replicate_width, state.replicate_sums)
        samples = (state.confidences, state.correct, state.indices) if self.adaptive else None
        return draws_from_statistics(
            names, statistics, samples, n_bins=self.n_bins, replicates=self.bootstrap, seed=self.seed
        )

    def intervals(
        self, *, metrics: Optional[Sequence[str]] = None, confidence: float = DEFAULT_CONFIDENCE, sync: bool = True
    ) -> Dict[str, Interval]:
        """Bootstrap percentile intervals over every sample seen (docs/design.md §2).

        The same intervals as :func:`~hf_calibrate.metrics.intervals.bootstrap_intervals` on the
        samples in index order, with the same seed (to float64 summation order). ``metrics``:
        the defaults are accuracy, ece, mce, rms_ce, nll, brier and, with ``adaptive``, ada_ece;
        smooth_ece on request (``adaptive`` only; one smECE per replicate).

        Example:
            >>> import torch
            >>> metrics = CalibrationMetrics(num_classes=2, bootstrap=200)
            >>> metrics.update(torch.tensor([[0.9, 0.1], [0.2, 0.8]] * 50), torch.tensor([0, 0] * 50))
            >>> interval = metrics.intervals(metrics=["accuracy"])["accuracy"]
            >>> interval.point, interval.low < 0.5 < interval.high, interval.replicates
            (0.5, True, 200)
        """
        names, confidence = self._metric_names(metrics), check_confidence(confidence)
        return self._draws(self._synced_state(sync), names).intervals(confidence)

    def smooth_ece(self, *, sync: bool = True) -> float:
        """smECE (automatic bandwidth; :func:`~hf_calibrate.metrics.smooth_calibration_error`) of the top-label
        confidence over every sample seen; needs ``adaptive`` (each sample's confidence)."""
        if not self.adaptive:
            raise ValueError("smooth_ece needs each sample's confidence: build the accumulator with adaptive=True.")
        state = self._synced_state(sync)
        return smooth_ece_from_confidences(state.confidences, state.correct)

    def reliability(self, *, sync: bool = True) -> ReliabilityBins:
        """Reliability-diagram data (equal-width bins) over every sample seen."""
        return ReliabilityBins.from_statistics(self._synced_state(sync)[0])
