"""``hf_calibrate.results.evaluator``: evaluate's Evaluator fed class probabilities (docs/design.md §7).

Real models: the demo's BBC MiniLM (text) and digits CNN (image, timm), each through a pipeline of the
plain model and of a temperature-scaling ``CalibratedModel`` of it. The evaluator's ECE, NLL and Brier
(through the ``evaluate_metrics/`` modules) must equal ``CalibratedModel.evaluate``'s uncalibrated /
calibrated metrics on the same rows, whatever the data's form (a ``Dataset``, a stream of it, class
names, a ``ClassLabel`` in another order, a ``label_mapping``); its bootstrap must be scipy's
bootstrap over resampled samples of the metric's definition; its results must land in the pushed
model-index; every documented error names the problem and the fix.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator

import datasets
import evaluate
import numpy as np
import pytest
import scipy.stats
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from transformers import TimmWrapperForImageClassification, pipeline
from transformers.models.timm_wrapper import TimmWrapperImageProcessor

from hf_calibrate import CalibratedModel, metrics
from hf_calibrate.results.evaluator import SIDES, TIME_KEYS, as_evaluation, calibration_evaluator, metric_values
from hf_calibrate.metrics.interval_options import MIN_INTERVAL_REPLICATES, MIN_INTERVAL_SAMPLES

pytestmark = pytest.mark.usefixtures("hf_home", "single_thread")  # conftest.py: single_thread, one torch thread

METRICS_DIR = Path(__file__).resolve().parents[2] / "evaluate_metrics"
KEYS = ("ece", "nll", "brier")
DEFINITIONS = {"ece": metrics.expected_calibration_error, "nll": metrics.negative_log_likelihood, "brier": metrics.brier_score}
#: pipelines give float32 softmax scores, CalibratedModel.evaluate float64 softmax of float32 logits
TOLERANCE = 1e-6


def _spread(split: datasets.Dataset, rows: int) -> datasets.Dataset:
    """``rows`` rows taken at a fixed stride over ``split`` (the demo's splits are sorted by class)."""
    return split.select(range(0, len(split), len(split) // rows)[:rows])


@pytest.fixture(scope="module")
def metric() -> Any:
    """ECE, NLL and Brier, the evaluate modules of this repository, combined."""
    return evaluate.combine([evaluate.load(str(METRICS_DIR / name)) for name in KEYS])


def _case(model: Any, dataset: datasets.DatasetDict, rows: int, preprocessor: Any, **pipeline_options: Any) -> SimpleNamespace:
    """A temperature calibration of ``model`` fitted on calibration rows, ``rows`` test rows and its evaluation of them."""
    calibration = _spread(dataset["calibration"], 60)
    test = _spread(dataset["test"], rows)
    calibrated = CalibratedModel.fit(model, calibration, method="temperature", preprocessor=preprocessor, progress=False)
    report = calibrated.evaluate(test, bootstrap=0, progress=False)
    assert abs(report["calibrated"]["nll"] - report["uncalibrated"]["nll"]) > 1e-3  # the two pipelines differ
    return SimpleNamespace(calibration=calibration, test=test, calibrated=calibrated, report=report, options=pipeline_options)


@pytest.fixture(scope="module")
def text(bbc_minilm) -> SimpleNamespace:
    """The BBC MiniLM: 60 test rows, the evaluation, and the plain and calibrated text-classification pipelines."""
    case = _case(bbc_minilm.model, bbc_minilm.dataset, 60, bbc_minilm.preprocessor, tokenizer=bbc_minilm.preprocessor)
    case.pipelines = {"uncalibrated": pipeline("text-classification", model=bbc_minilm.model, tokenizer=bbc_minilm.preprocessor),
                      "calibrated": pipeline("text-classification", model=case.calibrated, tokenizer=bbc_minilm.preprocessor)}
    case.evaluator = calibration_evaluator("text-classification")
    return case


@pytest.fixture(scope="module")
def image(digits_cnn) -> SimpleNamespace:
    """The digits CNN (timm): 90 test rows, the evaluation, and the plain (transformers' timm wrapper of the same
    weights) and calibrated image-classification pipelines, with the image processor of its timm config."""
    processor = TimmWrapperImageProcessor(pretrained_cfg=digits_cnn.model.pretrained_cfg)
    case = _case(digits_cnn.model, digits_cnn.dataset, 90, None, feature_extractor=processor)
    base = TimmWrapperForImageClassification.from_pretrained(str(digits_cnn.path)).eval()
    case.pipelines = {"uncalibrated": pipeline("image-classification", model=base, image_processor=processor),
                      "calibrated": pipeline("image-classification", model=case.calibrated, image_processor=processor)}
    case.evaluator = calibration_evaluator("image-classification")
    case.processor, case.base = processor, base
    return case


@pytest.fixture(scope="module", params=["text", "image"])
def case(request) -> SimpleNamespace:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def results(case, metric) -> Dict[str, Dict[str, Any]]:
    """The evaluator's results of the plain and the calibrated pipeline on the case's test rows."""
    return {side: case.evaluator.compute(model_or_pipeline=case.pipelines[side], data=case.test, metric=metric) for side in SIDES}


def _same_metrics(result: Dict[str, Any], expected: Dict[str, Any], tolerance: float = TOLERANCE) -> None:
    for key in KEYS:
        assert result[key] == pytest.approx(expected[key], rel=0, abs=tolerance), key


# ----------------------------------------------------------------------------- the numbers


@pytest.mark.parametrize("side", SIDES)
def test_metrics_equal_calibrated_model_evaluate(case, results, side):
    _same_metrics(results[side], case.report[side])


def test_time_results_are_evaluates(case, results):
    """evaluate's three time keys: seconds, samples per second and seconds per sample, of the same N samples."""
    for result in results.values():
        assert set(result) == set(KEYS) | set(TIME_KEYS)
        assert result["total_time_in_seconds"] > 0
        assert result["samples_per_second"] * result["total_time_in_seconds"] == pytest.approx(len(case.test))
        assert result["latency_in_seconds"] == pytest.approx(1 / result["samples_per_second"])


def test_a_stream_of_the_rows_gives_the_same_numbers(case, results, metric):
    """An IterableDataset of the same rows, and a pipeline built by the evaluator from the model and preprocessor."""
    streamed = case.evaluator.compute(model_or_pipeline=case.calibrated, data=case.test.to_iterable_dataset(), metric=metric,
                                      device=-1, **case.options)
    _same_metrics(streamed, results["calibrated"], tolerance=1e-12)


def test_class_names_and_reordered_class_labels_give_the_same_numbers(image, metric):
    """Labels as class names (a string column), and a ClassLabel listing the model's names in reverse (ids reversed)."""
    names = image.test.features["label"].names
    reversed_names = datasets.ClassLabel(names=names[::-1])
    relabelled = image.test.map(lambda row: {"name": names[row["label"]], "reversed": len(names) - 1 - row["label"]})
    relabelled = relabelled.cast_column("reversed", reversed_names)
    for column in ("name", "reversed"):
        result = image.evaluator.compute(model_or_pipeline=image.pipelines["calibrated"], data=relabelled, metric=metric,
                                         label_column=column)
        _same_metrics(result, image.report["calibrated"])


def test_label_mapping_sets_the_class_ids(image, metric):
    """label_mapping gives model label d the id 9 - d: the data's ids, reversed to match, give the same numbers."""
    relabelled = image.test.map(lambda row: {"mapped": 9 - row["label"]})
    mapping = {str(digit): 9 - digit for digit in range(10)}
    result = image.evaluator.compute(model_or_pipeline=image.pipelines["calibrated"], data=relabelled, metric=metric,
                                     label_column="mapped", label_mapping=mapping)
    _same_metrics(result, image.report["calibrated"])


# ----------------------------------------------------------------------------- bootstrap


@pytest.fixture(scope="module")
def bootstrapped(image, metric) -> SimpleNamespace:
    """Two bootstrap runs of the plain digits pipeline on 40 test rows, with the same random_state (the fewest
    replicates an interval takes)."""
    rows = _spread(image.test, 40)
    runs = [image.evaluator.compute(model_or_pipeline=image.pipelines["uncalibrated"], data=rows, metric=metric,
                                    strategy="bootstrap", n_resamples=MIN_INTERVAL_REPLICATES, random_state=11,
                                    confidence_level=0.9)
            for _ in range(2)]
    return SimpleNamespace(rows=rows, runs=runs)


def test_bootstrap_intervals_hold_the_score_and_repeat(bootstrapped):
    first, second = bootstrapped.runs
    for key in KEYS:
        entry = first[key]
        assert set(entry) == {"score", "confidence_interval", "standard_error"}
        low, high = entry["confidence_interval"]
        assert low <= entry["score"] <= high and low < high, key
        assert entry["standard_error"] > 0
    assert {key: first[key] for key in KEYS} == {key: second[key] for key in KEYS}
    assert metric_values(first) == {key: first[key]["score"] for key in KEYS}


def _probabilities(image: SimpleNamespace, rows: datasets.Dataset) -> np.ndarray:
    """Softmax of the plain digits model's logits on ``rows``, preprocessed by the pipeline's image processor."""
    pixels = image.processor(list(rows["image"]), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return torch.softmax(image.base(pixel_values=pixels).logits.double(), -1).numpy()


def test_bootstrap_is_scipys_over_resampled_samples(image, bootstrapped):
    """The interval and standard error are scipy.stats.bootstrap's (BCa) of the metric's definition over resampled rows."""
    probabilities, labels = _probabilities(image, bootstrapped.rows), np.asarray(bootstrapped.rows["label"])
    result = bootstrapped.runs[0]
    for key in KEYS:
        expected = scipy.stats.bootstrap(
            [np.arange(len(labels))], lambda rows, key=key: DEFINITIONS[key](probabilities[rows], labels[rows]), vectorized=False,
            n_resamples=MIN_INTERVAL_REPLICATES, random_state=11, confidence_level=0.9,
        )
        assert result[key]["confidence_interval"] == pytest.approx(tuple(expected.confidence_interval), abs=TOLERANCE), key
        assert result[key]["standard_error"] == pytest.approx(expected.standard_error, abs=TOLERANCE), key


def test_too_few_rows_give_no_interval_and_say_why(image, metric):
    """Below 30 rows the bootstrap's interval would be no evidence (one row: zero width, or scipy's error): no
    interval, its reason, and the scores still there (the same rule as evaluate and the metric modules)."""
    rows = _spread(image.test, MIN_INTERVAL_SAMPLES - 1)
    result = image.evaluator.compute(model_or_pipeline=image.pipelines["uncalibrated"], data=rows, metric=metric,
                                     strategy="bootstrap", n_resamples=MIN_INTERVAL_REPLICATES, random_state=11)
    for key in KEYS:
        assert result[key] == {"score": pytest.approx(result[key]["score"]), "confidence_interval": (None, None),
                               "standard_error": None,
                               "reason": f"no interval: {len(rows)} samples, fewer than the {MIN_INTERVAL_SAMPLES} an interval needs"}
        assert math.isfinite(result[key]["score"])


@pytest.mark.parametrize("n_resamples", [1, MIN_INTERVAL_REPLICATES - 1])
def test_too_few_resamples_are_refused_before_the_pipeline_runs(image, metric, n_resamples, monkeypatch):
    """evaluate() and the evaluate modules refuse 1-99 replicates; so does the evaluator, before any pipeline call."""
    monkeypatch.setattr(type(image.evaluator), "call_pipeline", lambda *args: pytest.fail("the pipeline ran"))
    with pytest.raises(ValueError, match=f"n_resamples must be at least {MIN_INTERVAL_REPLICATES} with "
                                         f"strategy='bootstrap', got {n_resamples}: .* or strategy='simple'"):
        image.evaluator.compute(model_or_pipeline=image.pipelines["uncalibrated"], data=image.test, metric=metric,
                                strategy="bootstrap", n_resamples=n_resamples)


# ----------------------------------------------------------------------------- to the model card


def test_pushed_model_index_holds_the_evaluators_numbers(image, hub_online):
    image_results = {side: image.evaluator.compute(model_or_pipeline=image.pipelines[side], data=image.test,
                                                   metric=str(METRICS_DIR / "calibration")) for side in SIDES}
    repo_id = hub_online.unique_repo_id("evaluator")
    image.calibrated.push_to_hub(repo_id)
    evaluation = as_evaluation(image_results["uncalibrated"], image_results["calibrated"], dataset="digits", split="test")
    image.calibrated.push_evaluation_results(repo_id, evaluation)

    card = ModelCard.load(hf_hub_download(repo_id, "README.md"))
    pushed = {(entry.metric_type, entry.metric_config): entry for entry in card.data.eval_results}
    card_metrics = ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier", "mce")
    assert set(pushed) == {(key, side) for key in card_metrics for side in SIDES}
    for (key, side), entry in pushed.items():
        assert entry.metric_value == metric_values(image_results[side])[key]
        assert (entry.dataset_name, entry.dataset_split, entry.task_type) == ("digits", "test", "image-classification")
    _same_metrics({key: pushed[key, "calibrated"].metric_value for key in KEYS}, image.report["calibrated"])


def test_evaluate_push_to_hub_takes_the_metric_values(results, case, hub_online):
    """evaluate.push_to_hub, one metric at a time, from metric_values (its dataset_type must be a hub dataset)."""
    repo_id, dataset_id = hub_online.unique_repo_id("evaluate-push"), hub_online.unique_repo_id("data")
    HfApi().create_repo(repo_id)
    HfApi().create_repo(dataset_id, repo_type="dataset")
    for side in SIDES:
        for key, value in metric_values(results[side]).items():
            evaluate.push_to_hub(model_id=repo_id, task_type=case.evaluator.task, dataset_type=dataset_id, dataset_name="demo",
                                 dataset_split="test", metric_type=key, metric_name=f"{key} ({side})", metric_value=value,
                                 metric_config=side)
    pushed = {(entry.metric_type, entry.metric_config): entry.metric_value
              for entry in ModelCard.load(hf_hub_download(repo_id, "README.md")).data.eval_results}
    assert pushed == {(key, side): results[side][key] for key in KEYS for side in SIDES}


# ----------------------------------------------------------------------------- errors and warnings


def _label_metric(folder: Path) -> Any:
    """An evaluate metric whose predictions are label ids (as evaluate's accuracy), loaded offline from ``folder``."""
    (folder / "label_accuracy").mkdir()
    (folder / "label_accuracy" / "label_accuracy.py").write_text(textwrap.dedent('''
        import datasets
        import evaluate

        class LabelAccuracy(evaluate.Metric):
            def _info(self):
                return evaluate.MetricInfo(description="", citation="", inputs_description="", features=datasets.Features(
                    {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}))

            def _compute(self, predictions, references):
                return {"accuracy": sum(p == r for p, r in zip(predictions, references)) / len(references)}
        '''))
    return evaluate.load(str(folder / "label_accuracy"))


def _stream_without(column: str, rows: datasets.Dataset) -> datasets.IterableDataset:
    """A stream of ``rows`` whose features are unknown until read, lacking ``column``."""
    def generate() -> Iterator[Dict[str, Any]]:
        for row in rows:
            yield {name: value for name, value in row.items() if name != column}
    return datasets.IterableDataset.from_generator(generate)


@pytest.fixture(scope="module")
def wrong(image, text, metric, tmp_path_factory) -> SimpleNamespace:
    """Wrong inputs, on 4 rows: ``run(**arguments)`` computes the image evaluator over the calibrated pipeline, the
    rows and the metric unless the arguments say otherwise (``evaluator=`` another one)."""
    rows = image.test.select(range(4))
    names = image.test.features["label"].names

    def run(evaluator: Any = image.evaluator, **arguments: Any) -> Dict[str, Any]:
        defaults = {"model_or_pipeline": image.pipelines["calibrated"], "data": rows, "metric": metric}
        return evaluator.compute(**{**defaults, **arguments})

    return SimpleNamespace(
        run=run, rows=rows, text_rows=text.test.select(range(4)), text_evaluator=text.evaluator,
        unknown=rows.map(lambda row, i: {"name": "cat" if i == 0 else names[row["label"]]}, with_indices=True),
        shifted=rows.map(lambda row: {"id": row["label"] + 5}),
        foreign=rows.cast_column("label", datasets.ClassLabel(names=list("abcdefghij"))),
        fractions=rows.map(lambda row: {"fraction": row["label"] + 0.5}),
        label_metric=_label_metric(tmp_path_factory.mktemp("metric")),
        sigmoid=pipeline("image-classification", model=image.calibrated, image_processor=image.processor,
                         function_to_apply="sigmoid"),
        features=pipeline("feature-extraction", model=text.calibrated.base_model.bert, tokenizer=text.options["tokenizer"]),
        base_module=image.calibrated.base_model,
    )


#: name → (call on the ``wrong`` fixture, message): the errors docs/design.md §7 documents
ERRORS: Dict[str, tuple] = {
    "a label that is not the model's": (
        lambda w: w.run(data=w.unknown, label_column="name"),
        r"labels \['cat'\] of column 'name' are not among the model's labels \['0', .*\]\. Pass label_mapping="),
    "a class id out of range": (
        lambda w: w.run(data=w.shifted, label_column="id"),
        r"column 'id' holds class ids from \d+ to 1\d, but the model has 10 classes .* Pass label_mapping="),
    "a ClassLabel of other names": (
        lambda w: w.run(data=w.foreign),
        r"ClassLabel names \['a', .*\] of column 'label' are not the model's labels .*cast_column"),
    "labels that are neither ids nor names": (
        lambda w: w.run(data=w.fractions, label_column="fraction"),
        r"column 'fraction' must hold class ids \(integers\) or class names \(strings\), all of one kind; "
        r"it holds \d\.5 \(float\)"),
    "a label_mapping that is not a permutation": (
        lambda w: w.run(label_mapping={"0": 0, "1": 0}),
        r"label_mapping must give each of the model's 10 labels .* a distinct class id 0\.\.9"),
    "a metric of label ids": (
        lambda w: w.run(metric=w.label_metric),
        r"metric 'label_accuracy' takes predictions as Value\('int64'\), one label id per sample, .* Pass a metric of class "
        r"probabilities.* evaluate\.evaluator\('image-classification'\)"),
    "no metric": (lambda w: w.run(metric=None), r"no default metric: pass metric=\.\.\., a metric of class probabilities"),
    "a pipeline of the other task": (
        lambda w: w.run(evaluator=w.text_evaluator, data=w.text_rows),
        r"is a 'image-classification' pipeline, but this evaluator scores the class probabilities of a 'text-classification' "
        r"pipeline: pass transformers\.pipeline\('text-classification', model=\.\.\.\)"),
    "not a classification pipeline": (
        lambda w: w.run(evaluator=w.text_evaluator, data=w.text_rows, model_or_pipeline=w.features),
        r"is a 'feature-extraction' pipeline, but this evaluator scores"),
    "neither a pipeline nor a model": (
        lambda w: w.run(model_or_pipeline=w.base_module),
        r"model_or_pipeline must be a transformers image-classification Pipeline, a classification model .*; got ResNet"),
    "scores that are not probabilities": (
        lambda w: w.run(model_or_pipeline=w.sigmoid),
        r"scores of sample 0 sum to \d+\.\d+, not 1: they are not a probability distribution .* without function_to_apply"),
    "a DatasetDict": (
        lambda w: w.run(data=datasets.DatasetDict({"test": w.rows})),
        r"data is a DatasetDict of the splits \['test'\]; pass one split, e\.g\. data=data\['test'\]"),
    "a missing column": (
        lambda w: w.run(label_column="labels"),
        r"Invalid `label_column` labels specified\. The dataset contains the following columns: \['image', 'label'\]"),
    "a missing column of a stream": (
        lambda w: w.run(data=_stream_without("label", w.rows)),
        r"Invalid `label_column` label specified\. The dataset contains the following columns: \['image'\]"),
    "no rows": (lambda w: w.run(data=w.rows.select([])), r"data has no rows to evaluate"),
    "an unknown task": (
        lambda w: calibration_evaluator("token-classification"),
        r"no calibration evaluator for the task 'token-classification'; the tasks are"),
    "results without card metrics": (
        lambda w: as_evaluation({"total_time_in_seconds": 1.0}, {"ece": 0.1}, dataset="d"),
        r"the uncalibrated results \[\] hold none of the model card's metrics"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_documented_error(name, wrong):
    call, message = ERRORS[name]
    with pytest.raises(ValueError, match=message):
        call(wrong)


def test_in_sample_data_warn(image, metric):
    """The calibrated pipeline evaluated on the very data its calibration was fitted on: a warning says so."""
    with pytest.warns(UserWarning, match="data the pipeline's calibration was fitted on .* in_sample=True"):
        result = image.evaluator.compute(model_or_pipeline=image.pipelines["calibrated"], data=image.calibration, metric=metric)
    assert math.isfinite(result["ece"])


def test_partly_in_sample_data_warn_with_the_count(image, metric):
    """Ten calibration rows among thirty: the warning says how many rows are calibration rows."""
    mixed = datasets.concatenate_datasets([image.test.select(range(20)), image.calibration.select(range(10))])
    with pytest.warns(UserWarning, match="partly in-sample: 10 of 30 rows are data the calibration was fitted on"):
        image.evaluator.compute(model_or_pipeline=image.pipelines["calibrated"], data=mixed, metric=metric)


def test_a_calibrated_model_named_before_the_model_module_is_imported_is_refused_with_the_fix(tmp_path):
    """The evaluator sits below the model module and cannot register it with transformers: a calibrated model named by
    folder or hub id, before ``CalibratedModel`` is imported, gets transformers' error plus the import that fixes it."""
    import json
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "hf_calibrate"}))
    code = textwrap.dedent(f"""
        import sys
        from hf_calibrate.results.evaluator import calibration_evaluator
        assert "hf_calibrate.modeling" not in sys.modules
        try:
            calibration_evaluator("image-classification").prepare_pipeline({str(tmp_path)!r})
        except ValueError as error:
            print(error)
    """)
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "hf_calibrate" in shown.stdout and "from hf_calibrate import CalibratedModel" in shown.stdout, shown.stdout
