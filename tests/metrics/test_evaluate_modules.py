"""The Hugging Face ``evaluate`` modules in ``evaluate_metrics/`` are exact, thin wrappers
over :mod:`hf_calibrate.metrics`, load offline, take every option as an explicit parameter, and their documented
examples run; each folder is ready to push as a metric Space."""

from __future__ import annotations

import doctest
import importlib.metadata
import inspect
import re
import runpy
import sys
import uuid
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
import yaml

import hf_calibrate
from hf_calibrate import metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULES_DIR = REPO_ROOT / "evaluate_metrics"

# Folder name -> the hf_calibrate call the module must reproduce, as the module's output dict.
REFERENCE = {
    "ece": lambda p, y, **kw: {"ece": metrics.expected_calibration_error(p, y, **kw)},
    "classwise_ece": lambda p, y, **kw: {"classwise_ece": metrics.classwise_calibration_error(p, y, **kw)},
    "nll": lambda p, y, **kw: {"nll": metrics.negative_log_likelihood(p, y, **kw)},
    "brier": lambda p, y, **kw: {"brier": metrics.brier_score(p, y, **kw)},
    "calibration": lambda p, y, **kw: metrics.calibration_report(p, y, **kw),
}
NAMES = sorted(REFERENCE)
# Folder name -> the hf_calibrate function whose keyword options (and their defaults) the module takes.
LIBRARY_FUNCTION = {
    "ece": metrics.expected_calibration_error,
    "classwise_ece": metrics.classwise_calibration_error,
    "nll": metrics.negative_log_likelihood,
    "brier": metrics.brier_score,
    "calibration": metrics.calibration_report,
}
# The colours the Hub takes for a Space's thumbnail gradient (its Spaces configuration reference).
SPACE_THUMBNAIL_COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
CLASS_NAMES = {
    "ece": "Ece", "classwise_ece": "ClasswiseEce", "nll": "Nll", "brier": "Brier", "calibration": "Calibration"
}


@pytest.fixture(autouse=True)
def offline_from_repo_root(hf_home, monkeypatch):
    """Every test loads modules by their folder path relative to the repository root."""
    monkeypatch.chdir(REPO_ROOT)


def load(name: str, *, will_fail: bool = False) -> evaluate.EvaluationModule:
    """Load a module by its folder path in the checkout (``evaluate_metrics/<name>``, from the repository root).

    In evaluate 0.4.6 a ``compute`` that raises keeps its instance's cache-file lock until the
    instance is garbage-collected, and each later instance with the same ``experiment_id``
    waits 1 s for that lock; an instance meant to fail gets an ``experiment_id`` of its own.
    """
    return evaluate.load(f"evaluate_metrics/{name}", experiment_id=uuid.uuid4().hex if will_fail else None)


def random_probs(num_samples: int = 257, num_classes: int = 7, seed: int = 0):
    """Over-confident float64 probabilities (softmax of scaled Gaussian logits) and labels."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal((num_samples, num_classes))
    labels = rng.integers(0, num_classes, num_samples)
    return torch.softmax(torch.from_numpy(logits), dim=1).numpy(), labels, logits


def run_doctests(text: str, name: str) -> doctest.TestResults:
    test = doctest.DocTestParser().get_doctest(text, {}, name, name, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)
    return result


@pytest.mark.parametrize("name", NAMES)
def test_loads_offline_into_the_tmp_cache(name, hf_home):
    metric = load(name)
    assert isinstance(metric, evaluate.Metric)
    assert type(metric).__name__ == CLASS_NAMES[name]  # not evaluate's abstract-by-convention base
    assert metric.name == name
    assert list(metric.features) == ["predictions", "references"]
    copied = Path(sys.modules[type(metric).__module__].__file__)
    assert copied.is_relative_to(hf_home / "modules") and copied.name == f"{name}.py"


@pytest.mark.parametrize("name", NAMES)
def test_compute_matches_hf_calibrate_exactly(name):
    probs, labels, _ = random_probs()
    assert load(name).compute(predictions=probs, references=labels) == REFERENCE[name](probs, labels)


@pytest.mark.parametrize("name", NAMES)
def test_add_batch_and_add_equal_one_shot(name):
    probs, labels, _ = random_probs()
    expected = load(name).compute(predictions=probs, references=labels)

    batched = load(name)
    for start, stop in [(0, 50), (50, 51), (51, 200), (200, len(labels))]:
        batched.add_batch(predictions=probs[start:stop], references=labels[start:stop])
    assert batched.compute() == expected

    one_by_one = load(name)
    for row, label in zip(probs, labels):
        one_by_one.add(prediction=row, reference=label)
    assert one_by_one.compute() == expected


@pytest.mark.parametrize("name", NAMES)
def test_from_logits_equals_softmax_then_compute(name):
    probs, labels, logits = random_probs(seed=1)
    from_logits = load(name).compute(predictions=logits, references=labels, from_logits=True)
    assert from_logits == load(name).compute(predictions=probs, references=labels)
    assert from_logits == REFERENCE[name](logits, labels, from_logits=True)
    with pytest.raises(ValueError, match="from_logits=True"):  # the logits are not probabilities
        load(name, will_fail=True).compute(predictions=logits, references=labels)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("ece", {"n_bins": 4}),
        ("ece", {"binning": "equal_mass"}),
        ("ece", {"norm": "l2"}),
        ("ece", {"norm": "max", "n_bins": 7}),
        ("classwise_ece", {"n_bins": 4}),
        ("calibration", {"n_bins": 4}),
    ],
)
def test_kwargs_pass_through(name, kwargs):
    probs, labels, _ = random_probs(num_samples=300, seed=2)
    result = load(name).compute(predictions=probs, references=labels, **kwargs)
    assert result == REFERENCE[name](probs, labels, **kwargs)
    assert result != REFERENCE[name](probs, labels)  # the kwargs changed the value


def test_unknown_kwarg_is_rejected_naming_the_options_and_the_batches_are_kept():
    metric = load("ece", will_fail=True)
    metric.add_batch(predictions=[[0.3, 0.7], [0.8, 0.2]], references=[1, 0])
    with pytest.raises(ValueError, match=r"ece: unknown option\(s\) 'n_bin'; the options are n_bins, binning, norm, "
                                         r"from_logits, bootstrap, seed\. Check the spelling"):
        metric.compute(n_bin=10)
    assert metric.compute(n_bins=10) == load("ece").compute(predictions=[[0.3, 0.7], [0.8, 0.2]], references=[1, 0], n_bins=10)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("predictions", "references", "message"),
    [
        ([[0.3, 0.7], [0.6, 0.4]], [1, 2], r"label 2 is outside the valid range \[0, 1\]"),
        ([[0.3, 0.9], [0.6, 0.4]], [1, 0], r"row 0 sums to 1\.2.*from_logits=True"),
        ([[0.3, 0.7], [1.0]], [1, 0], "probs could not be read as a numeric array"),
        ([[float("nan"), 0.7]], [1], "NaN"),
        ([[0.3, 0.7], [0.6, 0.4]], [1], r"Mismatch in the number of predictions \(2\) and references \(1\)"),
    ],
    ids=["label-out-of-range", "row-sum", "ragged-rows", "nan", "length-mismatch"],
)
def test_bad_input_gives_a_clear_value_error(name, predictions, references, message):
    with pytest.raises(ValueError, match=message):
        load(name, will_fail=True).compute(predictions=predictions, references=references)


@pytest.mark.parametrize(
    ("name", "kwargs"), [("ece", {"n_bins": 0}), ("ece", {"norm": "l3"}), ("calibration", {"n_bins": 1.5})]
)
def test_bad_kwargs_give_a_clear_value_error(name, kwargs):
    with pytest.raises(ValueError, match="n_bins must be|norm must be"):
        load(name, will_fail=True).compute(predictions=[[0.3, 0.7]], references=[1], **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_every_option_is_an_explicit_parameter_with_the_library_default(name):
    """No ``**kwargs`` (evaluate's own module test refuses them), the options of the library function with its
    defaults, plus ``bootstrap=0`` and ``seed=0`` where intervals are offered; each documented in both places."""
    parameters = inspect.signature(type(load(name))._compute).parameters
    assert all(parameter.kind is parameter.POSITIONAL_OR_KEYWORD for parameter in parameters.values())
    assert list(parameters)[:3] == ["self", "predictions", "references"]
    options = {option: parameter.default for option, parameter in list(parameters.items())[3:]}
    library = inspect.signature(LIBRARY_FUNCTION[name]).parameters.values()
    expected = {parameter.name: parameter.default for parameter in library if parameter.kind is parameter.KEYWORD_ONLY}
    assert options == {**expected, **({"bootstrap": 0, "seed": 0} if name in BOOTSTRAP_NAMES else {})}
    card = (MODULES_DIR / name / "README.md").read_text(encoding="utf-8")
    for option in options:
        assert re.search(rf"^    {option} \(`", load(name).inputs_description, re.M), f"{name}: {option} undocumented"
        assert f"- **{option}** (" in card, f"{name}/README.md: {option} undocumented"


@pytest.mark.parametrize("name", NAMES)
def test_kwargs_description_examples_run(name):
    result = run_doctests(load(name).inputs_description, f"{name}._KWARGS_DESCRIPTION")
    assert result.attempted >= 3


@pytest.mark.parametrize("name", NAMES)
def test_metric_card(name):
    card = (MODULES_DIR / name / "README.md").read_text(encoding="utf-8")
    front_matter = yaml.safe_load(re.match(r"---\n(.*?)\n---\n", card, re.S).group(1))
    assert set(front_matter) >= {
        "title", "emoji", "colorFrom", "colorTo", "sdk", "sdk_version", "app_file", "pinned", "tags", "description"
    }
    assert {"evaluate", "metric"} <= set(front_matter["tags"])
    assert (front_matter["sdk"], front_matter["sdk_version"]) == ("gradio", "3.19.1")  # evaluate's widget API
    assert {front_matter["colorFrom"], front_matter["colorTo"]} <= SPACE_THUMBNAIL_COLORS
    assert (MODULES_DIR / name / front_matter["app_file"]).is_file()
    for section in ["Metric Description", "How to Use", "Inputs", "Output Values", "Examples",
                    "Limitations and Bias", "Citation", "Further References"]:
        assert re.search(rf"^#+ {section}$", card, re.M), f"{name}/README.md lacks '{section}'"
    # The card's examples run as doctests (code fences blanked so they do not end an output).
    result = run_doctests(re.sub(r"^```.*$", "", card, flags=re.M), f"{name}/README.md")
    assert result.attempted >= 3


@pytest.mark.parametrize("name", NAMES)
def test_space_requirements_pin_the_tested_evaluate_and_this_hf_calibrate(name):
    """The Space installs the evaluate these modules are tested with and the hf_calibrate they ship in."""
    requirements = (MODULES_DIR / name / "requirements.txt").read_text(encoding="utf-8").split()
    evaluate_version = importlib.metadata.version("evaluate")
    assert requirements == [f"evaluate=={evaluate_version}", f"hf-calibrate=={hf_calibrate.__version__}"]


@pytest.mark.parametrize("name", NAMES)
def test_space_app_launches_the_widget_of_its_metric(name, monkeypatch):
    launched = []
    monkeypatch.setattr(evaluate.utils, "launch_gradio_widget", launched.append)
    runpy.run_path(str(MODULES_DIR / name / "app.py"))
    assert [metric.name for metric in launched] == [name]


# ----------------------------------------------------------------------------- bootstrap intervals

ENDS = ("low", "high")
MEANS = ("accuracy", "nll", "brier")
CALIBRATION_ERRORS = ("ece", "ada_ece", "mce", "rms_ce")
# Module, its compute kwargs, and {output key: the bootstrap_intervals metric its interval must be}.
INTERVAL_CASES = [
    ("ece", {}, {"ece": "ece"}),
    ("ece", {"binning": "equal_mass", "n_bins": 10}, {"ece": "ada_ece"}),
    ("ece", {"norm": "l2"}, {"ece": "rms_ce"}),
    ("ece", {"norm": "max", "n_bins": 7}, {"ece": "mce"}),
    ("nll", {}, {"nll": "nll"}),
    ("brier", {}, {"brier": "brier"}),
    ("calibration", {"n_bins": 10}, {name: name for name in MEANS + CALIBRATION_ERRORS}),
]
BOOTSTRAP_NAMES = sorted({name for name, _, _ in INTERVAL_CASES})


def interval_keys(keys) -> set:
    return {f"{key}_{end}" for key in keys for end in ENDS}


@pytest.mark.parametrize(("name", "kwargs", "metric_of"), INTERVAL_CASES)
def test_bootstrap_adds_the_flat_intervals_of_bootstrap_intervals(name, kwargs, metric_of):
    probs, labels, _ = random_probs(seed=3)
    result = load(name).compute(predictions=probs, references=labels, bootstrap=100, seed=7, **kwargs)
    plain = REFERENCE[name](probs, labels, **kwargs)
    assert set(result) == set(plain) | interval_keys(metric_of)
    assert {key: result[key] for key in plain} == plain  # the values themselves are unchanged
    n_bins = {key: value for key, value in kwargs.items() if key == "n_bins"}
    want = metrics.bootstrap_intervals(
        probs, labels, metrics=list(metric_of.values()), replicates=100, seed=7, **n_bins
    )
    for key, metric in metric_of.items():
        assert want[metric].point == pytest.approx(result[key], abs=1e-12)  # the right metric
        for end in ENDS:
            assert type(result[f"{key}_{end}"]) is float
            assert result[f"{key}_{end}"] == getattr(want[metric], end)


@pytest.mark.parametrize("name", BOOTSTRAP_NAMES)
def test_bootstrap_from_logits_and_batches(name):
    _, labels, logits = random_probs(seed=4)
    result = load(name).compute(predictions=logits, references=labels, from_logits=True, bootstrap=100, seed=2)
    want = metrics.bootstrap_intervals(logits, labels, replicates=100, seed=2, from_logits=True)
    keys = set(result) - set(REFERENCE[name](logits, labels, from_logits=True))
    assert keys and keys <= interval_keys(want)
    for key in keys:
        metric, end = key.rsplit("_", 1)
        assert result[key] == getattr(want[metric], end)
    batched = load(name)
    for start, stop in [(0, 100), (100, len(labels))]:
        batched.add_batch(predictions=logits[start:stop], references=labels[start:stop])
    assert batched.compute(from_logits=True, bootstrap=100, seed=2) == result


@pytest.mark.parametrize("data_seed", range(4))
def test_intervals_are_ordered_and_the_means_hold_their_point(data_seed):
    """Only what the library guarantees (tests/metrics/test_metrics_intervals.py): low ≤ high, in [0, 1] for
    the calibration errors, whose bias-shifted interval can exclude the point; low ≤ point ≤ high
    for the means (to 1e-12 for the rounding of Σw·x/Σw)."""
    probs, labels, _ = random_probs(num_samples=120 + 60 * data_seed, num_classes=2 + data_seed, seed=data_seed)
    result = load("calibration").compute(predictions=probs, references=labels, bootstrap=100, seed=data_seed)
    for name in CALIBRATION_ERRORS:
        assert 0.0 <= result[f"{name}_low"] <= result[f"{name}_high"] <= 1.0 + 1e-12, name
    for name in MEANS:
        assert result[f"{name}_low"] - 1e-12 <= result[name] <= result[f"{name}_high"] + 1e-12, name
    for binning, norm in [("equal_width", "l1"), ("equal_mass", "l1"), ("equal_width", "l2"), ("equal_width", "max")]:
        ece = load("ece").compute(
            predictions=probs, references=labels, binning=binning, norm=norm, bootstrap=100, seed=data_seed
        )
        assert 0.0 <= ece["ece_low"] <= ece["ece_high"] <= 1.0 + 1e-12, (binning, norm)


@pytest.mark.parametrize("name", BOOTSTRAP_NAMES)
def test_bootstrap_zero_is_the_default_output(name):
    probs, labels, _ = random_probs(seed=5)
    default = load(name).compute(predictions=probs, references=labels)
    assert load(name).compute(predictions=probs, references=labels, bootstrap=0, seed=123) == default
    assert set(default) == set(REFERENCE[name](probs, labels))


@pytest.mark.parametrize("name", BOOTSTRAP_NAMES)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap": True}, r"bootstrap must be a non-negative integer \(0 turns intervals off\), got True"),
        ({"bootstrap": 100.0}, "bootstrap must be a non-negative integer.*got 100.0"),
        ({"bootstrap": -1}, "bootstrap must be a non-negative integer.*got -1"),
        ({"bootstrap": "1000"}, "bootstrap must be a non-negative integer.*got '1000'"),
        ({"bootstrap": 1}, "bootstrap must be 0 .points only. or at least 100 replicates, got 1"),
        ({"bootstrap": 99}, "bootstrap must be 0 .points only. or at least 100 replicates, got 99"),
        ({"bootstrap": 100, "seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"seed": False}, "seed must be an integer, got False"),
    ],
    ids=["bootstrap-bool", "bootstrap-float", "bootstrap-negative", "bootstrap-str", "bootstrap-1", "bootstrap-99",
         "seed-float", "seed-bool"],
)
def test_bad_bootstrap_or_seed_gives_a_clear_value_error(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load(name, will_fail=True).compute(predictions=[[0.3, 0.7], [0.6, 0.4]], references=[1, 0], **kwargs)


@pytest.mark.parametrize("name", BOOTSTRAP_NAMES)
def test_too_few_samples_give_no_interval_and_say_why(name):
    """One sample (as the probe fed the ece module) would give low = high: the ends are None and the reason is given,
    as evaluate() does; the values themselves are still computed."""
    result = load(name).compute(predictions=[[0.3, 0.7]], references=[1], bootstrap=1000)
    ends = {key: value for key, value in result.items() if key.endswith(("_low", "_high"))}
    assert ends and all(value is None for value in ends.values())
    assert result["no_interval_reason"] == "no interval: 1 sample, fewer than the 30 an interval needs"


@pytest.mark.parametrize(("binning", "norm"), [("equal_mass", "l2"), ("equal_mass", "max")])
def test_ece_interval_of_an_unsupported_combination_is_refused(binning, norm):
    probs, labels, _ = random_probs(num_samples=60, seed=6)
    plain = load("ece").compute(predictions=probs, references=labels, binning=binning, norm=norm)
    assert set(plain) == {"ece"}  # fine without intervals
    message = (
        rf"bootstrap intervals are offered for binning='equal_width' with norm='l1', binning='equal_mass' with "
        rf"norm='l1', .*; got binning='{binning}' with norm='{norm}'\..*bootstrap=0"
    )
    with pytest.raises(ValueError, match=message):
        load("ece", will_fail=True).compute(
            predictions=probs, references=labels, binning=binning, norm=norm, bootstrap=100
        )


def test_classwise_ece_has_no_bootstrap_option():
    with pytest.raises(ValueError, match="unknown option\\(s\\) 'bootstrap'; the options are n_bins, from_logits"):
        load("classwise_ece", will_fail=True).compute(predictions=[[0.3, 0.7]], references=[1], bootstrap=10)
    card = (MODULES_DIR / "classwise_ece" / "README.md").read_text(encoding="utf-8")
    assert "no `bootstrap` option" in card and "not the per-class" in card  # and says why
