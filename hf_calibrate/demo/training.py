"""How the zoo trains a model: seeded and deterministic on the CPU, AdamW on cross-entropy in full batches.

Everything a builder (:mod:`.digits`, :mod:`.bbc`) shares: the seeded context, the training
loop, batched prediction, the test metrics recorded in the recipe, and the split accessors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._progress import progress_bar
from ..metrics import accuracy, expected_calibration_error, negative_log_likelihood

#: torch threads the zoo trains on, whatever the caller set: reductions are split by thread
#: count, so a fixed count keeps a retrained model's bits independent of the caller's setting.
TRAINING_THREADS = 1

Trained = tuple[nn.Module, Any, dict[str, Any]]  # model, preprocessor, test metrics


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch, use deterministic algorithms and :data:`TRAINING_THREADS` torch threads
    inside the block; restore all of it afterwards.

    Filling uninitialised memory (a debugging aid that comes with deterministic mode) is
    switched off: it adds a fill to every allocation (measured ~15 % of CPU training time)
    and does not change results.
    """
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    was_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.set_num_threads(TRAINING_THREADS)
        try:
            yield
        finally:
            torch.set_num_threads(was_threads)
            torch.utils.deterministic.fill_uninitialized_memory = was_filling
            torch.use_deterministic_algorithms(was_deterministic)


def _lr_schedule(optimizer: torch.optim.Optimizer, name: str, lr: float, total_steps: int) -> Any:
    """Per-step learning-rate schedule: ``"one_cycle"`` (10 % warm-up, cosine to ~0) or ``"constant"``."""
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if name == "one_cycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps, pct_start=0.1)
    raise ValueError(f"unknown learning-rate schedule {name!r}")


def fit_classifier(
    module: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    hparams: dict[str, Any],
    *,
    desc: str,
    progress: bool,
) -> list[float]:
    """Train ``module`` (inputs (N, ...) → logits (N, C)) with AdamW on cross-entropy.

    Uses ``hparams``: ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``schedule``
    (``"one_cycle"`` or ``"constant"`` learning rate), ``seed`` (batch order). Each epoch
    visits a fresh permutation in full batches (the remainder is dropped, as a tiny batch
    upsets batch norm). Only parameters with ``requires_grad`` are trained. Returns the
    mean training loss per epoch.
    """
    batch_size = hparams["batch_size"]
    steps_per_epoch = len(labels) // batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{len(labels)} training examples do not fill one batch of {batch_size}")
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=hparams["lr"], weight_decay=hparams["weight_decay"])
    schedule = _lr_schedule(optimizer, hparams["schedule"], hparams["lr"], hparams["epochs"] * steps_per_epoch)
    order_rng = torch.Generator().manual_seed(hparams["seed"])
    losses: list[float] = []
    module.train()
    bar = progress_bar(range(hparams["epochs"]), desc=desc, unit="epoch", enabled=progress)
    for _ in bar:
        order = torch.randperm(len(labels), generator=order_rng)[: steps_per_epoch * batch_size]
        total = 0.0
        for batch in order.view(steps_per_epoch, batch_size):
            loss = F.cross_entropy(module(inputs[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        losses.append(total / steps_per_epoch)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    module.eval()
    return losses


@torch.inference_mode()
def predict_logits(module: nn.Module, inputs: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Logits (N, C) of ``module`` in eval mode, computed in batches."""
    module.eval()
    return torch.cat([module(chunk) for chunk in inputs.split(batch_size)])


def evaluation_metrics(logits: torch.Tensor, labels: torch.Tensor, train_losses: list[float]) -> dict[str, Any]:
    """Accuracy, 15-bin ECE, mean confidence and NLL on the test split, plus the loss curve."""
    probs = logits.double().softmax(dim=1)
    return {
        "accuracy": accuracy(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        "mean_confidence": probs.max(dim=1).values.mean().item(),
        "nll": negative_log_likelihood(probs, labels),
        "train_loss_per_epoch": [round(loss, 6) for loss in train_losses],
    }


def fit_and_test(
    module: nn.Module,
    inputs_of: Callable[[str], torch.Tensor],
    dataset: datasets.DatasetDict,
    hparams: dict[str, Any],
    *,
    desc: str,
    progress: bool,
) -> dict[str, Any]:
    """Train ``module`` on ``inputs_of("train")`` (model inputs of that split) and return its test metrics."""
    losses = fit_classifier(module, inputs_of("train"), labels_of(dataset["train"]), hparams, desc=desc, progress=progress)
    return evaluation_metrics(predict_logits(module, inputs_of("test")), labels_of(dataset["test"]), losses)


def labels_of(split: datasets.Dataset) -> torch.Tensor:
    """The split's ``label`` column as class indices (N,) int64."""
    return torch.tensor(split["label"], dtype=torch.long)


def label_names(dataset: datasets.DatasetDict) -> list[str]:
    """The class names of the ``label`` column, in index order."""
    return list(dataset["train"].features["label"].names)


def images_of(split: datasets.Dataset) -> list[Any]:
    """The split's PIL images."""
    return list(split["image"])


def pixel_stats(split: datasets.Dataset) -> tuple[float, float]:
    """Mean and std of the (grey) pixel values in [0, 1], rounded to 4 decimals."""
    pixels = np.stack([np.asarray(image, dtype=np.float64) / 255.0 for image in images_of(split)])
    return round(float(pixels.mean()), 4), round(float(pixels.std()), 4)
