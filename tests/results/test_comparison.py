"""``hf_calibrate.results.comparison.compare``: several calibrations of one base ranked on the same test data.

Every row is checked against what the metrics' own functions give on the models' outputs in dataset
order: its points are those of ``evaluate``, its difference to the best is the one-shot paired bootstrap
with the same seed, and "tied" means exactly that this paired interval holds 0.
"""

from __future__ import annotations

import copy

import pytest
import torch

import _tiny_models as tm
from hf_calibrate.results.comparison import UNCALIBRATED, compare, markdown_table, write
from hf_calibrate.metrics import paired_bootstrap_intervals

pytestmark = pytest.mark.usefixtures("single_thread")
REPLICATES = 200


@pytest.fixture(scope="module")
def models():
    base = tm.tiny_timm()
    calibration, test = tm.image_data(base, 96, seed=0), tm.image_data(base, 120, seed=1)
    fitted = {method: tm.fit(base, calibration, method) for method in ("temperature", "histogram", "vector")}
    return {"base": base, "test": test, "models": fitted}


@pytest.fixture(scope="module")
def result(models):
    return compare(models["models"], models["test"], bootstrap=REPLICATES, seed=2, progress=False)


def _outputs(models, name):
    inputs, _ = models["test"].tensors
    with torch.no_grad():
        model = models["base"] if name == UNCALIBRATED else models["models"][name]
        return model(inputs).float()


def test_rows_are_ranked_best_first_and_hold_every_model_and_the_base(result, models):
    names = [row["name"] for row in result["rows"]]
    assert sorted(names) == sorted([UNCALIBRATED, *models["models"]])
    values = [row["metrics"][result["metric"]] for row in result["rows"]]  # NLL, the default ranking metric
    assert values == sorted(values)
    assert list(result["reliability"]) == [UNCALIBRATED, *models["models"]]


def test_each_rows_points_are_what_evaluate_gives(result, models):
    for row in result["rows"]:
        model = models["models"].get(row["name"]) or next(iter(models["models"].values()))
        evaluation = model.evaluate(models["test"], bootstrap=0, progress=False)
        side = evaluation["uncalibrated" if row["name"] == UNCALIBRATED else "calibrated"]
        for key in ("accuracy", "ece", "nll", "brier", "smooth_ece"):
            assert row["metrics"][key] == pytest.approx(side[key], rel=1e-9, abs=1e-12), (row["name"], key)


def test_differences_to_the_best_are_paired_bootstrap_intervals_and_ties_hold_zero(result, models):
    assert result["metric"] == "nll"  # a proper score by default
    best = result["rows"][0]
    assert best["versus_best"] is None and best["tied_with_best"]
    _, labels = models["test"].tensors
    for row in result["rows"][1:]:
        want = paired_bootstrap_intervals(_outputs(models, row["name"]), _outputs(models, best["name"]), labels,
                                          metrics=["nll"], replicates=REPLICATES, seed=2, from_logits=True)["nll"]
        got = row["versus_best"]
        assert [got[key] for key in ("point", "low", "high")] == pytest.approx([want.point, want.low, want.high], rel=1e-6, abs=1e-9)
        assert row["tied_with_best"] == (got["low"] <= 0.0 <= got["high"])


def test_every_method_is_held_against_the_uncalibrated_model_on_nll_and_brier(result, models):
    """Whatever the ranking metric: the paired interval row − uncalibrated of NLL and Brier, and "made worse" exactly
    when it lies above 0."""
    _, labels = models["test"].tensors
    for row in result["rows"]:
        if row["name"] == UNCALIBRATED:
            assert row["versus_uncalibrated"] == {} and row["made_worse"] == []
            continue
        want = paired_bootstrap_intervals(_outputs(models, row["name"]), _outputs(models, UNCALIBRATED), labels,
                                          metrics=["nll", "brier"], replicates=REPLICATES, seed=2, from_logits=True)
        for key in ("nll", "brier"):
            got = row["versus_uncalibrated"][key]
            assert [got[end] for end in ("point", "low", "high")] == pytest.approx([want[key].point, want[key].low, want[key].high],
                                                                                   rel=1e-6, abs=1e-9)
        assert row["made_worse"] == [key for key in ("nll", "brier") if row["versus_uncalibrated"][key]["low"] > 0]


def test_a_calibration_that_makes_the_nll_worse_is_flagged_whatever_its_ece_rank(models):
    """A temperature far too low (T = e^-4: near-hard argmax) makes NLL and Brier worse than no calibration: flagged
    in the row and the table, when ranked by ECE too."""
    overconfident = copy.deepcopy(models["models"]["temperature"])
    with torch.no_grad():
        overconfident.calibrator.log_temperature.fill_(-4.0)
    result = compare({"overconfident": overconfident}, models["test"], metric="ece", bootstrap=REPLICATES, seed=2, progress=False)
    row = next(row for row in result["rows"] if row["name"] == "overconfident")
    assert row["made_worse"] == ["nll", "brier"]
    assert "**made worse: NLL, Brier**" in markdown_table(result)


def test_a_model_compared_with_itself_is_tied_at_exactly_zero(models):
    ts = models["models"]["temperature"]
    result = compare({"a": ts, "b": ts}, models["test"], bootstrap=REPLICATES, progress=False)
    a, b = (next(row for row in result["rows"] if row["name"] == name) for name in ("a", "b"))
    assert a["metrics"] == b["metrics"]
    if a["versus_best"] is None or b["versus_best"] is None:  # one of them is the best: the other differs by 0
        second = b if a["versus_best"] is None else a
        assert {key: second["versus_best"][key] for key in ("point", "low", "high")} == {"point": 0.0, "low": 0.0, "high": 0.0}
        assert second["tied_with_best"]
    else:  # the base is the best: both differ from it alike
        assert a["versus_best"] == b["versus_best"] and a["tied_with_best"] == b["tied_with_best"]


def test_models_fitted_on_the_ranked_data_are_named_and_flagged(models):
    ts = models["models"]["temperature"]
    calibration = tm.image_data(models["base"], 64, seed=3)
    own = tm.fit(models["base"], calibration, "histogram")
    result = compare({"ts": ts, "own": own}, calibration, bootstrap=REPLICATES, progress=False)
    assert result["in_sample"] == ["own"]
    assert markdown_table(result).startswith("**In-sample for own**")
    assert compare({"ts": ts}, models["test"], bootstrap=REPLICATES, progress=False)["in_sample"] == []


def test_no_interval_counts_as_a_tie(models):
    """One test sample with R replicates: a replicate may hold it 0 times; with all empty there are no ends."""
    from torch.utils.data import Subset

    result = compare(models["models"], Subset(models["test"], [0]), bootstrap=REPLICATES, progress=False)
    assert all(isinstance(row["tied_with_best"], bool) for row in result["rows"])


def test_markdown_table_and_files(result, tmp_path):
    table = markdown_table(result)
    assert table.count("\n| ") == len(result["rows"]) + 1  # header and one line per row
    assert "| best |" in table and f"{REPLICATES} replicates, seed 2" in table
    write(result, table, tmp_path / "out")
    assert (tmp_path / "out" / "comparison.md").read_text(encoding="utf-8") == table
    assert (tmp_path / "out" / "comparison.png").read_bytes().startswith(b"\x89PNG")
    assert not [path for path in (tmp_path / "out").iterdir() if path.name.startswith(".")]  # no temporary left


def test_refuses_what_it_cannot_rank(models):
    ts, test = models["models"]["temperature"], models["test"]
    other = tm.fit(tm.tiny_timm(seed=1), tm.image_data(tm.tiny_timm(seed=1), 64, seed=0), "temperature")
    cases = [
        ({}, {}, "non-empty mapping"),
        ({"ts": object()}, {}, "must be a CalibratedModel"),
        ({UNCALIBRATED: ts}, {}, "other than 'uncalibrated'"),
        ({"ts": ts, "other": other}, {}, "different base models"),
        ({"ts": ts}, {"metric": "classwise_ece"}, "metric must be one of"),
        ({"ts": ts}, {"bootstrap": 0}, "bootstrap must be >= 100"),
        ({"ts": ts}, {"bootstrap": 50}, "at least 100 replicates"),
    ]
    for given, options, message in cases:
        with pytest.raises(ValueError, match=message):
            compare(given, test, progress=False, **options)


def test_a_copy_of_a_model_is_the_same_base(models):
    ts = models["models"]["temperature"]
    result = compare({"ts": ts, "copy": copy.deepcopy(ts)}, models["test"], bootstrap=REPLICATES, progress=False)
    assert {row["name"] for row in result["rows"]} == {UNCALIBRATED, "ts", "copy"}
