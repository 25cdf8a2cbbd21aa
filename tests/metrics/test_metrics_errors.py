"""Every documented ValueError of hf_calibrate.metrics, with the message a user would act on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
    reliability_bins,
)

GOOD_PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
GOOD_LABELS = torch.tensor([0, 2])


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one thread


# Every public entry point that validates (probs, labels).
ENTRY_POINTS = {
    "ece": expected_calibration_error,
    "ada_ece": adaptive_calibration_error,
    "mce": maximum_calibration_error,
    "classwise": classwise_calibration_error,
    "nll": negative_log_likelihood,
    "brier": brier_score,
    "accuracy": accuracy,
    "reliability": reliability_bins,
    "report": calibration_report,
    "stream": lambda probs, labels, **kw: CalibrationMetrics(3).update(probs, labels, **kw),
}


@pytest.fixture(params=sorted(ENTRY_POINTS))
def metric(request):
    return ENTRY_POINTS[request.param]


def test_good_inputs_pass(metric) -> None:
    metric(GOOD_PROBS, GOOD_LABELS)  # the baseline the error cases below deviate from


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("position", [0, -1])
def test_non_finite_probabilities(metric, bad: float, position: int) -> None:
    probs = GOOD_PROBS.clone()
    probs.view(-1)[position] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        metric(probs, GOOD_LABELS)
    with pytest.raises(ValueError, match="NaN or infinite"):
        metric(probs, GOOD_LABELS, from_logits=True)


def test_non_finite_found_anywhere_in_a_large_input() -> None:
    probs = torch.full((100_000, 4), 0.25)
    labels = torch.zeros(100_000, dtype=torch.long)
    for row in (0, 54_321, 99_999):
        for bad in (float("nan"), float("inf")):
            corrupted = probs.clone()
            corrupted[row, 3] = bad
            with pytest.raises(ValueError, match="NaN or infinite"):
                expected_calibration_error(corrupted, labels)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_values_outside_unit_interval(metric, value: float) -> None:
    probs = GOOD_PROBS.clone()
    probs[0, 0] = value
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\].*softmax.*from_logits=True"):
        metric(probs, GOOD_LABELS)


def test_rows_not_summing_to_one(metric) -> None:
    probs = torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.3, 0.6]])
    with pytest.raises(ValueError, match=r"row 0 sums to 0\.8.*softmax.*from_logits=True"):
        metric(probs, GOOD_LABELS)
    # the same scores as logits are fine
    metric(probs, GOOD_LABELS, from_logits=True)


def test_row_sum_tolerance_depends_on_dtype() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1 + 5e-3], [0.1, 0.3, 0.6]])
    with pytest.raises(ValueError, match="sum to 1"):
        expected_calibration_error(probs, GOOD_LABELS)  # float32: tolerance 1e-3
    expected_calibration_error(probs.half(), GOOD_LABELS)  # float16: tolerance 1e-2


@pytest.mark.parametrize("labels, bad", [([0, 3], 3), ([-1, 0], -1), ([0, 100], 100)])
def test_labels_out_of_range(metric, labels, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"label {bad} is outside the valid range \[0, 2\] for 3 classes"):
        metric(GOOD_PROBS, torch.tensor(labels))


@pytest.mark.parametrize(
    "labels",
    [torch.tensor([0.0, 2.0]), torch.tensor([True, False]), np.array([0.0, 2.0]), np.array([True, False]), [0.0, 2.0]],
    ids=["torch-float", "torch-bool", "numpy-float", "numpy-bool", "list-float"],
)
def test_non_integer_labels(metric, labels) -> None:
    with pytest.raises(ValueError, match="labels must be integer class indices.*argmax.*long"):
        metric(GOOD_PROBS, labels)


def test_two_dimensional_labels(metric) -> None:
    with pytest.raises(ValueError, match=r"labels must be one-dimensional \(N,\), got shape \(2, 3\)"):
        metric(GOOD_PROBS, torch.nn.functional.one_hot(GOOD_LABELS, 3))


def test_shape_mismatch(metric) -> None:
    with pytest.raises(ValueError, match="probs has 2 rows but labels has 3 entries"):
        metric(GOOD_PROBS, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("shape", [(3,), (2, 3, 1), ()])
def test_probs_not_two_dimensional(metric, shape) -> None:
    with pytest.raises(ValueError, match="probs must be two-dimensional"):
        metric(torch.full(shape, 0.5), GOOD_LABELS)


def test_empty_input(metric) -> None:
    with pytest.raises(ValueError, match="probs is empty: at least one sample"):
        metric(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))


def test_zero_classes(metric) -> None:
    with pytest.raises(ValueError, match="zero classes"):
        metric(torch.zeros(2, 0), GOOD_LABELS)


@pytest.mark.parametrize("probs", [torch.tensor([[1, 0], [0, 1]]), np.array([[1, 0], [0, 1]])], ids=["torch", "numpy"])
def test_integer_probabilities(metric, probs) -> None:
    with pytest.raises(ValueError, match="probs must be floating point"):
        metric(probs, torch.tensor([0, 1]))


def test_unreadable_inputs() -> None:
    with pytest.raises(ValueError, match="probs has dtype object"):
        expected_calibration_error(np.array([[0.5, 0.5], None], dtype=object), GOOD_LABELS)
    with pytest.raises(ValueError, match="probs could not be read as a numeric array"):
        expected_calibration_error([[0.5, 0.5], [0.5]], GOOD_LABELS)


BINNED = {
    "ece": expected_calibration_error,
    "ada_ece": adaptive_calibration_error,
    "mce": maximum_calibration_error,
    "classwise": classwise_calibration_error,
    "reliability": reliability_bins,
    "report": calibration_report,
}


@pytest.mark.parametrize("name", sorted(BINNED))
@pytest.mark.parametrize("n_bins", [0, -3, 1.5, 15.0, "15", True, None, 10_001, 10**9])
def test_bad_n_bins(name: str, n_bins) -> None:
    with pytest.raises(ValueError, match=r"n_bins must be an integer from 1 to 10,000, got"):
        BINNED[name](GOOD_PROBS, GOOD_LABELS, n_bins=n_bins)


def test_numpy_integer_n_bins_accepted() -> None:
    assert expected_calibration_error(GOOD_PROBS, GOOD_LABELS, n_bins=np.int64(10)) == expected_calibration_error(
        GOOD_PROBS, GOOD_LABELS, n_bins=10
    )


@pytest.mark.parametrize("n_bins", [0, 2.0, False])
def test_accumulator_bad_n_bins(n_bins) -> None:
    with pytest.raises(ValueError, match="n_bins must be an integer from 1 to 10,000"):
        CalibrationMetrics(3, n_bins=n_bins)


@pytest.mark.parametrize("binning", ["equal-width", "adaptive", "EQUAL_WIDTH", ""])
def test_bad_binning_name(binning: str) -> None:
    with pytest.raises(ValueError, match=r"binning must be one of 'equal_width', 'equal_mass'; got"):
        expected_calibration_error(GOOD_PROBS, GOOD_LABELS, binning=binning)


@pytest.mark.parametrize("norm", ["L1", "inf", "l3", "mce"])
def test_bad_norm_name(norm: str) -> None:
    with pytest.raises(ValueError, match=r"norm must be one of 'l1', 'l2', 'max'; got"):
        expected_calibration_error(GOOD_PROBS, GOOD_LABELS, norm=norm)


def test_device_mismatch(metric) -> None:
    """A meta tensor stands in for an accelerator tensor: the check runs before any data is read."""
    with pytest.raises(ValueError, match="probs is on meta but labels is on cpu; move both to one device"):
        metric(GOOD_PROBS.to("meta"), GOOD_LABELS)
    with pytest.raises(ValueError, match="probs is on cpu but labels is on meta"):
        metric(GOOD_PROBS, GOOD_LABELS.to("meta"))


@pytest.mark.parametrize("num_classes", [0, -1, 2.0, True, "3", None])
def test_accumulator_bad_num_classes(num_classes) -> None:
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1"):
        CalibrationMetrics(num_classes)


def test_accumulator_wrong_number_of_classes() -> None:
    metrics = CalibrationMetrics(4)
    with pytest.raises(ValueError, match="built for 4 classes but the batch has 3 columns"):
        metrics.update(GOOD_PROBS, GOOD_LABELS)
    metrics = CalibrationMetrics(2)  # labels are checked against the batch's own columns first
    with pytest.raises(ValueError, match="built for 2 classes but the batch has 3 columns"):
        metrics.update(GOOD_PROBS, torch.tensor([0, 1]))


def test_accumulator_compute_before_update() -> None:
    metrics = CalibrationMetrics(3)
    with pytest.raises(ValueError, match=r"no samples were added: call update\(\)"):
        metrics.compute()
    with pytest.raises(ValueError, match="no samples were added"):
        metrics.reliability()
    metrics.update(GOOD_PROBS, GOOD_LABELS)
    metrics.compute()
    metrics.reset()
    with pytest.raises(ValueError, match="no samples were added"):
        metrics.compute()


def test_accumulator_device_change_between_batches() -> None:
    metrics = CalibrationMetrics(3)
    metrics.update(GOOD_PROBS, GOOD_LABELS)
    with pytest.raises(ValueError, match="holds its state on cpu but the batch is on meta"):
        metrics.update(GOOD_PROBS.to("meta"), GOOD_LABELS.to("meta"), validate=False)
    assert metrics.compute()["num_samples"] == 2  # the rejected batch left no trace


def test_failed_update_leaves_state_unchanged() -> None:
    metrics = CalibrationMetrics(3)
    metrics.update(GOOD_PROBS, GOOD_LABELS)
    before = metrics.compute()
    with pytest.raises(ValueError):
        metrics.update(torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([0]))
    assert metrics.compute() == before


def test_sizes_of_an_evaluation_are_bounded_before_anything_is_allocated() -> None:
    """n_bins=10**9 or bootstrap=10**9 would allocate 24 GB / 360 GB: both are refused before anything is allocated."""
    from torch import nn
    from torch.utils.data import TensorDataset

    from hf_calibrate import CalibratedModel
    from hf_calibrate.metrics import bootstrap_intervals

    logits = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(40) % 3
    model = CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method="temperature", progress=False)
    with pytest.raises(ValueError, match="n_bins must be an integer from 1 to 10,000, got 1000000000: pass e.g. n_bins=15"):
        model.evaluate(TensorDataset(logits, labels), n_bins=10**9)
    with pytest.raises(ValueError, match="bootstrap must be at most 100,000, got 1000000000"):
        model.evaluate(TensorDataset(logits, labels), bootstrap=10**9)
    with pytest.raises(ValueError, match="replicates must be at most 100,000, got"):
        bootstrap_intervals(torch.softmax(logits, 1), labels, replicates=10**9)
