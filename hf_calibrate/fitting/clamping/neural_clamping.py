"""The Neural Clamping fit: the entry point, and the SGD optimiser (``optimizer="sgd"``, the authors' recipe).

The default L-BFGS optimiser (``optimizer="lbfgs"``) is :mod:`.lbfgs`; :func:`fit_neural_clamping` dispatches on ``options.optimizer``.

Per epoch the cost is one forward pass and one backward pass to the input over the fitting
part — the base model is frozen with ``requires_grad_(False)``, so autograd never builds
parameter gradients (the reference code computes and discards them).

SGD procedure (docs/design.md §3.2):
1. split the calibration data into a fitting part and a held-out part (``holdout_fraction``);
2. one forward pass caches the base logits of both; T starts at the TS optimum of the
   fitting part (or at ``temperature_init``), and the held-out score (NLL by default) of that
   TS is the baseline;
3. for every (γ, λ) of the grid, SGD from the same start; the held-out score is taken every
   ``eval_every`` epochs and after the last; the best (γ, λ, epoch) snapshot is kept;
4. the snapshot replaces TS only if its held-out score is strictly better — otherwise δ = 0
   and T is the TS optimum of all the calibration data (fitting and held-out parts: exactly
   what the ``temperature`` method fits). On the selection split NC is therefore never worse
   than TS fitted without that split.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, List, Optional

import torch

from ...backbones import Backbone, InputSizeError, format_size
from ...calibrators.holdout import content_groups, note_repeated_rows, note_validation_copies, rows_repeating
from ...calibrators.neural_clamping import NeuralClamping, focal_loss
from ...calibrators.requirements import warn_if_probabilities
from ...calibrators.temperature import CALIBRATION_DATA_FIX, fit_inverse_temperature, temperature_method_beta, warn_if_without_minimum
from ...data import CalibrationData
from ... import _distributed
from ..runtime.engine import Engine, steps_per_epoch
from .lbfgs_fit import fit_by_lbfgs
from .start import holdout_scores, initial_delta, require_rereadable

# With epochs=None, a run takes as many epochs as give this many SGD steps.
DEFAULT_STEPS = 500
# With eval_every=None, a run is evaluated on the held-out part about this many times.
DEFAULT_EVALUATIONS = 20


def random_crop_flip_cutout(pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The reference's CIFAR augmentation on normalised (N, C, H, W) tensors.

    Random crop after zero-padding by H/8, horizontal flip with probability 1/2, and one
    cutout square of side H/8 per image (zeros are the mean colour after normalisation).
    """
    count, _, height, width = pixels.shape
    pad = max(1, height // 8)
    padded = torch.nn.functional.pad(pixels, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (count, 2), generator=generator).tolist()
    flips = (torch.rand(count, generator=generator) < 0.5).tolist()
    centres = torch.stack(
        [torch.randint(0, height, (count,), generator=generator), torch.randint(0, width, (count,), generator=generator)], 1
    ).tolist()
    out = torch.empty_like(pixels)
    for i, ((dy, dx), flip, (cy, cx)) in enumerate(zip(offsets, flips, centres)):
        image = padded[i, :, dy : dy + height, dx : dx + width]
        image = image.flip(-1) if flip else image.clone()
        image[:, max(0, cy - pad // 2) : cy + (pad + 1) // 2, max(0, cx - pad // 2) : cx + (pad + 1) // 2] = 0
        out[i] = image
    return out


class _Snapshot:
    """The best (score, γ, λ, epoch, δ, log T) seen so far; ties keep the earlier one."""

    def __init__(self) -> None:
        self.score = math.inf
        self.record: Optional[Dict[str, Any]] = None
        self.delta: Optional[torch.Tensor] = None
        self.log_temperature: Optional[torch.Tensor] = None

    def offer(self, score: float, record: Dict[str, Any], delta: torch.Tensor, log_temperature: torch.Tensor) -> None:
        if score < self.score:
            self.score, self.record = score, dict(record)
            self.delta, self.log_temperature = delta.detach().clone(), log_temperature.detach().clone()


def fit_neural_clamping(
    backbone: Backbone,
    data: CalibrationData,
    calibrator: NeuralClamping,
    options: NeuralClamping.Options,
    engine: Engine,
    validation: Optional[CalibrationData] = None,
) -> Dict[str, Any]:
    """Fit ``calibrator`` (δ, log T) in place; return the fit summary with its history.

    The selection split is ``validation`` when given (all of ``data`` is then fitted on),
    else a ``holdout_fraction`` share of ``data``. δ has the shape of the first calibration
    sample; a sample of another size raises :class:`~hf_calibrate.backbones.InputSizeError`.
    """
    try:
        return _fit(backbone, data, calibrator, options, engine, validation)
    except InputSizeError as error:
        raise InputSizeError(
            f"the calibration samples differ in size: δ is fitted at {error.expected} (the per-sample shape of the "
            f"first calibration sample) but another sample has per-sample shape {error.actual}. Neural Clamping fits "
            "one δ shaped like one input, so every calibration and validation sample needs the same size: resize or "
            f"crop them all to one size (e.g. {format_size(error.expected)}) before fitting.",
            expected=error.expected, actual=error.actual,
        ) from None


def _fit(
    backbone: Backbone,
    data: CalibrationData,
    calibrator: NeuralClamping,
    options: NeuralClamping.Options,
    engine: Engine,
    validation: Optional[CalibrationData],
) -> Dict[str, Any]:
    """:func:`fit_neural_clamping` without the error translation."""
    if options.optimizer == "lbfgs":
        return fit_by_lbfgs(backbone, data, calibrator, options, engine, validation)
    if options.augment and backbone.modality != "image":
        raise ValueError(f"augment=True applies to images; this {backbone.modality} model takes {backbone.delta_space}.")
    grid = [(gamma, weight) for gamma in options.gamma for weight in options.delta_weight]
    if len(grid) > 1 and options.holdout_fraction == 0:
        raise ValueError("selecting among several gamma/delta_weight values needs holdout_fraction > 0.")
    start = _base_pass(backbone, data, validation, options, engine)
    fit_indices, holdout_indices, validation, beta = start.fit_indices, start.holdout_indices, start.validation, start.beta
    start_log_t = _start_log_temperature(options, torch.tensor(-math.log(beta), device=engine.device))
    has_holdout = start.baseline_scores is not None
    steps = steps_per_epoch(len(fit_indices), engine.options.batch_size)
    epochs = options.epochs or max(1, math.ceil(DEFAULT_STEPS / steps))
    eval_every = options.eval_every or max(1, epochs // DEFAULT_EVALUATIONS)
    start_delta = initial_delta(backbone, data, fit_indices, calibrator, options, engine, start_log_t)

    history: List[Dict[str, Any]] = []
    best = _Snapshot()
    with engine.progress(len(grid) * epochs * steps, "Neural Clamping") as bar:
        for gamma, weight in grid:
            delta = torch.nn.Parameter(start_delta.clone())
            log_t = torch.nn.Parameter(start_log_t.clone())
            optimizer = torch.optim.SGD([delta, log_t], lr=options.lr, momentum=options.momentum)
            for epoch in range(1, epochs + 1):
                started = time.perf_counter()
                loss = _train_epoch(backbone, data, fit_indices, delta, log_t, optimizer, gamma, weight, epoch, options, engine, bar)
                record = {
                    "gamma": gamma, "delta_weight": weight, "epoch": epoch, "loss": loss,
                    "delta_norm": float(delta.detach().norm()), "temperature": float(log_t.detach().exp()),
                    "seconds": time.perf_counter() - started,
                }
                if has_holdout and (epoch % eval_every == 0 or epoch == epochs):
                    logits, labels = engine.collect_logits(backbone, validation, holdout_indices, delta=delta.detach(), description="held-out check")
                    record.update(holdout_scores(logits * torch.exp(-log_t.detach()), labels, options.n_bins))
                    best.offer(record[f"holdout_{options.select_metric}"], record, delta, log_t)
                    bar.set_postfix(loss=f"{loss:.4f}", **{options.select_metric: f"{record[f'holdout_{options.select_metric}']:.4f}"})
                history.append(record)
            if not has_holdout:
                best.offer(-math.inf, record, delta, log_t)

    summary = note_repeated_rows({
        "optimizer": "sgd", "fit_samples": len(fit_indices), "holdout_samples": len(holdout_indices), "epochs": epochs,
        "steps_per_epoch": steps, "temperature_scaling": {"temperature": 1.0 / beta}, "history": history,
    }, start.groups)
    if start.validation_copies is not None:
        note_validation_copies(summary, start.validation_copies, len(start.holdout_indices))
    return _keep_best_or_fall_back(calibrator, best, start, options, summary)


def _keep_best_or_fall_back(calibrator: NeuralClamping, best: _Snapshot, start: "_Start", options: NeuralClamping.Options, summary: Dict[str, Any]) -> Dict[str, Any]:
    """Set the calibrator to the best snapshot when it beat TS on the held-out part (or nothing was held out), else to
    TS (δ = 0); return ``summary`` with the choice and the baseline."""
    scores = start.baseline_scores
    use_delta = scores is None or best.score < scores[f"holdout_{options.select_metric}"]
    with torch.no_grad():
        if use_delta:
            calibrator.delta.copy_(best.delta)
            calibrator.log_temperature.copy_(best.log_temperature)
        else:
            calibrator.delta.zero_()
            calibrator.log_temperature.copy_(start.fallback_log_t)
    if scores is not None:
        summary["temperature_scaling"].update(scores)
        summary["temperature_scaling"]["fallback_temperature"] = float(start.fallback_log_t.exp())
    summary["selected"] = best.record if use_delta else {"fallback": "temperature_scaling"}
    summary["fell_back_to_temperature_scaling"] = not use_delta
    return summary


def _train_epoch(
    backbone: Backbone,
    data: CalibrationData,
    fit_indices: torch.Tensor,
    delta: torch.nn.Parameter,
    log_t: torch.nn.Parameter,
    optimizer: torch.optim.Optimizer,
    gamma: float,
    weight: float,
    epoch: int,
    options: NeuralClamping.Options,
    engine: Engine,
    bar: Any,
) -> float:
    """One epoch of SGD steps; returns the mean loss over its global batches."""
    augment = random_crop_flip_cutout if options.augment is True else options.augment
    global_batches = engine.global_batches(fit_indices, shuffle=True, epoch=epoch, block=data.shuffle_block)
    total = 0.0
    for number, micro_batches in engine.batches(data, global_batches):
        optimizer.zero_grad(set_to_none=True)
        batch_size = len(global_batches[number])
        loss_sum = torch.zeros((), device=engine.device)
        for part, (_, inputs, labels) in enumerate(micro_batches):
            if augment:
                generator = engine.generator(epoch, number, part, engine.rank)
                inputs[backbone.input_key] = augment(inputs[backbone.input_key], generator)
            with engine.autocast():
                logits = backbone.logits(inputs, delta)
            loss = focal_loss(logits.float() * torch.exp(-log_t), labels, gamma, reduction="sum") / batch_size
            loss.backward()
            loss_sum += loss.detach()
        engine.all_reduce_gradients([delta, log_t])
        _distributed.all_reduce_sum_(loss_sum)
        penalty = weight * delta.norm()
        penalty.backward()
        step_loss = float(loss_sum) + float(penalty.detach())
        if not math.isfinite(step_loss) or not bool(torch.isfinite(delta.grad).all()):
            raise FloatingPointError(
                f"Neural Clamping loss became {step_loss} at epoch {epoch}, batch {number + 1} "
                f"(lr={options.lr}, gamma={gamma}, delta_weight={weight}). Lower lr, or fit in float32 "
                "(mixed_precision='no'). The model was left unchanged."
            )
        optimizer.step()
        total += step_loss
        bar.update(1)
    return total / len(global_batches)


@dataclasses.dataclass
class _Start:
    """What the base pass gives a fit: the fitting and selection parts, the TS start and the fallback."""

    fit_indices: torch.Tensor
    holdout_indices: torch.Tensor
    validation: CalibrationData  # the selection data: ``data`` itself when a part of it is held out
    beta: float  # 1/T of temperature scaling on the fitting part
    fallback_log_t: torch.Tensor  # log T if δ does not help: TS on all the calibration data (fitting and held-out parts)
    baseline_scores: Optional[Dict[str, float]]  # that TS's held-out scores (None: nothing held out)
    groups: torch.Tensor  # (N,) content ids of the calibration rows' base logits: a row's copies are held out together
    validation_copies: Optional[int]  # validation rows that repeat a calibration row (None: no validation data)


def _base_pass(backbone: Backbone, data: CalibrationData, validation: Optional[CalibrationData], options: NeuralClamping.Options, engine: Engine) -> _Start:
    """One pass of the base model over the calibration data (and the validation data): the split, the TS start, the baseline."""
    device = engine.device
    require_rereadable(data, validation)
    all_logits, all_labels = engine.collect_logits(backbone, data, description="base logits", keep_inputs=True)
    groups = content_groups(all_logits)
    if validation is None:
        fit_indices, holdout_indices = engine.split_indices(len(data), options.holdout_fraction, groups)
        validation = data
        holdout_logits, holdout_labels = all_logits[holdout_indices.to(device)], all_labels[holdout_indices.to(device)]
    else:
        fit_indices = torch.arange(len(data))
        holdout_logits, holdout_labels = engine.collect_logits(backbone, validation, description="base logits (validation)", keep_inputs=True)
        holdout_indices = torch.arange(len(validation))
    copies = None if validation is data else rows_repeating(all_logits, holdout_logits)
    fit_logits, fit_labels = all_logits[fit_indices.to(device)], all_labels[fit_indices.to(device)]
    beta, _ = fit_inverse_temperature(fit_logits, fit_labels)
    if engine.is_main:
        warn_if_probabilities(all_logits)
        warn_if_without_minimum(beta, fit_logits, fit_labels, "the base model's logits over the fitting part of the calibration data (the rows not held out)",
                                CALIBRATION_DATA_FIX)
    fallback_log_t, baseline_scores = torch.tensor(-math.log(beta), device=device), None
    if len(holdout_indices) > 0:
        baseline_scores = holdout_scores(holdout_logits * beta, holdout_labels, options.n_bins)
        if validation is data:  # the fallback is then exactly the temperature method's fit on all the data
            all_beta = temperature_method_beta(all_logits, all_labels)
            fallback_log_t = torch.tensor(-math.log(all_beta), device=device)
    return _Start(fit_indices, holdout_indices, validation, beta, fallback_log_t, baseline_scores, groups, copies)


def _start_log_temperature(options: NeuralClamping.Options, ts_log_t: torch.Tensor) -> torch.Tensor:
    """log T's starting point: the TS optimum of the fitting part, or ``options.temperature_init``."""
    if isinstance(options.temperature_init, str):
        return ts_log_t
    return torch.full_like(ts_log_t, math.log(options.temperature_init))
