"""How results name what they were computed on (:mod:`hf_calibrate.results.reporting`): one place for the card, the
diagram, the CLI and the warnings of ``fit``."""

from __future__ import annotations

import re

import datasets
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.data import identity
from hf_calibrate.results import reporting


@pytest.mark.parametrize(
    ("available", "used", "expected"),
    [
        (["validation", "test"], {"validation"}, "test"),
        (["train", "calibration", "validation"], {"calibration"}, "validation"),
        (["calibration", "test"], {"calibration", "test"}, None),  # test is the --validation-split: not held out
        (["train", "validation"], {"validation"}, None),  # the base's training data never count as held out
        (["validation"], {"validation"}, None),
    ],
)
def test_held_out_split_is_one_the_fit_does_not_use(available, used, expected):
    assert reporting.held_out_split(available, used) == expected


def test_sources_are_named_by_what_the_user_gave(tmp_path):
    folder = tmp_path / "bbc"
    folder.mkdir()
    (folder / "validation.csv").write_text("text,label\n")
    assert identity.source_display_name(str(folder)) == "bbc"
    assert identity.source_display_name(f"{folder}/") == "bbc"
    assert identity.source_display_name(str(folder / "validation.csv")) == "validation.csv"
    assert identity.source_display_name("SetFit/bbc-news") == "SetFit/bbc-news"


def test_data_are_named_by_their_dataset_not_by_the_reader_of_their_files():
    rows = datasets.Dataset.from_dict({"x": [1, 2]}, info=datasets.DatasetInfo(dataset_name="imagefolder"),
                                      split="validation")
    assert (identity.data_display_name(rows), identity.data_split(rows)) == ("local imagefolder files", "validation")
    named = datasets.Dataset.from_dict({"x": [1]}, info=datasets.DatasetInfo(dataset_name="bbc-news"))
    assert (identity.data_display_name(named), identity.data_split(named)) == ("bbc-news", None)
    assert identity.data_display_name(datasets.Dataset.from_dict({"x": [1]})) == "datasets.Dataset"
    tensors = TensorDataset(torch.zeros(2, 3), torch.zeros(2))
    assert identity.data_display_name(tensors) == identity.data_display_name(DataLoader(tensors)) == "TensorDataset"
    assert identity.data_fingerprint(tensors) is None and identity.data_fingerprint(named) == named._fingerprint


def test_labels_of_evaluations():
    evaluation = {"dataset": "digits", "split": "test", "calibrated": {"num_samples": 450}, "in_sample": False,
                  "calibration_dataset": "digits", "calibration_split": "validation"}
    assert reporting.evaluation_label(evaluation) == "digits, test split, 450 samples"
    assert reporting.calibration_label(evaluation) == "digits, validation split"
    assert reporting.model_index_dataset_name(evaluation) == "digits"
    assert reporting.in_sample_warning(evaluation, ["validation", "test"]) is None
    in_sample = {**evaluation, "split": "validation", "in_sample": True}
    assert reporting.evaluation_label(in_sample).endswith("(in-sample: data the calibration was fitted on, so optimistic)")
    assert reporting.model_index_dataset_name(in_sample) == "digits (in-sample: the calibration data)"
    assert "--eval-split" in reporting.in_sample_warning(in_sample, ["validation"])
    whole = {**in_sample, "in_sample_rows": {"calibration": 450, "total": 450}}
    assert reporting.evaluation_label(whole) == reporting.evaluation_label(in_sample)


def test_labels_of_partly_in_sample_evaluations_say_how_many_rows():
    """30 calibration rows among 450 are not 'the calibration data': every label gives the count."""
    partly = {"dataset": "digits", "split": "test", "calibrated": {"num_samples": 450}, "in_sample": True,
              "in_sample_rows": {"calibration": 30, "total": 450}}
    assert reporting.evaluation_label(partly) == (
        "digits, test split, 450 samples (partly in-sample: 30 of 450 rows are data the calibration was fitted on, so "
        "optimistic)")
    assert reporting.model_index_dataset_name(partly) == "digits (partly in-sample: 30 of 450 rows are calibration data)"
    assert reporting.in_sample_warning(partly, ["test"]).startswith(
        "these results are partly in-sample: 30 of 450 rows of the split 'test' are data the calibration was fitted on")


INTERVAL = {"point": -0.0098, "low": -0.0177, "high": -0.00001, "confidence": 0.95, "replicates": 1000, "seed": 0}


def test_interval_ends_show_the_side_of_zero_they_lie_on():
    assert reporting.interval_text(INTERVAL, signed=True) == "[-0.0177, -1.0e-05]"  # not "-0.0000", read as "holds 0"
    assert reporting.interval_text({**INTERVAL, "high": 0.0}, signed=True) == "[-0.0177, +0.0000]"
    assert reporting.interval_text({**INTERVAL, "low": 0.01, "high": 0.02}) == "[0.0100, 0.0200]"
    assert reporting.interval_text(None) == "" and reporting.interval_text({**INTERVAL, "low": None}) == ""
    too_few = {**INTERVAL, "low": None, "high": None, "reason": "no interval: 1 sample, fewer than the 30 an interval needs"}
    assert reporting.interval_text(too_few) == "(no interval)"  # never an empty cell a reader takes for a forgotten one


def test_values_and_changes_carry_their_intervals_when_there_are_any():
    evaluation = {
        "uncalibrated": {"ece": 0.05, "intervals": {"ece": {**INTERVAL, "low": 0.03, "high": 0.07}}},
        "calibrated": {"ece": 0.02},
        "difference": {"ece": {**INTERVAL, "low": -0.04, "high": -0.01}},
        "verdicts": {"ece": "improved", "nll": "no detectable change at this test size", "brier": "made worse"},
    }
    assert reporting.value_text(evaluation, "uncalibrated", "ece") == "0.0500 [0.0300, 0.0700]"
    assert reporting.value_text(evaluation, "calibrated", "ece") == "0.0200"
    assert reporting.change_text(evaluation, "ece") == "-0.0300 [-0.0400, -0.0100]"
    assert reporting.verdict_summary(evaluation) == (
        "ECE improved; NLL: no detectable change at this test size; Brier made worse")
    assert reporting.verdict_summary({}) is None and reporting.bootstrap_note({}) is None


def test_the_interval_note_claims_pairing_only_for_two_sides():
    settings = {"replicates": 1000, "seed": 0, "confidence": 0.95}
    plain = reporting.bootstrap_note({"uncalibrated": {}, "bootstrap": settings})
    assert plain == "[low, high]: 95% Poisson-bootstrap intervals (1000 replicates, seed 0)"
    assert "paired" in reporting.bootstrap_note({"uncalibrated": {}, "calibrated": {}, "bootstrap": settings})


def test_a_change_too_small_for_four_decimals_shows_its_sign():
    evaluation = {"uncalibrated": {"ece": 0.01}, "calibrated": {"ece": 0.01 - 2e-6}}
    assert reporting.change_text(evaluation, "ece") == "-2.0e-06"


def test_the_fallback_note_names_the_criterion_the_fit_selected_on():
    """A record without ``select_metric`` (written before it was recorded) used the default, held-out NLL."""
    from hf_calibrate.calibrators.neural_clamping import recorded_select_metric

    summary = {"fell_back_to_temperature_scaling": True, "holdout_samples": 24,
               "temperature_scaling": {"holdout_nll": 0.5, "holdout_ece": 0.07, "fallback_temperature": 1.5}}
    assert recorded_select_metric({}) == recorded_select_metric(None) == "nll"
    assert "held-out nll 0.5000" in reporting.fallback_note(summary, recorded_select_metric({}))
    assert "held-out ece 0.0700" in reporting.fallback_note(summary, recorded_select_metric({"select_metric": "ece"}))
    assert reporting.fallback_note(dict(summary, fell_back_to_temperature_scaling=False), "nll") is None


def test_every_metric_results_name_has_one_entry_in_the_catalog():
    """Titles, model-index types and directions come from one table (:mod:`hf_calibrate.metrics.catalog`)."""
    from hf_calibrate.results import evaluation
    from hf_calibrate.metrics import intervals
    from hf_calibrate.metrics.catalog import CARD_METRICS, HIGHER_IS_BETTER, METRIC_INFO

    assert reporting.METRICS == tuple((info.key, info.title) for info in CARD_METRICS)
    assert [key for key, _ in reporting.METRICS] == ["accuracy", "ece", "ada_ece", "smooth_ece", "classwise_ece", "nll",
                                                     "brier", "mce"]
    assert all(info.card_type == info.key for info in CARD_METRICS)  # the model-index types the Hub has seen
    assert set(evaluation.INTERVAL_METRICS) <= set(reporting.METRIC_NAMES)  # compare's ranking metrics have a title
    assert HIGHER_IS_BETTER == intervals.HIGHER_IS_BETTER == {"accuracy"}
    assert METRIC_INFO["classwise_ece"].short_title == "cw-ECE" and METRIC_INFO["accuracy"].short_title == "acc"


@pytest.mark.parametrize("method, options, expected", [
    ("temperature", {}, r"^T = \d"),
    ("vector", {"l2": 0.5}, r"^pulled towards temperature scaling \(T = [\d.]+\) with l2 = 0.5$"),
    ("isotonic", {"prior": 5.0}, r"^prior m = 5 pseudo-samples"),
    ("structured_matrix", {}, r"^a linear map on temperature scaling's log-probabilities \(T = [\d.]+, uniform mixture ε = [\d.e-]+\), ridge l2 = 1$"),
    ("neural_clamping", {"epochs": 1, "lr": 0.1}, r"^T = [\d.]+, ‖δ‖₂ = [\d.e-]+$"),
])
def test_what_a_fit_learnt_is_said_from_its_summary(method, options, expected):
    """The card's and the CLI's "fitted" line: T, δ's norm, the l2 pull, the prior; the numbers are the fit's."""
    base = tm.plain_module()
    model = CalibratedModel.fit(base, tm.plain_data(base), method=method, progress=False, **options)
    text = reporting.fitted_text(method, model.fit_summary)
    assert re.search(expected, text), text
    if method in ("temperature", "neural_clamping"):
        assert f"T = {float(model.calibrator.temperature):.4g}" in text


def test_a_fallback_says_delta_is_zero():
    summary = {"fell_back_to_temperature_scaling": True, "temperature_scaling": {"fallback_temperature": 1.5}}
    assert reporting.fitted_text("neural_clamping", summary) == "T = 1.5, δ = 0 (fell back to temperature scaling)"
    assert reporting.fitted_text("tst", {}) is None
