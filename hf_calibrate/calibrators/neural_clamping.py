"""Neural Clamping (Tang, Chen & Ho, TMLR 2024; arXiv 2209.11604).

Calibrated logits are ``f(x + δ) / T`` for the frozen classifier f: δ is one universal
perturbation shaped like one model input (added after normalisation, no clipping) and T a
scalar temperature, stored as log T. Both minimise

    focal loss_γ(f(x + δ)/T, y) + λ·‖δ‖₂

over the calibration data (the paper: γ=1, λ=0.01). The default optimiser, ``optimizer="lbfgs"``,
is full-batch L-BFGS on that objective plus a ridge that stands in for the reference's early
stopping, stopped on cross-fitted held-out data (:mod:`hf_calibrate.fitting.clamping.lbfgs`); the authors'
SGD recipe (momentum 0.9, lr 0.01, batch 1000) is ``optimizer="sgd"``
(:mod:`hf_calibrate.fitting.clamping.neural_clamping`). δ = 0 is temperature scaling, so a fit that selects
on held-out data can always fall back to TS.

Text models (our extension): δ is one vector of the hidden size added to the word embedding
of every non-padding token, at every position.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .base import AutoRole, Calibrator, ModelFacts, NO_FACTS
from .options import HELD_OUT_SHARE, LEARNING_RATE, InvalidOptionError, Range, check_fields, ranged, require
from .binning import BINS
from .temperature import BETA_BOUNDS

DELTA_INITS = ("zero", "gradient", "random")
SELECT_METRICS = ("nll", "ece", "ada_ece", "brier", "smooth_ece")
OPTIMIZERS = ("lbfgs", "sgd")
#: options that only the SGD optimiser reads: setting one (to anything but None / False) selects it
SGD_OPTIONS = ("epochs", "lr", "momentum", "eval_every", "augment")
#: the SGD optimiser's values for options left None (the authors' demo recipe)
SGD_DEFAULTS = {"lr": 0.01, "momentum": 0.9}
#: options that only the L-BFGS optimiser reads: setting one (to anything but None) selects it
LBFGS_OPTIONS = ("max_iterations", "patience", "folds", "ridge", "refit")
#: the L-BFGS optimiser's values for options left None
LBFGS_DEFAULTS = {"max_iterations": 12, "patience": 12, "ridge": 0.1, "refit": "average"}
#: how the cross-fitted L-BFGS optimiser turns its fold runs into the fitted (δ, T)
REFITS = ("average", "all")
#: SGD momentum: 1 or more never forgets a step
MOMENTUM = Range(0.0, 1.0, high_open=True)
#: focal-loss γ: (1 − p)^γ of every sample the model does not get wholly right is 0 long before γ = 100
GAMMA = Range(0.0, 100.0)
#: λ on ‖δ‖₂ and the ridge ρ: at 10³ either holds δ at 0 (temperature scaling) whatever the data
PENALTY = Range(0.0, 1e3)
#: the standard deviation of a random start of δ, in the model's (normalised) input units
DELTA_INIT_SCALE = Range(0.0, 10.0)
#: T's starting point: temperature scaling's own bounds (beyond them the model is constant or a hard argmax)
TEMPERATURE = Range(*BETA_BOUNDS)


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float, reduction: str = "mean") -> torch.Tensor:
    r"""Focal loss (Lin et al., 2017) with α = 1: :math:`-(1 - p_y)^\gamma \log p_y`.

    ``gamma=0`` is the cross-entropy. ``reduction``: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    log_p = F.log_softmax(logits.float(), dim=1).gather(1, labels[:, None]).squeeze(1)
    losses = -log_p if gamma == 0 else -((1 - log_p.exp()).clamp_min(0) ** gamma) * log_p
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.mean()


def _as_grid(value: Union[float, Sequence[float]], name: str) -> Tuple[float, ...]:
    """A number or a list of numbers (each already checked against its range) as a non-empty tuple of floats."""
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    require(bool(values), name, value, "a number or a non-empty list of them")
    return tuple(float(v) for v in values)


def recorded_select_metric(options: Optional[Mapping[str, Any]]) -> str:
    """The held-out criterion of a fit whose recorded options are ``options``: its ``select_metric``, or
    the default (records written before the option was recorded used it)."""
    return (options or {}).get("select_metric", NeuralClamping.Options.select_metric)


class NeuralClamping(Calibrator):
    """δ (one input-shaped tensor) and log T; see the module docstring."""

    method = "neural_clamping"
    needs_base_model = True
    #: auto tries it by default, and runs it only when its estimated time fits a ``budget`` (:mod:`hf_calibrate.fitting.auto.clamping`)
    auto_role = AutoRole.DEFAULT
    title = "Neural Clamping"
    description = (
        "A universal input perturbation δ (one tensor shaped like one model input, added after normalisation) and a "
        "temperature T are learned on the frozen classifier by minimising the focal loss plus λ‖δ‖₂ (Tang, Chen & Ho, "
        "TMLR 2024). Held-out calibration data (cross-fitted folds, or one held-out part) choose when to stop and the "
        "hyper-parameters, and the fit falls back to plain temperature scaling (δ = 0) when δ does not help there."
    )
    citation = (
        "@article{tang2024neural, title={Neural Clamping: Joint Input Perturbation and Temperature Scaling for Neural "
        "Network Calibration}, author={Tang, Yung-Chen and Chen, Pin-Yu and Ho, Tsung-Yi}, "
        "journal={Transactions on Machine Learning Research}, year={2024}}"
    )

    @dataclasses.dataclass
    class Options:
        """Fit options of Neural Clamping (the objective's defaults, γ and λ, follow the authors' demo).

        Two ways to minimise the objective, chosen by ``optimizer``:

        * ``"lbfgs"`` (the default): full-batch L-BFGS on (δ, log T) from δ = 0 and T = the TS
          optimum, one pass of the base model over the fitting rows per iteration (forward and
          backward to the input), with the ``ridge`` penalty, stopped early on cross-fitted held-out
          data: the calibration data are split into ``folds`` folds (rows dealt at random), one run per fold is
          scored on its held-out fold after every iteration, and the iteration (with γ, λ, ρ) that
          minimises the pooled held-out criterion is kept — the mean of the fold runs' (δ, log T)
          there (``refit``) — or, when no iteration beats iteration 0 (δ = 0: temperature scaling),
          the fit falls back to temperature scaling. At most ``max_iterations`` iterations; the runs
          stop ``patience`` iterations after the best (by default 12, so they run all 12: the pooled
          held-out curve often rises for a few iterations before it falls below TS's, and a patience of 4
          fell back on 3 of 10 fresh CNN seeds where the reference gained, ``benchmarks/results/nc_fresh_seeds.md``).
          On the digits CNN and ViT (449 rows, 10 and 5 fresh seeds) it took 0.17–0.20× the reference
          recipe's time, with a test NLL not resolved from the reference's and below TS's.
        * ``"sgd"``: the authors' recipe — SGD with momentum over shuffled batches for ``epochs``, a
          single held-out part (``holdout_fraction``) checked every ``eval_every`` epochs; chosen by
          passing any SGD option.

        Attributes:
            optimizer: ``"lbfgs"``, ``"sgd"`` or None (default: ``"sgd"`` when an SGD option —
                ``epochs``, ``lr``, ``momentum``, ``eval_every``, ``augment`` — is given without L-BFGS
                options, else ``"lbfgs"``); the resolved name is recorded.
            max_iterations: L-BFGS iterations at most per run (default None: 12).
            patience: the L-BFGS runs stop this many iterations after the best pooled held-out score (default None: 12,
                ``max_iterations``: no early stop).
            ridge: L-BFGS: ρ of the penalty (ρ/2)·(‖δ‖₂² + (log T − log T₀)²) that holds (δ, log T) near its start
                (δ = 0, and T₀ = ``temperature_init``: the TS optimum of the run's rows by default), in [0, 1e3], or a list
                to select from on the held-out data (default None: 0.1). On up to 1,000 calibration rows the authors' recipe takes 100
                SGD steps (one batch per epoch; lr 0.01, momentum 0.9), a gradient flow of duration
                τ ≈ 100 × 0.01 / (1 − 0.9) = 10 from its start, which regularises like a ridge of ρ ≈ 1/τ. Larger sets
                take more steps there (100 per 1,000 rows), and 0.1 was not re-derived for them. Without the ridge
                full-batch L-BFGS over-fits small calibration sets (T → 0 once δ separates the classes).
            refit: L-BFGS with several folds: how the chosen iteration becomes the fitted model — ``"average"``
                (default None: this) takes the mean of the fold runs' (δ, log T) at that iteration, which costs no
                further pass over the data; ``"all"`` refits on all the calibration data from the start for that many
                iterations (1.3–2.0× the time on the zoo models). Ignored with one fold or ``validation_data=`` (nothing to
                average: the single run is kept, recorded as ``refit="none"``).
            folds: cross-fitting folds of the L-BFGS optimiser (default None: 2 when the calibration
                data hold 50 to 10,000 samples and ``holdout_fraction`` is left at its default, else
                1 — a single ``holdout_fraction`` part, kept as fitted without a refit, like the SGD
                optimiser's). ``validation_data=`` replaces the folds by that one selection set.
            require_significant_gain: L-BFGS: True keeps δ only when the pooled held-out NLL of the
                chosen iteration is below TS's by a paired 95 % interval that excludes 0, else falls back
                to TS; False (the default) keeps δ whenever that point estimate is lower. True with the SGD
                optimiser is an error (it keeps δ whenever its held-out score is lower). With the ridge
                the interval rule threw away real gains: it fell back in most zoo seeds where δ beat
                TS on the test half (``benchmarks/results/nc_time_to_quality.md``).
            epochs: SGD passes over the fitting part (default None: as many as give 500 SGD steps; at least 1).
            lr: SGD learning rate, in (0, 1] (default None: 0.01).
            momentum: SGD momentum, in [0, 1) (default None: 0.9).
            gamma: focal-loss γ, in [0, 100], or a list to select from on the held-out part (default 1.0).
            delta_weight: λ on ‖δ‖₂, in [0, 1e3], or a list to select from (default 0.01).
            delta_init: ``"zero"`` (default; starts exactly at TS), ``"gradient"`` (the paper's
                data-driven rule: the mean over the data of ∂ Σ_k f_k(x + δ)/T / ∂δ at δ = 0) or
                ``"random"`` (N(0, delta_init_scale²), as in the authors' demo). On the zoo's
                models ``"gradient"`` was no better than ``"zero"`` in paired 5-seed comparisons
                (``benchmarks/results/defaults.md``).
            delta_init_scale: standard deviation for ``delta_init="random"``, in [0, 10] (default 0.001).
            temperature_init: T's starting point: ``"ts"`` (default; the TS optimum of the
                fitting part, so that δ = 0 starts exactly at TS) or a number in [0.001, 1000], temperature
                scaling's bounds (the authors' code starts at 1.0). T is optimised as log T either way.
            augment: image augmentation during the fit: False (default), True (random crop
                with 1/8 padding, horizontal flip, cutout of 1/8 side — the reference's CIFAR
                recipe), or a callable ``(pixel_values, generator) -> pixel_values``. The recipe
                suits natural images, not every dataset: on the digits models it fell back to TS
                in every seed (flips change digits; ``benchmarks/results/defaults.md``).
            holdout_fraction: share of the calibration data held out, when a single part is held
                out (SGD, or L-BFGS with one fold), to select the epoch or iteration, γ and λ, and to
                fall back to TS (δ = 0) when δ does not help, in [0, 1) (default 0.2; 0 trains on everything
                and keeps the last epoch or iteration). With L-BFGS, a share other than the default
                asks for that one held-out part instead of automatic folds.
            select_metric: held-out criterion, one of ``"nll"`` (default), ``"ece"``,
                ``"ada_ece"``, ``"brier"``, ``"smooth_ece"``. Every one of them is recorded in
                the fit history at each check, whichever selects. NLL is a proper scoring
                rule; binned ECE is not (predicting the class frequencies scores ECE ≈ 0) and,
                on the ~100-row hold-outs of typical calibration sets, moves by ~0.01 per
                sample. Selecting on ECE or smECE was no better on test ECE and worse on test
                NLL than NLL in paired 5-seed comparisons (``benchmarks/results/defaults.md``).
            eval_every: SGD: evaluate on the held-out part every this many epochs (default None:
                about 20 evaluations per run, and always after the last epoch).
            n_bins: bins of the held-out ECE, from 1 to 10000 (default 15).
        """

        optimizer: Optional[str] = None
        max_iterations: Optional[int] = None
        patience: Optional[int] = None
        folds: Optional[int] = None
        ridge: Optional[Union[float, Sequence[float]]] = ranged(None, PENALTY)
        refit: Optional[str] = None
        require_significant_gain: bool = False
        epochs: Optional[int] = None
        lr: Optional[float] = ranged(None, LEARNING_RATE)
        momentum: Optional[float] = ranged(None, MOMENTUM)
        gamma: Union[float, Sequence[float]] = ranged(1.0, GAMMA)
        delta_weight: Union[float, Sequence[float]] = ranged(0.01, PENALTY)
        delta_init: str = "zero"
        delta_init_scale: float = ranged(0.001, DELTA_INIT_SCALE)
        temperature_init: Union[str, float] = ranged("ts", TEMPERATURE)
        augment: Union[bool, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = False
        holdout_fraction: float = ranged(0.2, HELD_OUT_SHARE)
        select_metric: str = "nll"
        eval_every: Optional[int] = None
        n_bins: int = ranged(15, BINS)

        def __post_init__(self) -> None:
            check_fields(self)
            self.gamma = _as_grid(self.gamma, "gamma")
            self.delta_weight = _as_grid(self.delta_weight, "delta_weight")
            self._resolve_optimizer()
            self.ridge = None if self.ridge is None else _as_grid(self.ridge, "ridge")
            require(self.epochs is None or self.epochs >= 1, "epochs", self.epochs, "a positive integer or None")
            require(self.max_iterations is None or self.max_iterations >= 1, "max_iterations", self.max_iterations, "a positive integer")
            require(self.patience is None or self.patience >= 1, "patience", self.patience, "a positive integer")
            require(self.folds is None or self.folds >= 1, "folds", self.folds, "a positive integer or None")
            require(self.refit is None or self.refit in REFITS, "refit", self.refit, f"one of {list(REFITS)} or None")
            require(self.delta_init in DELTA_INITS, "delta_init", self.delta_init, f"one of {list(DELTA_INITS)}")
            require(self.select_metric in SELECT_METRICS, "select_metric", self.select_metric, f"one of {list(SELECT_METRICS)}")
            require(self.eval_every is None or self.eval_every >= 1, "eval_every", self.eval_every, "a positive integer or None")
            require(self.temperature_init == "ts" or not isinstance(self.temperature_init, str), "temperature_init",
                    self.temperature_init, f'"ts" or {TEMPERATURE.describe(integer=False)}')

        def _resolve_optimizer(self) -> None:
            """``optimizer=None`` → ``"sgd"`` when an SGD option is set, else ``"lbfgs"``; options of both optimisers, or of
            the one not chosen, are an error. Unset options of the chosen optimiser get their defaults."""
            given = [name for name in SGD_OPTIONS if getattr(self, name) is not None and getattr(self, name) is not False]
            lbfgs_given = [name for name in LBFGS_OPTIONS if getattr(self, name) is not None]
            if self.optimizer is None and given and lbfgs_given:
                raise InvalidOptionError(f"option(s) {given} belong to optimizer='sgd' and {lbfgs_given} to optimizer='lbfgs': "
                                         "pass one optimizer's options (the default is 'lbfgs').")
            if self.optimizer is None:
                self.optimizer = "sgd" if given else "lbfgs"
            if self.optimizer == "sgd" and lbfgs_given:
                raise InvalidOptionError(f"option(s) {lbfgs_given} belong to optimizer='lbfgs', but the SGD recipe was chosen: "
                                         "drop them, or pass optimizer='lbfgs' (without SGD options).")
            require(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"one of {list(OPTIMIZERS)} or None")
            if self.optimizer == "lbfgs" and given:
                raise InvalidOptionError(
                    f"option(s) {given} set the SGD schedule, but optimizer='lbfgs' was asked for: drop them, or pass "
                    "optimizer='sgd' (or leave optimizer unset) to train by SGD.")
            if self.optimizer == "sgd" and self.require_significant_gain:
                raise InvalidOptionError("require_significant_gain=True is an L-BFGS option, but the SGD recipe was chosen: "
                                         "drop it, or drop the SGD options to use optimizer='lbfgs'.")
            defaults = SGD_DEFAULTS if self.optimizer == "sgd" else LBFGS_DEFAULTS
            for name, value in defaults.items():
                setattr(self, name, value if getattr(self, name) is None else getattr(self, name))

    def __init__(self, num_classes: int, delta_shape: Sequence[int], delta_space: str = "pixel_values") -> None:
        super().__init__(num_classes)
        self.delta_space = delta_space
        self.delta = nn.Parameter(torch.zeros(tuple(int(v) for v in delta_shape)))
        self.log_temperature = nn.Parameter(torch.zeros(()))

    @classmethod
    def create(cls, num_classes: int, options: "NeuralClamping.Options", facts: ModelFacts = NO_FACTS) -> "NeuralClamping":
        return cls(num_classes, delta_shape=facts.need("delta_shape", cls.method), delta_space=facts.need("delta_space", cls.method))

    @property
    def input_perturbation(self) -> torch.Tensor:
        return self.delta

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * torch.exp(-self.log_temperature).to(logits.dtype)

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "delta_shape": list(self.delta.shape), "delta_space": self.delta_space}

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, delta_shape={tuple(self.delta.shape)}, delta_space={self.delta_space!r}"
