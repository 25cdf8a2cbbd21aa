"""``fit_and_evaluate``: fit a calibration, then evaluate it, running the base model over the calibration data once."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch import nn

from .data.streams.units import is_one_shot
from .fitting.calibrate import fit_calibration, resolve_method
from .model_evaluation import check_engine_options, evaluate_model, require_logit_space_for_one_pass, same_base_pass
from .modeling import CalibratedModel
from .results.evaluation import EvaluationKeywords

__all__ = ["fit_and_evaluate"]


def fit_and_evaluate(
    model: nn.Module, calibration_data: Any, evaluation_data: Any = None, *, method: str = "neural_clamping",
    validation_data: Any = None, temperature_data: Any = None, dataset_name: Optional[str] = None,
    split: Optional[str] = None, evaluation_options: Optional[Dict[str, Any]] = None, **options: Any,
) -> Tuple[CalibratedModel, Dict[str, Any]]:
    """Fit, then evaluate; on the calibration data itself without running the base model over it twice.

    The same as ``calibrated = CalibratedModel.fit(model, calibration_data, method=method,
    validation_data=validation_data, temperature_data=temperature_data, dataset_name=dataset_name,
    split=split, **options)`` followed by ``calibrated.evaluate(evaluation_data, **evaluation_options)``
    (``evaluation_data`` None: the calibration data, an in-sample evaluation; ``evaluation_options``:
    ``n_bins``, ``dataset_name``, ``split``, ``in_sample`` and engine options).

    When the evaluation data are the calibration data (None or the same object) and the evaluation
    runs the base model as the fit did (the same engine options, except ``progress``,
    ``num_workers`` and ``seed``; its ``preprocessor`` unset or the fit's), the base logits the fit
    computed over them are reused: the uncalibrated metrics need no forward pass, nor do the
    calibrated ones of a logit-space method, whose evaluation loads no input at all. Neural
    Clamping and the head methods run the calibrated model once (δ and the new head need it). The
    kept logits (N × C float32) live only during this call.

    Evaluation options are checked before the fit starts. For data whose items are deterministic
    (no random augmentation in ``__getitem__``), the results are those of the two calls, bit for bit:
    every method's first pass runs the base model over the whole calibration data in the batches an
    evaluation uses. A one-shot stream (a generator) can be fitted and evaluated here with a
    logit-space method, whose evaluation reads no input.

    Returns:
        (the calibrated model, its evaluation): see :meth:`CalibratedModel.fit` and :meth:`CalibratedModel.evaluate`.
    """
    evaluation_settings = dict(evaluation_options or {})
    keywords = EvaluationKeywords.taken_from(evaluation_settings)
    check_engine_options(evaluation_settings)
    fitted_method = resolve_method(method)
    in_sample = evaluation_data is None or evaluation_data is calibration_data
    reuse = in_sample and same_base_pass(options, evaluation_settings)
    if in_sample and is_one_shot(calibration_data):
        require_logit_space_for_one_pass(fitted_method, reuse)
    fitted = fit_calibration(
        model, (calibration_data, validation_data, temperature_data), fitted_method, options,
        naming=(dataset_name, split), keep_logits=reuse,
    )
    calibrated = CalibratedModel._from_fit(model, fitted)
    data = calibration_data if evaluation_data is None else evaluation_data
    return calibrated, evaluate_model(calibrated, data, keywords, evaluation_settings, kept=fitted.kept)
