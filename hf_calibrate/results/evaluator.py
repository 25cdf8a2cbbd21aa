"""The ecosystem's evaluator, fed class probabilities: ``evaluate``'s ``Evaluator`` for calibration metrics
(docs/design.md §7).

``evaluate.evaluator("text-classification")`` / ``("image-classification")`` give their metrics one
predicted label id per sample, so a metric of probabilities (ECE, NLL, Brier: ``evaluate_metrics/``)
cannot be used through them. :func:`calibration_evaluator` returns a subclass of the same
evaluator with the same ``compute`` arguments and the same result — the metric's values (with
``strategy="bootstrap"`` each one a ``{"score", "confidence_interval", "standard_error"}``) and
``total_time_in_seconds``, ``samples_per_second``, ``latency_in_seconds`` — that runs any
classification pipeline (a plain model's or a :class:`~hf_calibrate.CalibratedModel`'s) for every
class's score and gives the metric:

``predictions``
    (N, C) float64: row i holds sample i's scores in class-id order (column k: the class whose
    id is k), from the pipeline's labels mapped to ids by ``label_mapping`` when given, else by
    the model's ``config.label2id`` (the inverse of the ``id2label`` the pipeline labels its scores
    with, so column k is the model's logit k after softmax);
``references``
    (N,) int64 class ids: ids (a ``ClassLabel`` or integer column) as they are, except that a
    ``ClassLabel`` whose names are the model's in another order is matched by name (as
    :meth:`CalibratedModel.evaluate` does); class names (a string column) by the same mapping
    (:mod:`hf_calibrate._class_ids`).

What changes from ``evaluate``'s evaluator, and why (each in the method that does it):

* the data may also be a ``datasets.IterableDataset``; every dataset is read in chunks of
  :data:`CHUNK_ROWS` rows (``Dataset.iter``), each chunk given to the pipeline as one list, so a
  stream is read once and never held whole. The time results count the pipeline calls only;
* ``prepare_pipeline`` takes a ``Pipeline`` object (evaluate 0.4.6's checks
  ``transformers.TFPreTrainedModel``, which transformers 5 no longer has) and refuses a pipeline
  of another task;
* ``prepare_metric`` refuses a metric whose ``predictions`` are label ids;
* the bootstrap resamples sample indices (what evaluate's ``paired=True`` does with 1-D inputs):
  evaluate's ``scipy.stats.bootstrap([references, predictions], paired=True)`` raises, as (N,)
  and (N, C) do not broadcast. One ``scipy.stats.bootstrap`` call gives every metric key, from
  the same resamples. The rule of every interval of this library holds
  (:mod:`hf_calibrate.metrics.intervals`): ``n_resamples`` below
  :data:`~hf_calibrate.metrics.interval_options.MIN_INTERVAL_REPLICATES` (100) is refused before the
  pipeline runs, and below :data:`~hf_calibrate.metrics.interval_options.MIN_INTERVAL_SAMPLES` (30)
  rows there is no interval: ``confidence_interval`` is ``(None, None)``, ``standard_error`` None,
  and ``reason`` says why (never an interval of zero width, nor scipy's error on one row).

For the model card's ``model-index``, :func:`as_evaluation` turns the results of the base's and the
calibrated model's pipelines into what :meth:`CalibratedModel.push_evaluation_results` takes;
:func:`metric_values` gives one result's metric values, one at a time as ``evaluate.push_to_hub``
takes them.
"""

from __future__ import annotations

import inspect
import logging
import numbers
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import datasets
import numpy as np
from evaluate import EvaluationModule
from evaluate.evaluator import Evaluator, ImageClassificationEvaluator, TextClassificationEvaluator
from scipy.stats import bootstrap
from transformers import Pipeline, PreTrainedModel
from transformers.pipelines import TASK_ALIASES

from . import reporting
from .._class_ids import LabelColumn, class_names, reference_ids
from .._warnings import warn_user
from ..data.calibration_rows import in_sample_rows
from ..metrics.interval_options import MIN_INTERVAL_REPLICATES, TOO_FEW_REPLICATES, check_replicates, no_interval_reason

logger = logging.getLogger(__name__)

#: rows read from the dataset and given to the pipeline per call
CHUNK_ROWS = 256
#: the keys ``evaluate``'s evaluators add to the metric's values
TIME_KEYS = ("total_time_in_seconds", "samples_per_second", "latency_in_seconds")
#: how far a row of pipeline scores may sum from 1 (the metrics' own tolerance)
SUM_TOLERANCE = 1e-3
#: the sides of an evaluation, in the order the card shows them
SIDES = ("uncalibrated", "calibrated")
METRIC_HINT = (
    "a metric of class probabilities, e.g. evaluate.load(hf_calibrate.evaluate_module_path('calibration')) (also ece, "
    "nll, brier, classwise_ece), or evaluate.combine([...]) of several"
)


# ----------------------------------------------------------------------------- reading the data


@dataclass
class _Rows:
    """A dataset read in chunks: the pipeline's inputs of each chunk, its labels collected into ``labels``."""

    data: Union[datasets.Dataset, datasets.IterableDataset]
    columns: Dict[str, Optional[str]]  # evaluate's argument name -> column name (second_input_column may be None)
    labels: LabelColumn

    def chunks(self, size: int = CHUNK_ROWS) -> Iterator[List[Any]]:
        """Each chunk's pipeline inputs (texts, ``{"text", "text_pair"}`` dicts or images); labels appended as read."""
        for batch in self.data.iter(batch_size=size):
            _check_columns(list(batch), self.columns)
            self.labels.values.extend(batch[self.labels.column])
            first, second = batch[self.columns["input_column"]], self.columns.get("second_input_column")
            yield list(first) if second is None else [{"text": a, "text_pair": b} for a, b in zip(first, batch[second])]


def _check_columns(available: Optional[Sequence[str]], columns: Mapping[str, Optional[str]]) -> None:
    """evaluate's ``check_required_columns``, for a stream whose columns are known only once read."""
    for argument, column in columns.items():
        if column is not None and column not in available:
            raise ValueError(f"Invalid `{argument}` {column} specified. The dataset contains the following columns: {available}.")


def _label_names(data: Any, column: str) -> Optional[List[str]]:
    """The names of ``column`` when it is a ``ClassLabel`` (None otherwise, or when a stream's features are unknown)."""
    feature = (getattr(data, "features", None) or {}).get(column)
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


# ----------------------------------------------------------------------------- pipeline scores


@dataclass
class _Scores:
    """The pipeline's scores: ``scores`` (N, C) float64 with column j the label ``names[j]`` (the model's
    ``id2label`` order), and the labels read with them."""

    names: List[str]
    scores: np.ndarray
    labels: LabelColumn


def pipeline_labels(pipe: Any) -> List[str]:
    """The labels of ``pipe``'s model in class-id order (its ``config.id2label``); a ValueError when it has none."""
    config = getattr(getattr(pipe, "model", None), "config", None)
    id2label = getattr(config, "id2label", None) or {}
    names = [str(id2label.get(index, id2label.get(str(index), ""))) for index in range(len(id2label))]
    if len(names) < 2 or not all(names) or len(set(names)) != len(names):
        raise ValueError(
            f"the pipeline's model has no usable class labels (config.id2label = {id2label}): a classification model "
            "names each of its C >= 2 classes once. Set config.id2label and config.label2id on the model."
        )
    return names


def _score_row(output: Sequence[Mapping[str, Any]], column: Mapping[str, int]) -> List[float]:
    """One sample's pipeline output (a list of ``{"label", "score"}``) as its C scores in column order."""
    row = [float("nan")] * len(column)
    for item in output:
        row[column[item["label"]]] = float(item["score"])
    return row


def _check_distributions(scores: np.ndarray, pipe: Any) -> None:
    """Every row of ``scores`` (N, C) is a probability distribution; else name the cause and the fix."""
    if np.isnan(scores).any():
        raise ValueError("the pipeline returned scores for only some of the model's labels; it must return all C (top_k=C).")
    sums = scores.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > SUM_TOLERANCE)
    if len(bad):
        config = pipe.model.config
        raise ValueError(
            f"the pipeline's scores of sample {bad[0]} sum to {sums[bad[0]]:.4f}, not 1: they are not a probability "
            "distribution over the classes (the pipeline applies a sigmoid or nothing: its function_to_apply, or the "
            f"model's problem_type {config.problem_type!r} with {config.num_labels} labels, says so). Calibration metrics "
            "need a single-label classifier's softmax probabilities: build the pipeline without function_to_apply, and set "
            "config.problem_type = 'single_label_classification' if the model is one."
        )


# ----------------------------------------------------------------------------- metrics


def _non_probability_feature(module: EvaluationModule) -> Optional[Any]:
    """What ``module`` declares its ``predictions`` to be when that is not a vector of floats (None when it is)."""
    schemas = module.features if isinstance(module.features, list) else [module.features]
    declared = [schema.get("predictions") for schema in schemas if schema is not None]
    for feature in declared:
        item = getattr(feature, "feature", None)
        if isinstance(item, datasets.Value) and item.dtype.startswith("float"):
            return None
    return declared[0] if declared else "no predictions"


# ----------------------------------------------------------------------------- the evaluators


def _unregistered(error: ValueError) -> Optional[ValueError]:
    """transformers' error on loading a calibrated model by name before the Auto classes know it, said with the fix
    (registering is the model module's: this module sits below it); None for any other error."""
    if "hf_calibrate" not in str(error):
        return None
    return ValueError(
        f"{error}\nA calibrated model is loaded by name once transformers knows its model type: run "
        "`from hf_calibrate import CalibratedModel` (or `hf_calibrate.register_auto_classes()`) before this evaluator."
    )


class _ProbabilityEvaluation:
    """What :func:`calibration_evaluator`'s classes change in ``evaluate``'s classification evaluators (put it first
    in the bases): the data, the pipeline and the metric are checked, and the metric gets probabilities."""

    task: str
    PIPELINE_KWARGS: Dict[str, Any]

    def compute(self, *args: Any, **kwargs: Any) -> Any:
        """evaluate's ``compute`` (the same arguments and result), its ``n_resamples`` checked before the pipeline runs
        when ``strategy="bootstrap"``: at least :data:`~hf_calibrate.metrics.interval_options.MIN_INTERVAL_REPLICATES`."""
        arguments = inspect.signature(super().compute).bind(*args, **kwargs)  # type: ignore[misc]
        arguments.apply_defaults()
        if arguments.arguments["strategy"] == "bootstrap":
            resamples = check_replicates(arguments.arguments["n_resamples"], "n_resamples")
            if resamples < MIN_INTERVAL_REPLICATES:
                raise ValueError(
                    f"n_resamples must be at least {MIN_INTERVAL_REPLICATES} with strategy='bootstrap', got {resamples}: "
                    f"{TOO_FEW_REPLICATES}. Pass n_resamples=9999 (evaluate's default), or strategy='simple' for the "
                    "metric without intervals."
                )
        return super().compute(*args, **kwargs)  # type: ignore[misc]

    def load_data(self, data: Any, subset: Optional[str] = None, split: Optional[str] = None) -> Any:
        """evaluate's ``load_data``, also taking a ``datasets.IterableDataset``; a DatasetDict is an error naming its splits."""
        if isinstance(data, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            example = next(iter(data), "test")
            raise ValueError(
                f"data is a {type(data).__name__} of the splits {list(data)}; pass one split, e.g. data=data[{example!r}]."
            )
        if isinstance(data, datasets.IterableDataset):
            if split is not None or subset is not None:
                logger.warning("`data` is a preloaded IterableDataset! Ignoring `subset` and `split`.")
            return data
        return super().load_data(data=data, subset=subset, split=split)  # type: ignore[misc]

    def prepare_data(
        self, data: Any, input_column: str, label_column: str, second_input_column: Optional[str] = None
    ) -> Tuple[Dict[str, List[Any]], _Rows]:
        """({"references": the labels, filled as the rows are read}, the rows to read); columns checked as evaluate does."""
        columns = {"input_column": input_column, "label_column": label_column, "second_input_column": second_input_column}
        if getattr(data, "column_names", None) is not None:
            _check_columns(data.column_names, columns)
        rows = _Rows(data, columns, LabelColumn(label_column, _label_names(data, label_column)))
        return {"references": rows.labels.values}, rows

    def prepare_pipeline(
        self, model_or_pipeline: Any, tokenizer: Any = None, feature_extractor: Any = None, device: Optional[int] = None
    ) -> Pipeline:
        """A pipeline of this evaluator's task: built from a model or hub id as evaluate does, or the one given."""
        if isinstance(model_or_pipeline, (str, PreTrainedModel)):
            try:
                pipe = super().prepare_pipeline(model_or_pipeline, tokenizer, feature_extractor, device)  # type: ignore[misc]
            except ValueError as error:
                unregistered = _unregistered(error)
                if unregistered is None:
                    raise
                raise unregistered from error
        elif isinstance(model_or_pipeline, Pipeline):
            pipe = model_or_pipeline
            if tokenizer is not None or feature_extractor is not None:
                logger.warning("Ignoring the value of the preprocessor argument (`tokenizer` or `feature_extractor`).")
        else:
            raise ValueError(
                f"model_or_pipeline must be a transformers {self.task} Pipeline, a classification model (PreTrainedModel, "
                f"e.g. a CalibratedModel) or its hub id / folder; got {type(model_or_pipeline).__name__}."
            )
        if getattr(pipe, "task", None) != self.task:
            raise ValueError(
                f"model_or_pipeline is a {getattr(pipe, 'task', None)!r} pipeline, but this evaluator scores the class "
                f"probabilities of a {self.task!r} pipeline: pass transformers.pipeline({self.task!r}, model=...) or the "
                "classification model itself."
            )
        pipeline_labels(pipe)
        return pipe

    def prepare_metric(self, metric: Any) -> Any:
        """evaluate's ``prepare_metric`` (a name or path is loaded), checked to take probability predictions."""
        if metric is None:
            raise ValueError(f"this evaluator has no default metric: pass metric=..., {METRIC_HINT}.")
        metric = super().prepare_metric(metric)  # type: ignore[misc]
        for module in getattr(metric, "evaluation_modules", [metric]):
            declared = _non_probability_feature(module)
            if declared is not None:
                raise ValueError(
                    f"the metric {module.name!r} takes predictions as {declared}, one label id per sample, but this evaluator "
                    f"gives each sample's class probabilities, shape (N, C). Pass {METRIC_HINT}; for label-id metrics such "
                    f"as accuracy use evaluate.evaluator({self.task!r})."
                )
        return metric

    def call_pipeline(self, pipe: Pipeline, rows: _Rows) -> Tuple[_Scores, Dict[str, float]]:
        """(every sample's scores for every label with the labels read, evaluate's time results of the pipeline calls)."""
        names = pipeline_labels(pipe)
        column = {name: position for position, name in enumerate(names)}
        scores: List[List[float]] = []
        seconds = 0.0
        for inputs in rows.chunks():
            start = perf_counter()
            outputs = pipe(inputs, top_k=len(names), **self.PIPELINE_KWARGS)  # top_k=None is 5 for images
            seconds += perf_counter() - start
            scores.extend(_score_row(output, column) for output in outputs)
        if not scores:
            raise ValueError("data has no rows to evaluate.")
        array = np.asarray(scores, dtype=np.float64)
        _check_distributions(array, pipe)
        _warn_if_in_sample(pipe, rows.data, len(scores))
        return _Scores(names, array, rows.labels), self._compute_time_perf(0.0, seconds, len(scores))

    def predictions_processor(self, predictions: _Scores, label_mapping: Optional[Mapping[str, Any]]) -> Dict[str, np.ndarray]:
        """The metric's inputs: ``predictions`` (N, C) float64 in class-id order and ``references`` (N,) int64 class ids."""
        classes = class_names(predictions.names, label_mapping)
        order = [predictions.names.index(name) for name in classes]
        references = reference_ids(predictions.labels, classes, mapped=label_mapping is not None)
        return {"predictions": predictions.scores[:, order], "references": references}

    @staticmethod
    def _compute_confidence_interval(
        metric: Any, metric_inputs: Mapping[str, Any], metric_keys: Sequence[str], confidence_level: float = 0.95,
        n_resamples: int = 9999, random_state: Optional[int] = None,
    ) -> Dict[str, Dict[str, Any]]:
        """evaluate's bootstrap (``scipy.stats.bootstrap`` with its defaults: BCa) of every key of ``metric``, over
        resampled sample indices: one call, every key from the same resamples; no interval (None ends and standard
        error, and the ``reason``) on fewer than ``MIN_INTERVAL_SAMPLES`` rows."""
        predictions, references = np.asarray(metric_inputs["predictions"]), np.asarray(metric_inputs["references"])
        keys = list(metric_keys)
        reason = no_interval_reason(len(references), n_resamples)
        if reason:
            return {key: {"confidence_interval": (None, None), "standard_error": None, "reason": reason} for key in keys}

        def statistic(rows: np.ndarray) -> np.ndarray:
            values = metric.compute(predictions=predictions[rows], references=references[rows])
            return np.array([values[key] for key in keys], dtype=np.float64)

        result = bootstrap(
            [np.arange(len(references))], statistic, vectorized=False, confidence_level=confidence_level,
            n_resamples=n_resamples, random_state=random_state,
        )
        low, high = np.atleast_1d(result.confidence_interval.low), np.atleast_1d(result.confidence_interval.high)
        errors = np.atleast_1d(result.standard_error)
        return {key: {"confidence_interval": (float(low[i]), float(high[i])), "standard_error": float(errors[i])}
                for i, key in enumerate(keys)}


def _warn_if_in_sample(pipe: Pipeline, data: Any, samples: int) -> None:
    """Warn when the pipeline's model is a calibration fitted on ``data``, or on some of their ``samples`` rows (saying
    how many): its numbers are optimistic."""
    if not callable(getattr(pipe.model, "fitted_on", None)):
        return
    in_sample, rows = in_sample_rows(pipe.model, data, samples)
    if in_sample:
        warn_user(
            f"these data are or hold data the pipeline's calibration was fitted on "
            f"({reporting.in_sample_note({'in_sample_rows': rows})}). Evaluate on data the fit did not use, or pass "
            "in_sample=True to as_evaluation so that the model card says so."
        )


class TextClassificationCalibrationEvaluator(_ProbabilityEvaluation, TextClassificationEvaluator):
    """``evaluate``'s text-classification evaluator, giving its metric every class's probability (module docstring)."""


class ImageClassificationCalibrationEvaluator(_ProbabilityEvaluation, ImageClassificationEvaluator):
    """``evaluate``'s image-classification evaluator, giving its metric every class's probability (module docstring)."""


EVALUATORS = {
    "text-classification": TextClassificationCalibrationEvaluator,
    "image-classification": ImageClassificationCalibrationEvaluator,
}


def calibration_evaluator(task: str) -> Evaluator:
    """The evaluator of ``task`` (``"text-classification"``, alias ``"sentiment-analysis"``, or
    ``"image-classification"``) whose metric gets class probabilities; ``compute`` as ``evaluate.evaluator(task)``'s."""
    task = TASK_ALIASES.get(task, task)
    if task not in EVALUATORS:
        raise ValueError(f"no calibration evaluator for the task {task!r}; the tasks are {list(EVALUATORS)}.")
    return EVALUATORS[task](task=task)


# ----------------------------------------------------------------------------- to the model card


def metric_values(results: Mapping[str, Any]) -> Dict[str, float]:
    """The metric values of an evaluator's ``results`` (a bootstrap entry's ``score``), without the time keys."""
    values = {}
    for key, value in results.items():
        value = value["score"] if isinstance(value, Mapping) else value
        if key not in TIME_KEYS and isinstance(value, numbers.Real):
            values[key] = float(value)
    return values


def as_evaluation(
    uncalibrated: Mapping[str, Any], calibrated: Mapping[str, Any], *, dataset: str, split: Optional[str] = None,
    dataset_id: Optional[str] = None, in_sample: bool = False, n_bins: int = 15,
) -> Dict[str, Any]:
    """The results of the base's and the calibrated model's pipelines as the evaluation that
    :meth:`CalibratedModel.push_evaluation_results` (and ``cards.eval_results``) take.

    Args:
        uncalibrated, calibrated: ``compute`` results of the two pipelines on the same data.
        dataset: the data's display name (the model-index ``dataset.name``); ``dataset_id``: its hub id
            (``dataset.type``, default ``dataset``); ``split``: its split.
        in_sample: the data are data the calibration was fitted on (the card then says the numbers are optimistic).
        n_bins: the bins of the binned metrics (the metrics' default: 15), as the card says.

    Returns:
        ``{"uncalibrated": {metric: value}, "calibrated": {metric: value}, "dataset", "split", "dataset_id",
        "in_sample", "n_bins"}``: points only (the model-index holds values, not intervals). It does not say which
        model computed them: ``calibrated.push_evaluation_results(repo_id, evaluation)`` takes them as the results of
        ``calibrated`` (the model of the calibrated pipeline), and pushes them only into a card of that model.
    """
    sides = dict(zip(SIDES, (metric_values(uncalibrated), metric_values(calibrated))))
    card_keys = [key for key, _ in reporting.METRICS]
    for side, values in sides.items():
        if not any(key in values for key in card_keys):
            raise ValueError(
                f"the {side} results {sorted(values)} hold none of the model card's metrics {card_keys}: compute them with "
                f"{METRIC_HINT}."
            )
    return {**sides, "dataset": dataset, "split": split, "dataset_id": dataset_id, "in_sample": bool(in_sample),
            "n_bins": n_bins}
