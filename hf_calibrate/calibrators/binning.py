"""Non-parametric calibration maps: histogram binning here, isotonic regression in :mod:`.isotonic`, and what they share.

Both fit a monotone-in-spirit map g from a score to a frequency, in one of two modes:
* ``"top_label"`` (default): g maps the confidence c = max_k p_k to P(correct | c); the
  calibrated top probability is g(c) and the other classes share 1 − g(c) in proportion to
  their original probabilities. One map whatever the number of classes.
* ``"one_vs_rest"``: a map g_k per class from p_k to P(y = k | p_k); rows are renormalised.

They output probabilities; as calibrators they return log-probabilities (clamped at 1e-12),
which softmax maps back to the same probabilities. Top-label mode keeps the argmax whenever
g(c) ≥ 1/C (see :func:`_top_label_vector`); one-vs-rest mode can change it.

**A prior towards temperature scaling.** On a few hundred rows of a model that is right 95–99 %
of the time the top bins (or isotonic blocks) hold no error, their frequency is 1, and every test
error there costs −log 1e-12 ≈ 28 nats. So both are pulled towards temperature scaling (TS, fitted
on the same data) by m = ``prior`` pseudo-samples:

* histogram: each bin's value is the posterior mean under a Beta prior of m pseudo-samples centred
  on t̄, the mean TS-calibrated score of the bin's samples: g = (hits + m t̄) / (count + m);
* isotonic: each distinct score keeps its own t̄ plus its isotonic block's correction shrunk by m
  pseudo-samples, g = t̄ + (hits_B − Σ_B t) / (count_B + m), made monotone again (a weighted
  isotonic fit): m = ∞ follows TS wherever TS's score is monotone in the uncalibrated one;

both clipped to [ε, 1 − ε] with ε = 1 / (2 (N + 1)), N the number of calibration samples. m = 0
gives the classic maps (unclipped). By default m is chosen by K-fold cross-fitted NLL
(:func:`.holdout.select_by_cross_fitting`, rows of equal logits in one fold) among ∞ and :data:`DEFAULT_PRIOR_GRID`, so no bin or
knot value is 0 or 1. (In top-label mode the other classes share 1 − g in proportion to their
uncalibrated probabilities, which a confident model can make tiny: that share is not floored.)
A histogram's values stay constant per bin, so even m = ∞ loses TS's resolution within a bin.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..metrics.functional import equal_width_bin_index
from .base import NO_FACTS, Calibrator, ModelFacts, chunk_rows
from .options import Range, check_fields, ranged, require
from .holdout import cross_fitting_folds, default_folds, fit_groups, select_by_cross_fitting
from .memory import Footprint
from .requirements import DataRequirements
from .temperature import fit_inverse_temperature, starting_temperature_warnings

MODES = ("top_label", "one_vs_rest")
_LOG_FLOOR = 1e-12
_TIE_MARGIN = 1e-6
#: candidate prior strengths m (pseudo-samples) after m = ∞, strongest first
DEFAULT_PRIOR_GRID = (1000.0, 300.0, 100.0, 30.0, 10.0, 3.0, 1.0)
#: the most bins a histogram may have (its state is maps × bins float64 values, allocated before the data are seen)
MAX_BINS = 10_000
#: the bin counts a histogram (or a held-out ECE) may have
BINS = Range(1, MAX_BINS)
#: m, in pseudo-samples: at 10⁶ a map is temperature scaling's averaged per bin or block to within what a fit can tell
#: (m = ∞ is a candidate of the default selection)
PRIOR = Range(0.0, 1e6)
#: what binning and isotonic regression need: errors to learn a confidence from, and rows to fill a few bins
BINNING_REQUIREMENTS = DataRequirements(rows=10, classes=1, errors=1, advised_rows=100)
#: probabilities, TS's probabilities (the prior's centres), scores and targets, the calibrated rows
BINNING_FOOTPRINT = Footprint(rows=5)


def check_mode(mode: str) -> str:
    require(isinstance(mode, str) and mode in MODES, "mode", mode, f"one of {MODES}")
    return mode


def mode_scores(probs: torch.Tensor, mode: str) -> torch.Tensor:
    """(maps, N) scores a map is applied to: the confidence (1 map) or each p_k (C maps)."""
    return probs.max(dim=1).values[None] if mode == "top_label" else probs.T.contiguous()


def _targets(probs: torch.Tensor, labels: torch.Tensor, mode: str) -> torch.Tensor:
    """(maps, N) 0/1 targets: correctness (top-label) or [y = k] (one-vs-rest)."""
    if mode == "top_label":
        return (probs.argmax(dim=1) == labels).to(probs.dtype)[None]
    return torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype).T


def _top_label_vector(probs: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Probability rows whose predicted class gets ``top`` and the others share 1 − top.

    The others keep their relative sizes, mixed towards uniform just enough that none
    exceeds ``top``: with m the largest other share and u = 1/(C−1), the mixing weight is
    α = (m − r)/(m − u) for r = top/(1 − top) (clipped to [0, 1]). The argmax is thus kept
    whenever top ≥ 1/C, below which no probability vector can keep it.
    """
    predictions = probs.argmax(dim=1)
    others = probs.shape[1] - 1
    if others == 0:
        return torch.ones_like(probs)
    shares = probs.scatter(1, predictions[:, None], 0.0)
    rest_mass = shares.sum(dim=1)  # not 1 − confidence: that cancels catastrophically near 1
    has_mass = rest_mass > _LOG_FLOOR
    uniform = 1.0 / others
    shares = torch.where(has_mass[:, None], shares / rest_mass.clamp_min(_LOG_FLOOR)[:, None], torch.full_like(shares, uniform))
    shares = shares.scatter(1, predictions[:, None], 0.0)
    largest = shares.max(dim=1).values
    ratio = top / (1 - top).clamp_min(_LOG_FLOOR) * (1 - _TIE_MARGIN)  # strictly below top: no ties
    alpha = ((largest - ratio) / (largest - uniform).clamp_min(_LOG_FLOOR)).clamp(0, 1)
    alpha = torch.where(largest > ratio, alpha, torch.zeros_like(alpha))
    mixed = (1 - alpha[:, None]) * shares + alpha[:, None] * uniform
    calibrated = (1 - top[:, None]) * mixed
    return calibrated.scatter(1, predictions[:, None], top[:, None])


def assemble(probs: torch.Tensor, mapped: torch.Tensor, mode: str) -> torch.Tensor:
    """Calibrated log-probabilities from the mapped scores (maps, N)."""
    if mode == "one_vs_rest":
        calibrated = mapped.T.clamp_min(0)
        totals = calibrated.sum(dim=1, keepdim=True)
        uniform = torch.full_like(calibrated, 1.0 / calibrated.shape[1])
        calibrated = torch.where(totals > 0, calibrated / totals.clamp_min(_LOG_FLOOR), uniform)
    else:
        calibrated = _top_label_vector(probs, mapped[0].clamp(0, 1))
    return calibrated.clamp_min(_LOG_FLOOR).log()


# ----------------------------------------------------------------------------- the prior towards TS


@dataclasses.dataclass
class PriorOptions:
    """The prior options shared by histogram binning and isotonic regression (module docstring).

    Attributes:
        prior: m, the prior's weight in pseudo-samples centred on temperature scaling's probability, in [0, 1e6]; 0 gives
            the classic unsmoothed fit (which can say 0 or 1). None (default) selects it by cross-fitted
            NLL among ∞ (temperature scaling averaged per bin) and ``prior_grid``.
        prior_grid: candidate m values, each in (0, 1e6] (default 1000, 300, 100, 30, 10, 3, 1), tried strongest first
            until two in a row do not improve the cross-fitted NLL.
        folds: K of the K-fold cross-fitting (default None: 5, or 2 from 10⁷ logit values on).
        seed: seed of the folds (default 0); ``CalibratedModel.fit(seed=...)`` sets it with the fit's.
    """

    prior: Optional[float] = ranged(None, PRIOR)
    prior_grid: Tuple[float, ...] = ranged(DEFAULT_PRIOR_GRID, Range(0.0, PRIOR.high, low_open=True))
    folds: Optional[int] = None
    seed: int = 0

    def check_prior(self) -> None:
        require(len(self.prior_grid) > 0, "prior_grid", self.prior_grid, "a non-empty list (pass prior=0 for the unsmoothed fit)")
        require(self.folds is None or self.folds >= 2, "folds", self.folds, "an integer >= 2, or None")
        self.prior_grid = tuple(sorted(dict.fromkeys(float(v) for v in self.prior_grid), reverse=True))


@dataclasses.dataclass(frozen=True)
class Scored:
    """Calibration rows as the maps see them, each (maps, N) float64: ``scores`` (what a map is applied to),
    ``targets`` (0/1) and ``centres`` (the TS-calibrated scores, the prior's centres)."""

    scores: torch.Tensor
    targets: torch.Tensor
    centres: torch.Tensor


def scored_rows(logits: torch.Tensor, labels: torch.Tensor, mode: str) -> Scored:
    """:class:`Scored` of (N, C) logits and (N,) labels, with temperature scaling fitted on them for the centres."""
    probs = torch.softmax(logits.double(), dim=1)
    beta = fit_inverse_temperature(logits.detach(), labels)[0]
    return Scored(mode_scores(probs, mode), _targets(probs, labels, mode), mode_scores(torch.softmax(logits.double() * beta, dim=1), mode))


def smoothed(hits: torch.Tensor, counts: torch.Tensor, centre_sums: torch.Tensor, prior: float, floor: float) -> torch.Tensor:
    """(hits + m t̄) / (counts + m) with t̄ = centre_sums / counts, clipped to [floor, 1 − floor]; t̄ for m = ∞,
    hits / counts unclipped for m = 0. Empty entries (counts 0) give NaN (the caller fills them)."""
    centres = centre_sums / counts
    if prior == 0:
        return hits / counts
    values = centres if math.isinf(prior) else (hits + prior * centres) / (counts + prior)
    return values.clamp(floor, 1 - floor)


def floor_of(count: int) -> float:
    """ε = 1 / (2 (N + 1)): no probability of a class that can occur is closer to 0 or 1 than this (N samples)."""
    return 0.5 / (count + 1)


def select_prior(
    logits: torch.Tensor, labels: torch.Tensor, mode: str, options: PriorOptions,
    fit_map: Callable[[torch.Tensor, torch.Tensor, float], Callable[[torch.Tensor], torch.Tensor]],
) -> Tuple[float, Dict[str, float]]:
    """m = ``options.prior``, or the cross-fitted choice among ∞ and ``options.prior_grid``; and the candidates' scores.

    ``fit_map(logits, labels, m)`` fits a map and returns it as ``scores (maps, n) → values (maps, n)``;
    a candidate's score is the mean held-out NLL (nats) of the calibrated probabilities.
    """
    if options.prior is not None:
        return options.prior, {}
    folds = cross_fitting_folds(labels, default_folds(options.folds, *logits.shape), options.seed, fit_groups(logits))

    def held_out_nll(prior: float, fold: int) -> torch.Tensor:
        fit_rows, held_rows = (rows.to(logits.device) for rows in folds[fold])
        apply = fit_map(logits[fit_rows], labels[fit_rows], prior)
        probs = torch.softmax(logits[held_rows].double(), dim=1)
        log_probs = assemble(probs, apply(mode_scores(probs, mode)), mode)
        return -log_probs.gather(1, labels[held_rows, None]).squeeze(1)

    selection = select_by_cross_fitting((math.inf, *options.prior_grid), folds, held_out_nll)
    return selection.chosen, selection.scores


def prior_summary(prior: float, scores: Dict[str, float], logits: torch.Tensor, labels: torch.Tensor, method: str) -> Dict[str, Any]:
    """The summary's record of the prior: ``prior`` (None for m = ∞), the candidates' cross-fitted NLL, and the
    ``warnings`` of the temperature scaling it is centred on, fitted on (N, C) ``logits`` and (N,) ``labels`` (none for
    m = 0, which has no centre)."""
    return {"prior": None if math.isinf(prior) else prior, **({"prior_cv_nll": scores} if scores else {}),
            "warnings": starting_temperature_warnings(logits, labels, method) if prior else []}


# ----------------------------------------------------------------------------- histogram binning


class HistogramBinning(Calibrator):
    """Equal-width histogram binning (Zadrozny & Elkan, 2001) with a prior towards temperature scaling.

    Bins are those of the ECE (b/B, (b+1)/B]; a bin's value is its smoothed frequency (module
    docstring); an empty bin maps to its midpoint.
    """

    method = "histogram"
    title = "histogram binning"
    description = ("Confidences are mapped to the frequency of their equal-width bin on the calibration data, smoothed "
                   "towards temperature scaling by a prior whose weight is chosen by cross-fitted NLL.")
    citation = (
        "@inproceedings{zadrozny2001obtaining, title={Obtaining calibrated probability estimates from decision trees and "
        "naive Bayesian classifiers}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={ICML}, year={2001}}"
    )
    requirements, footprint = BINNING_REQUIREMENTS, BINNING_FOOTPRINT
    least_data_note = "at least n_bins rows (15 by default)"

    @dataclasses.dataclass
    class Options(PriorOptions):
        """Fit options of histogram binning (and those of :class:`PriorOptions`: ``prior``, ``prior_grid``, ``folds``, ``seed``).

        Attributes:
            n_bins: number of equal-width bins over [0, 1] (default 15; at most :data:`MAX_BINS`, and at
                most the number of calibration samples).
            mode: ``"top_label"`` (default) or ``"one_vs_rest"``.
        """

        n_bins: int = ranged(15, BINS)
        mode: str = "top_label"

        def __post_init__(self) -> None:
            check_fields(self)
            check_mode(self.mode)
            self.check_prior()

    def __init__(self, num_classes: int, n_bins: int = 15, mode: str = "top_label") -> None:
        super().__init__(num_classes)
        self.mode = check_mode(mode)
        if n_bins not in BINS:
            raise ValueError(f"n_bins must be {BINS.describe(integer=True)}, got {n_bins}.")
        maps = 1 if mode == "top_label" else num_classes
        midpoints = (torch.arange(n_bins, dtype=torch.float64) + 0.5) / n_bins
        self.register_buffer("bin_values", midpoints.repeat(maps, 1))

    @classmethod
    def create(cls, num_classes: int, options: "HistogramBinning.Options", facts: ModelFacts = NO_FACTS) -> "HistogramBinning":
        return cls(num_classes, n_bins=options.n_bins, mode=options.mode)

    @property
    def n_bins(self) -> int:
        return int(self.bin_values.shape[1])

    def config(self) -> Dict[str, Any]:
        return {"num_classes": self.num_classes, "n_bins": self.n_bins, "mode": self.mode}

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double(), dim=1)
        mapped = self.bin_values.gather(1, equal_width_bin_index(mode_scores(probs, self.mode), self.n_bins))
        return assemble(probs, mapped, self.mode).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "HistogramBinning.Options") -> Dict[str, Any]:
        if self.n_bins > len(labels):
            raise ValueError(f"n_bins={self.n_bins} is more than the {len(labels)} calibration samples, so most bins would be "
                             f"empty; pass n_bins <= {len(labels)} (default 15), or calibrate on more data.")
        prior, scores = select_prior(logits, labels, self.mode, options, self._fitted_map)
        values, counts = histogram_values(logits, labels, self.n_bins, self.mode, prior)
        with torch.no_grad():
            self.bin_values.copy_(torch.where(counts > 0, values, self.bin_values))
        return {"empty_bins": int((counts == 0).sum()), **prior_summary(prior, scores, logits, labels, self.method)}

    def _fitted_map(self, logits: torch.Tensor, labels: torch.Tensor, prior: float) -> Callable[[torch.Tensor], torch.Tensor]:
        values, counts = histogram_values(logits, labels, self.n_bins, self.mode, prior)
        values = torch.where(counts > 0, values, self.bin_values.to(values.device))
        return lambda scores: values.gather(1, equal_width_bin_index(scores, self.n_bins))


def histogram_values(logits: torch.Tensor, labels: torch.Tensor, n_bins: int, mode: str, prior: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(maps, B) smoothed bin values (NaN where empty) and (maps, B) sample counts of a histogram fitted on (N, C) logits."""
    beta = fit_inverse_temperature(logits.detach(), labels)[0]
    if mode == "one_vs_rest":
        counts, hits, centre_sums = _one_vs_rest_counts(logits, labels, n_bins, beta)
    else:
        rows = scored_rows(logits, labels, mode)
        index = equal_width_bin_index(rows.scores, n_bins)
        counts, hits, centre_sums = (torch.zeros(1, n_bins, dtype=torch.float64, device=logits.device).scatter_add_(1, index, values)
                                     for values in (torch.ones_like(rows.targets), rows.targets, rows.centres))
    return smoothed(hits, counts, centre_sums, prior, floor_of(len(labels))), counts


def _one_vs_rest_counts(logits: torch.Tensor, labels: torch.Tensor, n_bins: int, beta: float) -> Tuple[torch.Tensor, ...]:
    """(C, B) float64 counts of p_k per bin, of p_k for samples of class k, and sums of the TS probabilities
    softmax(β z)_k per bin, chunk by cache-sized chunk.

    Each sample adds one count per class and one hit (for its own class): no (N, C) one-hot,
    transpose or full float64 copy of the probabilities is made.
    """
    classes = logits.shape[1]
    offsets = torch.arange(classes, device=logits.device) * n_bins
    counts = torch.zeros(classes * n_bins, dtype=torch.float64, device=logits.device)
    hits, centre_sums = torch.zeros_like(counts), torch.zeros_like(counts)
    rows = chunk_rows(logits)
    for start in range(0, logits.shape[0], rows):
        y = labels[start : start + rows]
        chunk = logits[start : start + rows].double()
        index = equal_width_bin_index(torch.softmax(chunk, dim=1), n_bins)
        flat = (index + offsets).flatten()
        counts += torch.bincount(flat, minlength=classes * n_bins)
        centre_sums += torch.bincount(flat, weights=torch.softmax(chunk * beta, dim=1).flatten(), minlength=classes * n_bins)
        hits += torch.bincount(offsets[y] + index.gather(1, y[:, None]).squeeze(1), minlength=classes * n_bins)
    return counts.view(classes, n_bins), hits.view(classes, n_bins), centre_sums.view(classes, n_bins)
