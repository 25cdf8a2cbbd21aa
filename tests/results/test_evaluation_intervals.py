"""``CalibratedModel.evaluate``'s intervals, paired differences and verdicts, against the metrics' own functions.

The evaluation runs the base and the calibrated model over the test data and feeds both accumulators
each sample under its dataset index; so its intervals must be exactly those of the one-shot bootstrap on
the two models' outputs in dataset order, with the engine's seed — whatever the batch size.
"""

from __future__ import annotations

import json

import pytest
import torch
from _results import flat

import _tiny_models as tm
from hf_calibrate.results.evaluation import INTERVAL_METRICS
from hf_calibrate.metrics.intervals import MIN_INTERVAL_SAMPLES
from hf_calibrate.metrics import bootstrap_intervals, paired_bootstrap_intervals, smooth_calibration_error

pytestmark = pytest.mark.usefixtures("single_thread")
REPLICATES = 200


@pytest.fixture(scope="module")
def scored():
    """A temperature-scaled tiny CNN, its test data, and both models' logits on them in dataset order."""
    base = tm.tiny_timm()
    calibrated = tm.fit(base, tm.image_data(base, 64, seed=0), "temperature")
    test = tm.image_data(base, 96, seed=1)
    inputs, labels = test.tensors
    with torch.no_grad():
        before, after = base(inputs).float(), calibrated(inputs).float()
    return {"model": calibrated, "test": test, "labels": labels, "before": before, "after": after}


def _interval(interval) -> dict:
    return {key: getattr(interval, key) for key in ("point", "low", "high")}


@pytest.mark.parametrize("batch_size", (7, 96))
def test_intervals_are_the_one_shot_bootstrap_of_the_outputs_in_dataset_order(scored, batch_size):
    evaluation = scored["model"].evaluate(scored["test"], bootstrap=REPLICATES, seed=5, batch_size=batch_size, progress=False)
    labels = scored["labels"]
    for side, logits in (("uncalibrated", scored["before"]), ("calibrated", scored["after"])):
        want = bootstrap_intervals(logits, labels, metrics=list(INTERVAL_METRICS), replicates=REPLICATES, seed=5, from_logits=True)
        got = evaluation[side]["intervals"]
        assert set(got) == set(INTERVAL_METRICS)
        for name in INTERVAL_METRICS:
            assert (got[name]["replicates"], got[name]["seed"]) == (REPLICATES, 5)
            assert {key: got[name][key] for key in ("point", "low", "high")} == pytest.approx(
                _interval(want[name]), rel=1e-5, abs=1e-7), (side, name)
    paired = paired_bootstrap_intervals(scored["after"], scored["before"], labels, metrics=list(INTERVAL_METRICS),
                                        replicates=REPLICATES, seed=5, from_logits=True)
    for name in INTERVAL_METRICS:
        assert {key: evaluation["difference"][name][key] for key in ("point", "low", "high")} == pytest.approx(
            _interval(paired[name]), rel=1e-5, abs=1e-7), name


def test_smooth_ece_point_and_plain_json(scored):
    evaluation = scored["model"].evaluate(scored["test"], bootstrap=REPLICATES, progress=False)
    assert json.loads(json.dumps(evaluation)) == evaluation
    for side, logits in (("uncalibrated", scored["before"]), ("calibrated", scored["after"])):
        want = smooth_calibration_error(logits, scored["labels"], from_logits=True)
        assert evaluation[side]["smooth_ece"] == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert evaluation["bootstrap"] == {"replicates": REPLICATES, "seed": 0, "confidence": 0.95}


def test_temperature_scaling_keeps_accuracy_so_its_change_is_exactly_zero(scored):
    evaluation = scored["model"].evaluate(scored["test"], bootstrap=REPLICATES, progress=False)
    assert flat(evaluation["difference"]["accuracy"]) | {"confidence": 0} == {
        "point": 0.0, "low": 0.0, "high": 0.0, "confidence": 0, "replicates": REPLICATES, "seed": 0}
    assert evaluation["verdicts"]["accuracy"] == "unchanged"  # not "no detectable change": it is exactly 0


def test_verdicts_read_the_paired_intervals(scored):
    evaluation = scored["model"].evaluate(scored["test"], bootstrap=REPLICATES, progress=False)
    for name, interval in evaluation["difference"].items():
        better = interval["high"] < 0 if name != "accuracy" else interval["low"] > 0
        worse = interval["low"] > 0 if name != "accuracy" else interval["high"] < 0
        exact = interval["point"] == interval["low"] == interval["high"] == 0.0
        want = "improved" if better else "made worse" if worse else "unchanged" if exact else "no detectable change at this test size"
        assert evaluation["verdicts"][name] == want, name


@pytest.mark.parametrize("bootstrap", (-1, 1.5, True, "100", 1, 99))
def test_a_bad_bootstrap_is_refused_before_any_work(scored, bootstrap):
    with pytest.raises(ValueError, match="bootstrap"):
        scored["model"].evaluate(scored["test"], bootstrap=bootstrap, progress=False)


def test_bootstrap_zero_gives_points_only(scored):
    evaluation = scored["model"].evaluate(scored["test"], bootstrap=0, progress=False)
    assert not {"difference", "verdicts", "bootstrap"} & set(evaluation)
    assert "intervals" not in evaluation["calibrated"] and "smooth_ece" in evaluation["calibrated"]


@pytest.mark.parametrize("samples", [1, MIN_INTERVAL_SAMPLES - 1])
def test_too_few_test_samples_give_no_interval_and_no_verdict(scored, samples, tmp_path):
    """One sample: every replicate resamples it, so an interval would have zero width (the probe saw ECE
    [2.66e-05, 2.66e-05] called 95 %). Below 30 samples no metric, side or difference has an interval: its ends are
    None and its reason says why; no verdict rests on it; the record of it saves and loads."""
    from torch.utils.data import Subset

    few = scored["model"].evaluate(Subset(scored["test"], range(samples)), bootstrap=REPLICATES, progress=False)
    intervals = [*few["uncalibrated"]["intervals"].values(), *few["calibrated"]["intervals"].values(), *few["difference"].values()]
    assert intervals and all(interval["low"] is None and interval["high"] is None for interval in intervals)
    assert {interval["reason"] for interval in intervals} == {
        f"no interval: {samples} sample{'s' if samples > 1 else ''}, fewer than the {MIN_INTERVAL_SAMPLES} an interval needs"}
    assert set(few["verdicts"].values()) == {"no detectable change at this test size"}
    assert few["calibrated"]["ece"] is not None  # the points are still there
    scored["model"].save_pretrained(tmp_path / "model")
    loaded = type(scored["model"]).from_pretrained(tmp_path / "model", base_model=scored["model"].base_model)
    assert loaded.last_evaluation["difference"]["ece"]["reason"] == few["difference"]["ece"]["reason"]
    enough = scored["model"].evaluate(Subset(scored["test"], range(MIN_INTERVAL_SAMPLES)), bootstrap=REPLICATES, progress=False)
    assert enough["difference"]["ece"]["low"] is not None and "reason" not in enough["difference"]["ece"]


def test_a_plain_models_evaluation_is_the_uncalibrated_side(scored):
    """``evaluate_plain_model`` (an uncalibrated model's own metrics, as the CLI shows them) gives the points and
    intervals of a calibrated evaluation's uncalibrated side, in the same shape."""
    from hf_calibrate.scoring import evaluate_plain_model

    options = dict(bootstrap=REPLICATES, seed=5, progress=False)
    calibrated = scored["model"].evaluate(scored["test"], **options)
    plain = evaluate_plain_model(scored["model"].base_model, scored["test"], n_bins=15, dataset_name="test", split=None, **options)
    assert set(plain) == {"uncalibrated", "reliability", "dataset", "split", "n_bins", "bootstrap"}
    assert plain["bootstrap"] == calibrated["bootstrap"]
    assert flat(plain["uncalibrated"]) == pytest.approx(flat(calibrated["uncalibrated"]), rel=1e-6, abs=1e-9)
