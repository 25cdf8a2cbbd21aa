"""Evaluating calibrated models: ``evaluate``'s keywords, the one evaluation pass, its JSON result (docs/design.md §2, §3.0).

Every evaluation of a calibrated model goes through :func:`accumulate`: its keywords checked, the
calibrated preprocessing made the default, one :class:`~hf_calibrate.fitting.Engine` over the data
(every process scores its share under Accelerate; the accumulators are summed when computed), and
the base's and the calibrated model's logits added to a before/after pair of accumulators
(:mod:`hf_calibrate.scoring`). :meth:`CalibratedModel.evaluate` and
:func:`~hf_calibrate.fit_evaluate.fit_and_evaluate` summarize the pair (:func:`evaluate_model`);
:func:`hf_calibrate.results.comparison.compare` pairs the calibrated sides of several models. An uncalibrated
model's own metrics (the CLI's ``evaluate`` of a plain model) come from the same pass
(:func:`hf_calibrate.scoring.evaluate_plain_model`).

:meth:`CalibratedModel.evaluate`'s result is plain JSON data (``json.dumps`` takes it)::

    {"uncalibrated": metrics, "calibrated": metrics, "reliability": {side: bins},
     "dataset": str, "split": str or None, "n_bins": int, "in_sample": bool or None (unknown),
     "in_sample_rows": {"calibration": int, "total": int} or None,
     "calibration_dataset": str, "calibration_split": str or None,
     "difference": {metric: interval}, "verdicts": {metric: str}, "bootstrap": {...},
     "model_identity": {"calibration_sha256": str, "base_fingerprint": str or None, "description": str}}

where ``in_sample`` is True when the data hold rows the fit used (:func:`hf_calibrate.data.calibration_rows.in_sample_rows`), and
``in_sample_rows`` says how many of their rows those are (None when ``in_sample`` is not True, or was
given); metrics are the dicts of :class:`hf_calibrate.metrics.CalibrationMetrics` plus ``smooth_ece`` and
their ``intervals``, and bins are ``ReliabilityBins.to_dict()`` (``ReliabilityBins.from_dict`` reads
them back; the plotting functions take them as they are); :mod:`hf_calibrate.results.evaluation` describes
the intervals and verdicts; ``model_identity`` names the calibrated model the results are of
(:mod:`hf_calibrate.serialization.evaluated_model`), so that they go into no other model's card.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Protocol, Tuple

import torch

from . import scoring
from ._warnings import warn_user
from .backbones import Backbone
from .backbones.base import format_size
from .backbones.preprocessing import differently_scaled, evaluation_options, value_range
from .calibrators import Calibrator
from .data import prepare_data
from .data.calibration_rows import FittedModel, in_sample_rows
from .data.identity import data_display_name, data_split
from .data.streams.units import is_one_shot
from .fitting.calibrate import FitMethod, engine_options
from .fitting.runtime.engine import Engine, EngineOptions
from .metrics import CalibrationMetrics
from .results import evaluation
from .results.evaluation import EvaluationKeywords
from .serialization.evaluated_model import IDENTITY_KEY, model_identity

#: engine options that change no base logit: a fit and an evaluation may differ in them and share the base's pass
PASS_NEUTRAL_OPTIONS = ("progress", "num_workers", "seed", "cache_bytes")
#: base logits (N, C) float32 and labels (N,) of every sample of the evaluation data, in dataset order
KeptLogits = Tuple[torch.Tensor, torch.Tensor]


class EvaluatedModel(FittedModel, Protocol):
    """What an evaluation asks of a calibrated model (:class:`hf_calibrate.CalibratedModel` is one): its parts, what it
    was fitted on and with, its calibrated forward pass; the result is kept as its ``last_evaluation``."""

    backbone: Backbone
    calibrator: Calibrator
    provenance: Dict[str, Any]
    preprocessor: Any
    last_evaluation: Optional[Dict[str, Any]]

    def _calibrated_forward(self, inputs: Dict[str, Any]) -> Tuple[torch.Tensor, Any]: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...


def check_engine_options(options: Dict[str, Any]) -> EngineOptions:
    """``evaluate``'s engine options, checked before any work (``fit_and_evaluate`` checks them before fitting; its
    :class:`~hf_calibrate.results.evaluation.EvaluationKeywords` are checked when made)."""
    return engine_options(options, "evaluate", EvaluationKeywords.names())


def accumulate(
    model: EvaluatedModel, data: Any, keywords: EvaluationKeywords, options: Dict[str, Any], *,
    kept: Optional[KeptLogits] = None,
) -> Tuple[CalibrationMetrics, CalibrationMetrics]:
    """The (uncalibrated, calibrated) accumulators of ``model`` on labelled ``data``, arguments checked.

    ``keywords``: ``evaluate``'s own; ``options``: engine options (the preprocessor defaults to the
    model's own); ``kept``: the base logits and labels of every sample of ``data`` (from the fit), used
    instead of running the base model again.
    """
    check_engine_options(options)
    options = evaluation_options(model.provenance.get("input_contract"), options, model.preprocessor)
    engine = Engine(check_engine_options(options))
    scorer = scoring.Scorer(model.backbone, model.calibrator, lambda inputs: model._calibrated_forward(inputs)[0])
    needs_data = kept is None or not scorer.logit_space or not is_one_shot(data)  # a read generator is not read again
    with torch.no_grad():
        prepared = prepare_data(data, model.backbone, role="evaluation data", **engine.options.data_options()) if needs_data else None
        if prepared is not None:
            warn_if_other_inputs(model, prepared)
        model.to(engine.device)
        return scoring.score(scorer, engine, prepared, (keywords.n_bins, keywords.bootstrap), kept)


def warn_if_other_inputs(model: EvaluatedModel, data: Any) -> None:
    """Warn, at the user's line, when the prepared evaluation ``data`` (their first sample) differ from the inputs the
    model was calibrated on (its ``input_contract``) in per-sample size, or, for images, in how their pixel values look
    preprocessed (normalised or not, 0–255 or 0–1): its confidences hold for inputs like the calibration data's,
    whatever the method (Neural Clamping's δ also refuses another size outright). Empty data are left to the
    evaluation to refuse."""
    contract = model.provenance.get("input_contract") or {}
    if contract.get("input_size") is None and contract.get("value_range") is None:
        return
    try:
        inputs = data.first_inputs()
    except (StopIteration, IndexError):  # no first sample
        return
    recorded, given = contract.get("input_size"), model.backbone.input_size(inputs)
    if recorded is not None and given is not None and tuple(given) != tuple(recorded):
        warn_user(
            f"the evaluation inputs are {format_size(given)} per sample, but the model was calibrated on "
            f"{format_size(recorded)} inputs: its confidences hold for inputs sized and preprocessed like the calibration "
            "data. Preprocess the evaluation data the same way (or pass raw images and leave preprocessor unset to use "
            "the model's own)."
        )
    recorded_range, given_range = contract.get("value_range"), value_range(model.backbone, inputs)
    if recorded_range is not None and given_range is not None and differently_scaled(recorded_range, given_range):
        warn_user(
            f"the evaluation inputs' pixel values lie in [{given_range[0]:.3g}, {given_range[1]:.3g}], the calibration "
            f"inputs' in [{recorded_range[0]:.3g}, {recorded_range[1]:.3g}]: they look preprocessed (normalised or "
            "scaled) differently, and the model's confidences hold for inputs preprocessed like the calibration data. "
            "Preprocess them the same way (or pass raw images and leave preprocessor unset to use the model's own)."
        )


def evaluate_model(
    model: EvaluatedModel, data: Any, keywords: EvaluationKeywords, options: Dict[str, Any], *,
    kept: Optional[KeptLogits] = None,
) -> Dict[str, Any]:
    """:meth:`CalibratedModel.evaluate`'s JSON result (arguments as :func:`accumulate`), also kept as the model's
    ``last_evaluation``."""
    uncalibrated, calibrated = accumulate(model, data, keywords, options, kept=kept)
    with torch.no_grad():
        summary = evaluation.summarize(uncalibrated, calibrated)
        in_sample, rows = in_sample_rows(model, data, summary["calibrated"]["num_samples"])
        if keywords.in_sample is False and in_sample:
            warn_user(f"in_sample=False was given, but these data hold rows the calibration was fitted on ("
                      f"{rows['calibration']} of {rows['total']}): the results are labelled held-out as asked, and are "
                      "optimistic. Leave in_sample unset, or evaluate on rows the fit did not use.")
        if keywords.in_sample is not None:
            in_sample, rows = keywords.in_sample, None
        result = {
            **summary,
            "reliability": {"uncalibrated": uncalibrated.reliability().to_dict(), "calibrated": calibrated.reliability().to_dict()},
            "dataset": keywords.dataset_name or data_display_name(data),
            "split": keywords.split or data_split(data),
            "n_bins": keywords.n_bins,
            "in_sample": in_sample,
            "in_sample_rows": rows,
            "calibration_dataset": model.provenance.get("dataset_name"),
            "calibration_split": model.provenance.get("split"),
            IDENTITY_KEY: model_identity(model),
        }
    model.last_evaluation = result
    return result


def same_base_pass(fit_options: Dict[str, Any], evaluation_settings: Dict[str, Any]) -> bool:
    """Whether an evaluation with ``evaluation_settings`` runs the base model over the data exactly as a fit with
    ``fit_options`` does: the same preprocessing, batches, precision and processes (an unset evaluation
    ``preprocessor`` is the calibrated model's own, the fit's)."""
    names = {field.name for field in dataclasses.fields(EngineOptions)} - set(PASS_NEUTRAL_OPTIONS)
    for name in names:
        fitted, evaluated = fit_options.get(name), evaluation_settings.get(name)
        if name == "preprocessor" and evaluated is None:
            continue
        if evaluated is not fitted and evaluated != fitted:
            return False
    return True


def require_logit_space_for_one_pass(method: FitMethod, reuse: bool) -> None:
    """Refuse, before fitting, to fit and evaluate on one-shot data when the evaluation would have to read them again."""
    if reuse and method.logit_space:
        return
    raise ValueError(
        f"the calibration data can be read only once (a generator or other iterator), and evaluating a {method.name!r} "
        "calibration on them reads them a second time"
        + ("" if reuse else " (the evaluation runs the base model with other options than the fit)")
        + ". Pass a callable that returns a new iterator each time it is called, or a re-iterable (a list of batches, "
        "a DataLoader, an IterableDataset)."
    )
