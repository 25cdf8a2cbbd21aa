"""The hold-out rules: which samples a fit holds out to select on, from the fit's seed.

* :func:`holdout_split`, one held-out part: the fitting engine's ``Engine.split_indices`` (Neural
  Clamping, the head methods), so the same seed and sample count hold out the same samples
  (docs/design.md §3.0);
* :func:`cross_fitting_folds` and :func:`select_by_cross_fitting`, K-fold cross-fitting: how every
  regularised logit method (vector, matrix and Dirichlet calibration, histogram binning, isotonic
  regression) chooses its regularisation strength on held-out NLL, and how ``method="auto"`` scores
  its candidates, every calibration sample held out once. The rows are dealt at random, not by class
  (:func:`fold_assignment` says why).

Both keep copies together: given ``groups``, the (N,) content ids of :func:`content_groups` (rows whose bytes are
equal: the same input, for a deterministic model), they deal whole groups, so that no held-out row has a copy among
the rows fitted on (:func:`fold_assignment`, the folds as one fold number per row, is also Neural Clamping's L-BFGS
folds); :func:`paired_difference` counts a row and its copies as one sample. Without a repeated row all three are
what they are without ``groups``, bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .._probabilities import at_floor
from .fit_context import fit_context
from ..metrics.interval_options import MIN_INTERVAL_REPLICATES, MIN_INTERVAL_SAMPLES, no_interval_reason

#: salt of the hold-out split's generator (with the seed and the sample count)
HOLDOUT_SALT = 0xC0FFEE
#: bytes of rows :func:`content_groups` reads at a time
GROUP_CHUNK_BYTES = 1 << 26


def seeded_generator(seed: int, *salt: int) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and ``salt`` (the fitting engine's ``Engine.generator`` for its seed)."""
    generator = torch.Generator()
    generator.manual_seed(hash((seed, *salt)) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


def holdout_split(count: int, holdout_fraction: float, seed: int,
                  groups: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded (fit, holdout) split of ``range(count)``: sorted int64 indices, ``round(holdout_fraction · count)`` held out.

    With (count,) int64 ``groups`` (:func:`content_groups`) whole groups are held out: ``round(holdout_fraction · G)``
    of the G groups, so the fraction is of distinct rows. The holdout is empty for fraction 0. A positive fraction
    that would hold out no group, or every group, is a ValueError saying how many each part would get.
    """
    first, member = _first_rows(groups, count)
    distinct = len(first)
    permutation = torch.randperm(distinct, generator=seeded_generator(seed, distinct, HOLDOUT_SALT))
    holdout = int(round(holdout_fraction * distinct))
    if holdout_fraction > 0 and (holdout < 1 or holdout >= distinct):
        rows = "samples" if distinct == count else f"distinct rows (of {count} samples)"
        raise ValueError(
            f"holdout_fraction={holdout_fraction} leaves {distinct - holdout} of {distinct} {rows} to fit and "
            f"{holdout} to select on; use more calibration data or holdout_fraction=0."
        )
    held = torch.isin(member, permutation[:holdout])
    return (~held).nonzero().squeeze(1), held.nonzero().squeeze(1)


#: rows whose values all agree within this fraction of the row's largest magnitude (or 4 machine epsilons of their
#: dtype, when more) are one input: the same input run in a batch of another size, or on another device, gives logits
#: that differ in their last bits
NEAR_TOLERANCE = 1e-4
#: how many neighbours along a random projection each distinct row is compared with
NEAR_NEIGHBOURS = 4
#: the values of a row compared first: a pair that differs there is not near-equal, and is not compared in full
PROBE_COLUMNS = 16


def content_groups(rows: torch.Tensor) -> torch.Tensor:
    """(N,) int64 content id of each row of ``rows`` (N, ...) (logits or features, any dtype): rows equal up to
    :data:`NEAR_TOLERANCE` share an id.

    Rows of equal bytes are found by a 16-byte BLAKE2b digest of each row (as :mod:`hf_calibrate.data.lineage`
    digests dataset rows), read in chunks of about :data:`GROUP_CHUNK_BYTES`; then the distinct rows are sorted along
    a fixed random projection, where near-equal rows fall side by side, and each is compared with its
    :data:`NEAR_NEIGHBOURS` next ones (:func:`_near_pairs`); near-equal rows and their chains share an id. A row of
    the log of a softmax that underflowed (:func:`hf_calibrate._probabilities.at_floor`) has an id of its own: a model
    sure of many inputs gives them equal outputs, which are not copies of one input.
    """
    groups = _equal_content(rows)
    alone = at_floor(rows.detach()).cpu()
    if not bool(alone.any()):
        return groups
    groups = groups.clone()
    groups[alone] = int(groups.max()) + 1 + torch.arange(int(alone.sum()))
    return torch.from_numpy(np.unique(groups.numpy(), return_inverse=True)[1].reshape(-1).astype(np.int64))


def _equal_content(rows: torch.Tensor) -> torch.Tensor:
    """:func:`content_groups` before rows at the floor are set apart: equal and near-equal rows share an id."""
    flat = rows.detach().reshape(len(rows), -1).cpu()
    per_chunk = max(1, GROUP_CHUNK_BYTES // max(1, flat.shape[1] * flat.element_size()))
    digests = np.array([hashlib.blake2b(row.tobytes(), digest_size=16).digest() for chunk in flat.split(per_chunk)
                        for row in chunk.contiguous().view(torch.uint8).numpy()], dtype="S16")
    _, first, exact = np.unique(digests, return_index=True, return_inverse=True)
    tolerance = max(NEAR_TOLERANCE, 4 * torch.finfo(flat.dtype).eps) if flat.is_floating_point() else 0.0
    pairs = _near_pairs(flat, torch.from_numpy(first), tolerance) if len(first) > 1 else np.empty((0, 2), dtype=np.int64)
    if not len(pairs):
        return torch.from_numpy(exact.reshape(-1).astype(np.int64))
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(len(first), len(first)))
    near = connected_components(graph, directed=False)[1]
    return torch.from_numpy(np.unique(near, return_inverse=True)[1][exact.reshape(-1)].astype(np.int64))


def _near_pairs(flat: torch.Tensor, first: torch.Tensor, tolerance: float) -> np.ndarray:
    """(P, 2) index pairs into ``first`` (G,) (one row of each exact content, of the (N, D) ``flat`` rows) of the
    distinct rows that agree within ``tolerance`` × (the larger of their largest magnitudes, at least 1e-12): each row
    against its :data:`NEAR_NEIGHBOURS` next ones along a seeded random projection (rows equal up to rounding project to
    nearly the same point; computed a chunk at a time, in float32 for float32 rows). A pair must agree on its first
    :data:`PROBE_COLUMNS` values to agree on all, so only pairs that do are compared in full: on rows that differ that
    is almost none (25,000 × 1,000 logits: 0.4 s instead of 2.4 s)."""
    work = torch.promote_types(flat.dtype if flat.is_floating_point() else torch.float64, torch.float32)
    direction = torch.randn(flat.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(work)
    projected, scale = [], []
    for chunk in flat.split(max(1, GROUP_CHUNK_BYTES // max(1, 8 * flat.shape[1]))):
        values = chunk.to(work)
        projected.append(values @ direction)
        scale.append(torch.maximum(-values.amin(dim=1), values.amax(dim=1)))  # (aminmax is 7× slower here)
    order = torch.argsort(torch.cat(projected)[first])
    scale = torch.cat(scale)[first].double().clamp_min(1e-12)
    probe = flat[first, :PROBE_COLUMNS].double()
    found = []
    for shift in range(1, min(NEAR_NEIGHBOURS, len(order) - 1) + 1):
        left, right = order[:-shift], order[shift:]
        bound = tolerance * torch.maximum(scale[left], scale[right])
        candidate = (probe[left] - probe[right]).abs().amax(dim=1) <= bound
        left, right, bound = left[candidate], right[candidate], bound[candidate]
        close = (flat[first[left]].double() - flat[first[right]].double()).abs().amax(dim=1) <= bound
        found.append(torch.stack([left[close], right[close]], dim=1))
    return torch.cat(found).numpy()


def fit_groups(rows: torch.Tensor) -> torch.Tensor:
    """The (N,) content ids of the rows a logit fit runs on: those its :class:`~.fit_context.FitContext` carries (the caller
    computed them for the same rows), else :func:`content_groups` of ``rows``."""
    given = fit_context().groups
    return content_groups(rows) if given is None else given


def distinct_rows(groups: torch.Tensor) -> int:
    """How many distinct rows (N,) ``groups`` hold: each group counts once."""
    return int(torch.unique(groups).numel())


def repeated_rows(groups: torch.Tensor) -> int:
    """How many of the rows of (N,) ``groups`` repeat an earlier row of their group: N minus the distinct groups."""
    return len(groups) - distinct_rows(groups)


def note_repeated_rows(summary: Dict[str, Any], groups: torch.Tensor) -> Dict[str, Any]:
    """``summary`` with ``duplicate_rows`` (:func:`repeated_rows` of the calibration data's (N,) ``groups``) and, when
    some row repeats another, a line in its ``warnings`` saying how many and what the selection rests on."""
    repeated = repeated_rows(groups)
    summary["duplicate_rows"] = repeated
    if repeated:
        count, distinct = len(groups), len(groups) - repeated
        rule = (f"every fold or hold-out keeps a row's copies together, so what is chosen on held-out rows is chosen on "
                f"{distinct:,} distinct rows" if distinct > 1 else
                "with one distinct row nothing can be held out from its copies, and a fit learns no more than its labels' frequencies")
        summary["warnings"] = [*summary.get("warnings", []), (
            f"the calibration data hold {repeated:,} rows that repeat another row ({distinct:,} distinct of {count:,}): "
            f"{rule}; remove the copies unless the data the model will see repeat rows alike.")]
    return summary


def rows_repeating(reference: torch.Tensor, rows: torch.Tensor) -> int:
    """How many of the (M, ...) ``rows`` repeat a row of the (N, ...) ``reference`` (equal up to rounding, as
    :func:`content_groups` groups them)."""
    groups = content_groups(torch.cat([reference.detach().to(rows.device, rows.dtype), rows.detach()]))
    return int(torch.isin(groups[len(reference):], groups[: len(reference)]).sum())


def note_validation_copies(summary: Dict[str, Any], copies: int, validation_rows: int, what: str = "base logits") -> Dict[str, Any]:
    """``summary`` with ``validation_copies``: how many of the ``validation_rows`` repeat a calibration row (their
    ``what`` equal up to rounding, :func:`rows_repeating`), and, when some do, a line in its ``warnings``: those rows
    are not held out."""
    summary["validation_copies"] = copies
    if copies:
        summary["warnings"] = [*summary.get("warnings", []), (
            f"{copies:,} of the {validation_rows:,} validation rows repeat a calibration row (equal {what} up to "
            "rounding): for those rows the selection on the validation data is not held out, and it favours what fits "
            "the calibration rows. Remove them from validation_data, or leave validation_data out so that the fit holds "
            "out rows itself (keeping a row's copies together).")]
    return summary


def _first_rows(groups: Optional[torch.Tensor], count: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(G,) the first row of each of the G groups of (count,) ``groups``, in row order; (count,) each row's group
    number (0 … G − 1, in that order). Without ``groups``, or with a single one, every row is its own group: (arange,
    arange). One group cannot be held out from itself, and rows that are all one input (one logit row) teach a fit
    nothing beyond their label frequencies, which their copies share."""
    ids, inverse = torch.unique(groups.cpu(), return_inverse=True) if groups is not None else (torch.empty(0), None)
    if len(ids) < 2:
        return torch.arange(count), torch.arange(count)
    first = torch.full((len(ids),), count, dtype=torch.long).scatter_reduce_(0, inverse, torch.arange(count), "amin")
    order = first.argsort()
    number = torch.empty_like(order)
    number[order] = torch.arange(len(order))
    return first[order], number[inverse]


# ----------------------------------------------------------------------------- cross-fitting

#: salt of the cross-fitting folds' generator (with the seed and the sample count)
FOLDS_SALT = 0xF01D5
#: folds of the cross-fitted selection of every regularised logit method (vector, matrix, Dirichlet, binning) and of
#: ``method="auto"``
DEFAULT_FOLDS = 5
#: folds from :data:`LARGE_LOGITS` values on: each fit on half the rows, 1 data-sized fit instead of 4 (on 20,000 × 500
#: and 25,000 × 1,000 logits the linear maps' checks and auto chose as with 5 folds, and the binning priors moved within
#: their grid by at most .0003 nats held-out: benchmarks/results/fold_count.md)
LARGE_FOLDS = 2
#: logit values (rows × classes) from which :func:`default_folds` is :data:`LARGE_FOLDS`: 10,000 rows of 1,000 classes
LARGE_LOGITS = 10_000_000
#: the candidates' held-out path stops after its score has risen this many times in a row
PATH_PATIENCE = 2

Fold = Tuple[torch.Tensor, torch.Tensor]


def default_folds(folds: Optional[int], rows: int, classes: int) -> int:
    """K of a cross-fitted selection on (``rows``, ``classes``) logits: ``folds`` when given, else
    :data:`DEFAULT_FOLDS` (5), or :data:`LARGE_FOLDS` (2) from :data:`LARGE_LOGITS` values on, where every held-out row
    still scores the choice and a fit on half the rows is as telling (a 5-fold check would cost 4 data-sized fits)."""
    if folds is not None:
        return folds
    return LARGE_FOLDS if rows * classes >= LARGE_LOGITS else DEFAULT_FOLDS


def fold_assignment(labels: torch.Tensor, folds: int, seed: int, groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N,) int64 fold number (0 … K − 1) of each row of (N,) ``labels``: a seeded K-fold deal of the rows at random,
    a rare class's rows apart.

    The rows are shuffled by a generator seeded by ``seed`` and the row count. The rows of each class with fewer than
    K rows come first, class by class, then every other row in shuffled order, and all are dealt round-robin over the
    folds: the folds' sizes differ by at most one, a rare class's rows go to different folds (so no fold's fit loses
    the class: binary data with 2 rows of one class keep both classes in every fold), and every other row's fold is
    random. K is ``min(folds, N)``. With (N,) ``groups`` (:func:`content_groups`) the same deal is of the G groups (a
    group's class: its first row's), each row going with its group: K is ``min(folds, G)``, and N is G in the above.
    Needs N ≥ 2 (else a ValueError with the fix).

    Why not by class: folds stratified by class give each fold's fit the held-out rows' exact class frequencies, which
    a new draw does not share, so a map with per-class biases scores better held out than it will on new data (by
    .009–.021 nats where temperature scaling is the truth, and ``method="auto"`` chose such maps over it;
    benchmarks/results/fold_leak.md). Dealt at random, a fold's class frequencies vary as a new draw's do.
    """
    first, member = _first_rows(groups, int(labels.shape[0]))
    count = len(first)
    if count < 2:
        raise ValueError(f"cross-fitting needs at least 2 calibration samples, got {count}; calibrate on more held-out data.")
    folds = min(int(folds), count)
    permutation = torch.randperm(count, generator=seeded_generator(seed, count, FOLDS_SALT))
    shuffled = labels.cpu()[first][permutation]
    sizes = torch.bincount(shuffled)
    rare_first = torch.where(sizes[shuffled] < folds, shuffled, torch.full_like(shuffled, len(sizes)))
    order = permutation[torch.sort(rare_first, stable=True).indices]
    dealt = torch.empty(count, dtype=torch.long)
    dealt[order] = torch.arange(count) % folds
    return dealt[member]


def cross_fitting_folds(labels: torch.Tensor, folds: int, seed: int, groups: Optional[torch.Tensor] = None) -> List[Fold]:
    """Seeded K-fold split of ``range(len(labels))``: K (fit, held-out) pairs of sorted int64 indices, from
    :func:`fold_assignment` (rows dealt at random, a rare class's to different folds; ``groups``: copies kept in one
    fold); every row is held out exactly once."""
    assignment = fold_assignment(labels, folds, seed, groups)
    return [((assignment != k).nonzero().squeeze(1), (assignment == k).nonzero().squeeze(1))
            for k in range(int(assignment.max()) + 1)]


class FoldLayout:
    """Rows arranged fold by fold (held-out part of fold 0, then of fold 1, …), once: then a fold's held-out rows are a
    view, and so are its fitting rows when they are one run (the first and last folds; both folds of K = 2), where
    gathering them per fold would copy the (N, C) logits K times twice."""

    def __init__(self, folds: Sequence[Fold]) -> None:
        self.order = torch.cat([held for _, held in folds])
        self.bounds = [0, *torch.tensor([len(held) for _, held in folds]).cumsum(0).tolist()]

    def arrange(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (N, ...) in fold order (a copy)."""
        return rows[self.order.to(rows.device)]

    def held(self, arranged: torch.Tensor, fold: int) -> torch.Tensor:
        """Fold ``fold``'s held-out rows of ``arranged`` rows (a view)."""
        return arranged[self.bounds[fold]:self.bounds[fold + 1]]

    def fitting(self, arranged: torch.Tensor, fold: int) -> torch.Tensor:
        """Fold ``fold``'s fitting rows of ``arranged`` rows: every other fold's (a view when they are one run)."""
        before, after = arranged[:self.bounds[fold]], arranged[self.bounds[fold + 1]:]
        return after if not len(before) else before if not len(after) else torch.cat([before, after])


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


def paired_difference(differences: torch.Tensor, groups: Optional[torch.Tensor] = None) -> Dict[str, Any]:
    """The mean of (N,) per-sample differences (e.g. held-out NLL of a fit minus its reference's, nats) with its
    two-sided 95 % normal interval: ``{"point", "low", "high"}``.

    With (N,) content ``groups`` (:func:`content_groups`) a row and its copies are one sample, not several: the
    interval is the cluster-robust one over the groups (:func:`clustered_standard_error`), and the samples counted
    below are the distinct rows.
    Below ``MIN_INTERVAL_SAMPLES`` (30) samples, where a normal interval would be no evidence, the ends are None and
    ``"reason"`` says why.
    """
    differences = differences.double().cpu()
    point = float(differences.mean())
    repeated = 0 if groups is None else repeated_rows(groups)
    samples = len(differences) - repeated
    if samples < MIN_INTERVAL_SAMPLES:
        return {"point": point, "low": None, "high": None, "reason": no_interval_reason(samples, MIN_INTERVAL_REPLICATES)}
    if repeated:
        half = Z95 * clustered_standard_error(differences, groups)
    else:
        half = Z95 * float(differences.std()) / math.sqrt(len(differences))
    return {"point": point, "low": point - half, "high": point + half}


def clustered_standard_error(values: torch.Tensor, groups: torch.Tensor) -> float:
    """The cluster-robust standard error of the mean of (N,) float64 ``values`` over the G groups of (N,) ``groups``:
    √(G/(G − 1) · Σ_g (Σ_{i∈g} (v_i − v̄))²) / N, which is std/√N when every group is a single row."""
    ids, inverse = torch.unique(groups.cpu(), return_inverse=True)
    residuals = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inverse, values - values.mean())
    return math.sqrt(len(ids) / (len(ids) - 1) * float(residuals.square().sum())) / len(values)


def shown_below_zero(difference: Optional[Dict[str, Any]]) -> bool:
    """Whether a :func:`paired_difference` has its whole 95 % interval below 0 (False without an interval)."""
    return bool(difference) and difference["high"] is not None and difference["high"] < 0
