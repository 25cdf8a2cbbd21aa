"""The hold-out rules: which samples a fit holds out to select on, from the fit's seed.

* :func:`holdout_split`, one held-out part: the fitting engine's ``Engine.split_indices`` (Neural
  Clamping, the head methods), so the same seed and sample count hold out the same samples
  (docs/design.md §3.0);
* :func:`stratified_folds` and :func:`select_by_cross_fitting`, K-fold cross-fitting: how every
  regularised logit method (vector, matrix and Dirichlet calibration, histogram binning, isotonic
  regression) chooses its regularisation strength on held-out NLL, every calibration sample
  held out once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..metrics.interval_options import MIN_INTERVAL_REPLICATES, MIN_INTERVAL_SAMPLES, no_interval_reason

#: salt of the hold-out split's generator (with the seed and the sample count)
HOLDOUT_SALT = 0xC0FFEE


def seeded_generator(seed: int, *salt: int) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and ``salt`` (the fitting engine's ``Engine.generator`` for its seed)."""
    generator = torch.Generator()
    generator.manual_seed(hash((seed, *salt)) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


def holdout_split(count: int, holdout_fraction: float, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded (fit, holdout) split of ``range(count)``: sorted int64 indices, ``round(holdout_fraction · count)`` held out.

    The holdout is empty for fraction 0. A positive fraction that would hold out no sample, or every
    sample, is a ValueError saying how many samples each part would get.
    """
    permutation = torch.randperm(count, generator=seeded_generator(seed, count, HOLDOUT_SALT))
    holdout = int(round(holdout_fraction * count))
    if holdout_fraction > 0 and (holdout < 1 or holdout >= count):
        raise ValueError(
            f"holdout_fraction={holdout_fraction} leaves {count - holdout} of {count} samples to fit and "
            f"{holdout} to select on; use more calibration data or holdout_fraction=0."
        )
    return permutation[holdout:].sort().values, permutation[:holdout].sort().values


# ----------------------------------------------------------------------------- cross-fitting

#: salt of the cross-fitting folds' generator (with the seed and the sample count)
FOLDS_SALT = 0xF01D5
#: folds of the cross-fitted selection of every regularised logit method (vector, matrix, Dirichlet, binning)
DEFAULT_FOLDS = 5
#: the candidates' held-out path stops after its score has risen this many times in a row
PATH_PATIENCE = 2

Fold = Tuple[torch.Tensor, torch.Tensor]


def stratified_folds(labels: torch.Tensor, folds: int, seed: int) -> List[Fold]:
    """Seeded, stratified K-fold split of ``range(len(labels))``: K (fit, held-out) pairs of sorted int64 indices.

    Each class's rows are shuffled by a generator seeded by ``seed`` and the sample count, then
    dealt round-robin over the folds, continuing from one class to the next, so every fold holds
    each class's rows to within one and the folds' sizes differ by at most one. K is
    ``min(folds, N)``; every row is held out exactly once. Needs N ≥ 2 (else a ValueError with the fix).
    """
    count = int(labels.shape[0])
    if count < 2:
        raise ValueError(f"cross-fitting needs at least 2 calibration samples, got {count}; calibrate on more held-out data.")
    folds = min(int(folds), count)
    permutation = torch.randperm(count, generator=seeded_generator(seed, count, FOLDS_SALT))
    labels = labels.cpu()
    order = permutation[torch.sort(labels[permutation], stable=True).indices]  # shuffled within each class
    assignment = torch.empty(count, dtype=torch.long)
    assignment[order] = torch.arange(count) % folds
    return [((assignment != k).nonzero().squeeze(1), (assignment == k).nonzero().squeeze(1)) for k in range(folds)]


@dataclasses.dataclass
class Selection:
    """The outcome of :func:`select_by_cross_fitting`.

    Attributes:
        chosen: the selected candidate (the lowest cross-fitted NLL; on a tie, the more regularised).
        scores: {repr(candidate): cross-fitted mean NLL (nats per sample)} of every candidate tried, in order.
    """

    chosen: Any
    scores: Dict[str, float]


def select_by_cross_fitting(
    candidates: Sequence[Any], folds: Sequence[Fold], held_out_nll: Callable[[Any, int], torch.Tensor],
) -> Selection:
    """Choose among ``candidates`` (most regularised first) the one of the lowest cross-fitted NLL.

    ``held_out_nll(candidate, k)`` fits the candidate on fold k's fit part and returns the (n_k,)
    per-sample NLL (nats) of fold k's held-out part; it may warm-start from the previous
    candidate's fit of the same fold (candidates come in order). Every sample is held out once,
    so a candidate's score is the mean of N per-sample NLLs. The path stops once the score has
    risen :data:`PATH_PATIENCE` times in a row (weaker regularisers only fit the noise more; a flat
    stretch, where strong candidates all equal temperature scaling, does not stop it). A tie keeps
    the more regularised candidate (tried first).
    """
    scores: Dict[str, float] = {}
    best, rising, previous = 0, 0, math.inf
    for number, candidate in enumerate(candidates):
        score = float(torch.cat([held_out_nll(candidate, k).double().cpu() for k in range(len(folds))]).mean())
        scores[repr(candidate)] = score
        best = number if score < scores[repr(candidates[best])] else best
        rising = rising + 1 if score > previous else 0
        previous = score
        if rising == PATH_PATIENCE:
            break
    return Selection(chosen=candidates[best], scores=scores)


# ----------------------------------------------------------------------------- paired evidence

#: z of the two-sided 95 % normal interval of a paired mean difference
Z95 = 1.959963984540054


def paired_difference(differences: torch.Tensor) -> Dict[str, Any]:
    """The mean of (N,) per-sample differences (e.g. held-out NLL of a fit minus its reference's, nats) with its
    two-sided 95 % normal interval: ``{"point", "low", "high"}``.

    Below ``MIN_INTERVAL_SAMPLES`` (30) samples, where a normal interval would be no evidence, the ends are None and
    ``"reason"`` says why.
    """
    differences = differences.double().cpu()
    point = float(differences.mean())
    if len(differences) < MIN_INTERVAL_SAMPLES:
        return {"point": point, "low": None, "high": None, "reason": no_interval_reason(len(differences), MIN_INTERVAL_REPLICATES)}
    half = Z95 * float(differences.std()) / math.sqrt(len(differences))
    return {"point": point, "low": point - half, "high": point + half}


def shown_below_zero(difference: Optional[Dict[str, Any]]) -> bool:
    """Whether a :func:`paired_difference` has its whole 95 % interval below 0 (False without an interval)."""
    return bool(difference) and difference["high"] is not None and difference["high"] < 0
