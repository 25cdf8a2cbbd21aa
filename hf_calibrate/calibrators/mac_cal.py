"""MaC-Cal: masked retraining of a linear head with an adaptive retention rate.

**MaC-Cal** (Ni, Zhao, Yang, Guo, 2025; arXiv 2508.09116) — a *documented reconstruction*
designed from the paper's abstract and one figure caption. The full text is public on arXiv
but has not been checked against this code yet (docs/design.md §3.4). A linear head initialised from the
base classifier is retrained with Bernoulli masks on its weights (retention rate r,
inverted scaling); predictions average the softmax over M fixed masks at the same r, so r
is the knob that smooths them. After each epoch a controller moves r by the validation gap
between mean confidence and accuracy of those predictions (over-confident → lower r,
more stochastic sparsity; under-confident → higher r); early stopping on validation NLL.
(A first reconstruction used the full weights at prediction time; its confidence did not
fall monotonically with r — heavy masking of a large-norm head drove the weights *up* —
so the controller could not steer it. Masked prediction makes the lever monotone.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import NO_FACTS, AutoRole, ModelFacts
from .options import LEARNING_RATE, Range, ranged, require
from .heads import SAMPLES, HeadCalibrator, HeadOptions

#: salt of the seeded generator (the fit's ``seed`` and a salt make one generator) of the prediction masks' seed
MASK_SEED_SALT = 0x3A5C
#: r, the share of the classifier's weights a mask keeps: below 1 % nearly every mask keeps none (r = 1e-300 made the
#: training loss NaN)
RETENTION = Range(0.01, 1.0)
#: η: r moves by at most η per epoch and is clipped to [min_retention, 1], so a larger gain only jumps between the ends
CONTROLLER_GAIN = Range(0.0, 100.0)


class _MaskedLinear(nn.Linear):
    """A linear head under Bernoulli(r) weight masks.

    Training: one fresh mask per forward pass, weights scaled by 1/r (inverted DropConnect).
    Prediction: the log of the mean softmax over M fixed masks (drawn from ``mask_seed``), so
    the retention rate r directly sets how much the prediction is smoothed; r = 1 is the
    plain linear head. r and the seed are buffers: saved and restored with the weights.
    """

    def __init__(self, in_features: int, out_features: int, samples: int) -> None:
        super().__init__(in_features, out_features)
        self.samples = samples
        self.register_buffer("retention", torch.ones(()))
        self.register_buffer("mask_seed", torch.zeros((), dtype=torch.long))
        self.generator: Optional[torch.Generator] = None
        self._cached: Optional[tuple] = None

    def _draw(self, shape, generator: torch.Generator) -> torch.Tensor:
        return (torch.rand(shape, generator=generator) < float(self.retention)).to(self.weight.device, self.weight.dtype)

    def _prediction_masks(self) -> torch.Tensor:
        key = (float(self.retention), int(self.mask_seed), self.weight.device)
        if self._cached is None or self._cached[0] != key:
            generator = torch.Generator().manual_seed(int(self.mask_seed))
            self._cached = (key, self._draw((self.samples, *self.weight.shape), generator))
        return self._cached[1]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        r = float(self.retention)
        if r >= 1.0:
            return super().forward(features)
        if self.training:
            return F.linear(features, self.weight * self._draw(self.weight.shape, self.generator) / r, self.bias)
        weights = self.weight[None] * self._prediction_masks() / r  # (M, C, d)
        log_probs = F.log_softmax(torch.einsum("nd,mcd->mnc", features, weights) + self.bias, dim=-1)
        return torch.logsumexp(log_probs, dim=0) - math.log(self.samples)


class MaskedClassifierHead(HeadCalibrator):
    """MaC-Cal (reconstruction): masked retraining of a linear head with an adaptive retention rate."""

    method = "mac_cal"
    #: auto trains K + 1 heads per head candidate: only when named
    auto_role = AutoRole.NAMED
    title = "MaC-Cal (mask-based classifier calibration, reconstructed)"
    description = (
        "A linear head initialised from the base's classifier is retrained on the frozen base's features under random "
        "Bernoulli masks on its weights (retention rate r). Predictions average the softmax over M fixed masks, and "
        "after each epoch r moves by the validation gap between mean confidence and accuracy: lower when "
        "over-confident, higher when under-confident (Ni, Zhao, Yang & Guo, 2025). The epoch with the lowest "
        "validation NLL is kept. This is a reconstruction designed from the paper's abstract, not yet checked against its full text."
    )
    citation = (
        "@misc{ni2025maccal, title={Deep Neural Network Calibration by Reducing Classifier Shift with Stochastic "
        "Masking}, author={Ni, Jiani and Zhao, He and Yang, Yibo and Guo, Dandan}, year={2025}, eprint={2508.09116}, "
        "archivePrefix={arXiv}}"
    )

    @dataclasses.dataclass
    class Options(HeadOptions):
        """MaC-Cal options (plus those of :class:`HeadOptions`).

        Attributes:
            lr: Adam learning rate, in (0, 1] (default 3e-3).
            epochs: default 30.
            initial_retention: r at the start, in [min_retention, 1] (default 0.9).
            min_retention: lower bound of r, in [0.01, 1] (default 0.3).
            controller_gain: η in r ← clip(r − η·(mean confidence − accuracy), min, 1) after each
                epoch, measured on the validation split with the masked prediction, in [0, 100] (default 1.0).
            samples: M, fixed masks averaged at prediction time, from 1 to 100 (default 10).
            init_from_base: start from the base classifier's weights (default True).
        """

        lr: float = ranged(3e-3, LEARNING_RATE)
        epochs: int = 30
        initial_retention: float = ranged(0.9, RETENTION)
        min_retention: float = ranged(0.3, RETENTION)
        controller_gain: float = ranged(1.0, CONTROLLER_GAIN)
        samples: int = ranged(10, SAMPLES)
        init_from_base: bool = True

        def __post_init__(self) -> None:
            super().__post_init__()
            require(self.min_retention <= self.initial_retention, "initial_retention", self.initial_retention,
                    f"a number in [min_retention, 1] = [{self.min_retention}, 1]")

    def __init__(self, num_classes: int, feature_dim: int, samples: int = 10) -> None:
        super().__init__(num_classes, feature_dim)
        self.samples = int(samples)
        self.head_module = _MaskedLinear(feature_dim, num_classes, self.samples)

    @classmethod
    def create(cls, num_classes: int, options: "MaskedClassifierHead.Options",
               facts: ModelFacts = NO_FACTS) -> "MaskedClassifierHead":
        return cls(num_classes, facts.need("feature_dim", cls.method), options.samples)

    def config(self) -> Dict[str, Any]:
        return {**super().config(), "samples": self.samples}

    def prepare_training(
        self, base_classifier: nn.Linear, options: "MaskedClassifierHead.Options", training_generator: torch.Generator,
        seeded: Callable[[int], torch.Generator],
    ) -> None:
        """Start from the base's classifier (``init_from_base``) at the initial retention rate; training masks are
        drawn from the training generator, the prediction masks from a seed drawn from the fit's seed."""
        head = self.head_module
        if options.init_from_base:
            with torch.no_grad():
                head.weight.copy_(base_classifier.weight)
                bias = base_classifier.bias
                head.bias.copy_(bias if bias is not None else torch.zeros_like(head.bias))
        head.generator = training_generator
        head.retention.fill_(options.initial_retention)
        head.mask_seed.fill_(int(torch.randint(0, 2**62, (1,), generator=seeded(MASK_SEED_SALT))))

    def epoch_facts(self) -> Dict[str, Any]:
        """The retention rate r this epoch was trained and validated at."""
        return {"retention": float(self.head_module.retention)}

    def after_validation(self, record: Dict[str, Any], options: "MaskedClassifierHead.Options") -> None:
        """The controller, only now (the kept state was validated at this epoch's r): set the next epoch's r."""
        self.head_module.retention.fill_(self.next_retention(record["retention"], record["confidence_gap"], options))

    @staticmethod
    def next_retention(retention: float, confidence_gap: float, options: "MaskedClassifierHead.Options") -> float:
        """The controller: lower r when over-confident (gap > 0), raise it when under-confident."""
        return float(min(1.0, max(options.min_retention, retention - options.controller_gain * confidence_gap)))
