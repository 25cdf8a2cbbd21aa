"""The Accelerate-driven engine every fit runs on.

One code path for a laptop CPU, one GPU, or many GPUs and nodes (``accelerate launch`` /
``torchrun``): Accelerate sets up the device and the process group; the engine

* splits every *global* batch of indices (seeded, identical on every process) into one
  strided shard per process and, within a shard, into micro-batches that fit in memory;
* sums per-sample losses divided by the global batch size, so all-reducing (summing) the
  gradients of the few trainable tensors gives exactly the single-process gradient;
* gathers per-sample outputs back into the global index order.

A fit is therefore the same on 1 or N processes up to floating-point summation order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from ... import _distributed
from ..._probabilities import LOGITS, PROBABILITIES
from ..._progress import progress_bar
from ...backbones import Backbone, Inputs
from ...calibrators.options import check_fields, require
from ...calibrators.holdout import holdout_split, seeded_generator
from ...data import DEFAULT_CACHE_BYTES, CalibrationData, StreamedData
from ...metrics._checks import check_labels
from .faults import FaultLedger, check_finite_outputs, note_bad_inputs
from .kept_logits import KeptLogits
from .collected_rows import DEFAULT_SPILL_BYTES, RowBuffer
from .scan import scan_stream

MIXED_PRECISION = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass
class EngineOptions:
    """Options of every fit, whatever the method.

    Attributes:
        batch_size: samples per optimizer step and per inference batch, over all processes
            (default 1000, the Neural Clamping reference).
        micro_batch_size: samples per forward pass on each process (default None: the whole
            per-process share of a batch); gradients are accumulated over micro-batches, so
            this trades memory for nothing but speed.
        seed: seeds the data split, the shuffling and any augmentation (default 0).
        progress: show progress bars on the main process (default True): redrawn in a terminal,
            one line per stage in a log (``hf_calibrate._progress``).
        mixed_precision: ``"no"``, ``"bf16"`` or ``"fp16"`` autocast for the base model's
            forward pass (default None: the Accelerate setting, e.g. from
            ``accelerate launch --mixed_precision``). Calibration parameters stay float32.
        num_workers: DataLoader worker processes (default 0).
        accelerator: an existing ``accelerate.Accelerator`` to run on (default: a new one).
        preprocessor: the model's image processor or tokenizer (or a callable image → tensor),
            used for raw ``image``/``text`` rows of a ``datasets.Dataset``.
        preprocess: callable turning one dataset row (dict) into model inputs (dict).
        image_column, text_column, label_column: column names when not the usual ones.
        max_length: tokenizer truncation length for raw text (default: the tokenizer's).
        cache_bytes: preprocessed inputs kept in memory for a fit's later passes, in bytes over
            all processes (default 2 GiB). A stream whose inputs take more is read again for each
            pass, and shuffled within blocks of samples taking about this much (docs/design.md §3.0).
        spill_bytes: logits or features a pass collects (float32, one row per sample) beyond this
            many bytes go to a memory-mapped temporary file instead of memory (default 4 GiB;
            :mod:`hf_calibrate.fitting.runtime.collected_rows`).
        base_outputs: what the base model returns, ``"logits"`` or ``"probabilities"`` (its forward ends in a
            softmax: the fit reads their log); default None: ``"probabilities"`` when its first 16 calibration rows
            are non-negative and sum to 1 (:func:`hf_calibrate.fitting.runtime.probing.base_outputs`), else ``"logits"``.
    """

    batch_size: int = 1000
    micro_batch_size: Optional[int] = None
    seed: int = 0
    progress: bool = True
    mixed_precision: Optional[str] = None
    num_workers: int = 0
    accelerator: Any = None
    preprocessor: Any = None
    preprocess: Optional[Callable[[dict], dict]] = None
    image_column: Optional[str] = None
    text_column: Optional[str] = None
    label_column: Optional[str] = None
    max_length: Optional[int] = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    spill_bytes: int = DEFAULT_SPILL_BYTES
    base_outputs: Optional[str] = None

    def __post_init__(self) -> None:
        check_fields(self)
        require(self.batch_size >= 1, "batch_size", self.batch_size, "a positive integer")
        require(self.micro_batch_size is None or self.micro_batch_size >= 1, "micro_batch_size", self.micro_batch_size,
                "a positive integer or None")
        require(self.num_workers >= 0, "num_workers", self.num_workers, "an integer >= 0")
        require(self.max_length is None or self.max_length >= 1, "max_length", self.max_length, "a positive integer or None")
        require(self.cache_bytes >= 0, "cache_bytes", self.cache_bytes, "a number of bytes >= 0")
        require(self.spill_bytes >= 0, "spill_bytes", self.spill_bytes, "a number of bytes >= 0")
        require(self.mixed_precision is None or self.mixed_precision in MIXED_PRECISION, "mixed_precision",
                self.mixed_precision, f"one of {list(MIXED_PRECISION)} or None")
        require(self.base_outputs in (None, LOGITS, PROBABILITIES), "base_outputs", self.base_outputs,
                f"{LOGITS!r}, {PROBABILITIES!r} or None")

    def data_options(self) -> dict:
        names = ("preprocessor", "preprocess", "image_column", "text_column", "label_column", "max_length", "cache_bytes",
                 "progress")
        return {name: getattr(self, name) for name in names}


class Engine:
    """Device, processes, batching, precision and progress for one fit."""

    def __init__(self, options: EngineOptions) -> None:
        from accelerate import Accelerator

        self.options = options
        self.accelerator = options.accelerator if options.accelerator is not None else Accelerator()
        self.device = self.accelerator.device
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.faults = FaultLedger()  # bad data found on this process, raised on all (see faults.py)
        #: receives the base logits this fit computes of one data object (see kept_logits.py); None: keep none
        self.kept_logits: Optional[KeptLogits] = None
        #: receives (dataset rows, per-row held-out NLL difference to temperature scaling) of a cross-fitted Neural
        #: Clamping fit, which ``method="auto"`` compares it by (see auto/clamping.py); None: keep none
        self.held_out_sink: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None
        if _distributed.world_size() != self.world:
            raise RuntimeError(
                f"torch.distributed runs {_distributed.world_size()} processes but Accelerate reports {self.world}: "
                "Accelerate's state was created before the process group (e.g. a bare PartialState() under torchrun "
                "without ACCELERATE_USE_CPU on CPU). Create accelerate.Accelerator() first, or pass accelerator=...."
            )
        precision = options.mixed_precision or str(self.accelerator.mixed_precision)
        self.amp_dtype = MIXED_PRECISION.get(precision)
        if self.amp_dtype is torch.float16 and self.device.type == "cpu":
            raise ValueError("mixed_precision='fp16' needs a GPU; use 'bf16' on CPU.")

    # ------------------------------------------------------------------ precision, progress
    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def progress(self, total: int, description: str) -> Any:
        """A bar on the main process when ``progress`` is on: redrawn in a terminal, one line per stage in a log."""
        return progress_bar(total=total, desc=description, enabled=self.options.progress and self.is_main, leave=False)

    def generator(self, *salt: int) -> torch.Generator:
        """A CPU generator seeded by the fit seed and ``salt`` (e.g. epoch, rank)."""
        return seeded_generator(self.options.seed, *salt)

    # ------------------------------------------------------------------ batching
    def split_indices(self, count: int, holdout_fraction: float,
                      groups: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Seeded (fit, holdout) split of ``range(count)`` (:func:`~hf_calibrate.calibrators.holdout.holdout_split`:
        ``round(holdout_fraction · count)`` held out, Python's round half to even, e.g. 10 × 0.25 → 2; none for
        fraction 0), the same on every process. With (count,) ``groups``
        (:func:`~hf_calibrate.calibrators.holdout.content_groups`) a row's copies stay in one part, and the fraction is
        of the distinct rows."""
        return holdout_split(count, holdout_fraction, self.options.seed, groups)

    def global_batches(self, indices: torch.Tensor, *, shuffle: bool, epoch: int = 0, block: Optional[int] = None) -> List[torch.Tensor]:
        """Batches of ``batch_size`` indices (seeded shuffle), the same for any number of processes (a
        process with no sample of a batch still takes part in its collectives).

        ``block`` (a stream's ``shuffle_block``): the shuffle permutes consecutive blocks of that
        many indices one by one, so that a pass over a stream holds about one block; the same
        permutation as without it when the indices fit in one block.
        """
        if len(indices) < self.world:
            raise ValueError(f"{len(indices)} samples cannot be shared by {self.world} processes; use more data.")
        if shuffle:
            indices = self._shuffled(indices, epoch, block)
        return list(indices.split(self.options.batch_size))

    def _shuffled(self, indices: torch.Tensor, epoch: int, block: Optional[int]) -> torch.Tensor:
        if block is None or len(indices) <= block:
            return indices[torch.randperm(len(indices), generator=self.generator(epoch, 0xBA7C4))]
        parts = indices.split(block)
        return torch.cat([part[torch.randperm(len(part), generator=self.generator(epoch, 0xBA7C4, number))]
                          for number, part in enumerate(parts)])

    def local_micro_batches(self, data: CalibrationData, global_batch: torch.Tensor) -> List[torch.Tensor]:
        """This process's share of a global batch (:meth:`~hf_calibrate.data.PreparedData.local_share`), cut into
        micro-batches of dataset indices (1-D int64 tensors: a few bytes per sample of a pass)."""
        local = data.local_share(global_batch, self.rank, self.world)
        size = self.options.micro_batch_size or max(len(local), 1)
        return list(local.split(size)) if len(local) else []

    def iterate(self, data: CalibrationData, global_batches: Sequence[torch.Tensor]) -> Iterator[Tuple[int, List[int], Inputs, torch.Tensor]]:
        """Yield (global batch number, indices, inputs, labels) for each local micro-batch, on device (unchecked)."""
        plan = [(number, micro) for number, batch in enumerate(global_batches) for micro in self.local_micro_batches(data, batch)]
        if not plan:
            return
        micro_batches = [micro for _, micro in plan]
        if isinstance(data, StreamedData):
            batches = data.serve(micro_batches, self.rank, self.world)
        else:
            batches = data.loader(micro_batches, num_workers=self.options.num_workers)
        for (number, micro), (inputs, labels) in zip(plan, batches):
            yield number, micro, self.to_device(inputs), labels.to(self.device)

    def batches(self, data: CalibrationData, global_batches: Sequence[torch.Tensor]) -> Iterator[Tuple[int, Iterator[Tuple[List[int], Inputs, torch.Tensor]]]]:
        """Yield (global batch number, its local micro-batches) for *every* global batch.

        A process whose share of a batch is empty still gets that batch (with no
        micro-batches), so collectives after each batch line up across processes.
        Non-finite floating inputs are noted in :attr:`faults` as each micro-batch is handed
        over (not when it is read ahead) and handed over as zeros; consume each inner iterator,
        then call :meth:`sync_faults` (directly, or through :meth:`gather_sorted` /
        :meth:`all_reduce_gradients`), before advancing the outer one.
        """
        stream = self.iterate(data, global_batches)
        pending = next(stream, None)

        def micro_batches(number: int) -> Iterator[Tuple[List[int], Inputs, torch.Tensor]]:
            nonlocal pending
            while pending is not None and pending[0] == number:
                _, micro, inputs, labels = pending
                yield micro, note_bad_inputs(self.faults, data, inputs, micro), labels
                pending = next(stream, None)

        for number in range(len(global_batches)):
            yield number, micro_batches(number)
            self.faults.raise_local()  # a consumer that skipped sync_faults still never runs on bad data

    def to_device(self, inputs: Inputs) -> Inputs:
        return {key: value.to(self.device) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}

    # ------------------------------------------------------------------ passes
    @torch.no_grad()
    def stream(
        self,
        data: CalibrationData,
        indices: torch.Tensor,
        compute: Callable[[Inputs], torch.Tensor],
        *,
        num_classes: Optional[int] = None,
        description: str = "forward pass",
        what: str = "logits",
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(compute(inputs) rows, labels)`` per global batch, gathered from every process in index order.

        ``compute`` runs under autocast and its output is cast to float32; labels are checked
        against ``num_classes`` when given. Inputs and outputs must be finite: a NaN or ±inf
        raises :class:`~hf_calibrate.metrics.NonFiniteError` naming the samples (``what`` names
        the outputs in that message: ``"logits"``, ``"features"``, ...).
        """
        batches = self.global_batches(indices, shuffle=False)
        with self.progress(len(batches), description) as bar:
            for number, micro_batches in self.batches(data, batches):
                positions, outputs, targets = [], [], []
                for micro, inputs, labels in micro_batches:
                    with self.autocast():
                        rows = compute(inputs).float()
                    if num_classes is not None:
                        self.note_label_faults(labels, num_classes, getattr(data, "role", "data"), micro)
                    positions.append(torch.as_tensor(micro, device=self.device))
                    outputs.append(rows)
                    targets.append(labels)
                order, rows, labels = self.gather_sorted(*self._local(positions, outputs, targets), count=len(batches[number]))
                check_finite_outputs(data, rows, order, what)  # gathered: every process raises alike
                yield rows, labels
                bar.update(1)

    def scan(
        self,
        data: CalibrationData,
        compute: Callable[[Inputs], torch.Tensor],
        *,
        num_classes: Optional[int] = None,
        description: str = "forward pass",
        what: str = "logits",
        keep_inputs: bool = False,
        spill_dir: Optional[str] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(``compute(inputs)`` rows (N, K) float32, labels (N,)) of every sample of ``data``, in dataset order, on every process.

        The first pass over a stream reads each process's own units once and indexes the stream
        (:mod:`hf_calibrate.fitting.runtime.scan`); ``keep_inputs`` keeps its units in memory for later passes
        when they fit. Otherwise (map-style data, a stream already indexed) this is :meth:`stream` over all.
        Rows beyond ``spill_bytes`` are a memory-mapped file's, made in ``spill_dir`` (default: the temp folder).
        """
        if isinstance(data, StreamedData) and data.index is None:
            return scan_stream(self, data, compute, num_classes=num_classes, description=description, what=what,
                               keep_inputs=keep_inputs, spill_dir=spill_dir)
        buffer, labels = RowBuffer(self.options.spill_bytes, spill_dir, self.device), []
        try:
            for rows, part_labels in self.stream(data, torch.arange(len(data)), compute, num_classes=num_classes,
                                                 description=description, what=what):
                buffer.append(rows)
                labels.append(part_labels)
            return buffer.finish(), torch.cat(labels)
        except BaseException:
            buffer.close()
            raise

    def collect_logits(
        self,
        backbone: Backbone,
        data: CalibrationData,
        indices: Optional[torch.Tensor] = None,
        *,
        delta: Optional[torch.Tensor] = None,
        description: str = "computing logits",
        keep_inputs: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Float32 logits (n, C) and labels of the base model (with δ) for ``indices`` (None: every sample, through
        :meth:`scan`), in that order, on every process.

        Non-finite inputs or logits raise :class:`~hf_calibrate.metrics.NonFiniteError` before anything is fitted.
        Base logits (no δ) of the data :attr:`kept_logits` names are handed to it too (not copied).
        """
        what = "logits" if delta is None else "logits with the perturbation δ"
        compute = lambda inputs: backbone.logits(inputs, delta)  # noqa: E731
        if indices is None:
            logits, labels = self.scan(data, compute, description=description, what=what, keep_inputs=keep_inputs)
            indices = torch.arange(len(data))
        else:
            parts = list(self.stream(data, indices, compute, description=description, what=what))
            logits, labels = torch.cat([part[0] for part in parts]), torch.cat([part[1] for part in parts])
        self.check_labels(labels, logits.shape[1], getattr(data, "role", "data"), indices)
        if delta is None and self.kept_logits is not None:
            self.kept_logits.add(data, indices, logits, labels)
        return logits, labels

    def _local(self, positions, outputs, targets):
        """This process's (indices, rows, labels) of a batch; empty when its share was (a stream's units may miss a batch)."""
        if outputs:
            return torch.cat(positions), torch.cat(outputs), torch.cat(targets)
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        return empty, torch.empty(0, device=self.device), empty

    def gather_sorted(self, positions: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor, *, count: int):
        """(dataset indices, rows, targets) gathered from every process, sorted by dataset index.

        A synchronisation point: raises the faults any process noted in this batch.
        """
        self.sync_faults()
        positions = _distributed.all_gather_variable(positions)
        outputs = _distributed.all_gather_variable(outputs)
        targets = _distributed.all_gather_variable(targets)
        order = torch.argsort(positions)
        if len(order) != count:
            raise RuntimeError(f"gathered {len(order)} samples, expected {count}.")
        return positions[order], outputs[order], targets[order]

    def all_reduce_gradients(self, parameters: Sequence[torch.Tensor]) -> None:
        """Sum gradients over processes (each process already divided by the global batch size).

        A synchronisation point: raises the faults any process noted in this batch first.
        """
        self.sync_faults()
        for parameter in parameters:
            if parameter.grad is None:  # this process had no samples of the batch: it adds nothing
                parameter.grad = torch.zeros_like(parameter)
            _distributed.all_reduce_sum_(parameter.grad)

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every process hold the main process's parameters and buffers."""
        for tensor in [*module.parameters(), *module.buffers()]:
            _distributed.broadcast_(tensor.data)

    def sync_faults(self) -> None:
        """Collective: every process raises the bad data any process noted since the last call."""
        self.faults.raise_agreed(self.device)

    def note_label_faults(self, labels: torch.Tensor, num_classes: int, role: str = "data",
                          indices: Optional[Sequence[int]] = None) -> bool:
        """Note labels that do not fit a ``num_classes`` model (raised at :meth:`sync_faults`), naming the data's
        ``role`` and the samples' positions ``indices``; True when bad."""
        try:
            self.check_labels(labels, num_classes, role, None if indices is None else torch.as_tensor(indices))
        except ValueError as error:
            self.faults.note(ValueError, str(error))
            return True
        return False

    @staticmethod
    def check_labels(labels: torch.Tensor, num_classes: int, role: str = "data",
                     indices: Optional[torch.Tensor] = None) -> None:
        """Refuse labels that are not class indices of a ``num_classes`` model, naming the ``role`` of the data and the
        positions (``indices``: the samples' positions in the data) of the first bad ones."""
        try:
            check_labels(labels, num_classes)
        except ValueError as error:
            where = ""
            if indices is not None and labels.ndim == 1 and not labels.is_floating_point():
                bad = ((labels < 0) | (labels >= num_classes)).nonzero().flatten()[:5]
                where = f" (sample(s) {', '.join(str(int(indices[i])) for i in bad)})" if len(bad) else ""
            raise ValueError(f"the {role}'s labels do not match the model{where}: {error}") from None


def steps_per_epoch(count: int, batch_size: int) -> int:
    return max(1, math.ceil(count / batch_size))
