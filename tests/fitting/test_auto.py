"""``method="auto"``: the rule that chooses, the cross-fitted scores it chooses on, and what the result records.

Properties, not scores: every sample's held-out NLL comes from a fit that did not see it (checked against
temperature scaling refitted by hand per fold); temperature scaling is kept unless a paired interval shows
another candidate better, and then the simplest not shown worse than the best is chosen; the result is a
model of the chosen method that saves, loads and shows its choice in its card; what auto cannot use is refused.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from _tiny_models import NUM_CLASSES, plain_data, plain_module
from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import ClassifierLayerError
from hf_calibrate.calibrators import InvalidOptionError, TemperatureScaling, cross_fitting_folds, fit_inverse_temperature
from hf_calibrate.fitting.auto import selection as auto
from hf_calibrate.fitting.auto.selection import AutoOptions, choose, default_logit_candidates
from hf_calibrate.fitting.auto.scoring import Scored, cross_fitted_nll
from hf_calibrate.results.reporting import auto_note, auto_table, seconds_text

CLASSES = 4


def _logits_and_labels(rows: int, seed: int, *, scale: float = 1.0, bias=(0.0, 0.0, 0.0, 0.0)):
    """(rows, 4) logits a model would give, and labels drawn from softmax of the true logits; the model's logits are
    the true ones × ``scale`` + ``bias`` (overconfident for scale > 1, biased per class for a non-zero bias)."""
    generator = torch.Generator().manual_seed(seed)
    true = 2.5 * torch.randn(rows, CLASSES, generator=generator)
    labels = torch.multinomial(torch.softmax(true, dim=1), 1, generator=generator).squeeze(1)
    return scale * true + torch.tensor(bias), labels


def _fit_auto(logits, labels, **options) -> CalibratedModel:
    return CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method="auto", progress=False, **options)


# ----------------------------------------------------------------------------- the rule


def _scored(method: str, nll: torch.Tensor) -> Scored:
    return Scored(method, nll.double())


def _noise(rows: int, seed: int) -> torch.Tensor:
    return 0.05 * torch.randn(rows, generator=torch.Generator().manual_seed(seed))


def test_temperature_scaling_is_kept_unless_an_interval_shows_another_better():
    reference = 0.5 + _noise(400, 0).abs()
    tied = reference + _noise(400, 1)  # no better on average: its interval holds 0
    choice = choose([_scored("temperature", reference), _scored("vector", tied)])
    assert choice.method == "temperature"
    assert "kept" in choice.reason
    assert choice.versus_reference["vector"]["low"] < 0 < choice.versus_reference["vector"]["high"]


def test_a_candidate_shown_better_is_chosen_with_its_interval_in_the_reason():
    reference = 0.5 + _noise(400, 0).abs()
    choice = choose([_scored("temperature", reference), _scored("vector", reference - 0.1 + _noise(400, 1))])
    assert choice.method == "vector"
    assert choice.versus_reference["vector"]["high"] < 0
    assert "95 % interval" in choice.reason


def test_the_simplest_candidate_not_shown_worse_than_the_best_is_chosen():
    reference = 0.5 + _noise(400, 0).abs()
    simpler, best = reference - 0.100 + _noise(400, 1), reference - 0.101 + _noise(400, 2)  # tied with each other
    choice = choose([_scored("temperature", reference), _scored("vector", simpler), _scored("matrix", best)])
    assert choice.method == "vector" and "matrix" in choice.reason
    clearly_best = reference - 0.3 + _noise(400, 3)
    assert choose([_scored("temperature", reference), _scored("vector", simpler), _scored("matrix", clearly_best)]).method == "matrix"


def test_too_few_samples_for_an_interval_keep_temperature_scaling():
    reference = torch.full((20,), 1.0)
    choice = choose([_scored("temperature", reference), _scored("vector", reference - 0.5)])
    assert choice.method == "temperature"
    assert "too few" in choice.reason


def test_left_out_candidates_do_not_take_part():
    reference = 0.5 + _noise(100, 0).abs()
    choice = choose([_scored("temperature", reference), Scored("matrix", None, "matrix needs more data")])
    assert choice.method == "temperature" and "matrix" not in choice.versus_reference


# ----------------------------------------------------------------------------- the scores


def test_each_sample_is_scored_by_a_fit_that_did_not_see_it():
    logits, labels = _logits_and_labels(300, 0, scale=2.0)
    folds = cross_fitting_folds(labels, 5, 0)
    scores = cross_fitted_nll("temperature", TemperatureScaling.Options(), logits, labels, folds)
    expected = torch.empty(len(labels), dtype=torch.float64)
    for fit_rows, held_rows in folds:
        beta = fit_inverse_temperature(logits[fit_rows], labels[fit_rows])[0]
        expected[held_rows] = torch.nn.functional.cross_entropy(beta * logits[held_rows].double(), labels[held_rows], reduction="none")
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- the fitted model


@pytest.fixture(scope="module")
def biased_fit() -> CalibratedModel:
    """auto between temperature and vector scaling on logits with a per-class bias no temperature can undo."""
    logits, labels = _logits_and_labels(300, 1, bias=(2.0, 0.0, 0.0, -2.0))
    return _fit_auto(logits, labels, candidates=["vector"])


def test_a_per_class_bias_makes_auto_choose_vector_scaling(biased_fit):
    assert biased_fit.method == "vector"
    record = biased_fit.fit_summary["auto"]
    assert record["chosen"] == "vector" and record["folds"] == 5 and record["samples"] == 300
    rows = {row["method"]: row for row in record["candidates"]}
    assert list(rows) == ["uncalibrated", "temperature", "vector"]
    assert rows["vector"]["versus_temperature"]["high"] < 0
    assert rows["vector"]["held_out_nll"] < rows["temperature"]["held_out_nll"] < rows["uncalibrated"]["held_out_nll"]


def test_overconfidence_alone_keeps_temperature_scaling():
    logits, labels = _logits_and_labels(200, 2, scale=3.0)
    model = _fit_auto(logits, labels)
    assert model.method == "temperature"
    assert [row["method"] for row in model.fit_summary["auto"]["candidates"]] == ["uncalibrated", *default_logit_candidates(), "neural_clamping"]
    assert model.calibrator.temperature.item() == pytest.approx(3.0, rel=0.25)
    clamping = model.fit_summary["auto"]["candidates"][-1]
    assert "not a candidate without a budget" in clamping["excluded"] and "pass budget=" in clamping["excluded"]


def test_auto_saves_loads_and_says_why_in_its_card(biased_fit, tmp_path):
    biased_fit.save_pretrained(tmp_path)
    loaded = CalibratedModel.from_pretrained(tmp_path, base_model=nn.Identity())
    assert loaded.method == "vector"
    assert loaded.fit_summary["auto"] == biased_fit.fit_summary["auto"]
    card = (tmp_path / "README.md").read_text()
    assert "## Calibration method: vector scaling (chosen by `method=\"auto\"`)" in card
    assert "**Why this method.** auto chose vector" in card
    assert "**Fitted:** pulled towards temperature scaling (T = " in card  # what the chosen fit learnt
    assert "| candidate | held-out NLL | minus temperature scaling |" in card


def test_candidates_below_their_least_data_are_left_out_with_the_reason():
    logits, labels = _logits_and_labels(200, 3, scale=3.0)
    labels = logits.argmax(dim=1)  # the model is never wrong: only temperature scaling can be fitted
    with pytest.warns(UserWarning, match="on the calibration rows: all 200 rows are classified correctly"):  # temperature scaling's own
        model = _fit_auto(logits, labels, candidates=["vector", "isotonic"])
    rows = {row["method"]: row for row in model.fit_summary["auto"]["candidates"]}
    assert model.method == "temperature"
    assert "misclassified" in rows["vector"]["excluded"] and "misclassified" in rows["isotonic"]["excluded"]
    assert rows["vector"]["held_out_nll"] is None


def test_a_fold_below_a_candidates_least_data_is_named_as_the_fold_not_the_data():
    """12 rows: each of the 5 folds fits on 9 or 10 of them, below isotonic's 10; the reason says so, not that the
    user's data (12 rows) are below it."""
    logits, labels = _logits_and_labels(12, 4)
    model = _fit_auto(logits, labels, candidates=["isotonic"])
    reason = {row["method"]: row for row in model.fit_summary["auto"]["candidates"]}["isotonic"]["excluded"]
    assert "each fold's fitting rows (one of auto's 5 folds fits on 9 of the 12 rows)" in reason
    assert "calibration data" not in reason


def test_per_class_methods_are_left_out_when_classes_are_absent():
    """No held-out row of an absent class exists, so cross-fitting cannot see a per-class map hurt it: a per-class
    bias that vector scaling would fix is not enough to choose it with class 2 missing."""
    logits, labels = _logits_and_labels(300, 6, bias=(2.0, 0.0, 0.0, -2.0))
    kept = labels != 2
    model = _fit_auto(logits[kept], labels[kept], candidates=["vector", "matrix", "isotonic"])
    rows = {row["method"]: row for row in model.fit_summary["auto"]["candidates"]}
    for method in ("vector", "matrix"):
        assert "1 of the 4 classes are absent" in rows[method]["excluded"] and rows[method]["held_out_nll"] is None
    assert rows["isotonic"]["excluded"] is None  # top-label: no per-class parameters
    assert model.method in ("temperature", "isotonic")


def test_the_fit_seed_reaches_the_chosen_methods_own_options():
    """auto's vector fit is the by-name fit at l2 = 1 (auto's paired rule is its check against TS) with the same seed:
    same options, same parameters."""
    logits, labels = _logits_and_labels(150, 7, bias=(2.0, 0.0, 0.0, -2.0))
    data = TensorDataset(logits, labels)
    chosen = _fit_auto(logits, labels, candidates=["vector"], seed=7)
    by_name = CalibratedModel.fit(nn.Identity(), data, method="vector", seed=7, l2=1.0, progress=False)
    assert chosen.method == "vector" and chosen.provenance["options"] == by_name.provenance["options"]
    assert chosen.provenance["options"]["seed"] == 7
    torch.testing.assert_close(chosen(logits), by_name(logits))


def test_more_folds_than_rows_are_said():
    logits, labels = _logits_and_labels(12, 8, scale=2.0)
    with pytest.warns(UserWarning, match="folds=20 is more than the 12 calibration rows; 12 folds were used"):
        model = _fit_auto(logits, labels, candidates=["isotonic"], folds=20)
    assert model.fit_summary["auto"]["folds"] == 12


# ----------------------------------------------------------------------------- Neural Clamping under a budget


@pytest.fixture(scope="module")
def clamping_fit() -> CalibratedModel:
    """auto between temperature scaling and Neural Clamping, with a budget; through ``nn.Identity`` δ is a per-class
    bias of the logits, which the bias in these logits asks for."""
    logits, labels = _logits_and_labels(300, 9, bias=(2.0, 0.0, 0.0, -2.0))
    return _fit_auto(logits, labels, candidates=["neural_clamping"], budget=600)


def test_neural_clamping_takes_part_under_a_budget_on_its_own_fits_evidence(clamping_fit):
    """Neural Clamping's row is its own cross-fitted difference to temperature scaling, put on auto's scale: the
    paired mean in auto's table is the one its fit selected by."""
    assert clamping_fit.method == "neural_clamping"
    record = clamping_fit.fit_summary["auto"]
    row = next(row for row in record["candidates"] if row["method"] == "neural_clamping")
    own = clamping_fit.fit_summary["selection"]["nll_difference"]
    assert row["excluded"] is None and row["seconds"] > 0 and row["versus_temperature"]["high"] < 0
    assert row["versus_temperature"]["point"] == pytest.approx(own["point"], abs=1e-9)
    assert record["budget"] == 600 and record["neural_clamping_estimate"] > 0


def test_neural_clamping_row_and_note_say_how_it_was_scored_and_what_budget_admitted_it(clamping_fit):
    """Its row was not scored on auto's folds but by its own fit's: the table and the note say so, and the note gives
    the budget and the estimate it was admitted by."""
    record = clamping_fit.fit_summary["auto"]
    row = next(row for row in record["candidates"] if row["method"] == "neural_clamping")
    assert row["scored_by"].startswith(f"scored by its own fit's {clamping_fit.fit_summary['folds']}-fold cross-fitting")
    assert all(other["scored_by"] is None for other in record["candidates"][1:-1])
    note, table = auto_note(clamping_fit.fit_summary), auto_table(clamping_fit.fit_summary)
    assert note.startswith("auto chose neural_clamping by held-out NLL on the 300 calibration samples")
    assert "(neural_clamping was scored by its own fit's 2-fold cross-fitting" in note
    assert f"estimated at {seconds_text(record['neural_clamping_estimate'])}; the budget was 600 s." in note
    assert "**chosen**; scored by its own fit's" in table


def test_auto_chosen_neural_clamping_saves_and_loads(clamping_fit, tmp_path):
    logits, _ = _logits_and_labels(20, 10)
    clamping_fit.save_pretrained(tmp_path)
    loaded = CalibratedModel.from_pretrained(tmp_path, base_model=nn.Identity())
    assert loaded.method == "neural_clamping" and loaded.fit_summary["auto"] == clamping_fit.fit_summary["auto"]
    torch.testing.assert_close(loaded(logits), clamping_fit(logits))


def test_neural_clamping_outside_the_budget_is_left_out_saying_what_would_admit_it():
    logits, labels = _logits_and_labels(120, 11)
    model = _fit_auto(logits, labels, candidates=["neural_clamping"], budget=1e-6)
    row = model.fit_summary["auto"]["candidates"][-1]
    assert row["method"] == "neural_clamping" and row["held_out_nll"] is None and model.method == "temperature"
    assert "more than the 0 s left of budget=1e-06" in row["excluded"] and "raise budget to at least" in row["excluded"]
    assert "neural_clamping" not in {row["method"] for row in _fit_auto(logits, labels, candidates=["vector"]).fit_summary["auto"]["candidates"]}


def test_a_stream_read_once_leaves_neural_clamping_out_with_the_fix():
    logits, labels = _logits_and_labels(200, 12)
    batches = ((logits[start:start + 50], labels[start:start + 50]) for start in range(0, 200, 50))
    model = CalibratedModel.fit(nn.Identity(), batches, method="auto", candidates=["neural_clamping"], budget=600, progress=False)
    row = model.fit_summary["auto"]["candidates"][-1]
    assert row["method"] == "neural_clamping" and "can be read only once" in row["excluded"] and "lambda: make_batches()" in row["excluded"]
    assert model.method == "temperature"


# ----------------------------------------------------------------------------- head methods, when named


def test_a_named_head_method_is_cross_fitted_on_the_base_features():
    """MaC-Cal (the cheapest head: 30 epochs) takes part when named: its row has a held-out NLL from fits that did
    not see each row (the same folds as the logit candidates), and the rule then chooses as it does for any row."""
    module = plain_module(0)
    model = CalibratedModel.fit(module, plain_data(module), method="auto", candidates=["mac_cal"], progress=False)
    rows = {row["method"]: row for row in model.fit_summary["auto"]["candidates"]}
    assert list(rows) == ["uncalibrated", "temperature", "mac_cal"]
    assert rows["mac_cal"]["excluded"] is None and rows["mac_cal"]["held_out_nll"] > 0 and rows["mac_cal"]["seconds"] > 0
    difference = rows["mac_cal"]["versus_temperature"]
    assert model.method == ("mac_cal" if difference["high"] < 0 else "temperature")


def _two_classifier_layers() -> nn.Module:
    """A model with two ``nn.Linear`` layers of C outputs: which one a head replaces is the user's to name."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, NUM_CLASSES), nn.Tanh(), nn.Linear(NUM_CLASSES, NUM_CLASSES)).eval()


def _auto_choosing(monkeypatch, method: str):
    """auto's rule, with its choice replaced by ``method`` (to reach what a chosen head gives, whatever its score)."""
    real = auto.choose
    monkeypatch.setattr(auto, "choose", lambda scored, groups=None: dataclasses.replace(real(scored, groups), method=method))


def test_a_head_chosen_by_auto_is_its_fit_by_name_on_the_layer_auto_was_told(monkeypatch):
    """auto's head is the by-name fit (the same weights, from the cached features), replacing the layer named with
    ``classifier=``; naming it silences the guess's warning."""
    module = _two_classifier_layers()
    data = plain_data(plain_module(0))  # every class present
    _auto_choosing(monkeypatch, "mac_cal")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = CalibratedModel.fit(module, data, method="auto", candidates=["mac_cal"], classifier="2", progress=False)
    by_name = CalibratedModel.fit(module, data, method="mac_cal", classifier="2", progress=False)
    assert chosen.method == "mac_cal" and chosen.calibrator.classifier == by_name.calibrator.classifier == "2"
    assert chosen.fit_summary["auto"]["options"] == {"candidates": ["mac_cal"], "folds": None, "budget": None, "classifier": "2"}
    assert not [warning for warning in caught if "nn.Linear layers" in str(warning.message)]
    inputs = data.tensors[0]
    torch.testing.assert_close(chosen(inputs), by_name(inputs))


@pytest.mark.parametrize("chosen, warns", [("mac_cal", True), ("temperature", False)])
def test_the_guessed_layers_warning_is_the_users_only_when_a_head_is_chosen(monkeypatch, chosen, warns):
    module = _two_classifier_layers()
    _auto_choosing(monkeypatch, chosen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CalibratedModel.fit(module, plain_data(plain_module(0)), method="auto", candidates=["mac_cal"], progress=False)
    guessed = [str(warning.message) for warning in caught if "nn.Linear layers" in str(warning.message)]
    assert bool(guessed) == warns
    assert all("Pass classifier='2' to keep this choice" in message for message in guessed)


def test_a_named_layer_whose_output_is_not_the_logits_is_the_users_error_under_auto():
    """Layer "0" has one output per class, but the model transforms it further: a head in its place would be scored
    on outputs that are not the model's; auto raises (the user named it) rather than leave the heads out."""
    module = _two_classifier_layers()
    with pytest.raises(ClassifierLayerError, match="'0' .* does not output its logits .* the model transforms it further.*\\['2'\\]"):
        CalibratedModel.fit(module, plain_data(plain_module(0)), method="auto", candidates=["mac_cal"], classifier="0", progress=False)


def test_head_methods_are_left_out_when_classes_are_absent():
    module = plain_module(0)
    data = plain_data(module)
    kept = [index for index in range(len(data)) if int(data[index][1]) != 0]
    model = CalibratedModel.fit(module, torch.utils.data.Subset(data, kept), method="auto", candidates=["mac_cal"], progress=False)
    row = model.fit_summary["auto"]["candidates"][-1]
    assert row["method"] == "mac_cal" and "classes are absent" in row["excluded"] and model.method == "temperature"


# ----------------------------------------------------------------------------- what auto refuses


@pytest.mark.parametrize("options, words", [
    ({"candidates": ["focal"]}, ("focal", "tst, vtst, mac_cal", "Fit another method by name")),
    ({"candidates": ["neural_clamping"]}, ("neural_clamping together with budget=<seconds>",)),
    ({"budget": 0}, ("budget", "a positive number in (0, 604800]")),
    ({"candidates": ["vector", "vector"]}, ("distinct",)),
    ({"candidates": "vector"}, ("a list whose items are each a string, or None", "Write candidates=['vector']")),
    ({"candidates": []}, ("non-empty list", "leave it out")),
    ({"folds": 1}, ("folds", "2 to 20")),
    ({"candidates": ["vector"], "budget": 60}, ("budget", "neural_clamping named among the candidates")),
    ({"classifier": "0"}, ("classifier", "a head method (tst, vtst, mac_cal) named among the candidates")),
    ({"candidates": ["vector"], "classifier": "0"}, ("classifier", "names the layer a head replaces")),
    ({"epochs": 3}, ("epochs", "budget, candidates, classifier, folds")),
])
def test_options_auto_cannot_use_are_refused_naming_the_fix(options, words):
    logits, labels = _logits_and_labels(100, 4)
    with pytest.raises((InvalidOptionError, TypeError)) as caught:
        _fit_auto(logits, labels, **options)
    for word in words:
        assert word in str(caught.value)


def test_temperature_scaling_is_always_a_candidate():
    assert AutoOptions(candidates=["isotonic", "vector"]).methods() == ["temperature", "vector", "isotonic"]
    assert AutoOptions().methods() == list(default_logit_candidates())


@pytest.mark.parametrize("method", ["auto", "temperature"])
def test_selection_data_a_method_would_not_read_are_refused(method):
    logits, labels = _logits_and_labels(100, 5)
    data = TensorDataset(logits, labels)
    with pytest.raises(ValueError, match="does not read validation_data"):
        CalibratedModel.fit(nn.Identity(), data, method=method, validation_data=data, progress=False)
    with pytest.raises(ValueError, match="does not read temperature_data"):
        CalibratedModel.fit(nn.Identity(), data, method=method, temperature_data=data, progress=False)


@pytest.mark.parametrize("seconds, text", [(1198.4, "1,198 s"), (0.43, "0.43 s"), (0.0061, "0.0061 s"), (0.0, "0 s")])
def test_durations_read_alike_in_the_note_and_the_rows(seconds, text):
    assert seconds_text(seconds) == text
