"""Smooth ECE and the debiased L2 calibration error (docs/design.md §2): parity with their reference
implementations (relplot, uncertainty-calibration), properties, errors and docstring examples.

Tolerances: smECE agrees with ``relplot.smECE`` to 1e-4, the agreement docs/design.md §2 promises
(the two differ only by FFT versus direct convolution, ≈ 1e-15; a wrong grid, kernel or search
step moves the value by ≥ 1e-4). The debiased error is compared as its square D to 1e-12
(float64 sums of at most 10⁵ terms in [0, 1], each rounded by ≤ 2⁻⁵³) and as the error itself
to 1e-8: |√x − √y| ≤ √|x − y|, so only a D within 1e-16 of 0 could exceed it.
"""

from __future__ import annotations

import doctest
import math
from typing import Tuple

import calibration  # the uncertainty-calibration package
import numpy as np
import pytest
import relplot
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metrics_properties import datasets

from hf_calibrate.metrics import (
    NonFiniteError,
    debiased_calibration_error,
    smooth_calibration_error,
    smooth_ece_from_confidences,
)
from hf_calibrate.metrics import debiased as debiased_module
from hf_calibrate.metrics import smooth as smooth_module

# The number of examples, derandomisation and deadline come from the profile in conftest.py.
SETTINGS = settings()
SMOOTH_TOL = 1e-4
SQUARE_TOL, ERROR_TOL = 1e-12, 1e-8


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one thread


# ----------------------------------------------------------------------------- data


def dirichlet_data(n: int, c: int, concentration: float, seed: int, *, calibrated: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """Dirichlet rows (float64) and labels drawn from the rows (calibrated) or uniformly (over-confident)."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(c, concentration), size=n)
    probs /= probs.sum(axis=1, keepdims=True)
    if calibrated:
        labels = np.minimum((probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), c - 1)
    else:
        labels = rng.integers(0, c, size=n)
    return probs, labels


def model_like_logits(n: int, c: int, seed: int, *, sharpness: float, model_temperature: float) -> Tuple[np.ndarray, np.ndarray]:
    """Logits of a model whose true class probabilities are softmax(sharpness·z) and who reports
    softmax(sharpness·z / model_temperature): T < 1 over-confident (confidences near 1), T > 1 under-confident."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, c))
    z[np.arange(n), rng.integers(0, c, size=n)] += 2.0  # one favoured class per sample
    true = np.exp(sharpness * z - (sharpness * z).max(axis=1, keepdims=True))
    true /= true.sum(axis=1, keepdims=True)
    labels = np.minimum((true.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1), c - 1)
    return sharpness * z / model_temperature, labels


def relplot_smece(probs: np.ndarray, labels: np.ndarray, bandwidth=None) -> float:
    confidences, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    if bandwidth is None:
        return float(relplot.smECE(confidences, correct))
    return float(relplot.smECE_sigma(confidences, correct, bandwidth))


def peer_debiased(probs: np.ndarray, labels: np.ndarray, mode: str, n_bins: int = 15) -> float:
    """The peer's equal-mass path (what get_calibration_error runs on continuous data)."""
    return calibration.lower_bound_scaling_ce(
        probs, labels, p=2, debias=True, num_bins=n_bins, binning_scheme=calibration.get_equal_bins, mode=mode
    )


def assert_debiased_close(got: float, want: float) -> None:
    assert abs(got**2 - want**2) <= SQUARE_TOL
    assert abs(got - want) <= ERROR_TOL


# ----------------------------------------------------------------------------- smooth ECE: parity


@pytest.mark.parametrize("n", [1, 2, 3, 10, 100, 1000, 10_000])
@pytest.mark.parametrize("c, concentration", [(2, 1.0), (3, 0.3), (10, 0.1), (10, 10.0), (100, 0.05)])
@pytest.mark.parametrize("calibrated", [True, False])
def test_smooth_ece_matches_relplot_on_dirichlet(n: int, c: int, concentration: float, calibrated: bool) -> None:
    probs, labels = dirichlet_data(n, c, concentration, seed=n * 1000 + c, calibrated=calibrated)
    assert abs(smooth_calibration_error(probs, labels) - relplot_smece(probs, labels)) <= SMOOTH_TOL


@pytest.mark.parametrize("n", [2, 100, 10_000, 100_000])
@pytest.mark.parametrize("model_temperature", [0.25, 1.0, 3.0], ids=["over-confident", "calibrated", "under-confident"])
def test_smooth_ece_matches_relplot_on_model_like_logits(n: int, model_temperature: float) -> None:
    logits, labels = model_like_logits(n, 10, seed=n, sharpness=3.0, model_temperature=model_temperature)
    confidences, correct = relplot.multiclass_logits_to_confidences(logits, labels)  # scipy softmax
    want = float(relplot.smECE(confidences, correct))
    assert abs(smooth_calibration_error(logits, labels, from_logits=True) - want) <= SMOOTH_TOL
    assert abs(smooth_calibration_error(torch.from_numpy(logits), torch.from_numpy(labels), from_logits=True) - want) <= SMOOTH_TOL


@pytest.mark.parametrize(
    "confidences, correct",
    [
        ([1.0] * 50 + [0.9999] * 50, [1] * 90 + [0] * 10),  # saturated softmax: the end grid point
        ([1.0], [0]),  # N = 1, the largest possible residual
        ([0.0, 0.0, 1.0, 1.0], [1, 0, 1, 0]),  # both ends
        ([0.5] * 7, [1, 0, 1, 1, 0, 1, 1]),  # all tied
        (np.round(np.linspace(0.3, 1.0, 400), 1), np.arange(400) % 3 > 0),  # ten tied values
        (1.0 - np.geomspace(1e-9, 1e-2, 300), np.arange(300) % 50 > 0),  # confidences near 1
    ],
    ids=["saturated", "single", "ends", "all-tied", "quantised", "near-one"],
)
def test_smooth_ece_matches_relplot_on_constructed_inputs(confidences, correct) -> None:
    f, y = np.asarray(confidences, dtype=np.float64), np.asarray(correct, dtype=np.float64)
    assert abs(smooth_ece_from_confidences(f, y) - float(relplot.smECE(f, y))) <= SMOOTH_TOL


@pytest.mark.parametrize(
    "bandwidth",
    # σ < 0.01 with odd grids (M = 5001, 1501) and an even one (20/3002: M = 1502, where relplot samples
    # the kernel half a cell off centre); σ ≥ 0.01 (M = 1001); σ ≥ 0.5 (the kernel cut at ±½ matters).
    [0.002, 20 / 3000, 20 / 3002, 0.05, 0.3, 1.0, 3],
)
@pytest.mark.parametrize("n", [1, 50, 5000])
def test_smooth_ece_at_fixed_bandwidth_matches_relplot(bandwidth: float, n: int) -> None:
    logits, labels = model_like_logits(n, 5, seed=n + 7, sharpness=4.0, model_temperature=0.5)
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    got = smooth_calibration_error(probs, labels, bandwidth=bandwidth)
    assert abs(got - relplot_smece(probs, labels, bandwidth)) <= SMOOTH_TOL


def test_automatic_bandwidth_is_relplots_bisection() -> None:
    """The value is smECE at the upper end of relplot's final bracket, a multiple of 2⁻¹⁰, not at σ* itself."""
    probs, labels = dirichlet_data(3000, 10, 0.3, seed=5)
    confidences, correct = relplot.multiclass_logits_to_confidences(probs, labels, probs=True)
    value, width = relplot.smECE(confidences, correct, return_width=True)
    assert (width * 1024).is_integer() and 2**-9 <= width <= 1
    assert smooth_calibration_error(probs, labels) == pytest.approx(smooth_calibration_error(probs, labels, bandwidth=width), abs=1e-15)
    assert abs(smooth_calibration_error(probs, labels) - value) <= SMOOTH_TOL
    # the bracket: σ̂ − 2⁻¹⁰ is still too small (smECE above it), σ̂ is not
    assert smooth_calibration_error(probs, labels, bandwidth=width - 2**-10) > width - 2**-10
    assert smooth_calibration_error(probs, labels, bandwidth=width) <= width


def test_weights_match_relplot_on_repeated_rows() -> None:
    rng = np.random.default_rng(3)
    confidences, correct = rng.uniform(0.4, 1.0, 500), (rng.random(500) < 0.7).astype(np.float64)
    counts = rng.poisson(1.0, 500)  # a bootstrap replicate
    want = float(relplot.smECE(np.repeat(confidences, counts), np.repeat(correct, counts)))
    assert abs(smooth_ece_from_confidences(confidences, correct, weights=counts) - want) <= SMOOTH_TOL


def test_correct_may_be_bool_int_or_float_and_inputs_any_container() -> None:
    rng = np.random.default_rng(4)
    confidences, correct = rng.uniform(0.5, 1.0, 200), rng.random(200) < 0.8
    want = smooth_ece_from_confidences(confidences, correct)
    assert smooth_ece_from_confidences(confidences, correct.astype(np.int64)) == want
    assert smooth_ece_from_confidences(torch.from_numpy(confidences), torch.from_numpy(correct).double()) == want
    assert smooth_ece_from_confidences(confidences.tolist(), correct.tolist()) == want
    # float32 confidences are read exactly (widened to float64 before any arithmetic)
    narrow = confidences.astype(np.float32)
    assert smooth_ece_from_confidences(narrow, correct) == smooth_ece_from_confidences(narrow.astype(np.float64), correct)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_smooth_ece_on_cuda_equals_cpu() -> None:
    logits, labels = model_like_logits(20_000, 10, seed=1, sharpness=3.0, model_temperature=0.5)
    on_cpu = smooth_calibration_error(logits, labels, from_logits=True)
    on_gpu = smooth_calibration_error(torch.from_numpy(logits).cuda(), torch.from_numpy(labels).cuda(), from_logits=True)
    assert on_gpu == pytest.approx(on_cpu, abs=1e-12)
    weights = torch.ones(20_000, dtype=torch.float64, device="cuda")
    confidences = torch.softmax(torch.from_numpy(logits).cuda(), dim=1).max(dim=1)
    correct = confidences.indices == torch.from_numpy(labels).cuda()
    assert smooth_ece_from_confidences(confidences.values, correct, weights=weights) == pytest.approx(on_cpu, abs=1e-12)


# ----------------------------------------------------------------------------- smooth ECE: properties


@st.composite
def confidence_data(draw, max_n: int = 150) -> Tuple[np.ndarray, np.ndarray]:
    """(confidences, correct) float64 (N,): smooth, tied, at the ends, over- and under-confident."""
    n = draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["beta", "quantised", "ends", "near-one"]))
    if kind == "beta":
        confidences = rng.beta(draw(st.floats(0.2, 10.0)), draw(st.floats(0.2, 10.0)), size=n)
    elif kind == "quantised":
        confidences = rng.integers(0, 9, size=n) / 8.0
    elif kind == "ends":
        confidences = rng.choice([0.0, 1.0, 0.5], size=n)
    else:
        confidences = 1.0 - rng.exponential(draw(st.floats(1e-6, 0.05)), size=n).clip(0.0, 1.0)
    accuracy_power = draw(st.floats(0.25, 4.0))  # < 1 under-confident, > 1 over-confident
    correct = (rng.random(n) < confidences**accuracy_power).astype(np.float64)
    return confidences, correct


@SETTINGS
@given(confidence_data())
def test_smooth_ece_in_unit_interval_and_matches_relplot(data) -> None:
    confidences, correct = data
    value = smooth_ece_from_confidences(confidences, correct)
    assert 0.0 <= value < 1.0
    assert abs(value - float(relplot.smECE(confidences, correct))) <= SMOOTH_TOL


@SETTINGS
@given(confidence_data(), st.integers(0, 2**32 - 1))
def test_smooth_ece_permutation_invariant(data, seed: int) -> None:
    confidences, correct = data
    order = np.random.default_rng(seed).permutation(len(confidences))
    assert smooth_ece_from_confidences(confidences[order], correct[order]) == pytest.approx(
        smooth_ece_from_confidences(confidences, correct), abs=1e-12
    )


@SETTINGS
@given(confidence_data(max_n=60), st.integers(0, 2**32 - 1))
def test_integer_weights_equal_repetition(data, seed: int) -> None:
    confidences, correct = data
    counts = np.random.default_rng(seed).integers(0, 5, size=len(confidences))
    counts[0] = max(counts[0], 1)
    repeated = smooth_ece_from_confidences(np.repeat(confidences, counts), np.repeat(correct, counts))
    for weights in (counts, counts.astype(np.float64), torch.from_numpy(counts)):
        assert smooth_ece_from_confidences(confidences, correct, weights=weights) == pytest.approx(repeated, abs=1e-12)
    # weight 0 is the same as leaving the sample out
    kept = counts > 0
    assert smooth_ece_from_confidences(confidences, correct, weights=kept.astype(np.float64)) == pytest.approx(
        smooth_ece_from_confidences(confidences[kept], correct[kept]), abs=1e-12
    )


@SETTINGS
@given(st.integers(0, 2**31), st.integers(2, 10), st.floats(0.1, 5.0))
def test_smooth_ece_of_calibrated_data_shrinks_with_n(seed: int, c: int, concentration: float) -> None:
    """Labels drawn from the probabilities: the true calibration error is 0, and smECE, which then
    measures only sampling noise, falls about as N^(-1/3) (256× the samples: about ×0.16)."""
    small = smooth_calibration_error(*dirichlet_data(100, c, concentration, seed))
    large = smooth_calibration_error(*dirichlet_data(25_600, c, concentration, seed + 1))
    assert large < small


def test_density_floor_is_the_only_gap_below_one() -> None:
    """Every confidence 1 and every prediction wrong: R = D at every point, so smECE = ΣD/(ΣD + 10⁻⁴·T)
    < 1; N identical samples scale ΣD by N, so 1/smECE − 1 falls exactly as 1/N."""
    floor_share = {n: 1.0 / smooth_ece_from_confidences(np.ones(n), np.zeros(n)) - 1.0 for n in (10, 1000)}
    assert 0.0 < floor_share[1000] < floor_share[10]
    assert floor_share[10] / floor_share[1000] == pytest.approx(100.0, rel=1e-9)


# ----------------------------------------------------------------------------- debiased L2: parity


@pytest.mark.parametrize("n", [1, 2, 3, 14, 16, 100, 1000, 20_000])
@pytest.mark.parametrize("c, concentration", [(2, 1.0), (3, 0.3), (10, 0.1), (10, 10.0)])
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
@pytest.mark.parametrize("calibrated", [True, False])
def test_debiased_matches_uncertainty_calibration(n: int, c: int, concentration: float, mode: str, calibrated: bool) -> None:
    probs, labels = dirichlet_data(n, c, concentration, seed=n * 100 + c, calibrated=calibrated)
    assert not calibration.is_discrete(probs)  # so get_calibration_error takes the equal-mass path
    want = calibration.get_calibration_error(probs, labels, p=2, debias=True, mode=mode)
    assert_debiased_close(debiased_calibration_error(probs, labels, mode=mode), want)


@pytest.mark.parametrize("n_bins", [1, 2, 7, 15, 40, 500])
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_number_of_bins_matches_peer(n_bins: int, mode: str) -> None:
    logits, labels = model_like_logits(300, 4, seed=n_bins, sharpness=2.0, model_temperature=0.5)
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    got = debiased_calibration_error(logits, labels, n_bins=n_bins, mode=mode, from_logits=True)
    assert_debiased_close(got, peer_debiased(probs, labels, mode, n_bins))


@pytest.mark.parametrize("model_temperature", [0.25, 1.0, 3.0], ids=["over-confident", "calibrated", "under-confident"])
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_matches_peer_on_model_like_logits(model_temperature: float, mode: str) -> None:
    logits, labels = model_like_logits(50_000, 10, seed=3, sharpness=3.0, model_temperature=model_temperature)
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    want = calibration.get_calibration_error(probs, labels, p=2, debias=True, mode=mode)
    assert_debiased_close(debiased_calibration_error(logits, labels, mode=mode, from_logits=True), want)


@pytest.mark.parametrize("mode", ["top-label", "marginal"])
@pytest.mark.parametrize("levels", [2, 5, 11])
def test_debiased_ties_keep_equal_values_in_one_bin(mode: str, levels: int) -> None:
    """Quantised probabilities: the peer's edges are midpoints, so ties never straddle a bin."""
    rng = np.random.default_rng(levels)
    probs = rng.integers(0, levels, size=(400, 3)).astype(np.float64)
    probs[:, 0] += 1.0
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, 3, size=400)
    assert_debiased_close(debiased_calibration_error(probs, labels, mode=mode), peer_debiased(probs, labels, mode))


def test_discrete_inputs_keep_equal_mass_bins_unlike_the_peer() -> None:
    """The documented difference: with < N/4 distinct values in every column the peer switches to one
    bin per distinct value (get_binning_ce); we keep the 15 equal-mass bins (its other path). The two
    differ once there are more distinct values than bins."""
    rng = np.random.default_rng(0)
    confidences = rng.choice(np.linspace(0.5, 0.99, 50), size=400)  # 50 < 400/4 distinct values, 15 bins
    probs = np.stack([confidences, 1.0 - confidences], axis=1)
    labels = (rng.random(400) > confidences ** 3).astype(np.int64)  # over-confident
    assert calibration.is_discrete(probs)
    ours = debiased_calibration_error(probs, labels)
    assert_debiased_close(ours, peer_debiased(probs, labels, "top-label"))
    peer = calibration.get_calibration_error(probs, labels, p=2, debias=True, mode="top-label")
    assert peer == calibration.get_binning_ce(probs, labels, p=2, debias=True, mode="top-label")
    assert abs(ours - peer) > 1e-3


def test_debiased_hand_computed_cases() -> None:
    tied = np.full((4, 2), 0.5)  # one bin holding all four samples, c̄ = 0.5
    # all right: ā = 1, variance term 0 → D = 0.5²
    assert debiased_calibration_error(tied, [0, 0, 0, 0]) == pytest.approx(0.5, abs=1e-15)
    # 3 of 4 right: (0.5 − 0.75)² − 0.75·0.25/3 = 0 exactly
    assert debiased_calibration_error(tied, [0, 0, 0, 1]) == pytest.approx(0.0, abs=1e-8)
    # 2 of 4 right: D = 0 − 0.25/3 < 0 → clipped to 0 (the peer clips too)
    assert debiased_calibration_error(tied, [0, 1, 0, 1]) == 0.0
    assert calibration.get_calibration_error(tied, np.array([0, 1, 0, 1]), p=2, debias=True, mode="top-label") == 0.0
    # bins of one sample add nothing: N = 1, and N = 2 distinct values in two bins
    assert debiased_calibration_error([[0.9, 0.1]], [1]) == 0.0
    assert debiased_calibration_error([[0.9, 0.1], [0.2, 0.8]], [1, 0]) == 0.0
    # ... but two samples in one bin do: (0.85 − 0)² − 0 = 0.7225
    assert debiased_calibration_error([[0.9, 0.1], [0.2, 0.8]], [1, 0], n_bins=1) == pytest.approx(0.85, abs=1e-15)


@pytest.mark.parametrize("n, c", [(1, 2), (2, 2), (3, 2), (2, 5), (1, 1), (30, 1)])
@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_tiny_inputs_match_peer(n: int, c: int, mode: str) -> None:
    probs, labels = dirichlet_data(n, c, 1.0, seed=n + c)
    assert_debiased_close(debiased_calibration_error(probs, labels, mode=mode), peer_debiased(probs, labels, mode))


@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_float32_edges_rounded_like_the_peer(mode: str) -> None:
    """Edges are midpoints rounded to the probabilities' precision: 0.75 − 2⁻²⁴ and 0.75 are
    neighbouring float32 values whose midpoint rounds (to even) up to 0.75, so 0.75 joins the lower bin."""
    below = np.float32(0.75) - np.float32(2**-24)
    assert np.float32((below + np.float32(0.75)) / np.float32(2)) == np.float32(0.75)
    confidences = np.array([0.6, 0.6, below, below, 0.75, 0.75, 0.9, 0.9], dtype=np.float32)
    probs = np.stack([confidences, np.float32(1) - confidences], axis=1)
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])  # right below 0.75, wrong from 0.75 up
    got = debiased_calibration_error(probs, labels, n_bins=2, mode=mode)
    want = peer_debiased(probs, labels, mode, n_bins=2)  # the peer computes in float32
    assert abs(got**2 - want**2) <= 1e-6
    # in float64 the edge lies strictly between the two values and 0.75 goes up: another binning,
    # a change of D far beyond float32 rounding
    unrounded = debiased_calibration_error(probs.astype(np.float64), labels, n_bins=2, mode=mode)
    assert abs(got**2 - unrounded**2) > 1e-2


# ----------------------------------------------------------------------------- debiased L2: properties

#: (probs, labels drawn from the rows, n_bins up to 200) for the debiased estimator's properties
PROBABILITY_DATA = datasets(max_c=8, bins=(1, 2, 3, 10, 15, 200), labels_from_rows=True)



@SETTINGS
@given(PROBABILITY_DATA, st.sampled_from(["top-label", "marginal"]))
def test_debiased_matches_peer_and_lies_in_unit_interval(data, mode: str) -> None:
    probs, labels, n_bins = data
    value = debiased_calibration_error(probs, labels, n_bins=n_bins, mode=mode)
    assert 0.0 <= value <= 1.0
    assert_debiased_close(value, peer_debiased(probs, labels, mode, n_bins))


@SETTINGS
@given(PROBABILITY_DATA, st.sampled_from(["top-label", "marginal"]), st.integers(0, 2**32 - 1))
def test_debiased_permutation_invariant(data, mode: str, seed: int) -> None:
    probs, labels, n_bins = data
    order = np.random.default_rng(seed).permutation(len(labels))
    base = debiased_calibration_error(probs, labels, n_bins=n_bins, mode=mode)
    assert_debiased_close(debiased_calibration_error(probs[order], labels[order], n_bins=n_bins, mode=mode), base)


def test_marginal_chunks_over_classes_like_one_pass(monkeypatch) -> None:
    probs, labels = dirichlet_data(500, 7, 0.5, seed=11)
    whole = debiased_calibration_error(probs, labels, mode="marginal")
    monkeypatch.setattr(debiased_module, "CHUNK_ELEMENTS", 1000)  # two classes per chunk
    assert debiased_calibration_error(probs, labels, mode="marginal") == pytest.approx(whole, abs=1e-15)


# ----------------------------------------------------------------------------- errors


GOOD_PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
GOOD_LABELS = torch.tensor([0, 2])
GOOD_CONFIDENCES = torch.tensor([0.7, 0.6], dtype=torch.float64)
GOOD_CORRECT = torch.tensor([True, False])
ENTRY_POINTS = {"smooth": smooth_calibration_error, "debiased": debiased_calibration_error}


@pytest.fixture(params=sorted(ENTRY_POINTS))
def metric(request):
    return ENTRY_POINTS[request.param]


def test_probability_errors_come_from_the_shared_checks(metric) -> None:
    metric(GOOD_PROBS, GOOD_LABELS)  # the baseline the cases below deviate from
    with pytest.raises(ValueError, match=r"two-dimensional \(N samples, C classes\)"):
        metric(GOOD_PROBS[0], GOOD_LABELS)
    with pytest.raises(ValueError, match="2 rows but labels has 3 entries"):
        metric(GOOD_PROBS, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="label 3 is outside the valid range"):
        metric(GOOD_PROBS, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="probs is empty"):
        metric(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="sums to 0.8.*from_logits=True"):
        metric(torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.3, 0.6]]), GOOD_LABELS)
    for bad in (float("nan"), float("inf")):
        probs = GOOD_PROBS.clone()
        probs[1, 1] = bad
        with pytest.raises(NonFiniteError, match=r"NaN or infinite values \(rows 1\).*Remove these samples"):
            metric(probs, GOOD_LABELS)


@pytest.mark.parametrize("bandwidth", [0, -0.1, 0.0])
def test_non_positive_bandwidth(bandwidth) -> None:
    with pytest.raises(ValueError, match=r"bandwidth must be > 0.*or None to choose it automatically"):
        smooth_calibration_error(GOOD_PROBS, GOOD_LABELS, bandwidth=bandwidth)
    with pytest.raises(ValueError, match=r"bandwidth must be > 0"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, GOOD_CORRECT, bandwidth=bandwidth)


@pytest.mark.parametrize("bandwidth", [float("nan"), float("inf")])
def test_non_finite_bandwidth(bandwidth) -> None:
    with pytest.raises(NonFiniteError, match="bandwidth must be finite.*pass a positive number"):
        smooth_calibration_error(GOOD_PROBS, GOOD_LABELS, bandwidth=bandwidth)


@pytest.mark.parametrize("bandwidth", ["0.1", True, torch.tensor(0.1)], ids=["str", "bool", "tensor"])
def test_bandwidth_must_be_a_number(bandwidth) -> None:
    with pytest.raises(ValueError, match="bandwidth must be a positive number, or None"):
        smooth_calibration_error(GOOD_PROBS, GOOD_LABELS, bandwidth=bandwidth)


def test_bandwidth_below_the_grid_limit() -> None:
    with pytest.raises(ValueError, match=r"bandwidth 1e-06 is below 1e-05.*10,000,000 points.*Pass a bandwidth >= 1e-05"):
        smooth_calibration_error(GOOD_PROBS, GOOD_LABELS, bandwidth=1e-6)
    smooth_calibration_error(GOOD_PROBS, GOOD_LABELS, bandwidth=np.float64(smooth_module.MIN_BANDWIDTH))


@pytest.mark.parametrize(
    "confidences, message",
    [
        (torch.tensor([[0.7, 0.6]]), r"confidences must be one-dimensional \(N,\), got shape \(1, 2\)"),
        (torch.zeros(0), "confidences is empty: at least one sample is needed"),
        (torch.tensor([1, 0]), "confidences must be floating point, got dtype torch.int64"),
        (torch.tensor([0.7, 1.5]), r"confidences must lie in \[0, 1\] \(positions 1 do not\).*max_k p_ik.*from_logits=True"),
        (torch.tensor([-0.1, 0.5]), r"positions 0 do not"),
        (["high", "low"], "confidences holds strings"),
    ],
)
def test_bad_confidences(confidences, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        smooth_ece_from_confidences(confidences, torch.tensor([True] * max(1, len(confidences))))


@pytest.mark.parametrize("name", ["confidences", "correct", "weights"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_vectors(name: str, bad: float) -> None:
    inputs = {"confidences": GOOD_CONFIDENCES.clone(), "correct": GOOD_CORRECT.double(), "weights": torch.ones(2, dtype=torch.float64)}
    inputs[name][1] = bad
    with pytest.raises(NonFiniteError, match=rf"{name} contains NaN or infinite values \(positions 1\).*Remove these samples"):
        smooth_ece_from_confidences(inputs["confidences"], inputs["correct"], weights=inputs["weights"])


@pytest.mark.parametrize("correct", [[1, 2], [0.5, 1.0], [-1, 0]])
def test_correct_must_be_zero_or_one(correct) -> None:
    with pytest.raises(ValueError, match=r"correct must hold 0/1 \(or False/True\).*\(predictions == labels\)"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, correct)


@pytest.mark.parametrize("name", ["correct", "weights"])
def test_vector_length_and_shape_mismatch(name: str) -> None:
    inputs = {"correct": GOOD_CORRECT, "weights": None}
    inputs[name] = torch.ones(3)
    with pytest.raises(ValueError, match=rf"confidences has 2 entries but {name} has 3; they must describe the same samples"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, inputs["correct"], weights=inputs["weights"])
    inputs[name] = torch.ones(2, 1)
    with pytest.raises(ValueError, match=rf"{name} must be one-dimensional \(N,\), got shape \(2, 1\)"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, inputs["correct"], weights=inputs["weights"])


def test_vectors_on_another_device() -> None:
    with pytest.raises(ValueError, match="confidences is on cpu but weights is on meta; move both to one device"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, GOOD_CORRECT, weights=torch.ones(2, device="meta"))


def test_negative_weights() -> None:
    with pytest.raises(ValueError, match=r"weights must be non-negative sample multiplicities \(positions 0 are negative\).*or None"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, GOOD_CORRECT, weights=[-1.0, 2.0])


def test_weights_summing_to_zero() -> None:
    with pytest.raises(ValueError, match="weights sum to 0: give at least one sample a positive weight"):
        smooth_ece_from_confidences(GOOD_CONFIDENCES, GOOD_CORRECT, weights=[0, 0])


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True])
def test_debiased_bad_n_bins(n_bins) -> None:
    with pytest.raises(ValueError, match="n_bins must be an integer from 1 to 10,000"):
        debiased_calibration_error(GOOD_PROBS, GOOD_LABELS, n_bins=n_bins)


@pytest.mark.parametrize("mode", ["top_label", "classwise", "Marginal"])
def test_debiased_bad_mode(mode: str) -> None:
    with pytest.raises(ValueError, match=r"mode must be one of 'top-label', 'marginal'"):
        debiased_calibration_error(GOOD_PROBS, GOOD_LABELS, mode=mode)


# ----------------------------------------------------------------------------- docstrings


@pytest.mark.parametrize("module, examples", [(smooth_module, 7), (debiased_module, 5)])
def test_docstring_examples_run(module, examples: int) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= examples and result.failed == 0


def test_public_functions_are_exported() -> None:
    from hf_calibrate import metrics

    for name in ("debiased_calibration_error", "smooth_calibration_error", "smooth_ece_from_confidences"):
        assert name in metrics.__all__ and callable(getattr(metrics, name))
    assert math.isfinite(smooth_calibration_error(GOOD_PROBS, GOOD_LABELS))
