"""The model-level fit: a base model and the user's data and keywords in, a fitted calibration out.

:func:`fit_calibration` is the body of :meth:`hf_calibrate.CalibratedModel.fit` (and of
:func:`hf_calibrate.modeling.fit_and_evaluate`): it checks the keywords, freezes the base, prepares
the data, measures the input contract, fits the calibrator (:func:`hf_calibrate.fitting.fit_calibrator`)
and returns what the model is built from (:class:`FittedCalibration`): the calibrator, the config,
the fit summary, the provenance the record keeps, the preprocessor to save, and the base logits
the fit computed when asked to keep them.

The warnings raised under it that point at the user's line count on being called from the
user's entry point directly (``fit`` → :func:`fit_calibration` → :func:`input_contract` /
``contract_preprocessor``); keep that depth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import _auto_registration
from .._probabilities import PROBABILITIES
from .._warnings import warn_user
from ..backbones import Backbone, adapt
from ..backbones.preprocessing import contract_preprocessor
from ..calibrators import Calibrator, calibrator_class, options_to_dict, parse_options
from ..calibrators.neural_clamping import recorded_select_metric
from ..configuration import TASKS, CalibratedConfig
from ..data import CalibrationData, model_label_names, prepare_data
from ..data.lineage import KeptRows, keep_rows
from ..data.sources import is_one_shot
from ..results import reporting
from ..serialization.identity import weights_fingerprint
from . import fit_calibrator, input_contract
from .probing import base_outputs
from .auto import AUTO, AutoOptions, fit_auto
from .engine import Engine, EngineOptions
from .kept_logits import KeptLogits

#: (calibration, validation, temperature) data, as the user gave them (None where not given)
DataSources = Tuple[Any, Any, Any]
#: (display name, split) naming the calibration data (None: what the data record)
Naming = Tuple[Optional[str], Optional[str]]
#: (a weak reference to a data object's samples, or None; the content digests of their rows, or None)
FittedRows = Tuple[Optional[weakref.ref], Optional[KeptRows]]


#: the fit's warning when the base's outputs are probabilities (:func:`.probing.base_outputs`)
PROBABILITIES_READ = (
    "the model's outputs are probabilities, not logits: its calibration rows are non-negative and sum to 1 (its forward "
    "ends in a softmax; if it does not, fit with base_outputs='logits'). The calibration reads their log, log p: the "
    "model's logits up to a per-row constant, which softmax ignores (softmax(log p) = p). The calibrated model returns "
    "calibrated logits, not probabilities: apply a softmax to them for probabilities (pipelines do)."
)


class TemperatureScalingFallbackWarning(UserWarning):
    """A Neural Clamping fit fell back to plain temperature scaling: δ did not help on the held-out selection data."""


class CalibrationFitWarning(UserWarning):
    """A fit hit a bound, found its data separable, did not converge, or was given data near the least it needs.

    Each is one line of ``fit_summary["warnings"]`` (saved with the record), said at the user's line.
    """


@dataclasses.dataclass
class FittedCalibration:
    """What :func:`fit_calibration` returns: everything a ``CalibratedModel`` is built from, besides its base.

    Attributes:
        calibrator: the fitted calibrator (``is_fitted`` set).
        config: the model's transformers config.
        summary: the fit history (``CalibratedModel.fit_summary``).
        provenance: what the fit ran on and with (``CalibratedModel.provenance``; the record's ``fit``).
        preprocessor: the image processor or tokenizer to save beside the model (or None).
        fitted_data: weak references to the data objects the fit was given (``CalibratedModel.fitted_on``).
        fitted_rows: for each data object given, a weak reference to its samples and the content digests of their rows
            when they are ``datasets`` data or tensors (else None), so that its rows are still known once the object is
            gone (:func:`hf_calibrate.data.lineage.keep_rows`).
        kept: the base logits (N, C) float32 and labels (N,) of every calibration sample in dataset order,
            when asked to keep them and the fit computed all of them; else None.
    """

    calibrator: Calibrator
    config: CalibratedConfig
    summary: Dict[str, Any]
    provenance: Dict[str, Any]
    preprocessor: Any
    fitted_data: List[weakref.ref]
    fitted_rows: List[FittedRows]
    kept: Optional[Tuple[torch.Tensor, torch.Tensor]]


def refuse_one_shot_twice(data_sources: DataSources) -> None:
    """Refuse one iterator given for two of (calibration, validation, temperature) data: each would get part of it."""
    one_shot = [source for source in data_sources if source is not None and is_one_shot(source)]
    if len({id(source) for source in one_shot}) < len(one_shot):
        raise ValueError(
            "the same one-shot iterator (e.g. a generator) was given for two of calibration_data, validation_data and "
            "temperature_data: each would read only part of it. Pass separate data for each, or one re-iterable "
            "(a list of batches, a DataLoader, a callable returning a new iterator) for both."
        )


def is_logit_space(method: str) -> bool:
    """Whether ``method`` is fitted and applied on the base's logits alone: the logit methods and ``auto``."""
    if method == AUTO:
        return True
    cls = calibrator_class(method)
    return not (cls.needs_base_model or cls.needs_features)


def reads_selection_data(method: str) -> Tuple[bool, bool]:
    """Whether a fit of ``method`` reads (validation_data, temperature_data): Neural Clamping reads validation data,
    the head methods both; the logit methods and ``auto`` cross-fit on the calibration data and read neither."""
    logit_space = is_logit_space(method)
    return not logit_space, not logit_space and calibrator_class(method).needs_features


def refuse_unread_data(method: str, data_sources: DataSources) -> None:
    """Refuse validation or temperature data that a fit of ``method`` would not read (they would be silently ignored)."""
    for name, given, read in zip(("validation_data", "temperature_data"), data_sources[1:], reads_selection_data(method)):
        if given is not None and not read:
            raise ValueError(
                f"method {method!r} does not read {name}: it would be ignored. Leave it out"
                + (", or add its rows to calibration_data (the logit methods and auto fit on the calibration data alone; "
                   "those that choose a strength or a method hold out folds of it)."
                   if name == "validation_data" else "; only the head methods (tst, vtst, mac_cal) read it.")
            )


def _weakly_referable(source: Any) -> bool:
    if source is None:
        return False
    try:
        weakref.ref(source)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Freeze ``model`` (no grads, eval mode); on an exception restore its flags and mode."""
    flags = [parameter.requires_grad for parameter in model.parameters()]
    modes = [module.training for module in model.modules()]
    model.requires_grad_(False).eval()
    try:
        yield
    except BaseException:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
        for module, mode in zip(model.modules(), modes):
            module.training = mode
        raise


def engine_options(options: Dict[str, Any], where: str, own_names: Sequence[str]) -> EngineOptions:
    """``EngineOptions`` from the engine's part of ``options``; a name that is neither an engine option
    nor one of ``own_names`` (the options ``where`` itself takes) is a TypeError listing both."""
    engine_names = {field.name for field in dataclasses.fields(EngineOptions)}
    unknown = sorted(set(options) - engine_names - set(own_names))
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown} for {where}. Its options: {', '.join(sorted(own_names)) or 'none'}; "
            f"options of every fit: {', '.join(sorted(engine_names))}."
        )
    return EngineOptions(**{key: value for key, value in options.items() if key in engine_names})


def split_options(method: str, options: Dict[str, Any]) -> Tuple[EngineOptions, Any]:
    """(engine options, method options) of ``fit``'s keywords, each checked for name, type and range
    (``method="auto"``: :class:`~.auto.AutoOptions`)."""
    options_class = AutoOptions if method == AUTO else calibrator_class(method).Options
    method_names = [field.name for field in dataclasses.fields(options_class)]
    engine = engine_options(options, f"method {method!r}", method_names)
    method_options = parse_options(options_class, {k: v for k, v in options.items() if k in method_names}, method)
    return engine, method_options


def fallback_note(summary: Dict[str, Any], provenance: Dict[str, Any]) -> Optional[str]:
    """The sentence saying a Neural Clamping fit fell back to temperature scaling, or None when it did not."""
    return reporting.fallback_note(summary, recorded_select_metric(provenance.get("options")))


def fit_calibration(
    model: nn.Module, data_sources: DataSources, method: str, options: Dict[str, Any], *, naming: Naming, keep_logits: bool
) -> FittedCalibration:
    """Fit ``method`` on (calibration, validation, temperature) ``data_sources`` through the frozen ``model``.

    ``options`` are ``CalibratedModel.fit``'s keywords (the method's and the engine's); the calibration
    data are named ``naming``; with ``keep_logits`` the result keeps the base logits the fit computed
    (see :class:`FittedCalibration`). The model is frozen and moved to the fit's device; if the fit
    fails, its flags and mode are restored. A Neural Clamping fit that fell back to temperature
    scaling warns (:class:`TemperatureScalingFallbackWarning`) on the main process. ``method="auto"``
    fits the method it chooses (:mod:`.auto`): the result's config, options and calibrator are that method's.
    """
    engine_settings, method_options = split_options(method, options)
    engine = Engine(engine_settings)
    backbone = adapt(model, classifier=getattr(method_options, "classifier", None))
    calibration_data, validation_data, temperature_data = data_sources
    refuse_one_shot_twice(data_sources)
    refuse_unread_data(method, data_sources)
    with frozen(model):
        model.to(engine.device)
        prepare = lambda source, role: None if source is None else prepare_data(  # noqa: E731
            source, backbone, role=role, **engine_settings.data_options())
        data = prepare(calibration_data, "calibration data")
        engine.kept_logits = KeptLogits(data) if keep_logits else None
        contract = input_contract(backbone, data, engine)
        backbone.outputs = base_outputs(backbone, data, engine)
        if method == AUTO:
            calibrator, summary, method_options = fit_auto(backbone, data, method_options, engine)
        else:
            calibrator, summary = fit_calibrator(
                backbone, data, method, method_options, engine,
                validation=prepare(validation_data, "validation data"), temperature_data=prepare(temperature_data, "temperature data"),
            )
    kept = engine.kept_logits.take() if keep_logits else None
    calibrator.is_fitted = True
    preprocessor = contract_preprocessor(engine_settings.preprocessor, contract)
    provenance = _provenance(model, data, data_sources, naming, engine, method_options)
    provenance["input_contract"] = {**contract, "outputs": PROBABILITIES} if backbone.outputs == PROBABILITIES else contract
    if backbone.outputs == PROBABILITIES:
        summary["warnings"] = [PROBABILITIES_READ, *summary.get("warnings", [])]
    if data.class_names and model_label_names(backbone) is None:
        summary["class_names"] = "the calibration data's (the base model records none)"
    identities = [identity for source in data_sources if source is not None
                  for identity in _identities(source) if _weakly_referable(identity)]
    note = fallback_note(summary, provenance)
    if note is not None and engine.is_main:
        warn_user(f"{note} {reporting.fallback_advice(summary)}", TemperatureScalingFallbackWarning)
    for line in summary.get("warnings", []) if engine.is_main else []:
        warn_user(line, CalibrationFitWarning)
    return FittedCalibration(
        calibrator=calibrator,
        config=_config(backbone, calibrator.method, calibrator.num_classes, data),
        summary=summary,
        provenance=provenance,
        preprocessor=preprocessor,
        fitted_data=[weakref.ref(identity) for identity in identities],
        fitted_rows=[_fitted_rows(source, engine.is_main) for source in data_sources if source is not None],
        kept=kept,
    )


def _fitted_rows(source: Any, is_main: bool) -> FittedRows:
    """(a weak reference to the samples of ``source``, or None; the content digests of their rows, or None), the
    digests on the main process only."""
    samples = reporting.data_identity(source)
    return (weakref.ref(samples) if _weakly_referable(samples) else None, keep_rows(samples) if is_main else None)


def _identities(source: Any) -> List[Any]:
    """What stands for ``source`` in :meth:`CalibratedModel.fitted_on`: the object given (a DataLoader whose sampler
    reads part of its dataset is known as itself) and what :func:`~hf_calibrate.results.reporting.data_identity` makes
    of it, when that is another object."""
    identity = reporting.data_identity(source)
    return [source] if identity is source else [source, identity]


def _config(backbone: Backbone, method: str, num_classes: int, data: CalibrationData) -> CalibratedConfig:
    """The calibrated model's config; its labels are the model's names, else the calibration data's, else ``LABEL_i``."""
    from_data = data.class_names and {index: name for index, name in enumerate(data.class_names)}
    named = backbone.id2label if model_label_names(backbone) is not None else None
    return CalibratedConfig(
        base_library=backbone.library,
        base_task=TASKS[backbone.modality],
        calibration_method=method,
        id2label=named or from_data or backbone.id2label or {index: f"LABEL_{index}" for index in range(num_classes)},
    )


def _provenance(
    model: nn.Module, data: CalibrationData, data_sources: DataSources, naming: Naming, engine: Engine, method_options: Any
) -> Dict[str, Any]:
    """The fit's provenance (the record's ``fit``, plus ``options`` and ``base_fingerprint``), without the input contract."""
    calibration_data, options = data_sources[0], engine.options
    return {
        "dataset": data.description,
        "dataset_name": naming[0] or reporting.data_display_name(calibration_data),
        "split": naming[1] or reporting.data_split(calibration_data),
        "num_samples": len(data),
        "data_fingerprints": [fp for fp in map(reporting.data_fingerprint, data_sources) if fp is not None],
        "seed": options.seed,
        "options": options_to_dict(method_options),
        "batch_size": options.batch_size,
        "mixed_precision": options.mixed_precision or str(engine.accelerator.mixed_precision),
        "num_processes": engine.world,
        "base_fingerprint": weights_fingerprint(model),
    }


_auto_registration.finish_pending(__name__)  # when importing this module brought transformers in first
