"""Parity of hf_calibrate.metrics with docs/design.md §2, loop references, torchmetrics, netcal and sklearn.

Where a peer's definition matches ours the values agree to 1e-6 (peers accumulate in
float32) or to 1e-12 (float64 references). Where a peer's convention differs, a constructed
case asserts the specific difference and the value computed by hand from docs/design.md §2, so
a change on either side shows up here instead of hiding behind a loose tolerance.
"""

from __future__ import annotations

import math
import warnings
from typing import List, Tuple

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError
from torchmetrics.functional.classification import binary_calibration_error, multiclass_calibration_error

from hf_calibrate.metrics import (
    CalibrationMetrics,
    accuracy,
    adaptive_calibration_error,
    brier_score,
    classwise_calibration_error,
    expected_calibration_error,
    maximum_calibration_error,
    negative_log_likelihood,
    reliability_bins,
)
from hf_calibrate.metrics.functional import calibration_error_from_statistics, equal_width_statistics

with warnings.catch_warnings():  # netcal imports pkg_resources-era modules noisily
    warnings.simplefilter("ignore")
    from netcal.metrics import ECE as NetcalECE
    from netcal.metrics import MCE as NetcalMCE

from sklearn.metrics import brier_score_loss, log_loss

PEER_TOL = 1e-6  # peers accumulate in float32
EXACT_TOL = 1e-12  # float64 references


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one thread


NORMS = ("l1", "l2", "max")


# ----------------------------------------------------------------------------- data


def random_probs(n: int, c: int, seed: int, *, scale: float = 3.0, dtype=np.float32) -> Tuple[np.ndarray, np.ndarray]:
    """Softmax of Gaussian logits (float64 softmax, then cast) and labels drawn from those rows.

    Drawing labels from the predictions makes the data roughly calibrated, so bin gaps take
    both signs: with uniform labels every bin is over-confident and any binning gives the same
    ECE (|accuracy − mean confidence|), which would hide binning bugs.
    """
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * scale
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = np.minimum((probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), c - 1)
    return probs.astype(dtype), labels


def tm_value(probs: np.ndarray, labels: np.ndarray, n_bins: int, norm: str) -> float:
    return float(
        multiclass_calibration_error(
            torch.from_numpy(probs), torch.from_numpy(labels), num_classes=probs.shape[1], n_bins=n_bins, norm=norm
        )
    )


def netcal_value(probs: np.ndarray, labels: np.ndarray, n_bins: int, metric=NetcalECE) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(metric(bins=n_bins).measure(probs, labels))


# ----------------------------------------------------------------------------- loop references of docs/design.md §2


def ref_top_label(probs: np.ndarray, labels: np.ndarray) -> Tuple[List[float], List[int]]:
    """Confidence and correctness per sample; argmax ties go to the lowest index."""
    confidences, correct = [], []
    for row, label in zip(probs.astype(np.float64), labels):
        best = 0
        for k in range(1, row.shape[0]):
            if row[k] > row[best]:
                best = k
        confidences.append(float(row[best]))
        correct.append(int(best == label))
    return confidences, correct


def ref_width_bin(value: float, n_bins: int) -> int:
    """Bin b = (b/B, (b+1)/B]; 0 goes to the first bin, 1 to the last."""
    for b in range(n_bins):
        if value <= (b + 1) / n_bins:
            return b
    return n_bins - 1


def ref_gap_formula(bins: List[List[Tuple[float, float]]], total: int, norm: str) -> float:
    """ECE formula over a list of bins of (value, target) pairs; empty bins contribute 0."""
    weighted, gaps = 0.0, []
    for members in bins:
        if not members:
            continue
        gap = abs(sum(t for _, t in members) / len(members) - sum(v for v, _ in members) / len(members))
        gaps.append(gap)
        weighted += len(members) / total * (gap if norm == "l1" else gap * gap)
    if norm == "max":
        return max(gaps)
    return weighted if norm == "l1" else math.sqrt(weighted)


def ref_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int, norm: str = "l1") -> float:
    confidences, correct = ref_top_label(probs, labels)
    bins: List[List[Tuple[float, float]]] = [[] for _ in range(n_bins)]
    for c, a in zip(confidences, correct):
        bins[ref_width_bin(c, n_bins)].append((c, a))
    return ref_gap_formula(bins, len(confidences), norm)


def ref_ada_ece(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    """Equal-mass bins of docs/design.md §2.

    Ties in confidence are broken by correctness, wrong first (a refinement over a plain stable
    sort), so the value does not depend on the order of the samples.
    The first N mod B bins hold ⌈N/B⌉ samples, the others ⌊N/B⌋ (trailing bins stay empty
    when N < B).
    """
    confidences, correct = ref_top_label(probs, labels)
    ordered = sorted(zip(confidences, correct))  # tuple order: confidence, then wrong (0) first
    n = len(ordered)
    small, extra = divmod(n, n_bins)
    bins, start = [], 0
    for b in range(n_bins):
        size = small + (1 if b < extra else 0)
        bins.append(ordered[start : start + size])
        start += size
    assert start == n
    return ref_gap_formula(bins, n, "l1")


def ref_classwise(probs: np.ndarray, labels: np.ndarray, n_bins: int) -> float:
    n, num_classes = probs.shape
    total = 0.0
    for k in range(num_classes):
        bins: List[List[Tuple[float, float]]] = [[] for _ in range(n_bins)]
        for i in range(n):
            value = float(probs[i, k])
            bins[ref_width_bin(value, n_bins)].append((value, int(labels[i] == k)))
        total += ref_gap_formula(bins, n, "l1")
    return total / num_classes


# ----------------------------------------------------------------------------- loop references (exact)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_bins", [1, 7, 15])
def test_equal_width_metrics_match_loop_reference(seed: int, n_bins: int) -> None:
    probs, labels = random_probs(300, 6, seed, scale=1.0 + seed)
    for norm in NORMS:
        ours = expected_calibration_error(probs, labels, n_bins=n_bins, norm=norm)
        assert ours == pytest.approx(ref_ece(probs, labels, n_bins, norm), rel=EXACT_TOL, abs=EXACT_TOL)
    assert maximum_calibration_error(probs, labels, n_bins=n_bins) == expected_calibration_error(
        probs, labels, n_bins=n_bins, norm="max"
    )


def test_equal_width_edges_match_loop_reference() -> None:
    """Confidences exactly on the float64 edges b/B (and 1.0) go to the bin below (right-closed)."""
    n_bins = 20
    grid = np.array([k / n_bins for k in range(10, n_bins + 1)])  # 0.5 … 1.0, every one an edge
    rng = np.random.default_rng(7)
    conf = rng.choice(grid, size=400)
    probs = np.stack([conf, 1.0 - conf], axis=1)  # float64: the edge values survive exactly
    labels = rng.integers(0, 2, size=400)
    for norm in NORMS:
        assert expected_calibration_error(probs, labels, n_bins=n_bins, norm=norm) == pytest.approx(
            ref_ece(probs, labels, n_bins, norm), rel=EXACT_TOL, abs=EXACT_TOL
        )
    bins = reliability_bins(probs, labels, n_bins=n_bins)
    expected_counts = np.bincount([ref_width_bin(c, n_bins) for c in conf], minlength=n_bins)
    np.testing.assert_array_equal(bins.counts, expected_counts)
    for k in range(10, n_bins + 1):  # the edge k/B is the top of bin k − 1, never the bottom of bin k
        assert bins.counts[k - 1] == np.sum(conf == k / n_bins)
    # reliability data per bin: mean confidence and accuracy of its members, NaN when empty
    confidences, correct = ref_top_label(probs, labels)
    for b in range(n_bins):
        members = [(c, a) for c, a in zip(confidences, correct) if ref_width_bin(c, n_bins) == b]
        if not members:
            assert np.isnan(bins.mean_confidence[b]) and np.isnan(bins.accuracy[b])
            continue
        assert bins.mean_confidence[b] == pytest.approx(np.mean([c for c, _ in members]), rel=EXACT_TOL)
        assert bins.accuracy[b] == pytest.approx(np.mean([a for _, a in members]), rel=EXACT_TOL)
    assert bins.ece == pytest.approx(ref_ece(probs, labels, n_bins), rel=EXACT_TOL)


@pytest.mark.parametrize("n", [1, 5, 14, 15, 16, 29, 30, 31, 257])
def test_adaptive_ece_matches_loop_reference(n: int) -> None:
    probs, labels = random_probs(n, 4, seed=n)
    assert adaptive_calibration_error(probs, labels, n_bins=15) == pytest.approx(
        ref_ada_ece(probs, labels, 15), rel=EXACT_TOL, abs=EXACT_TOL
    )


def test_adaptive_ece_ties_broken_by_correctness() -> None:
    """Many exact ties straddling bins: the wrong-first rule is what makes the value unique."""
    rng = np.random.default_rng(3)
    conf = rng.choice([0.5, 0.75, 1.0], size=101)
    probs = np.stack([conf, 1.0 - conf], axis=1)
    labels = rng.integers(0, 2, size=101)
    expected = ref_ada_ece(probs, labels, 10)
    assert adaptive_calibration_error(probs, labels, n_bins=10) == pytest.approx(expected, rel=EXACT_TOL)
    # Hand-checked small case: confidences [0.5w, 0.5c, 0.5w, 0.9c], B=2 → sorted
    # [0.5w, 0.5w | 0.5c, 0.9c] → (2/4)·|0−0.5| + (2/4)·|1−0.7| = 0.4.
    probs = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.9, 0.1]])
    labels = np.array([1, 0, 1, 0])
    assert adaptive_calibration_error(probs, labels, n_bins=2) == pytest.approx(0.4, abs=EXACT_TOL)


@pytest.mark.parametrize("seed", range(3))
def test_classwise_ece_matches_loop_reference(seed: int) -> None:
    probs, labels = random_probs(200, 5, seed, dtype=np.float64)
    probs[:20] = np.eye(5)[labels[:20]]  # exact 0 and 1 entries: first and last bin
    for n_bins in (1, 10, 15):
        assert classwise_calibration_error(probs, labels, n_bins=n_bins) == pytest.approx(
            ref_classwise(probs, labels, n_bins), rel=EXACT_TOL, abs=EXACT_TOL
        )


def test_classwise_ece_float32_matches_loop_reference() -> None:
    """float32 inputs take the arithmetic bin-index path; it must equal the float64 comparisons."""
    probs, labels = random_probs(150, 4, seed=11, dtype=np.float32)
    # float32 values that are the float32 roundings of edges k/15 land on either side of them
    probs[:4] = np.array([[1 / 15, 4 / 15, 5 / 15, 5 / 15], [2 / 3, 1 / 3, 0, 0], [0.2, 0.2, 0.2, 0.4], [1, 0, 0, 0]])
    assert classwise_calibration_error(probs, labels, n_bins=15) == pytest.approx(
        ref_classwise(probs, labels, 15), rel=EXACT_TOL, abs=EXACT_TOL
    )


# ----------------------------------------------------------------------------- torchmetrics


@pytest.mark.parametrize(
    "n, c, seed",
    [(2000, 10, 0), (2000, 2, 1), (500, 1000, 2), (1, 3, 3), (1, 1000, 4), (3000, 100, 5)],
    ids=["10cls", "2cls", "1000cls", "single-3cls", "single-1000cls", "100cls"],
)
@pytest.mark.parametrize("norm", NORMS)
def test_torchmetrics_parity_random(n: int, c: int, seed: int, norm: str) -> None:
    probs, labels = random_probs(n, c, seed, scale=2.0)
    # Precondition of parity: no confidence on a bin edge (there the conventions differ, below).
    conf = probs.max(axis=1).astype(np.float64)
    assert np.all(np.abs(conf * 15 - np.round(conf * 15)) > 1e-5)
    assert expected_calibration_error(probs, labels, norm=norm) == pytest.approx(
        tm_value(probs, labels, 15, norm), abs=PEER_TOL
    )


def test_torchmetrics_parity_float64_input() -> None:
    probs, labels = random_probs(1000, 8, seed=9, dtype=np.float64)
    for norm in NORMS:
        assert expected_calibration_error(probs, labels, norm=norm) == pytest.approx(
            tm_value(probs, labels, 15, norm), abs=PEER_TOL
        )


def test_torchmetrics_parity_ties_and_equal_confidences() -> None:
    # argmax ties: both take the lowest index, so [0.4, 0.4, 0.2] with label 1 is wrong.
    probs = np.array([[0.4, 0.4, 0.2], [0.2, 0.4, 0.4], [0.3, 0.3, 0.4], [0.45, 0.1, 0.45]], dtype=np.float32)
    labels = np.array([1, 1, 2, 2])
    assert accuracy(probs, labels) == 0.5
    for norm in NORMS:
        assert expected_calibration_error(probs, labels, n_bins=10, norm=norm) == pytest.approx(
            tm_value(probs, labels, 10, norm), abs=PEER_TOL
        )
    # all-equal confidences: uniform rows, everything predicted as class 0
    uniform = np.full((40, 10), 0.1, dtype=np.float32)
    labels = np.arange(40) % 10
    ours = expected_calibration_error(uniform, labels)
    assert ours == pytest.approx(abs(0.1 - 0.1), abs=1e-7)  # accuracy 4/40 = 0.1 = confidence
    assert ours == pytest.approx(tm_value(uniform, labels, 15, "l1"), abs=PEER_TOL)
    labels = np.zeros(40, dtype=np.int64)  # all labels one class (class 0): accuracy 1
    assert expected_calibration_error(uniform, labels) == pytest.approx(0.9, abs=1e-7)
    assert expected_calibration_error(uniform, labels) == pytest.approx(
        tm_value(uniform, labels, 15, "l1"), abs=PEER_TOL
    )
    probs, _ = random_probs(500, 6, seed=8, scale=2.0)  # all labels one class, varied confidences
    labels = np.full(500, 4)
    for norm in NORMS:
        ours = expected_calibration_error(probs, labels, norm=norm)
        assert ours == pytest.approx(ref_ece(probs, labels, 15, norm), rel=EXACT_TOL, abs=EXACT_TOL)
        assert ours == pytest.approx(tm_value(probs, labels, 15, norm), abs=PEER_TOL)


def test_torchmetrics_class_matches_functional_and_ours() -> None:
    probs, labels = random_probs(3000, 20, seed=21)
    metric = MulticlassCalibrationError(num_classes=20, n_bins=15, norm="l1")
    ours = CalibrationMetrics(20, n_bins=15)
    for start in range(0, 3000, 700):
        batch = slice(start, start + 700)
        metric.update(torch.from_numpy(probs[batch]), torch.from_numpy(labels[batch]))
        ours.update(probs[batch], labels[batch])
    assert ours.compute()["ece"] == pytest.approx(float(metric.compute()), abs=PEER_TOL)


def test_binning_core_matches_torchmetrics_binary_off_edges() -> None:
    """The binning core on raw confidences (including exact 0 and 1) vs torchmetrics' binary CE."""
    rng = np.random.default_rng(5)
    conf = np.concatenate([[0.0, 0.0, 1.0 - 2**-20], rng.random(997)]).astype(np.float32)
    correct = (rng.random(1000) < conf).astype(np.float64)
    ours_stats = equal_width_statistics(torch.from_numpy(conf).double(), torch.from_numpy(correct), 10)
    for norm in NORMS:
        peer = binary_calibration_error(
            torch.from_numpy(conf), torch.from_numpy(correct.astype(np.int64)), n_bins=10, norm=norm
        )
        assert calibration_error_from_statistics(ours_stats, norm) == pytest.approx(float(peer), abs=PEER_TOL)
    # A confidence of exactly 0 is in the first bin for both (ours (0, 1/B] ∪ {0}; theirs [0, 1/B)).
    assert int(ours_stats[0, 0]) == int(np.sum(conf <= 0.1))


def test_torchmetrics_difference_confidence_one_has_its_own_bin() -> None:
    """torchmetrics: bucketize(right=True) over B+1 edges puts 1.0 in an extra bin [1, 1]; ours: (0.9, 1].

    Case (B=10): conf 1.0 wrong, conf 0.9375 correct.
    Ours: one bin, mean conf 0.96875, accuracy 0.5 → ECE = MCE = RMS = 0.46875.
    torchmetrics: two bins → ECE 0.5·1 + 0.5·0.0625 = 0.53125, MCE 1.0.
    """
    probs = np.array([[1.0, 0.0], [0.9375, 0.0625]], dtype=np.float32)
    labels = np.array([1, 0])
    for norm in NORMS:
        assert expected_calibration_error(probs, labels, n_bins=10, norm=norm) == 0.46875
    assert tm_value(probs, labels, 10, "l1") == pytest.approx(0.53125, abs=1e-7)
    assert tm_value(probs, labels, 10, "max") == pytest.approx(1.0, abs=1e-7)
    assert tm_value(probs, labels, 10, "l2") == pytest.approx(math.sqrt(0.5 + 0.5 * 0.0625**2), abs=1e-6)


def test_torchmetrics_difference_left_closed_bins() -> None:
    """A confidence exactly on an interior edge: ours (b/B, (b+1)/B] vs torchmetrics [b/B, (b+1)/B).

    Case (B=4): conf 0.5 correct, conf 0.625 wrong.
    Ours: 0.5 in (0.25, 0.5], 0.625 in (0.5, 0.75] → ECE = ½·0.5 + ½·0.625 = 0.5625, MCE 0.625.
    torchmetrics: both in [0.5, 0.75) → gap |0.5 − 0.5625| = 0.0625.
    """
    probs = np.array([[0.5, 0.25, 0.25], [0.625, 0.25, 0.125]], dtype=np.float32)
    labels = np.array([0, 1])
    assert expected_calibration_error(probs, labels, n_bins=4) == 0.5625
    assert maximum_calibration_error(probs, labels, n_bins=4) == 0.625
    assert tm_value(probs, labels, 4, "l1") == pytest.approx(0.0625, abs=1e-7)
    assert tm_value(probs, labels, 4, "max") == pytest.approx(0.0625, abs=1e-7)


def test_torchmetrics_difference_float32_cast() -> None:
    """torchmetrics casts confidences to float32: 0.2 − 1e-10 (float64) becomes float32(0.2) ≥ edge 0.2.

    Case (B=5): conf 0.2 − 1e-10 correct, conf 0.3 wrong. Ours: separate bins (0, 0.2] and
    (0.2, 0.4] → ECE ½·(0.8 + 1e-10) + ½·0.3. torchmetrics: one bin [0.2, 0.4) → ≈ |0.5 − 0.25|.
    """
    c = 0.2 - 1e-10
    probs = np.array([[c] + [(1 - c) / 5] * 5, [0.3] + [0.7 / 5] * 5])  # six classes, column 0 on top
    labels = np.array([0, 1])
    assert expected_calibration_error(probs, labels, n_bins=5) == pytest.approx(
        0.5 * (0.8 + 1e-10) + 0.5 * 0.3, abs=1e-15
    )
    assert tm_value(probs, labels, 5, "l1") == pytest.approx(0.25, abs=1e-7)


def test_torchmetrics_difference_one_class() -> None:
    """C = 1: torchmetrics rejects num_classes < 2; ours: every confidence is 1 and correct → 0."""
    probs, labels = np.ones((5, 1), dtype=np.float32), np.zeros(5, dtype=np.int64)
    with pytest.raises(ValueError, match="larger than 1"):
        tm_value(probs, labels, 15, "l1")
    for norm in NORMS:
        assert expected_calibration_error(probs, labels, norm=norm) == 0.0
    assert adaptive_calibration_error(probs, labels) == 0.0
    assert classwise_calibration_error(probs, labels) == 0.0
    assert negative_log_likelihood(probs, labels) == 0.0
    assert brier_score(probs, labels) == 0.0


# ----------------------------------------------------------------------------- netcal


@pytest.mark.parametrize("n, c, seed", [(2000, 10, 0), (500, 1000, 1), (1000, 3, 2)], ids=["10cls", "1000cls", "3cls"])
@pytest.mark.parametrize("n_bins", [10, 15])
def test_netcal_parity_random(n: int, c: int, seed: int, n_bins: int) -> None:
    probs, labels = random_probs(n, c, seed, dtype=np.float64)
    assert expected_calibration_error(probs, labels, n_bins=n_bins) == pytest.approx(
        netcal_value(probs, labels, n_bins), abs=PEER_TOL
    )
    assert maximum_calibration_error(probs, labels, n_bins=n_bins) == pytest.approx(
        netcal_value(probs, labels, n_bins, NetcalMCE), abs=PEER_TOL
    )


def test_netcal_difference_two_classes_is_positive_class_calibration() -> None:
    """netcal treats ≤ 2 distinct labels as binary: with C = 2 it bins p(class 1) against [y = 1].

    That is the per-class (classwise) ECE of class 1, which for two classes equals our classwise
    ECE (class 0 mirrors class 1), not the top-label ECE.
    """
    probs, labels = random_probs(2000, 2, seed=4, dtype=np.float64)
    peer = netcal_value(probs, labels, 15)
    assert peer == pytest.approx(classwise_calibration_error(probs, labels), abs=PEER_TOL)
    assert abs(peer - expected_calibration_error(probs, labels)) > 1e-3


def test_netcal_difference_clips_confidences() -> None:
    """netcal clips probabilities to [eps, 1 − eps] first: perfect one-hot predictions get ECE = eps, ours 0."""
    labels = np.array([0, 1, 2, 0, 1, 2])
    probs = np.eye(3, dtype=np.float32)[labels]
    assert expected_calibration_error(probs, labels) == 0.0
    assert maximum_calibration_error(probs, labels) == 0.0
    eps = float(np.finfo(np.float32).eps)
    assert netcal_value(probs, labels, 15) == pytest.approx(eps, rel=1e-6)
    assert netcal_value(probs, labels, 15, NetcalMCE) == pytest.approx(eps, rel=1e-6)


def test_netcal_difference_left_closed_bins() -> None:
    """netcal bins with np.histogramdd: [b/B, (b+1)/B), last bin closed; a confidence on an edge moves up.

    Case (B=4, three distinct labels so netcal stays multiclass): conf 0.5 correct, 0.625 wrong,
    0.875 correct. Ours: (0.5 + 0.625 + 0.125)/3 = 0.41667; netcal: 0.5 and 0.625 share
    [0.5, 0.75) → (2·0.0625 + 0.125)/3 = 0.08333.
    """
    probs = np.array([[0.5, 0.25, 0.25], [0.625, 0.25, 0.125], [0.0625, 0.0625, 0.875]])
    labels = np.array([0, 1, 2])
    assert expected_calibration_error(probs, labels, n_bins=4) == pytest.approx(1.25 / 3, abs=EXACT_TOL)
    assert netcal_value(probs, labels, 4) == pytest.approx(0.25 / 3, abs=EXACT_TOL)
    assert tm_value(probs.astype(np.float32), labels, 4, "l1") == pytest.approx(0.25 / 3, abs=1e-7)


def test_netcal_difference_quantile_bins_vs_equal_mass() -> None:
    """netcal's equal_intervals=False uses np.quantile edges; tied confidences then share one bin.

    Case (B=2): confidences [0.5w, 0.5c, 0.5w, 0.9c] (+ distinct labels for netcal's multiclass path).
    Ours (AdaECE): [0.5w, 0.5w | 0.5c, 0.9c] → 0.4. netcal: median 0.5, so [0, 0.5) is empty and
    all four share [0.5, 1] → |0.5 − 0.6| = 0.1.
    """
    probs = np.array([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.05, 0.05, 0.9]])
    labels = np.array([1, 0, 1, 2])
    assert adaptive_calibration_error(probs, labels, n_bins=2) == pytest.approx(0.4, abs=EXACT_TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer = NetcalECE(bins=2, equal_intervals=False).measure(probs, labels)
    assert peer == pytest.approx(0.1, abs=EXACT_TOL)


def test_netcal_difference_degenerate_label_sets() -> None:
    """netcal: C = 1 is read as a binary positive-class score (ECE ≈ 1); one label only with C > 2 raises."""
    probs, labels = np.ones((4, 1)), np.zeros(4, dtype=np.int64)
    assert expected_calibration_error(probs, labels) == 0.0
    assert netcal_value(probs, labels, 10) == pytest.approx(1.0, abs=1e-12)
    probs, _ = random_probs(20, 5, seed=0, dtype=np.float64)
    labels = np.full(20, 2)
    with pytest.raises(RuntimeError, match="binary"):
        netcal_value(probs, labels, 10)
    expected = ref_ece(probs, labels, 15)
    assert expected_calibration_error(probs, labels) == pytest.approx(expected, abs=EXACT_TOL)


# ----------------------------------------------------------------------------- NLL


@pytest.mark.parametrize("c", [2, 10, 1000])
def test_nll_matches_cross_entropy(c: int) -> None:
    rng = np.random.default_rng(c)
    logits = torch.from_numpy(rng.normal(size=(300, c)) * 4)
    labels = torch.from_numpy(rng.integers(0, c, size=300))
    expected = float(torch.nn.functional.cross_entropy(logits, labels))
    assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(expected, rel=EXACT_TOL)
    assert negative_log_likelihood(torch.softmax(logits, 1), labels) == pytest.approx(expected, rel=EXACT_TOL)
    logits32 = logits.float()
    expected32 = float(torch.nn.functional.cross_entropy(logits32, labels))
    assert negative_log_likelihood(logits32, labels, from_logits=True) == pytest.approx(expected32, rel=PEER_TOL)


def test_nll_difference_clamp_vs_cross_entropy() -> None:
    """Ours clamps p at 1e-12 (docs/design.md §2); cross_entropy uses log-softmax and is unbounded."""
    logits = torch.tensor([[0.0, 40.0]], dtype=torch.float64)
    labels = torch.tensor([0])
    assert float(torch.nn.functional.cross_entropy(logits, labels)) == pytest.approx(40.0, rel=1e-12)
    assert negative_log_likelihood(logits, labels, from_logits=True) == pytest.approx(-math.log(1e-12), rel=1e-12)


def test_nll_matches_sklearn_log_loss() -> None:
    probs, labels = random_probs(500, 7, seed=1, dtype=np.float64)
    expected = log_loss(labels, probs, labels=list(range(7)))
    assert negative_log_likelihood(probs, labels) == pytest.approx(expected, rel=EXACT_TOL)


def test_nll_difference_sklearn_clips_at_machine_eps() -> None:
    """p_y = 0: sklearn clips at float64 eps (−log 2.2e-16 ≈ 36.04), ours at 1e-12 (≈ 27.63)."""
    probs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    labels = np.array([1, 1, 2])
    assert log_loss(labels, probs, labels=[0, 1, 2]) == pytest.approx(-math.log(np.finfo(np.float64).eps) / 3, rel=1e-9)
    assert negative_log_likelihood(probs, labels) == pytest.approx(-math.log(1e-12) / 3, rel=EXACT_TOL)


# ----------------------------------------------------------------------------- Brier


@pytest.mark.parametrize("c", [2, 3, 10])
def test_brier_matches_definition_and_sklearn(c: int) -> None:
    probs, labels = random_probs(400, c, seed=c, dtype=np.float64)
    onehot = np.eye(c)[labels]
    direct = float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))
    ours = brier_score(probs, labels)
    assert ours == pytest.approx(direct, rel=EXACT_TOL)
    # sklearn 1.9 (scale_by_half="auto"): multiclass (C ≥ 3) sums over classes like ours;
    # binary (C = 2) halves it. With scale_by_half=False it always equals ours.
    sk_auto = brier_score_loss(labels, probs, labels=list(range(c)))
    sk_sum = brier_score_loss(labels, probs, labels=list(range(c)), scale_by_half=False)
    assert ours == pytest.approx(sk_sum, rel=EXACT_TOL)
    assert ours == pytest.approx(sk_auto * (2 if c == 2 else 1), rel=EXACT_TOL)
