"""Bootstrap intervals (docs/design.md §2, "Intervals"): the weight generator, weighted statistics,
one-shot and paired intervals, the streaming accumulator, and every documented error."""

from __future__ import annotations

import bisect
import doctest
import json
import math
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metrics_properties import datasets

from hf_calibrate.metrics import (
    CalibrationMetrics,
    Interval,
    adaptive_calibration_error,
    bootstrap_intervals,
    paired_bootstrap_intervals,
    paired_intervals,
    verdict,
)
from hf_calibrate.metrics import functional, intervals, streaming
from hf_calibrate.metrics.functional import (
    calibration_error_from_statistics,
    calibration_errors_from_statistics,
    equal_mass_order,
    equal_mass_statistics,
    equal_width_statistics,
    weighted_equal_mass_statistics,
)
from hf_calibrate.metrics.bootstrap import _THRESHOLDS
from hf_calibrate.metrics.draws import Draws
from hf_calibrate.metrics.intervals import (
    DEFAULT_METRICS,
    DEFAULT_REPLICATES,
    MIN_INTERVAL_REPLICATES,
    MIN_INTERVAL_SAMPLES,
    _one_shot_draws,
    index_fingerprint,
    poisson_weights,
)

SETTINGS = settings()  # the profile of conftest.py (derandomised under ci)
R = 100  # replicates in the property tests: the fewest an interval takes (MIN_INTERVAL_REPLICATES), cheap
MEAN_METRICS = ("accuracy", "nll", "brier")  # means of per-sample values
BINNED_METRICS = ("ece", "mce", "rms_ce", "ada_ece")


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one thread


def calibrated(num_samples: int, seed: int, num_classes: int = 4) -> Tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and labels drawn from them (a calibrated model), deterministic on any machine."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_samples, num_classes, generator=generator, dtype=torch.float64) * 1.5
    probs = torch.softmax(logits, dim=1)
    return probs, torch.multinomial(probs, 1, generator=generator).squeeze(1)


def as_pairs(intervals: Dict[str, Interval]) -> Dict[str, Tuple[float, float, float]]:
    return {name: (i.point, i.low, i.high) for name, i in intervals.items()}


def assert_close(got: Dict[str, Interval], want: Dict[str, Interval], tol: float = 1e-12) -> None:
    """The same metrics with the same points and ends (to ``tol``), or the same absence of an interval."""
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].reason == want[name].reason, name
        for field in ("point",) if want[name].reason else ("point", "low", "high"):
            a, b = getattr(got[name], field), getattr(want[name], field)
            assert a == pytest.approx(b, rel=tol, abs=tol), (name, field, a, b)


# ----------------------------------------------------------------------------- weight generator

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix(word: int) -> int:
    word &= _MASK
    word = ((word ^ (word >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    word = ((word ^ (word >> 27)) * 0x94D049BB133111EB) & _MASK
    return word ^ (word >> 31)


def _reference_weight(seed: int, replicate: int, index: int) -> int:
    """The documented generator in plain Python integers (docs/design.md §2)."""
    word = _splitmix(_splitmix(_splitmix(seed) + (replicate + 1) * _GOLDEN) + (index + 1) * _GOLDEN)
    return bisect.bisect_right([t + (1 << 63) for t in _THRESHOLDS], word)


def test_weights_match_the_documented_generator() -> None:
    """Wrapping int64 arithmetic on tensors reproduces SplitMix64 on Python integers, any seed or index."""
    rng = np.random.default_rng(0)
    replicates = [0, 1, 999, *rng.integers(0, 10**6, size=5).tolist()]
    indices = [0, 1, 2, 2**40 + 3, 2**62 + 11, *rng.integers(0, 2**62, size=20).tolist()]
    for seed in (0, 1, -1, 2**63 + 5, 2**64 + 7, 12345):
        weights = poisson_weights(seed, torch.tensor(replicates), torch.tensor(indices))
        want = [[_reference_weight(seed, r, i) for i in indices] for r in replicates]
        assert weights.tolist() == want, seed
    modulo = poisson_weights(2**64 + 7, torch.arange(3), torch.arange(9))
    assert modulo.equal(poisson_weights(7, torch.arange(3), torch.arange(9)))


def test_poisson_weights_have_mean_and_variance_one() -> None:
    weights = poisson_weights(0, torch.arange(10), torch.arange(100_000))  # 10⁶ draws
    flat = weights.flatten()
    assert abs(float(flat.mean()) - 1.0) < 0.005  # standard error 0.001
    assert abs(float(flat.var()) - 1.0) < 0.01  # standard error 0.0017
    assert abs(float((flat == 0).double().mean()) - math.exp(-1)) < 0.003
    assert float(flat.max()) >= 7 and bool((flat == flat.round()).all())
    centred = weights - 1.0
    across_replicates = float((centred[0] * centred[1]).mean())
    across_neighbours = float((centred[:, 1:] * centred[:, :-1]).mean())
    assert abs(across_replicates) < 0.01 and abs(across_neighbours) < 0.005
    other_seed = poisson_weights(1, torch.arange(10), torch.arange(100_000)) - 1.0
    assert abs(float((centred * other_seed).mean())) < 0.005


def test_weights_depend_only_on_seed_replicate_and_index() -> None:
    indices = torch.tensor([5, 17, 3, 100_000_007, 0])
    weights = poisson_weights(3, torch.arange(40), indices)
    permutation = torch.tensor([4, 2, 0, 3, 1])
    assert poisson_weights(3, torch.arange(40), indices[permutation]).equal(weights[:, permutation])
    assert poisson_weights(3, torch.arange(10, 20), indices).equal(weights[10:20])
    assert not poisson_weights(4, torch.arange(40), indices).equal(weights)


def test_index_fingerprint_is_order_free() -> None:
    indices = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    whole = index_fingerprint(indices)
    assert int(index_fingerprint(indices[:300]) + index_fingerprint(indices[300:])) == int(whole)
    assert int(index_fingerprint(indices.flip(0))) == int(whole)
    assert int(index_fingerprint(indices + 1)) != int(whole)


# ----------------------------------------------------------------------------- weighted statistics


@SETTINGS
@given(datasets(max_n=60, max_c=6), st.integers(0, 2**31))
def test_integer_weights_equal_repeated_samples(data, seed: int) -> None:
    """Weighted equal-width and equal-mass statistics are those of each sample repeated w times."""
    probs, labels, n_bins = data
    confidences, predictions = torch.from_numpy(probs).max(dim=1)
    correct = (predictions == torch.from_numpy(labels)).double()
    indices = torch.arange(confidences.shape[0])
    weights = poisson_weights(seed, torch.arange(4), indices)
    order = equal_mass_order(confidences, correct, indices)
    width = equal_width_statistics(confidences, correct, n_bins, weights)
    mass = weighted_equal_mass_statistics(confidences[order], correct[order], weights[:, order], n_bins)
    for row in range(4):
        counts = weights[row].long()
        if int(counts.sum()) == 0:  # an empty resample has no metric
            assert math.isnan(float(calibration_errors_from_statistics(mass[row], "l1")))
            continue
        repeated = torch.repeat_interleave(confidences, counts), torch.repeat_interleave(correct, counts)
        for got, statistics in ((width[row], equal_width_statistics), (mass[row], equal_mass_statistics)):
            want = statistics(*repeated, n_bins)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            for norm in ("l1", "l2", "max"):
                assert float(calibration_errors_from_statistics(got, norm)) == pytest.approx(
                    calibration_error_from_statistics(want, norm), abs=1e-12
                )
    ones = torch.ones(1, len(order), dtype=torch.float64)
    unit = weighted_equal_mass_statistics(confidences[order], correct[order], ones, n_bins)[0]
    torch.testing.assert_close(unit, equal_mass_statistics(confidences, correct, n_bins), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- one-shot intervals


@SETTINGS
@given(datasets(), st.integers(0, 1000))
def test_interval_contains_the_point_for_means(data, seed: int) -> None:
    """What is asserted about containment (docs/design.md §2, "Intervals").

    Accuracy, NLL and Brier are weighted means Σw·x/Σw: replicates fall on both sides of the
    point with probability bounded away from 0, so low ≤ point ≤ high (to 1e-12 for the rounding
    of Σw·x/Σw). For the binned metrics only 0 ≤ low ≤ high ≤ 1 is asserted: they are biased
    upwards under resampling and their interval can exclude the point (next test).
    """
    probs, labels, n_bins = data
    intervals = bootstrap_intervals(probs, labels, n_bins=n_bins, replicates=R, seed=seed)
    assert tuple(intervals) == DEFAULT_METRICS
    for name, interval in intervals.items():
        assert (interval.replicates, interval.seed, interval.confidence) == (R, seed, 0.95)
        if len(labels) < MIN_INTERVAL_SAMPLES:  # no interval rather than a degenerate one
            assert math.isnan(interval.low) and math.isnan(interval.high) and f"{len(labels)} sample" in interval.reason
            continue
        assert interval.low <= interval.high and interval.reason is None, name
        if name in MEAN_METRICS:
            assert interval.low - 1e-12 <= interval.point <= interval.high + 1e-12, name
        else:
            assert 0.0 <= interval.low and interval.high <= 1.0 + 1e-12, name


def test_a_calibration_errors_interval_is_shifted_by_the_bootstrap_bias() -> None:
    """ECE of a perfectly calibrated bin is 0, but a resample is exactly balanced only ~1.3 % of the time.

    Every confidence is 0.5 and half the labels are right: ECE = 0, while a replicate's ECE is
    |Σw·a − Σw/2| / Σw > 0 unless the weights balance, so the plain percentile interval lies above
    the point; the bias-shifted one holds it, is cut at 0 below, and keeps the percentile's width above.
    """
    probs = torch.full((1000, 2), 0.5, dtype=torch.float64)
    labels = torch.arange(1000) % 2
    found = bootstrap_intervals(probs, labels, metrics=["ece", "accuracy"], replicates=1000)
    draws = _one_shot_draws(probs, labels, ["ece"], 15, 1000, 0).values["ece"]
    plain_low, plain_high = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert found["ece"].point == 0.0 and plain_low > 0.0  # the plain percentile interval misses its point
    assert found["ece"].low == 0.0 and found["ece"].contains(0.0)
    assert found["ece"].high == pytest.approx(plain_high - float(draws.mean()), abs=1e-12)
    assert found["accuracy"].contains(0.5)


def test_a_paired_difference_is_shifted_but_not_cut_at_zero() -> None:
    """Differences of calibration errors may be negative: only single errors are cut at 0."""
    probs, labels = calibrated(800, 3)
    sharper = torch.softmax(torch.log(probs) * 2.0, dim=1)
    difference = paired_bootstrap_intervals(probs, sharper, labels, metrics=["ece"], replicates=300)["ece"]
    assert difference.high < 0.0 and difference.low < difference.point < difference.high


def test_width_shrinks_as_one_over_root_n() -> None:
    """4× the samples → about half the width (averaged over 4 data sets); MCE follows its sparsest bin instead."""
    names = ("accuracy", "ece", "rms_ce", "ada_ece", "nll", "brier")
    widths = {name: [0.0, 0.0] for name in names}
    for seed in range(4):
        for slot, num_samples in enumerate((500, 2000)):
            found = bootstrap_intervals(*calibrated(num_samples, seed), metrics=list(names), replicates=200, seed=seed)
            for name in names:
                widths[name][slot] += found[name].high - found[name].low
    for name, (small, large) in widths.items():
        assert 0.35 < large / small < 0.65, (name, large / small)


def test_accuracy_coverage_is_near_nominal() -> None:
    """Loose, deterministic: the 95 % interval of accuracy covers the true accuracy in ≥ 80 % of 40 data sets."""
    covered = 0
    for seed in range(40):
        generator = torch.Generator().manual_seed(seed)
        confidence = 0.5 + 0.5 * torch.rand(300, generator=generator, dtype=torch.float64)
        probs = torch.stack([confidence, 1.0 - confidence], dim=1)
        labels = (torch.rand(300, generator=generator, dtype=torch.float64) >= confidence).long()
        interval = bootstrap_intervals(probs, labels, metrics=["accuracy"], replicates=200, seed=seed)["accuracy"]
        covered += interval.contains(0.75)  # E[c] for c ~ U(0.5, 1), calibrated
    assert covered >= 32


@SETTINGS
@given(datasets(max_n=80), st.integers(0, 1000))
def test_paired_difference_of_a_model_with_itself_is_exactly_zero(data, seed: int) -> None:
    probs, labels, n_bins = data
    paired = paired_bootstrap_intervals(probs, probs, labels, n_bins=n_bins, replicates=R, seed=seed)
    assert tuple(paired) == DEFAULT_METRICS
    for name, interval in paired.items():
        low_high = (interval.point, interval.low, interval.high)
        assert low_high == (0.0, 0.0, 0.0) or (interval.point == 0.0 and math.isnan(interval.low)), name
        expected = "unchanged" if low_high == (0.0, 0.0, 0.0) else "no detectable change at this test size"
        assert verdict(interval) == expected, name


def test_paired_interval_detects_a_clear_improvement() -> None:
    probs, labels = calibrated(2000, 0)
    overconfident = torch.softmax(probs.log() * 3.0, dim=1)
    paired = paired_bootstrap_intervals(probs, overconfident, labels, replicates=300)
    for name in ("ece", "rms_ce", "ada_ece", "nll", "brier"):
        assert verdict(paired[name]) == "improved", name
        one = bootstrap_intervals(probs, labels, metrics=[name], replicates=300)[name].point
        other = bootstrap_intervals(overconfident, labels, metrics=[name], replicates=300)[name].point
        assert paired[name].point == one - other
    reversed_ = paired_bootstrap_intervals(overconfident, probs, labels, metrics=["ece"], replicates=300)["ece"]
    assert verdict(reversed_) == "made worse"
    assert verdict(paired["accuracy"], lower_is_better=False) == "unchanged"  # same argmax: 0 in every replicate


def test_paired_interval_is_narrower_than_separate_ones() -> None:
    """Shared weights: the variability common to both models cancels in the difference."""
    probs, labels = calibrated(1000, 1)
    tempered = torch.softmax(probs.log() * 1.2, dim=1)
    paired = paired_bootstrap_intervals(probs, tempered, labels, metrics=["nll"], replicates=300)["nll"]
    alone = bootstrap_intervals(probs, labels, metrics=["nll"], replicates=300)["nll"]
    assert paired.high - paired.low < 0.5 * (alone.high - alone.low)


@pytest.mark.parametrize(
    ("low", "high", "lower_is_better", "want"),
    [
        (-0.03, -0.01, True, "improved"),
        (0.01, 0.03, True, "made worse"),
        (-0.01, 0.02, True, "no detectable change at this test size"),
        (0.0, 0.0, True, "unchanged"),
        (-0.03, 0.0, True, "no detectable change at this test size"),
        (-0.03, -0.01, False, "made worse"),
        (0.01, 0.03, False, "improved"),
        (float("nan"), float("nan"), True, "no detectable change at this test size"),
    ],
)
def test_verdict_rule(low: float, high: float, lower_is_better: bool, want: str) -> None:
    interval = Interval(point=(low + high) / 2, low=low, high=high, confidence=0.95, replicates=1000, seed=0)
    assert verdict(interval, lower_is_better=lower_is_better) == want
    assert interval.excludes_zero == (want in ("improved", "made worse"))


def test_interval_is_reported_with_its_replicates_and_seed() -> None:
    found = bootstrap_intervals(*calibrated(200, 0), replicates=100, seed=9, confidence=0.9)
    record = json.loads(json.dumps({name: interval.to_dict() for name, interval in found.items()}))
    ece = found["ece"]
    assert record["ece"] == {"point": ece.point, "low": ece.low, "high": ece.high, "confidence": 0.9, "replicates": 100, "seed": 9}
    assert DEFAULT_REPLICATES == 1000
    assert bootstrap_intervals(*calibrated(50, 0), metrics=["nll"])["nll"].replicates == DEFAULT_REPLICATES
    narrower = bootstrap_intervals(*calibrated(200, 0), replicates=100, seed=9, confidence=0.5)["nll"]
    assert found["nll"].low <= narrower.low <= narrower.high <= found["nll"].high


def test_too_few_samples_or_replicates_give_no_interval_never_a_degenerate_one() -> None:
    """One sample (every replicate repeats it: low = high = point) or one replicate would give an interval of zero
    width: below 30 samples or 100 replicates there is none, its ends NaN (None in JSON) and its reason given."""
    probs, labels = torch.tensor([[0.8, 0.2]]), torch.tensor([0])
    one_sample = bootstrap_intervals(probs, labels, metrics=["ece", "ada_ece"], replicates=1000)
    paired = paired_bootstrap_intervals(probs, probs * 0.5 + 0.25, labels, metrics=["ece"], replicates=1000)
    for interval in (*one_sample.values(), *paired.values()):
        assert math.isnan(interval.low) and math.isnan(interval.high) and not interval.excludes_zero
        assert interval.to_dict()["low"] is None and interval.to_dict()["reason"] == "no interval: 1 sample, fewer than the 30 an interval needs"
    assert verdict(paired["ece"]) == "no detectable change at this test size"
    assert one_sample["ece"].point == pytest.approx(0.2)  # the point is still given
    enough = calibrated(MIN_INTERVAL_SAMPLES, 0)
    assert bootstrap_intervals(*enough, metrics=["nll"], replicates=MIN_INTERVAL_REPLICATES)["nll"].reason is None
    few = bootstrap_intervals(*enough, metrics=["nll"], replicates=MIN_INTERVAL_REPLICATES - 1)["nll"]
    assert math.isnan(few.high) and few.reason.startswith("no interval: 99 bootstrap replicates")
    below = bootstrap_intervals(*calibrated(MIN_INTERVAL_SAMPLES - 1, 0), metrics=["nll"], replicates=1000)["nll"]
    assert math.isnan(below.low) and "29 samples" in below.reason


def test_empty_replicates_are_left_out() -> None:
    """A replicate whose weights are all 0 has no metric; if all are, the interval is NaN (None in JSON)."""
    weights = poisson_weights(0, torch.arange(100), torch.tensor([0])).flatten()
    assert 10 < int((weights == 0).sum()) < 60  # N = 1: a replicate is empty with probability e⁻¹
    empty = Draws({"ece": 0.1}, {"ece": torch.full((100,), float("nan"), dtype=torch.float64)}, 100, 0, samples=100)
    interval = empty.intervals(0.95)["ece"]
    assert math.isnan(interval.low) and interval.to_dict()["high"] is None and interval.reason is None


def test_smooth_ece_intervals_streaming_and_paired() -> None:
    """smECE on request: one bandwidth search per replicate, the same in streaming as one-shot."""
    probs, labels = calibrated(150, 3)
    want = bootstrap_intervals(probs, labels, metrics=["smooth_ece", "ece"], replicates=100, seed=2)
    assert want["smooth_ece"].low <= want["smooth_ece"].high
    stream = CalibrationMetrics(4, bootstrap=100, seed=2)
    for start in range(0, 150, 40):
        stream.update(probs[start : start + 40], labels[start : start + 40])
    got = stream.intervals(metrics=["smooth_ece", "ece"])
    assert as_pairs(got)["smooth_ece"] == as_pairs(want)["smooth_ece"]
    assert_close(got, want)
    assert as_pairs(paired_bootstrap_intervals(probs, probs, labels, metrics=["smooth_ece"], replicates=100)) == {
        "smooth_ece": (0.0, 0.0, 0.0)
    }


# ----------------------------------------------------------------------------- streaming


@SETTINGS
@given(datasets(max_n=90), st.lists(st.integers(1, 89), max_size=6), st.integers(0, 1000))
def test_streaming_equals_one_shot_over_any_batch_split(data, cuts: List[int], seed: int) -> None:
    probs, labels, n_bins = data
    edges = sorted({0, probs.shape[0], *(c for c in cuts if c < probs.shape[0])})
    stream = CalibrationMetrics(probs.shape[1], n_bins=n_bins, bootstrap=R, seed=seed)
    for start, stop in zip(edges, edges[1:]):
        stream.update(probs[start:stop], labels[start:stop])
    want = bootstrap_intervals(probs, labels, n_bins=n_bins, replicates=R, seed=seed)
    got = stream.intervals()
    assert_close(got, want)
    if want["ada_ece"].reason is None:
        assert as_pairs(got)["ada_ece"] == as_pairs(want)["ada_ece"]  # same canonical sequence: to the last bit
    assert stream.compute()["intervals"] == {
        name: interval.to_dict() for name, interval in stream.intervals(confidence=0.95).items()
    }


def test_sample_index_makes_batch_order_irrelevant() -> None:
    probs, labels = calibrated(700, 5, num_classes=6)
    permutation = torch.randperm(700, generator=torch.Generator().manual_seed(1))
    shuffled = CalibrationMetrics(6, bootstrap=100, seed=4)
    for part in permutation.split(128):
        shuffled.update(probs[part], labels[part], sample_index=part)
    want = bootstrap_intervals(probs, labels, replicates=100, seed=4)
    assert_close(shuffled.intervals(), want)
    assert as_pairs(shuffled.intervals())["ada_ece"] == as_pairs(want)["ada_ece"]


def test_bootstrap_off_leaves_compute_unchanged() -> None:
    probs, labels = calibrated(300, 2, num_classes=5)
    plain, off, on = CalibrationMetrics(5), CalibrationMetrics(5, bootstrap=0), CalibrationMetrics(5, bootstrap=20)
    for start in range(0, 300, 64):
        for metrics in (plain, off, on):
            metrics.update(probs[start : start + 64], labels[start : start + 64])
    want = plain.compute()
    assert list(want) == ["accuracy", "ece", "mce", "rms_ce", "nll", "brier", "num_samples", "classwise_ece", "ada_ece"]
    assert off.compute() == want and off._replicate_width is None and off._indices == []
    with_intervals = on.compute()
    assert list(with_intervals) == [*want, "intervals"]
    assert {name: with_intervals[name] for name in want} == want  # the same numbers, bit for bit
    assert all(type(with_intervals[name]) is type(want[name]) for name in want)
    assert sorted(with_intervals["intervals"]) == sorted(DEFAULT_METRICS)
    assert all(with_intervals["intervals"][name]["point"] == want[name] for name in DEFAULT_METRICS)


def test_state_is_independent_of_the_number_of_samples() -> None:
    metrics = CalibrationMetrics(3, n_bins=10, bootstrap=50, adaptive=False)
    for seed in range(3):
        metrics.update(*calibrated(400, seed, num_classes=3))
        assert metrics._replicate_width.shape == (50, 3, 10) and metrics._replicate_sums.shape == (50, 2)
    assert metrics._indices == [] and sorted(metrics.intervals()) == sorted(set(DEFAULT_METRICS) - {"ada_ece"})


def test_streaming_paired_intervals() -> None:
    probs, labels = calibrated(600, 7)
    overconfident = torch.softmax(probs.log() * 3.0, dim=1)
    a, b, same = (CalibrationMetrics(4, bootstrap=100, seed=1) for _ in range(3))
    for start in range(0, 600, 100):
        rows = slice(start, start + 100)
        a.update(probs[rows], labels[rows])
        b.update(overconfident[rows], labels[rows])
        same.update(probs[rows], labels[rows])
    want = paired_bootstrap_intervals(probs, overconfident, labels, replicates=100, seed=1)
    assert_close(paired_intervals(a, b), want, tol=1e-11)
    assert all(values == (0.0, 0.0, 0.0) for values in as_pairs(paired_intervals(a, same)).values())
    lean = CalibrationMetrics(4, bootstrap=100, seed=1, adaptive=False)
    lean.update(overconfident, labels)
    assert sorted(paired_intervals(a, lean)) == sorted(set(DEFAULT_METRICS) - {"ada_ece"})


# ----------------------------------------------------------------------------- errors

GOOD_PROBS, GOOD_LABELS = torch.tensor([[0.7, 0.3], [0.4, 0.6]]), torch.tensor([0, 1])


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "100", None])
def test_bad_replicates(bad) -> None:
    with pytest.raises(ValueError, match=r"replicates must be a positive integer, got"):
        bootstrap_intervals(GOOD_PROBS, GOOD_LABELS, replicates=bad)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "10"])
def test_bad_bootstrap(bad) -> None:
    with pytest.raises(ValueError, match=r"bootstrap must be a non-negative integer \(0 turns intervals off\), got"):
        CalibrationMetrics(2, bootstrap=bad)


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, 95, -0.5, True, "0.95", float("nan")])
def test_bad_confidence(bad) -> None:
    with pytest.raises(ValueError, match=r"confidence must be a number strictly between 0 and 1 \(e.g. 0.95 for 95 %\)"):
        bootstrap_intervals(GOOD_PROBS, GOOD_LABELS, confidence=bad)
    stream = CalibrationMetrics(2, bootstrap=5)
    stream.update(GOOD_PROBS, GOOD_LABELS)
    with pytest.raises(ValueError, match="confidence must be"):
        stream.intervals(confidence=bad)


@pytest.mark.parametrize("bad", [1.5, True, "0", None])
def test_bad_seed(bad) -> None:
    with pytest.raises(ValueError, match=r"seed must be an integer, got"):
        bootstrap_intervals(GOOD_PROBS, GOOD_LABELS, seed=bad)
    with pytest.raises(ValueError, match=r"seed must be an integer, got"):
        CalibrationMetrics(2, bootstrap=5, seed=bad)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("ece", r"metrics must be a non-empty list of metric names such as \['ece', 'nll'\], got 'ece'"),
        ([], r"metrics must be a non-empty list"),
        (["ece", "f1"], r"metrics must be names among 'accuracy', 'ece', .*'smooth_ece'; got 'f1'"),
        (["classwise_ece"], r"got 'classwise_ece'"),
    ],
)
def test_bad_metrics(bad, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bootstrap_intervals(GOOD_PROBS, GOOD_LABELS, metrics=bad)


def test_per_sample_metrics_need_adaptive() -> None:
    stream = CalibrationMetrics(2, bootstrap=5, adaptive=False)
    stream.update(GOOD_PROBS, GOOD_LABELS)
    for name in ("ada_ece", "smooth_ece"):
        message = rf"metrics asks for '{name}', but it needs each sample's confidence: build the accumulator with adaptive=True"
        with pytest.raises(ValueError, match=message):
            stream.intervals(metrics=[name])


def test_intervals_need_bootstrap() -> None:
    stream = CalibrationMetrics(2)
    stream.update(GOOD_PROBS, GOOD_LABELS)
    message = r"intervals need bootstrap replicates, but this accumulator has bootstrap=0; build it with CalibrationMetrics\(..., bootstrap=1000\)"
    with pytest.raises(ValueError, match=message):
        stream.intervals()
    with pytest.raises(ValueError, match="no samples were added"):
        CalibrationMetrics(2, bootstrap=5).intervals()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.tensor([[0, 1]]), r"sample_index must be one-dimensional with one index per sample of the batch \(2,\), got shape \(1, 2\)"),
        (torch.tensor([0, 1, 2]), r"one index per sample of the batch \(2,\), got shape \(3,\)"),
        (torch.tensor([0.0, 1.0]), r"sample_index must hold integer sample indices, got dtype torch.float32"),
        (torch.tensor([True, False]), r"sample_index must hold integer sample indices, got dtype torch.bool"),
        (np.array([3, -1]), r"sample_index must be non-negative, got -1"),
        (["a", "b"], r"sample_index holds strings"),
    ],
)
@pytest.mark.parametrize("bootstrap", [0, 5])
def test_bad_sample_index(bad, message: str, bootstrap: int) -> None:
    stream = CalibrationMetrics(2, bootstrap=bootstrap)
    with pytest.raises(ValueError, match=message):
        stream.update(GOOD_PROBS, GOOD_LABELS, sample_index=bad)
    assert stream._width_stats is None or float(stream._width_stats.sum()) == 0.0  # nothing was added


def test_sample_index_for_every_batch_or_none() -> None:
    stream = CalibrationMetrics(2, bootstrap=5)
    stream.update(GOOD_PROBS, GOOD_LABELS, sample_index=[10, 11])
    with pytest.raises(ValueError, match=r"sample_index must be passed with every batch or with none, but earlier batches came with it"):
        stream.update(GOOD_PROBS, GOOD_LABELS)
    stream = CalibrationMetrics(2, bootstrap=5)
    stream.update(GOOD_PROBS, GOOD_LABELS)
    with pytest.raises(ValueError, match="earlier batches came without it; .* Pass it with every batch"):
        stream.update(GOOD_PROBS, GOOD_LABELS, sample_index=[2, 3])
    assert stream.compute()["num_samples"] == 2  # the refused batch left no trace


def _fed(**options) -> CalibrationMetrics:
    stream = CalibrationMetrics(2, **{"bootstrap": 5, **options})
    stream.update(GOOD_PROBS, GOOD_LABELS)
    return stream


@pytest.mark.parametrize(
    ("other", "message"),
    [
        (lambda: _fed(seed=1), r"paired_intervals needs the same seed in both accumulators, but a has seed=0 and b has 1; build both with the same seed"),
        (lambda: _fed(bootstrap=6), r"needs the same bootstrap in both accumulators, but a has bootstrap=5 and b has 6"),
        (lambda: _fed(n_bins=10), r"needs the same n_bins in both accumulators, but a has n_bins=15 and b has 10"),
        (lambda: "model", r"b must be a CalibrationMetrics, got str"),
    ],
)
def test_paired_intervals_refuse_mismatched_accumulators(other, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paired_intervals(_fed(), other())


def test_paired_intervals_refuse_different_samples() -> None:
    more = _fed()
    more.update(GOOD_PROBS, GOOD_LABELS)
    with pytest.raises(ValueError, match=r"needs the same samples in both accumulators, but a saw 2 and b saw 4; feed both every sample once"):
        paired_intervals(_fed(), more)
    shifted = CalibrationMetrics(2, bootstrap=5)
    shifted.update(GOOD_PROBS, GOOD_LABELS, sample_index=[7, 8])
    with pytest.raises(ValueError, match=r"a and b saw different sample indices; pass each sample's sample_index to both"):
        paired_intervals(_fed(), shifted)
    with pytest.raises(ValueError, match="intervals need bootstrap replicates"):
        paired_intervals(_fed(bootstrap=0), _fed(bootstrap=0))


def test_verdict_errors() -> None:
    with pytest.raises(ValueError, match=r"difference must be an Interval \(a value of paired_bootstrap_intervals or paired_intervals\), got dict"):
        verdict({"low": 0.0, "high": 1.0})
    interval = Interval(point=0.0, low=-1.0, high=1.0, confidence=0.95, replicates=10, seed=0)
    with pytest.raises(ValueError, match="lower_is_better must be True or False, got 'no'"):
        verdict(interval, lower_is_better="no")


def test_one_shot_input_errors() -> None:
    with pytest.raises(ValueError, match="each row of probs must sum to 1"):
        bootstrap_intervals(torch.tensor([[0.7, 0.7]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="probs has 2 rows but labels has 3 entries"):
        paired_bootstrap_intervals(GOOD_PROBS, GOOD_PROBS, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match=r"n_bins must be an integer from 1 to 10,000, got 0"):
        paired_bootstrap_intervals(GOOD_PROBS, GOOD_PROBS, GOOD_LABELS, n_bins=0)
    assert adaptive_calibration_error(GOOD_PROBS, GOOD_LABELS) == bootstrap_intervals(GOOD_PROBS, GOOD_LABELS, replicates=3)["ada_ece"].point


# ----------------------------------------------------------------------------- docstrings


@pytest.mark.parametrize(("module", "examples"), [(intervals, 10), (streaming, 3), (functional, 8)])
def test_docstring_examples_run(module, examples: int) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= examples and result.failed == 0


def test_public_names_are_exported() -> None:
    import hf_calibrate.metrics as metrics

    for name in ("Interval", "bootstrap_intervals", "paired_bootstrap_intervals", "paired_intervals", "verdict"):
        assert name in metrics.__all__ and getattr(metrics, name) is not None
