"""Head-retraining calibrators: a new classifier head on the frozen backbone's features.

The head replaces the base's classifier layer in the forward pass (its input is the
penultimate feature vector, N × d); an optional temperature, fitted afterwards on a separate
split, scales its logits. The training loops live in :mod:`hf_calibrate.fitting.heads`.

* **TST** (Jordahn & Olmos, ICML 2024; arXiv 2405.01196): Linear(d→3Z) → ReLU →
  Linear(3Z→Z) → Linear(Z→C), cross-entropy, Adam 1e-4, ~40 epochs, the epoch with the
  lowest validation NLL is kept.
* **V-TST**: the Z-layer is variational — μ and log σ² from two independent
  Linear(d→3Z) → ReLU → Linear(3Z→Z) branches (log σ² = logsigmoid(·), so σ² ≤ 1), as in the
  authors' code; prior N(0, I), z = μ + σ·ε, loss CE + KL/Z with one sample per step. Predictions average the softmax over
  M samples. The M noise vectors ε_m ∈ R^Z are drawn once at fit time from the seed and
  stored, so a sample's prediction does not depend on its batch and survives save/load;
  ``prediction="mean"`` uses z = μ instead.
* **MaC-Cal**: :mod:`.mac_cal`, which builds on this module.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .base import NO_FACTS, AutoRole, Calibrator, ModelFacts
from .options import HELD_OUT_SHARE, LEARNING_RATE, Range, check_fields, ranged, require
from .requirements import DataRequirements

PREDICTIONS = ("sample", "mean")
#: Z, the width of a head's last hidden layer: its hidden layers hold about (feature dim + Z) × 3Z weights, allocated
#: before the first step (a Z of 10⁹ asked for 72 GB)
LATENT_DIM = Range(1, 4096)
#: M, the noise draws or masks a head averages at prediction time (each held for the whole fit)
SAMPLES = Range(1, 100)
#: Adam's weight decay: beyond 10 the decay outweighs any gradient the loss gives
WEIGHT_DECAY = Range(0.0, 10.0)
#: Default head schedule: the paper's 40 epochs, stretched to at least this many Adam steps (the
#: authors' CIFAR-10 budget: 40 epochs × 157 batches of 256 ≈ 6,250 steps)
DEFAULT_EPOCHS, MIN_DEFAULT_STEPS = 40, 6000
#: salt of the seeded generator (the fit's ``seed`` and a salt make one generator) of V-TST's prediction noise
NOISE_SALT = 0x7E57
#: Jordahn & Olmos (ICML 2024), the paper of TST and V-TST
JORDAHN_OLMOS_2024_CITATION = (
    "@inproceedings{jordahn2024decoupling, title={Decoupling Feature Extraction and Classification Layers for "
    "Calibrated Neural Networks}, author={Jordahn, Mikkel and Olmos, Pablo M.}, booktitle={ICML}, year={2024}}"
)


@dataclasses.dataclass
class HeadOptions:
    """Options shared by the head-retraining methods.

    Attributes:
        epochs: passes over the cached training features (default None: the paper's 40, or
            more on a small training set, so that the head gets at least 6,000 Adam steps — the
            authors' 40 epochs at batch 256 over CIFAR-10's 40,000 training images are ~6,250
            steps; 40 epochs of a few hundred calibration rows would be ~80 steps and leave a
            freshly initialised head far from converged. On the digits CNN's 360 rows, 6,000
            steps against 2,000 lowered the validation NLL in 6 of 6 TST/V-TST fits). When the best validation epoch is the
            last one, the fit summary says ``"still_improving": True`` (with a warning when
            the epochs were chosen by this default).
        lr: Adam learning rate, in (0, 1] (default 1e-4, the TST paper's).
        head_batch_size: feature rows per Adam step (default 256, the authors' code's).
        weight_decay: Adam weight decay, in [0, 10] (default 0).
        patience: stop after this many epochs without a better validation NLL (default None:
            run every epoch; the best epoch is kept either way).
        temperature: after training, fit a temperature on the head's logits over
            ``temperature_data`` (or the validation data when none is given) (default False:
            fitted on the validation part, a fifth of the calibration data, it lowered test ECE
            only where the head is under-confident — V-TST on the digits CNN — and where that
            part is nearly separable its T falls to 0.002–0.07 and test NLL rises, by 0.03–0.31
            in 2–4 of 5 seeds per head on the CNN; ``benchmarks/results/defaults.md``). Pass
            ``temperature_data`` that neither trained nor validated the head.
        holdout_fraction: share of the training data held out for validation when no
            ``validation_data`` is passed to ``fit``, in [0, 1) (default 0.2).
        feature_cache_dir: the folder for the features' memory-mapped file when they take more
            than the fit's ``spill_bytes`` (default None: the system's temporary folder); the file
            is removed from the folder as soon as it is mapped, so nothing is left there.
        classifier: name of the base's classifier layer the new head replaces (a name in
            ``model.named_modules()``, e.g. ``"head"``; default None: the one ``nn.Linear`` with
            one output per class, or the last of several, with a warning naming them).
    """

    epochs: Optional[int] = None
    lr: float = ranged(1e-4, LEARNING_RATE)
    head_batch_size: int = 256
    weight_decay: float = ranged(0.0, WEIGHT_DECAY)
    patience: Optional[int] = None
    temperature: bool = False
    holdout_fraction: float = ranged(0.2, HELD_OUT_SHARE)
    feature_cache_dir: Optional[Union[str, os.PathLike]] = None
    classifier: Optional[str] = None

    def __post_init__(self) -> None:
        check_fields(self)
        require(self.epochs is None or self.epochs >= 1, "epochs", self.epochs, "a positive integer or None")
        require(self.head_batch_size >= 1, "head_batch_size", self.head_batch_size, "a positive integer")
        require(self.patience is None or self.patience >= 1, "patience", self.patience, "a positive integer or None")
        if self.feature_cache_dir is not None:
            self.feature_cache_dir = os.fspath(self.feature_cache_dir)

    def epochs_for(self, train_rows: int) -> int:
        """Epochs to run on ``train_rows`` training rows (see ``epochs``)."""
        if self.epochs is not None:
            return self.epochs
        steps_per_epoch = math.ceil(train_rows / self.head_batch_size)
        return max(DEFAULT_EPOCHS, math.ceil(MIN_DEFAULT_STEPS / max(steps_per_epoch, 1)))


class HeadCalibrator(Calibrator):
    """A new head (features → logits) plus a temperature on its logits (T = 1 until fitted).

    The family's fit (:mod:`hf_calibrate.fitting.heads`) trains the head on cached features and
    calls the hooks a method overrides: :meth:`prepare_training` once, :meth:`training_loss` per
    batch, :meth:`epoch_facts` and :meth:`after_validation` per epoch.
    """

    needs_features = True
    Options = HeadOptions
    #: a head has per-class output weights: refused on one class, warned about (naming them) when classes are absent
    requirements = DataRequirements(classes=2, per_class=True)
    least_data_note = "3 rows with the default holdout_fraction (one held out to select the epoch on)"
    #: name of the base's classifier layer the head replaces (set by the fit)
    classifier: Optional[str] = None

    def __init__(self, num_classes: int, feature_dim: int) -> None:
        super().__init__(num_classes)
        self.feature_dim = int(feature_dim)
        self.log_temperature = nn.Parameter(torch.zeros(()), requires_grad=False)

    @property
    def head(self) -> nn.Module:
        return self.head_module

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * torch.exp(-self.log_temperature).to(logits.dtype)

    def prepare_training(
        self, base_classifier: nn.Linear, options: HeadOptions, training_generator: torch.Generator,
        seeded: Callable[[int], torch.Generator],
    ) -> None:
        """Set the head up before its first epoch (default: nothing beyond its seeded initial weights).

        Args:
            base_classifier: the base's classifier layer the head replaces (C × d weights).
            options: the fit's options.
            training_generator: the generator of the training batches' order and of per-step draws.
            seeded: ``salt -> torch.Generator`` seeded by the fit's seed and ``salt``.
        """

    def training_loss(self, features: torch.Tensor, labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Loss of one training batch: (B, d) features, (B,) labels (the head is in train mode)."""
        return F.cross_entropy(self.head_module(features), labels)

    def epoch_facts(self) -> Dict[str, Any]:
        """Facts of the head's state this epoch, added to the epoch's record in the fit history (default none)."""
        return {}

    def after_validation(self, record: Dict[str, Any], options: HeadOptions) -> None:
        """Called after an epoch's validated state has been kept or dropped; ``record`` holds its validation
        scores (``nll``, ``ece``, ``accuracy``, ``confidence_gap``) and :meth:`epoch_facts` (default: nothing)."""

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "feature_dim": self.feature_dim}


class _TSTHead(nn.Module):
    def __init__(self, feature_dim: int, latent_dim: int, num_classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(feature_dim, 3 * latent_dim)
        self.latent = nn.Linear(3 * latent_dim, latent_dim)
        self.classifier = nn.Linear(latent_dim, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.latent(F.relu(self.hidden(features))))


class TwoStageHead(HeadCalibrator):
    """TST: Linear(d→3Z) → ReLU → Linear(3Z→Z) → Linear(Z→C) on frozen features."""

    method = "tst"
    #: auto trains K + 1 heads per head candidate: only when named
    auto_role = AutoRole.NAMED
    title = "two-stage training (TST)"
    description = (
        "The base model's feature extractor is frozen and a new classifier head, Linear(d→3Z) → ReLU → Linear(3Z→Z) → "
        "Linear(Z→C), is trained from scratch on its penultimate features with the cross-entropy (Adam); the epoch with "
        "the lowest validation NLL is kept (Jordahn & Olmos, ICML 2024). The paper retrains the head on the base's "
        "training data; here it is trained after the fact on the calibration data."
    )
    citation = JORDAHN_OLMOS_2024_CITATION

    @dataclasses.dataclass
    class Options(HeadOptions):
        """TST options (plus those of :class:`HeadOptions`).

        Attributes:
            latent_dim: Z, the width of the last hidden layer, from 1 to 4096 (default 128; our default,
                the paper tunes it per dataset).
        """

        latent_dim: int = ranged(128, LATENT_DIM)

    def __init__(self, num_classes: int, feature_dim: int, latent_dim: int = 128) -> None:
        super().__init__(num_classes, feature_dim)
        self.latent_dim = int(latent_dim)
        self.head_module = _TSTHead(feature_dim, latent_dim, num_classes)

    @classmethod
    def create(cls, num_classes: int, options: "TwoStageHead.Options", facts: ModelFacts = NO_FACTS) -> "TwoStageHead":
        return cls(num_classes, facts.need("feature_dim", cls.method), latent_dim=options.latent_dim)

    def config(self) -> Dict[str, Any]:
        return {**super().config(), "latent_dim": self.latent_dim}


def _encoder(feature_dim: int, latent_dim: int) -> nn.Sequential:
    """Linear(d→3Z) → ReLU → Linear(3Z→Z): one branch of the V-TST encoder."""
    return nn.Sequential(nn.Linear(feature_dim, 3 * latent_dim), nn.ReLU(), nn.Linear(3 * latent_dim, latent_dim))


class _VariationalHead(nn.Module):
    """μ and log σ² from two independent branches, as in the authors' code."""

    def __init__(self, feature_dim: int, latent_dim: int, num_classes: int, samples: int, prediction: str) -> None:
        super().__init__()
        self.mean_encoder = _encoder(feature_dim, latent_dim)
        self.variance_encoder = _encoder(feature_dim, latent_dim)
        self.classifier = nn.Linear(latent_dim, num_classes)
        self.prediction = prediction
        self.register_buffer("noise", torch.zeros(samples, latent_dim))

    def encode(self, features: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """μ (N, Z) and log σ² (N, Z), with log σ² = logsigmoid(·) ≤ 0 (σ² ≤ 1)."""
        return self.mean_encoder(features), F.logsigmoid(self.variance_encoder(features))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Log of the predictive probabilities (mean softmax over the stored noise samples)."""
        mean, log_variance = self.encode(features)
        if self.prediction == "mean":
            return self.classifier(mean)
        z = mean[None] + (0.5 * log_variance).exp()[None] * self.noise[:, None, :].to(mean.dtype)
        log_probs = F.log_softmax(self.classifier(z), dim=-1)  # (M, N, C)
        return torch.logsumexp(log_probs, dim=0) - math.log(self.noise.shape[0])


class VariationalTwoStageHead(HeadCalibrator):
    """V-TST: TST with a variational Z-layer; predictions average M softmax samples."""

    method = "vtst"
    #: auto trains K + 1 heads per head candidate: only when named
    auto_role = AutoRole.NAMED
    title = "variational two-stage training (V-TST)"
    description = (
        "As TST, a new classifier head is trained on the frozen base's penultimate features, but its last hidden layer "
        "is variational: a Gaussian latent z = μ + σ·ε with a standard normal prior, trained on the cross-entropy plus "
        "the KL divergence to the prior (Jordahn & Olmos, ICML 2024). Predictions average the softmax over M noise "
        "draws fixed when the head was fitted; the epoch with the lowest validation NLL is kept. The paper retrains "
        "the head on the base's training data; here it is trained after the fact on the calibration data."
    )
    citation = JORDAHN_OLMOS_2024_CITATION

    @dataclasses.dataclass
    class Options(HeadOptions):
        """V-TST options (plus those of :class:`HeadOptions`).

        Attributes:
            latent_dim: Z, from 1 to 4096 (default 128).
            samples: M, Monte-Carlo samples averaged at prediction time, from 1 to 100 (default 10).
            prediction: ``"sample"`` (default; average over the M stored noise draws) or
                ``"mean"`` (deterministic, z = μ).
        """

        latent_dim: int = ranged(128, LATENT_DIM)
        samples: int = ranged(10, SAMPLES)
        prediction: str = "sample"

        def __post_init__(self) -> None:
            super().__post_init__()
            require(self.prediction in PREDICTIONS, "prediction", self.prediction, f"one of {PREDICTIONS}")

    def __init__(self, num_classes: int, feature_dim: int, latent_dim: int = 128, samples: int = 10,
                 prediction: str = "sample") -> None:
        super().__init__(num_classes, feature_dim)
        self.latent_dim, self.samples, self.prediction = int(latent_dim), int(samples), prediction
        self.head_module = _VariationalHead(feature_dim, latent_dim, num_classes, samples, prediction)

    @classmethod
    def create(cls, num_classes: int, options: "VariationalTwoStageHead.Options",
               facts: ModelFacts = NO_FACTS) -> "VariationalTwoStageHead":
        return cls(num_classes, facts.need("feature_dim", cls.method), options.latent_dim, options.samples, options.prediction)

    def config(self) -> Dict[str, Any]:
        return {**super().config(), "latent_dim": self.latent_dim, "samples": self.samples, "prediction": self.prediction}

    def prepare_training(
        self, base_classifier: nn.Linear, options: HeadOptions, training_generator: torch.Generator,
        seeded: Callable[[int], torch.Generator],
    ) -> None:
        """Draw the M noise vectors of the predictions from the fit's seed."""
        self.draw_noise(seeded(NOISE_SALT))

    def draw_noise(self, generator: torch.Generator) -> None:
        """Fix the M noise vectors used at prediction time."""
        with torch.no_grad():
            noise = torch.randn(self.samples, self.latent_dim, generator=generator)
            self.head_module.noise.copy_(noise.to(self.head_module.noise.device))

    def training_loss(self, features: torch.Tensor, labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        head = self.head_module
        mean, log_variance = head.encode(features)
        noise = torch.randn(mean.shape, generator=generator).to(mean.device)
        z = mean + (0.5 * log_variance).exp() * noise
        kl = 0.5 * (mean.square() + log_variance.exp() - log_variance - 1).sum(dim=1).mean()
        return F.cross_entropy(head.classifier(z), labels) + kl / self.latent_dim
