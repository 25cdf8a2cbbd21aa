"""Head retraining on frozen features: one backbone pass per split, then cheap head epochs.

Features (the input of the base's classifier layer) are computed once per split under
``torch.no_grad()`` — one pass over the training data, whose held-out part is then split off —
and kept in a :class:`FeatureStore`: in memory, or past the engine's ``spill_bytes`` in a
memory-mapped file (made in ``feature_cache_dir``, or the temp folder) read batch by batch each
epoch, for features larger than memory. Every process receives every feature row and trains the
(small) head identically; the main process's head is broadcast at the end.

The loop is the head family's; what a method does differently lives in its class, as the hooks of
:class:`~hf_calibrate.calibrators.heads.HeadCalibrator` (set-up, training loss, per-epoch facts and
the step after validation), so a head method is one class (e.g. :mod:`hf_calibrate.calibrators.mac_cal`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .._warnings import warn_user
from ..backbones import Backbone
from ..calibrators.base import ModelFacts
from ..calibrators.heads import HeadCalibrator, HeadOptions
from ..calibrators.holdout import content_groups, note_repeated_rows, note_validation_copies, rows_repeating
from ..calibrators.requirements import check_labels
from ..calibrators.temperature import fit_inverse_temperature, temperature_warnings
from ..data import CalibrationData
from ..metrics.functional import accuracy, expected_calibration_error, negative_log_likelihood
from .runtime.engine import Engine

#: salt of the seeded generator of the training batches' order (and of a head's per-step draws)
TRAINING_SALT = 0x4EAD


class FeatureStore:
    """Training features: rows (N, d) — in memory or memory-mapped (:mod:`hf_calibrate.fitting.runtime.collected_rows`) — and their
    labels (N,), seen through ``indices`` (default: every row)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, indices: Optional[torch.Tensor] = None) -> None:
        self.features, self.labels = features, labels
        self.indices = torch.arange(len(labels)) if indices is None else indices.cpu()

    def __len__(self) -> int:
        return len(self.indices)

    def batches(self, batch_size: int, generator: torch.Generator) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every row once, in a new random order each call, ``batch_size`` rows at a time (read in file order within a batch)."""
        order = self.indices[torch.randperm(len(self.indices), generator=generator)]
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size].sort().values
            yield self.features[rows.to(self.features.device)], self.labels[rows.to(self.labels.device)]


def collect_features(
    backbone: Backbone, data: CalibrationData, engine: Engine, *, description: str, directory: Optional[Path] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One no-grad pass over all of ``data``: its classifier-layer inputs (N, d) float32 and labels (N,), in dataset order.
    A classifier layer whose output is not the model's logits raises
    :class:`~hf_calibrate.backbones.base.ClassifierLayerError` at the first batch.

    Features beyond the engine's ``spill_bytes`` are memory-mapped from a file made in ``directory``
    (default: the temp folder). When the engine keeps the base logits of ``data``
    (``engine.kept_logits``), the logits the pass computes anyway are kept too.
    """
    keep = engine.kept_logits is not None and engine.kept_logits.wants(data)
    width = _feature_dim(backbone) if keep else None  # the features' columns of a row

    def compute(inputs):
        with backbone.features_captured() as captured:
            logits = backbone.logits(inputs)
        backbone.check_classifier_output(captured.outputs[-1] if captured.outputs else None, logits)
        features = captured.inputs[-1].reshape(captured.inputs[-1].shape[0], -1)
        return torch.cat([features.float(), logits.float()], dim=1) if keep else features

    rows, labels = engine.scan(
        data, compute, num_classes=backbone.num_classes, description=description, spill_dir=directory,
        what="features (the input of its classifier layer)" + (" or logits" if keep else ""),
    )
    if keep:  # a copy of the logits columns, so that the features' rows are not held
        engine.kept_logits.add(data, torch.arange(len(labels)), rows[:, width:].clone(), labels)
        rows = rows[:, :width]
    return rows, labels


def _feature_dim(backbone: Backbone) -> int:
    return int(backbone.final_layer().in_features)


def _evaluate(head: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """An epoch's validation facts of ``head`` on (features (M, d), labels (M,)): NLL (nats), ECE, accuracy and mean
    confidence minus accuracy. The functional metrics, not a whole report: this runs once per epoch, 6,000 times in a
    default fit on a small set, where a report's other metrics cost 40 % of the fit."""
    with torch.no_grad():
        logits = head(features)
    correct = accuracy(logits, labels, from_logits=True)
    probs = torch.softmax(logits.double(), dim=1)
    return {
        "nll": negative_log_likelihood(logits, labels, from_logits=True),
        "ece": expected_calibration_error(logits, labels, from_logits=True), "accuracy": correct,
        "confidence_gap": float(probs.max(dim=1).values.mean()) - correct,
    }


def fit_head(
    backbone: Backbone,
    train: CalibrationData,
    validation: Optional[CalibrationData],
    calibrator: HeadCalibrator,
    options: HeadOptions,
    engine: Engine,
    temperature_data: Optional[CalibrationData] = None,
) -> Dict[str, Any]:
    """Train ``calibrator``'s head on cached features; keep the epoch with the lowest validation NLL.

    Non-finite inputs or features raise :class:`~hf_calibrate.metrics.NonFiniteError` (naming the
    samples) before any training; training labels below the method's ``requirements`` (one class) raise
    :class:`~hf_calibrate.calibrators.InsufficientDataError`, and absent classes are named in the summary's ``warnings``.
    """
    cache = Path(options.feature_cache_dir) if options.feature_cache_dir else None
    _require_selection_data(calibrator.method, validation, options)
    features, labels = collect_features(backbone, train, engine, description="features (train)", directory=cache)
    data_warnings = check_labels(labels, calibrator.num_classes, calibrator.method, calibrator.requirements)
    if validation is None:
        summary = fit_head_on_features(backbone, calibrator, options, (features, labels), torch.arange(len(labels)), engine, temperature_data)
    else:
        held = collect_features(backbone, validation, engine, description="features (validation)", directory=cache)
        summary = _train_and_summarise(backbone, calibrator, options, FeatureStore(features, labels), held, engine)
        summary["validated_on"] = validation.description
        summary = note_repeated_rows(_with_temperature(summary, backbone, calibrator, options, temperature_data, held, engine),
                                     content_groups(features))
        note_validation_copies(summary, rows_repeating(features, held[0]), len(held[0]), what="features")
    return {"trained_on": train.description, **summary, "warnings": data_warnings + summary.get("warnings", [])}


def _require_selection_data(method: str, validation: Optional[CalibrationData], options: HeadOptions) -> None:
    if validation is None and options.holdout_fraction == 0:
        raise ValueError(f"{method} selects its epoch on validation data: pass validation_data=... or holdout_fraction > 0.")


def fit_head_on_features(backbone: Backbone, calibrator: HeadCalibrator, options: HeadOptions, cached: Tuple[torch.Tensor, torch.Tensor],
                         rows: torch.Tensor, engine: Engine, temperature_data: Optional[CalibrationData] = None) -> Dict[str, Any]:
    """Train ``calibrator``'s head on ``rows`` of the cached (features (N, d), labels (N,)), a ``holdout_fraction``
    share of them held out to choose the epoch and, with ``options.temperature``, to fit the temperature (unless
    ``temperature_data`` are given); the fit summary, with ``duplicate_rows``: rows of equal features (copies of one
    input) are held out together. ``method="auto"`` calls this once per fold."""
    _require_selection_data(calibrator.method, None, options)
    features, labels = cached
    groups = content_groups(features)[rows.cpu()]
    train_positions, held_positions = engine.split_indices(len(rows), options.holdout_fraction, groups)
    train_rows, held_rows = rows[train_positions.cpu()], rows[held_positions.cpu()]
    held = tuple(tensor[held_rows.to(tensor.device)].to(engine.device) for tensor in (features, labels))
    summary = _train_and_summarise(backbone, calibrator, options, FeatureStore(features, labels, train_rows), held, engine)
    summary["validated_on"] = f"{len(held_rows)} held-out samples of the training data"
    return note_repeated_rows(_with_temperature(summary, backbone, calibrator, options, temperature_data, held, engine), groups)


def _with_temperature(summary: Dict[str, Any], backbone: Backbone, calibrator: HeadCalibrator, options: HeadOptions,
                      temperature_data: Optional[CalibrationData], held: Tuple[torch.Tensor, torch.Tensor], engine: Engine) -> Dict[str, Any]:
    """``summary`` with the optional temperature fitted (on ``temperature_data``, else the ``held`` features)."""
    if options.temperature:
        summary["temperature"], summary["warnings"] = _fit_temperature(backbone, calibrator, temperature_data, held, engine)
    return summary


def _train_and_summarise(backbone: Backbone, calibrator: HeadCalibrator, options: HeadOptions, train_store: FeatureStore,
                         held: Tuple[torch.Tensor, torch.Tensor], engine: Engine) -> Dict[str, Any]:
    """Train the head on ``train_store``, choosing the epoch on the ``held`` (features, labels); the fit summary."""
    calibrator.classifier = backbone.classifier_name
    generator = engine.generator(TRAINING_SALT)
    calibrator.prepare_training(backbone.final_layer(), options, generator, engine.generator)
    history, best_epoch, best_nll = _train_head(calibrator, train_store, held, generator, options, engine)
    summary: Dict[str, Any] = {
        "train_samples": len(train_store), "validation_samples": len(held[1]), "best_epoch": best_epoch,
        "epochs_run": len(history), "best_validation_nll": best_nll, "still_improving": best_epoch == len(history),
        "classifier": calibrator.classifier, "history": history,
    }
    if summary["still_improving"] and options.epochs is None and len(history) > 1:
        _warn_still_improving(calibrator.method, best_epoch, options)
    return summary


def _warn_still_improving(method: str, epochs: int, options: HeadOptions) -> None:
    warn_user(
        f"{method}: the validation NLL was still falling at the last of the default {epochs} epochs, so the head may be "
        f"under-trained. Pass epochs={2 * epochs} (or a larger lr than {options.lr:g}) to train it longer."
    )


def _train_head(
    calibrator: HeadCalibrator,
    train_store: FeatureStore,
    validation: Tuple[torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    options: HeadOptions,
    engine: Engine,
) -> Tuple[List[Dict[str, Any]], int, float]:
    """The epochs; the head is left in the state of the best epoch. Returns (history, best epoch, its NLL).

    The saved state is exactly the validated one: the method's :meth:`~HeadCalibrator.after_validation`
    (MaC-Cal's controller writing the next epoch's retention rate) runs only after the epoch's state has been kept.
    """
    head = calibrator.head_module
    optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=options.lr, weight_decay=options.weight_decay)
    history: List[Dict[str, Any]] = []
    best_nll, best_state, best_epoch, stale = math.inf, None, 0, 0
    epochs = options.epochs_for(len(train_store))
    with engine.progress(epochs, f"training head ({calibrator.method})") as bar:
        for epoch in range(1, epochs + 1):
            started = time.perf_counter()
            train_loss = _train_epoch(calibrator, train_store, optimizer, generator, options.head_batch_size, engine.device, epoch)
            record = {"epoch": epoch, "train_loss": train_loss, "seconds": time.perf_counter() - started}
            head.eval()
            record.update(_evaluate(head, *validation))
            record.update(calibrator.epoch_facts())
            history.append(record)
            bar.update(1)
            bar.set_postfix(val_nll=f"{record['nll']:.4f}")
            stale += 1
            if record["nll"] < best_nll:
                best_nll, best_state, best_epoch, stale = record["nll"], copy.deepcopy(head.state_dict()), epoch, 0
            calibrator.after_validation(record, options)  # only now: the state above was validated as it was
            if options.patience is not None and stale >= options.patience:
                break
    head.load_state_dict(best_state)
    head.eval()
    return history, best_epoch, best_nll


def _train_epoch(
    calibrator: HeadCalibrator, store: FeatureStore, optimizer: torch.optim.Optimizer, generator: torch.Generator,
    batch_size: int, device: torch.device, epoch: int,
) -> float:
    """One pass of Adam steps over the cached training features; returns the mean training loss."""
    calibrator.head_module.train()
    total, seen = 0.0, 0
    for features, labels in store.batches(batch_size, generator):
        features, labels = features.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = calibrator.training_loss(features, labels, generator)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"head training loss became {float(loss)} at epoch {epoch}; lower lr.")
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        seen += len(labels)
    return total / max(seen, 1)


#: the "+ TS" temperature is fitted only on data where the new head gets at least this many rows wrong: on fewer,
#: the NLL falls towards T → 0 (none wrong) or rests on one row, and the test NLL rose by up to 0.31 (bench_defaults)
TEMPERATURE_MIN_ERRORS = 2


def _fit_temperature(
    backbone: Backbone, calibrator: HeadCalibrator, data: Optional[CalibrationData], validation: Tuple[torch.Tensor, torch.Tensor], engine: Engine
) -> Tuple[Dict[str, Any], List[str]]:
    """Temperature on the new head's logits, over ``data`` (or the validation features): (its summary, warning lines).

    Refused — T stays 1, and a line says why — when the head gets fewer than :data:`TEMPERATURE_MIN_ERRORS`
    of these rows wrong: such data are (nearly) separable, and their temperature falls towards 0.
    """
    if data is not None:
        features, labels = collect_features(backbone, data, engine, description="features (temperature)")
        source = data.description
    else:
        (features, labels), source = validation, "the validation data"
    with torch.no_grad():
        logits = calibrator.head_module(features)
    errors = int((logits.argmax(dim=1) != labels).sum())
    if errors < TEMPERATURE_MIN_ERRORS:
        line = (f"{calibrator.method}: the temperature was not fitted (T = 1 kept): the new head gets {errors} of the "
                f"{len(labels)} rows of {source} wrong, fewer than the {TEMPERATURE_MIN_ERRORS} a temperature needs (on "
                "separable rows it falls towards 0, a hard argmax). Pass temperature_data= with more rows the head never "
                "saw, or fit with temperature=False.")
        return {"temperature": 1.0, "fitted_on": source, "refused": True}, [line]
    beta, _ = fit_inverse_temperature(logits, labels)
    with torch.no_grad():
        calibrator.log_temperature.fill_(-math.log(beta))
    return {"temperature": 1.0 / beta, "fitted_on": source}, temperature_warnings(beta, logits, labels, source, calibrator.method)


def head_facts(backbone: Backbone, facts: ModelFacts) -> ModelFacts:
    """``facts`` with the width d of the base's penultimate features, which a new head reads."""
    return dataclasses.replace(facts, feature_dim=_feature_dim(backbone))


__all__ = ["FeatureStore", "collect_features", "fit_head", "head_facts"]

