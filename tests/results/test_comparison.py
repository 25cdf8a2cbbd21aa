"""``hf_calibrate.results.comparison.compare``: several calibrations of one base ranked on the same test data.

Every row is checked against what the metrics' own functions give on the models' outputs in dataset
order: its points are those of ``evaluate``, its difference to the best is the one-shot paired bootstrap
with the same seed, and "tied" means exactly that this paired interval holds 0.
"""

from __future__ import annotations

import copy
import doctest
import json
import math

import pytest
import torch

import _tiny_models as tm
from hf_calibrate.results import comparison, reporting
from hf_calibrate.results.comparison import (IMPROVED, MADE_WORSE, NO_DIFFERENCE, UNCALIBRATED, compare, diagram,
                                             guard_verdict, markdown_table, verdict_text, write)
from hf_calibrate.metrics import Interval, paired_bootstrap_intervals

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
            assert row["versus_uncalibrated"] == {} and row["made_worse"] == row["improved"] == []
            assert row["verdict"] is None
            continue
        want = paired_bootstrap_intervals(_outputs(models, row["name"]), _outputs(models, UNCALIBRATED), labels,
                                          metrics=["nll", "brier"], replicates=REPLICATES, seed=2, from_logits=True)
        for key in ("nll", "brier"):
            got = row["versus_uncalibrated"][key]
            assert [got[end] for end in ("point", "low", "high")] == pytest.approx([want[key].point, want[key].low, want[key].high],
                                                                                   rel=1e-6, abs=1e-9)
        assert row["made_worse"] == [key for key in ("nll", "brier") if row["versus_uncalibrated"][key]["low"] > 0]
        assert row["improved"] == [key for key in ("nll", "brier") if row["versus_uncalibrated"][key]["high"] < 0]
        want_verdict = MADE_WORSE if row["made_worse"] else IMPROVED if row["improved"] else NO_DIFFERENCE
        assert row["verdict"] == want_verdict


def test_a_calibration_that_makes_the_nll_worse_is_flagged_whatever_its_ece_rank(models):
    """A temperature far too low (T = e^-4: near-hard argmax) makes NLL and Brier worse than no calibration: flagged
    in the row and the table, when ranked by ECE too."""
    overconfident = copy.deepcopy(models["models"]["temperature"])
    with torch.no_grad():
        overconfident.calibrator.log_temperature.fill_(-4.0)
    result = compare({"overconfident": overconfident}, models["test"], metric="ece", bootstrap=REPLICATES, seed=2, progress=False)
    row = next(row for row in result["rows"] if row["name"] == "overconfident")
    assert row["made_worse"] == ["nll", "brier"] and row["improved"] == [] and row["verdict"] == MADE_WORSE
    assert "| **made worse: NLL, Brier** |" in markdown_table(result)


def test_a_calibration_that_clearly_helps_is_marked_improved(models):
    """Labels drawn from softmax(50 · logits): the base is far under-confident, and T = 1/50 makes its NLL and Brier
    detectably better: "improved" in the row, the table and the figure's order."""
    sharp = copy.deepcopy(models["models"]["temperature"])
    tm.set_temperature(sharp, 1 / 50)
    test = tm.image_data(models["base"], 120, seed=1, sharpness=50.0)
    result = compare({"sharp": sharp}, test, bootstrap=REPLICATES, seed=2, progress=False)
    row = next(row for row in result["rows"] if row["name"] == "sharp")
    assert all(row["versus_uncalibrated"][key]["high"] < 0 for key in ("nll", "brier"))  # the premise
    assert row["improved"] == ["nll", "brier"] and row["made_worse"] == [] and row["verdict"] == IMPROVED
    assert "| sharp | " in markdown_table(result) and "| improved: NLL, Brier |" in markdown_table(result)


def _interval(low: float, high: float, point: float = None) -> Interval:
    point = (low + high) / 2 if point is None else point
    return Interval(point=point, low=low, high=high, confidence=0.95, replicates=REPLICATES, seed=0)


@pytest.mark.parametrize(("low", "high", "samples", "metric", "expected"), [
    (-0.03, -0.01, 120, "nll", IMPROVED),  # wholly below 0: better
    (0.01, 0.03, 120, "nll", MADE_WORSE),  # wholly above 0: worse
    (-0.01, 0.03, 120, "brier", NO_DIFFERENCE),  # holds 0
    (-0.03, 0.0, 120, "nll", NO_DIFFERENCE),  # an end at 0 holds it
    (0.0, 0.03, 120, "nll", NO_DIFFERENCE),
    (0.0, 0.0, 120, "nll", NO_DIFFERENCE),  # the same outputs: no change at all
    (math.nan, math.nan, 120, "nll", NO_DIFFERENCE),  # no interval
    (-0.03, -0.01, 30, "nll", IMPROVED),  # MIN_INTERVAL_SAMPLES: enough
    (-0.03, -0.01, 29, "nll", NO_DIFFERENCE),  # fewer: no change is detected either way
    (0.01, 0.03, 29, "nll", NO_DIFFERENCE),
    (0.01, 0.03, 120, "accuracy", IMPROVED),  # higher is better: above 0 is better
    (-0.03, -0.01, 120, "accuracy", MADE_WORSE),
])
def test_guard_verdict_reads_where_the_whole_interval_lies(low, high, samples, metric, expected):
    assert guard_verdict(_interval(low, high), samples, metric) == expected


@pytest.mark.parametrize(("fields", "expected"), [
    ({"verdict": None, "improved": [], "made_worse": []}, "–"),
    ({"verdict": NO_DIFFERENCE, "improved": [], "made_worse": []}, NO_DIFFERENCE),
    ({"verdict": IMPROVED, "improved": ["nll"], "made_worse": []}, "improved: NLL"),
    ({"verdict": MADE_WORSE, "improved": [], "made_worse": ["nll", "brier"]}, "**made worse: NLL, Brier**"),
    ({"verdict": MADE_WORSE, "improved": ["nll"], "made_worse": ["brier"]}, "**made worse: Brier**; improved: NLL"),
])
def test_the_vs_uncalibrated_cell_says_each_verdict(fields, expected):
    assert verdict_text(fields) == expected


@pytest.mark.parametrize(("seconds", "expected"), [(None, "–"), (0.0042, "0.0042 s"), (0.035, "0.035 s"), (1.234, "1 s"),
                                                  (185.2, "185 s"), (1198.4, "1,198 s")])
def test_fit_times_are_written_with_their_unit(seconds, expected):
    assert reporting.fit_time_text(seconds) == expected


def test_fit_times_reach_the_rows_and_the_table(models):
    """A time for some models: theirs in their rows and the "fit time" column, "–" for the rest and the base."""
    result = compare(models["models"], models["test"], bootstrap=REPLICATES, progress=False, fit_seconds={"vector": 0.035})
    seconds = {row["name"]: row["fit_seconds"] for row in result["rows"]}
    assert seconds == {UNCALIBRATED: None, "temperature": None, "histogram": None, "vector": 0.035}
    header, _, *lines = markdown_table(result).split("\n")[2:-1]
    assert header.endswith("| fit time |")
    for line in lines:
        name, cell = line.split(" | ")[0].lstrip("| "), line.rstrip(" |").split(" | ")[-1]
        assert cell == ("0.035 s" if name == "vector" else "–"), line


@pytest.mark.parametrize(("fit_seconds", "message"), [
    ([0.1], "fit_seconds must be a mapping"),
    ({"nope": 0.1}, r"fit_seconds names models that models does not hold: \['nope'\]"),
    ({"vector": -1.0}, "finite number of seconds >= 0"),
    ({"vector": math.nan}, "finite number of seconds >= 0"),
    ({"vector": True}, "finite number of seconds >= 0"),
    ({"vector": "1 s"}, "finite number of seconds >= 0"),
])
def test_refuses_fit_times_it_cannot_show(models, fit_seconds, message):
    with pytest.raises(ValueError, match=message):
        compare(models["models"], models["test"], bootstrap=REPLICATES, progress=False, fit_seconds=fit_seconds)


def test_the_figure_shows_the_rows_in_rank_order_titled_by_the_ranking_metric(result):
    """Panel k is the k-th row of the table: its rank and name, its ranking metric with interval, its own bins."""
    figure = diagram({**result, "reliability": dict(reversed(result["reliability"].items()))})  # not in rank order
    panels = figure.axes[0::2]
    assert len(panels) == len(result["rows"])
    for rank, (ax, row) in enumerate(zip(panels, result["rows"]), start=1):
        first, *rest = ax.get_title().split("\n")
        interval = f"[{row['interval']['low']:.4f}, {row['interval']['high']:.4f}]"
        assert first == f"{rank}. {row['name']}" and " ".join(rest) == f"NLL {row['metrics']['nll']:.4f} {interval}"
        bins = result["reliability"][row["name"]]
        heights = [bar.get_height() for bar in next(c for c in ax.containers if c.get_label() == "accuracy")]
        assert heights == pytest.approx([a for a, n in zip(bins["accuracy"], bins["counts"]) if n > 0])
    assert figure.get_suptitle().endswith("ranked by NLL")


def test_docstring_examples_run():
    outcome = doctest.testmod(comparison)
    assert outcome.attempted >= 2 and outcome.failed == 0


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
    record = json.loads((tmp_path / "out" / "comparison.json").read_text(encoding="utf-8"))
    assert all({"verdict", "improved", "made_worse", "fit_seconds"} <= set(row) for row in record["rows"])
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


def test_a_method_that_ties_the_base_on_accuracy_ranks_above_it(models):
    """Temperature scaling keeps the argmax, so it ties the base on accuracy: "best" names the method, not the base."""
    result = compare({"temperature": models["models"]["temperature"]}, models["test"], metric="accuracy",
                     bootstrap=REPLICATES, seed=2, progress=False)
    accuracies = {row["name"]: row["metrics"]["accuracy"] for row in result["rows"]}
    assert accuracies["temperature"] == accuracies[UNCALIBRATED]
    assert [row["name"] for row in result["rows"]] == ["temperature", UNCALIBRATED]
