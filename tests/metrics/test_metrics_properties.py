"""Property tests (hypothesis) of hf_calibrate.metrics: bounds, invariances, streaming = one-shot."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from hf_calibrate.metrics import (
    CalibrationMetrics,
    accuracy,
    adaptive_calibration_error,
    brier_score,
    calibration_report,
    classwise_calibration_error,
    expected_calibration_error,
    maximum_calibration_error,
    negative_log_likelihood,
)
from hf_calibrate.metrics.functional import equal_width_bin_index

# The number of examples, derandomisation and deadline come from the profile in conftest.py.
SETTINGS = settings()
REL, ABS = 1e-12, 1e-14  # rounding of float64 sums taken in a different order


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one thread


KINDS = ("softmax", "onehot", "quantized", "sparse", "uniform")


@st.composite
def datasets(
    draw, max_n: int = 120, max_c: int = 12, *, bins: Sequence[int] = (1, 2, 3, 10, 15, 20),
    labels_from_rows: Optional[bool] = None,
) -> Tuple[np.ndarray, np.ndarray, int]:
    """(probs float64 (N, C), labels (N,), n_bins from ``bins``) of several shapes: smooth, one-hot, on-edge, tied.

    Labels are drawn from the rows (roughly calibrated) or uniformly (over-confident): either at random,
    or as ``labels_from_rows`` says.
    """
    n = draw(st.integers(1, max_n))
    c = draw(st.integers(1, max_c))
    n_bins = draw(st.sampled_from(list(bins)))
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "softmax":
        logits = rng.normal(size=(n, c)) * draw(st.floats(0.1, 8.0))
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    elif kind == "onehot":
        probs = np.eye(c)[rng.integers(0, c, size=n)]
    elif kind == "quantized":  # dyadic values: exact bin edges and ties
        probs = rng.integers(0, 5, size=(n, c)).astype(np.float64)
        probs[:, 0] += 1.0
    elif kind == "sparse":
        probs = rng.dirichlet(np.full(c, 0.05), size=n)
    else:
        probs = np.ones((n, c))
    probs = probs / probs.sum(axis=1, keepdims=True)
    if draw(st.booleans()) if labels_from_rows is None else labels_from_rows:  # roughly calibrated, gaps of both signs
        labels = np.minimum((probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), c - 1)
    else:
        labels = rng.integers(0, c, size=n)
    return probs, labels, n_bins


def all_metrics(probs, labels, n_bins: int) -> Dict[str, float]:
    return {
        "ece": expected_calibration_error(probs, labels, n_bins=n_bins),
        "mce": maximum_calibration_error(probs, labels, n_bins=n_bins),
        "rms_ce": expected_calibration_error(probs, labels, n_bins=n_bins, norm="l2"),
        "ada_ece": adaptive_calibration_error(probs, labels, n_bins=n_bins),
        "classwise_ece": classwise_calibration_error(probs, labels, n_bins=n_bins),
        "nll": negative_log_likelihood(probs, labels),
        "brier": brier_score(probs, labels),
        "accuracy": accuracy(probs, labels),
    }


def assert_close(got: Dict[str, float], want: Dict[str, float], rel: float = REL, abs_: float = ABS) -> None:
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=rel, abs=abs_), key


@SETTINGS
@given(datasets())
def test_bounds_and_ordering(data) -> None:
    probs, labels, n_bins = data
    m = all_metrics(probs, labels, n_bins)
    for key in ("ece", "mce", "rms_ce", "ada_ece", "classwise_ece", "accuracy"):
        assert 0.0 <= m[key] <= 1.0, key
    assert 0.0 <= m["brier"] <= 2.0 + 1e-12
    assert 0.0 <= m["nll"] <= -np.log(1e-12) + 1e-9
    # ECE ≤ RMS ≤ MCE (Jensen; the max bounds every weighted mean), up to the last bit
    assert m["ece"] <= m["rms_ce"] * (1 + 1e-12) + 1e-15
    assert m["rms_ce"] <= m["mce"] * (1 + 1e-12) + 1e-15
    if n_bins == 1:  # a single bin: |accuracy − mean confidence|
        mean_conf = float(probs.max(axis=1).mean())
        assert m["ece"] == pytest.approx(abs(m["accuracy"] - mean_conf), rel=REL, abs=ABS)
        assert m["ece"] == pytest.approx(m["mce"], rel=REL, abs=ABS)


@SETTINGS
@given(datasets(), st.integers(0, 2**32 - 1))
def test_permutation_invariance(data, seed: int) -> None:
    probs, labels, n_bins = data
    order = np.random.default_rng(seed).permutation(len(labels))
    base = all_metrics(probs, labels, n_bins)
    permuted = all_metrics(probs[order], labels[order], n_bins)
    assert_close(permuted, base)
    # equal-mass bins see the same sorted sequence (ties broken by correctness): bit-identical
    assert permuted["ada_ece"] == base["ada_ece"]


@SETTINGS
@given(datasets(), st.lists(st.integers(0, 10**6), max_size=6), st.booleans())
def test_streaming_equals_one_shot(data, cut_seeds, from_numpy: bool) -> None:
    probs, labels, n_bins = data
    n = len(labels)
    cuts = sorted({seed % (n + 1) for seed in cut_seeds} | {0, n})
    metrics = CalibrationMetrics(probs.shape[1], n_bins=n_bins)
    for start, stop in zip(cuts[:-1], cuts[1:]):
        if stop == start:
            continue
        batch_probs, batch_labels = probs[start:stop], labels[start:stop]
        if not from_numpy:
            batch_probs, batch_labels = torch.from_numpy(batch_probs), torch.from_numpy(batch_labels)
        metrics.update(batch_probs, batch_labels)
    result = metrics.compute()
    want = all_metrics(probs, labels, n_bins)
    assert result["num_samples"] == n
    assert_close(result, want)
    assert result["ada_ece"] == want["ada_ece"]
    assert_close(calibration_report(probs, labels, n_bins=n_bins), want)
    # compute() leaves the state alone: a second call gives the same numbers
    assert metrics.compute() == result


@SETTINGS
@given(datasets())
def test_numpy_and_torch_inputs_identical(data) -> None:
    probs, labels, n_bins = data
    as_numpy = all_metrics(probs, labels, n_bins)
    as_torch = all_metrics(torch.from_numpy(probs), torch.from_numpy(labels), n_bins)
    as_lists = all_metrics(probs.tolist(), labels.tolist(), n_bins)
    assert as_torch == as_numpy
    assert as_lists == as_numpy


@SETTINGS
@given(datasets())
def test_float32_representable_values_agree_across_dtypes(data) -> None:
    """Same values in float32 and float64 tensors: the float32 fast bin-index path must match."""
    probs, labels, n_bins = data
    probs32 = probs.astype(np.float32)
    assume(np.all(np.abs(probs32.astype(np.float64).sum(axis=1) - 1.0) < 1e-4))
    got = all_metrics(probs32, labels, n_bins)
    want = all_metrics(probs32.astype(np.float64), labels, n_bins)
    assert_close(got, want)


#: Unit roundoff of float32 (round to nearest): a normal float64 p rounds to p·(1 + ε), |ε| ≤ 2⁻²⁴.
FLOAT32_ROUNDOFF = 2.0**-24


@SETTINGS
@given(datasets(max_c=8))
# Found by a random run: p → 1 makes −log p ≈ 1 − p tiny, so a relative bound on the NLL fails.
@example((np.array([[3.6e-4, 0.9991745, 4.655e-4]]), np.array([1]), 15))
def test_float32_and_float64_agree(data) -> None:
    """Rounding probabilities to float32 moves the binned metrics by < 1e-6 (away from bin edges)
    and the NLL by at most float32's unit roundoff u = 2⁻²⁴ in absolute terms.

    Why the NLL bound holds: float32 keeps p ≥ 1e-12 (the NLL clamp) normal, so
    p32 = p·(1 + ε) with |ε| ≤ u, and |log p32 − log p| = |log(1 + ε)| ≤ u/(1 − u) for each
    sample (the clamp at 1e-12 is 1-Lipschitz in log space); the mean keeps the bound. The
    relative change is unbounded as p → 1 (−log p → 0), so no relative bound is stated.
    """
    probs, labels, n_bins = data
    probs32 = probs.astype(np.float32)
    wide = probs32.astype(np.float64)
    # Rounding may move a value across an edge (then the jump is a genuine bin change) or change
    # the argmax of near-ties; skip those draws, they are covered by the exact-value tests.
    for values in (probs, wide):
        scaled = values * n_bins
        assume(np.all((np.abs(scaled - np.round(scaled)) > 1e-5) | (values == 0) | (values == 1)))
    assume(np.array_equal(probs.argmax(axis=1), probs32.argmax(axis=1)))
    got = all_metrics(probs32, labels, n_bins)
    want = all_metrics(probs, labels, n_bins)
    nll32, nll64 = got.pop("nll"), want.pop("nll")
    assert_close(got, want, rel=0.0, abs_=1e-6)
    # u/(1 − u) per sample, plus float64 rounding of a sum of at most 120 terms each ≤ 27.7.
    assert abs(nll32 - nll64) <= FLOAT32_ROUNDOFF / (1 - FLOAT32_ROUNDOFF) + 1e-12


@SETTINGS
@given(st.integers(1, 200), st.integers(1, 30), st.sampled_from([1, 5, 15, 40]))
def test_confident_and_correct_is_perfectly_calibrated(n: int, c: int, n_bins: int) -> None:
    labels = np.arange(n) % c
    probs = np.eye(c, dtype=np.float32)[labels]
    m = all_metrics(probs, labels, n_bins)
    for key in ("ece", "mce", "rms_ce", "ada_ece", "classwise_ece", "nll", "brier"):
        assert m[key] == 0.0, key
    assert m["accuracy"] == 1.0


@SETTINGS
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.sampled_from([1, 4, 10, 15]))
def test_frequency_matched_confidence_gives_zero_equal_width_error(groups, n_bins: int) -> None:
    """Groups of 8·m samples at a dyadic confidence q with exactly q·8·m correct: ECE = MCE = RMS = 0."""
    levels = [0.5, 0.625, 0.75, 0.875, 1.0]
    rows, labels = [], []
    for index, multiple in enumerate(groups):
        q = levels[index % len(levels)]
        size = 8 * multiple
        n_correct = int(q * size)
        rows += [[q, 1.0 - q]] * size
        labels += [0] * n_correct + [1] * (size - n_correct)
    probs, labels = np.array(rows), np.array(labels)
    for norm in ("l1", "l2", "max"):
        assert expected_calibration_error(probs, labels, n_bins=n_bins, norm=norm) == 0.0


@SETTINGS
@given(
    st.lists(st.floats(0.0, 1.0, width=32), min_size=1, max_size=50),
    st.sampled_from([1, 2, 3, 7, 10, 15, 49, 100, 1000]),
)
def test_fast_bin_index_equals_binary_search(values, n_bins: int) -> None:
    """float32 values (and their float64 upcasts, and edge neighbours) bin like bucketize over b/B."""
    edges = torch.arange(n_bins + 1, dtype=torch.float64) / n_bins
    edge32 = edges.float()
    extra = torch.cat(
        [
            edge32,
            torch.nextafter(edge32, torch.full_like(edge32, 2.0)),
            torch.nextafter(edge32, torch.full_like(edge32, -1.0)),
        ]
    )
    values32 = torch.cat([torch.tensor(values, dtype=torch.float32), extra.clamp(0.0, 1.0)])
    expected = (torch.bucketize(values32.double(), edges, right=False) - 1).clamp(0, n_bins - 1)
    assert torch.equal(equal_width_bin_index(values32, n_bins), expected)
    assert torch.equal(equal_width_bin_index(values32.double(), n_bins), expected)
    assert torch.equal(
        equal_width_bin_index(values32.half().float(), n_bins), equal_width_bin_index(values32.half(), n_bins)
    )


@SETTINGS
@given(st.integers(1, 60), st.integers(2, 6), st.integers(0, 2**32 - 1), st.sampled_from([1, 4, 15]))
def test_streaming_mixed_precision_batches_are_lossless(n: int, c: int, seed: int, n_bins: int) -> None:
    """Batches in float16/bfloat16/float32/float64 of dyadic values (exact in all): same numbers as float64."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(16, np.full(c, 1.0 / c), size=n)
    probs = counts / 16.0  # multiples of 1/16: exact in every float dtype
    labels = rng.integers(0, c, size=n)
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    metrics = CalibrationMetrics(c, n_bins=n_bins)
    for index, start in enumerate(range(0, n, 7)):
        batch = torch.from_numpy(probs[start : start + 7]).to(dtypes[index % len(dtypes)])
        metrics.update(batch, labels[start : start + 7])
    result = metrics.compute()
    want = all_metrics(probs, labels, n_bins)
    assert_close(result, want)
    assert result["ada_ece"] == want["ada_ece"]


def test_classwise_off_keeps_every_other_metric():
    generator = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(500, 20, generator=generator), 1)
    labels = torch.randint(0, 20, (500,), generator=generator)
    full, light = CalibrationMetrics(20), CalibrationMetrics(20, classwise=False)
    for part in range(5):
        rows = slice(100 * part, 100 * (part + 1))
        full.update(probs[rows], labels[rows])
        light.update(probs[rows], labels[rows])
    expected = full.compute()
    got = light.compute()
    assert "classwise_ece" not in got and "classwise_ece" in expected
    assert got == {key: value for key, value in expected.items() if key != "classwise_ece"}
    assert light._class_stats.numel() == 0
