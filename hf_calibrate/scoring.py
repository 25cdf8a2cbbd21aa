"""One evaluation pass: the base's and the calibrated model's logits over labelled data, into before/after accumulators.

Each process adds its share of the samples to the two :class:`~hf_calibrate.metrics.CalibrationMetrics`
(summed across processes when they are computed); a sample's bootstrap weights are keyed on its
dataset index and the engine's seed, so results are the same on any number of processes and for any
batch size. Map-style data are scored batch by batch (each process its strided share); a stream not
read before is scored in one first pass, each process adding the samples it read (no exchange of
logits: docs/design.md §3.0); kept base logits of a logit-space calibration need no data at all.
A plain model (a :class:`Scorer` without a calibrator) is scored the same way on its one side
(:func:`evaluate_plain_model`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .results import evaluation
from .backbones import Backbone, adapt
from .calibrators import Calibrator
from .data import CalibrationData, StreamedData, prepare_data
from .fitting import Engine, EngineOptions
from .fitting.runtime.scan import scan_stream_locally
from .fitting.runtime.faults import note_nonfinite_outputs
from .metrics import CalibrationMetrics

Logits = Tuple[torch.Tensor, torch.Tensor]  # (logits (N, C) float32, labels (N,))
Accumulators = Tuple[CalibrationMetrics, ...]  # (uncalibrated, calibrated), or (uncalibrated,) of a plain model


@dataclasses.dataclass
class Scorer:
    """What a pass needs of a calibrated model: its base, its calibrator, and its calibrated forward (inputs → logits).

    A plain model's scorer has no calibrator (:meth:`plain`): only its base's side is scored.
    """

    backbone: Backbone
    calibrator: Optional[Calibrator]
    calibrated_logits: Callable[[Dict[str, Any]], torch.Tensor]

    @classmethod
    def plain(cls, backbone: Backbone) -> "Scorer":
        """The scorer of an uncalibrated model: its own logits on one side."""
        return cls(backbone, None, backbone.logits)

    @property
    def sides(self) -> int:
        """Accumulators a pass fills: 2 (uncalibrated, calibrated), or 1 for a plain model."""
        return 1 if self.calibrator is None else 2

    @property
    def num_classes(self) -> int:
        return self.backbone.num_classes if self.calibrator is None else self.calibrator.num_classes

    @property
    def logit_space(self) -> bool:
        """Whether the calibration maps the base's logits (no δ, no new head): calibrated logits need no forward pass."""
        return self.calibrator is None or (self.calibrator.input_perturbation is None and self.calibrator.head is None)

    def calibrate(self, base_logits: torch.Tensor) -> torch.Tensor:
        """A logit-space calibration of ``base_logits`` (n, C); a plain model's are its own."""
        return base_logits if self.calibrator is None else self.calibrator(base_logits)


def score(scorer: Scorer, engine: Engine, data: Optional[CalibrationData], bins_and_replicates: Tuple[int, int],
          kept: Optional[Logits]) -> Accumulators:
    """(uncalibrated, calibrated) accumulators over ``data``, with (n_bins, bootstrap replicates) ``bins_and_replicates``
    (a plain model's scorer: (uncalibrated,) only).

    ``kept`` (base logits and labels of every sample, in dataset order) replaces the base model's forward
    pass; a logit-space calibration then needs no data at all (``data`` may be None).
    """
    accumulators = evaluation.accumulators(scorer.num_classes, *bins_and_replicates, seed=engine.options.seed)[: scorer.sides]
    if kept is not None:
        kept = (kept[0].to(engine.device), kept[1].to(engine.device))
    streamed = data is None or (isinstance(data, StreamedData) and data.index is None)
    if kept is not None and scorer.logit_space and streamed:
        _score_kept(scorer, engine, accumulators, kept)
    elif streamed:
        _score_stream(scorer, engine, data, accumulators, kept)
    else:
        _score_indexed(scorer, engine, data, accumulators, kept)
    return accumulators


def _update(accumulators: Accumulators, base: torch.Tensor, calibrated: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> None:
    """Add the samples ``indices`` (dataset indices: their bootstrap keys) with each side's logits (a plain model: the base's)."""
    for accumulator, logits in zip(accumulators, (base, calibrated)):
        accumulator.update(logits, labels, sample_index=indices.tolist(), from_logits=True)


def _score_kept(scorer: Scorer, engine: Engine, accumulators: Accumulators, kept: Logits) -> None:
    """A logit-space calibration of a stream over kept base logits: each process adds every W-th sample at once (one
    process: all of them in dataset order, as a stream's own pass adds them); no input is read."""
    base, labels = kept
    share = torch.arange(engine.rank, len(labels), engine.world, device=labels.device)
    with engine.autocast():
        calibrated = scorer.calibrate(base[share]).float()
    _update(accumulators, base[share], calibrated, labels[share], share)


def _check_kept(kept: Logits, count: int, data: CalibrationData) -> None:
    if len(kept[0]) != count:
        raise RuntimeError(
            f"the kept base logits are of {len(kept[0])} samples but the evaluation data are {data.description}: "
            "they are not of these data. Evaluate with CalibratedModel.evaluate (which runs the base model)."
        )


def _score_indexed(scorer: Scorer, engine: Engine, data: CalibrationData, accumulators: Accumulators, kept: Optional[Logits]) -> None:
    """Map-style data (or a stream already indexed): global batches in order, each process its share."""
    if kept is not None:
        _check_kept(kept, len(data), data)
    num_classes = scorer.num_classes
    batches = engine.global_batches(torch.arange(len(data)), shuffle=False)
    passes = _kept_batches(engine, data, batches, kept[1]) if kept is not None and scorer.logit_space else engine.batches(data, batches)
    with engine.progress(len(batches), "evaluating") as bar:
        for _, micro_batches in passes:
            for micro, inputs, labels in micro_batches:
                base_logits, calibrated_logits = _logit_pair(scorer, engine, inputs, micro, kept)
                bad = engine.note_label_faults(labels, num_classes, getattr(data, "role", "data"), micro)
                for side, logits in _named_sides(scorer, base_logits, calibrated_logits):
                    bad |= note_nonfinite_outputs(engine.faults, data, logits, micro, side)
                if not bad:
                    _update(accumulators, base_logits, calibrated_logits, labels, torch.as_tensor(micro))
            engine.sync_faults()
            bar.update(1)


def _score_stream(scorer: Scorer, engine: Engine, data: StreamedData, accumulators: Accumulators, kept: Optional[Logits]) -> None:
    """A stream's first pass: each process adds the samples it read, keyed by their dataset indices (no exchange)."""
    num_classes = scorer.num_classes
    if kept is not None:
        calibrated, labels, indices = scan_stream_locally(engine, data, lambda inputs: scorer.calibrated_logits(inputs).float(),
                                                          num_classes=num_classes, description="evaluating")
        _check_kept(kept, data.index.count, data)
        base = kept[0][indices.to(kept[0].device)]
    else:
        rows, labels, indices = scan_stream_locally(engine, data, lambda inputs: _both_logits(scorer, inputs),
                                                    num_classes=num_classes, description="evaluating")
        base = rows[:, :num_classes]
        calibrated = rows[:, num_classes:] if scorer.calibrator is not None else base
    for side, logits in _named_sides(scorer, base, calibrated):
        note_nonfinite_outputs(engine.faults, data, logits, indices.tolist(), side)
    engine.sync_faults()
    _update(accumulators, base, calibrated, labels, indices)


def _named_sides(scorer: Scorer, base: torch.Tensor, calibrated: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
    """(name in fault messages, logits) of each side a pass scores."""
    return [("logits", base), ("calibrated logits", calibrated)][: scorer.sides]


def _both_logits(scorer: Scorer, inputs: Dict[str, Any]) -> torch.Tensor:
    """(n, 2C): the base's logits, then the calibrated model's; a plain model: (n, C), the base's."""
    base = scorer.backbone.logits(inputs).float()
    if scorer.calibrator is None:
        return base
    calibrated = scorer.calibrator(base) if scorer.logit_space else scorer.calibrated_logits(inputs)
    return torch.cat([base, calibrated.float()], dim=1)


def _logit_pair(scorer: Scorer, engine: Engine, inputs: Optional[Dict[str, Any]], micro: List[int], kept: Optional[Logits]) -> Logits:
    """(base, calibrated) float32 logits (n, C) of one micro-batch (dataset indices ``micro``); the base's are
    taken from ``kept`` when given, else computed from ``inputs``."""
    with engine.autocast():
        if kept is not None:
            base_logits = kept[0][torch.as_tensor(micro, device=kept[0].device)]
        else:
            base_logits = scorer.backbone.logits(inputs).float()
        if scorer.logit_space:
            calibrated_logits = scorer.calibrate(base_logits).float()
        else:
            calibrated_logits = scorer.calibrated_logits(inputs).float()
    return base_logits, calibrated_logits


def _kept_batches(
    engine: Engine, data: CalibrationData, batches: Sequence[torch.Tensor], labels: torch.Tensor
) -> Iterator[Tuple[int, Iterator[Tuple[List[int], None, torch.Tensor]]]]:
    """:meth:`Engine.batches`' plan over ``batches`` without loading any input: (global batch number, its local
    micro-batches as (dataset indices, None, their labels from ``labels`` (N,))), so that kept logits are added in
    the micro-batches a pass over the data adds them in (the same float64 sums)."""
    for number, batch in enumerate(batches):
        micro_batches = engine.local_micro_batches(data, batch)
        yield number, iter([(micro, None, labels[torch.as_tensor(micro, device=labels.device)]) for micro in micro_batches])


@torch.no_grad()
def evaluate_plain_model(
    model: nn.Module, data: Any, *, n_bins: int, dataset_name: str, split: str, bootstrap: int, **options: Any
) -> Dict[str, Any]:
    """Metrics of an uncalibrated model's own logits on labelled ``data``, shaped like :meth:`CalibratedModel.evaluate`'s
    ``uncalibrated`` side: ``{"uncalibrated": metrics, "reliability": {"uncalibrated": bins}, "dataset", "split",
    "n_bins", "bootstrap"}`` (the last with ``bootstrap`` > 0 replicates).

    The same pass as a calibrated model's (:func:`score`), so a plain model's numbers are those of the
    uncalibrated side of any of its calibrations; ``options``: :class:`~hf_calibrate.fitting.EngineOptions` fields.
    """
    bootstrap = evaluation.check_bootstrap(bootstrap)
    engine = Engine(EngineOptions(**options))
    backbone = adapt(model)
    model.to(engine.device).eval()
    prepared = prepare_data(data, backbone, role="evaluation data", **engine.options.data_options())
    (metrics,) = score(Scorer.plain(backbone), engine, prepared, (n_bins, bootstrap), kept=None)
    result = {"uncalibrated": evaluation.summarize_one(metrics), "reliability": {"uncalibrated": metrics.reliability().to_dict()},
              "dataset": dataset_name, "split": split, "n_bins": n_bins}
    if bootstrap:
        result["bootstrap"] = evaluation.bootstrap_settings(metrics)
    return result
