"""The model-level fit: a base model and the user's data and keywords in, a fitted calibration out.

:func:`fit_calibration` is the body of :meth:`hf_calibrate.CalibratedModel.fit` (and of
:func:`hf_calibrate.fit_evaluate.fit_and_evaluate`): it checks the keywords, freezes the base, prepares
the data, measures the input contract, fits the calibrator (:func:`hf_calibrate.fitting.fit_calibrator`, or
``method="auto"``'s choice: :func:`resolve_method` turns the ``method`` name into what is fitted, once)
and returns what the model is built from (:class:`FittedCalibration`): the calibrator, the config,
the fit summary, the provenance the record keeps, the preprocessor to save, and the base logits
the fit computed when asked to keep them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type

import torch
from torch import nn

from .._probabilities import PROBABILITIES
from .._warnings import warn_user
from ..backbones import Backbone, adapt
from ..backbones.preprocessing import contract_preprocessor
from ..calibrators import CALIBRATORS, Calibrator, options_to_dict, parse_options
from ..calibrators.neural_clamping import recorded_select_metric
from ..configuration import TASKS, CalibratedConfig
from ..data import CalibrationData, model_label_names, prepare_data
from ..data.calibration_rows import CalibrationRows
from ..data.identity import data_display_name, data_fingerprint, data_split
from ..data.streams.units import is_one_shot
from ..results import reporting
from ..serialization.identity import weights_fingerprint
from . import fit_calibrator, input_contract
from .runtime.probing import base_outputs
from .auto.selection import AUTO, AutoOptions, fit_auto
from .runtime.engine import Engine, EngineOptions
from .runtime.kept_logits import KeptLogits

#: (calibration, validation, temperature) data, as the user gave them (None where not given)
DataSources = Tuple[Any, Any, Any]
#: (display name, split) naming the calibration data (None: what the data record)
Naming = Tuple[Optional[str], Optional[str]]
#: (validation data, temperature data) of a fit, prepared (None where not given)
SelectionData = Tuple[Optional[CalibrationData], Optional[CalibrationData]]
#: a method's fit: (backbone, calibration data, its options, engine, selection data) → (the fitted calibrator, its fit
#: summary, the options of the method fitted: for auto, its choice's)
MethodFit = Callable[[Backbone, CalibrationData, Any, Engine, SelectionData], Tuple[Calibrator, Dict[str, Any], Any]]


#: the fit's warning when the base's outputs are probabilities (:func:`.runtime.probing.base_outputs`)
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
        calibration_rows: the data the fit was given, recognised later (``CalibratedModel.fitted_on``).
        kept: the base logits (N, C) float32 and labels (N,) of every calibration sample in dataset order,
            when asked to keep them and the fit computed all of them; else None.
    """

    calibrator: Calibrator
    config: CalibratedConfig
    summary: Dict[str, Any]
    provenance: Dict[str, Any]
    preprocessor: Any
    calibration_rows: CalibrationRows
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


@dataclasses.dataclass(frozen=True)
class FitMethod:
    """A ``method=`` name resolved once (:func:`resolve_method`): its options, what its fit reads, and the fit.

    Attributes:
        name: the name given: ``"auto"`` or a method of :data:`~hf_calibrate.calibrators.CALIBRATORS`.
        options_class: the dataclass of its options (:class:`~.auto.selection.AutoOptions` for auto).
        logit_space: whether it is fitted and applied on the base's logits alone: the logit methods, and auto (which
            fits on the logits it cached, and runs the base again only for a head or Neural Clamping it was asked to try).
        reads: whether its fit reads (validation_data, temperature_data): Neural Clamping reads validation data, the
            head methods both; the logit methods and auto cross-fit on the calibration data and read neither.
        fit: the fit itself (:data:`MethodFit`).
    """

    name: str
    options_class: type
    logit_space: bool
    reads: Tuple[bool, bool]
    fit: MethodFit


def _fit_auto(backbone: Backbone, data: CalibrationData, options: AutoOptions, engine: Engine,
              selection: SelectionData) -> Tuple[Calibrator, Dict[str, Any], Any]:
    """``method="auto"``'s fit (:data:`MethodFit`): it reads no selection data."""
    return fit_auto(backbone, data, options, engine)


def _fit_class(cls: Type[Calibrator], backbone: Backbone, data: CalibrationData, options: Any, engine: Engine,
               selection: SelectionData) -> Tuple[Calibrator, Dict[str, Any], Any]:
    """A fit of the calibrator class ``cls`` by its family (:data:`MethodFit`)."""
    calibrator, summary = fit_calibrator(backbone, data, cls, options, engine, validation=selection[0],
                                         temperature_data=selection[1])
    return calibrator, summary, options


def resolve_method(method: str) -> FitMethod:
    """``method`` (``fit``'s keyword) resolved, once per fit: the one place where ``"auto"`` differs from a registered
    calibrator class. An unknown name is a ValueError listing the names."""
    if method == AUTO:
        return FitMethod(AUTO, AutoOptions, logit_space=True, reads=(False, False), fit=_fit_auto)
    try:
        cls = CALIBRATORS[method]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join([*CALIBRATORS, AUTO])}.") from None
    logit_space = cls.fitted_on_logits()
    return FitMethod(method, cls.Options, logit_space, (not logit_space, cls.needs_features), functools.partial(_fit_class, cls))


def selection_readers() -> Tuple[List[str], List[str]]:
    """(the methods whose fit reads validation data, those that read temperature data), in registration order."""
    resolved = [resolve_method(name) for name in CALIBRATORS]
    return [method.name for method in resolved if method.reads[0]], [method.name for method in resolved if method.reads[1]]


def refuse_unread_data(method: FitMethod, data_sources: DataSources) -> None:
    """Refuse validation or temperature data that a fit of ``method`` would not read (they would be silently ignored)."""
    for name, given, read in zip(("validation_data", "temperature_data"), data_sources[1:], method.reads):
        if given is not None and not read:
            raise ValueError(
                f"method {method.name!r} does not read {name}: it would be ignored. Leave it out"
                + (", or add its rows to calibration_data (the logit methods and auto fit on the calibration data alone; "
                   "those that choose a strength or a method hold out folds of it)."
                   if name == "validation_data" else f"; only {', '.join(selection_readers()[1])} read it.")
            )


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


def split_options(method: FitMethod, options: Dict[str, Any]) -> Tuple[EngineOptions, Any]:
    """(engine options, method options) of ``fit``'s keywords, each checked for name, type and range
    (``method="auto"``: :class:`~.auto.selection.AutoOptions`)."""
    method_names = [field.name for field in dataclasses.fields(method.options_class)]
    engine = engine_options(options, f"method {method.name!r}", method_names)
    method_options = parse_options(method.options_class, {k: v for k, v in options.items() if k in method_names}, method.name)
    return engine, method_options


def fallback_note(summary: Dict[str, Any], provenance: Dict[str, Any]) -> Optional[str]:
    """The sentence saying a Neural Clamping fit fell back to temperature scaling, or None when it did not."""
    return reporting.fallback_note(summary, recorded_select_metric(provenance.get("options")))


def fit_calibration(
    model: nn.Module, data_sources: DataSources, method: FitMethod, options: Dict[str, Any], *, naming: Naming, keep_logits: bool
) -> FittedCalibration:
    """Fit ``method`` (:func:`resolve_method`'s) on (calibration, validation, temperature) ``data_sources`` through the
    frozen ``model``.

    ``options`` are ``CalibratedModel.fit``'s keywords (the method's and the engine's); the calibration
    data are named ``naming``; with ``keep_logits`` the result keeps the base logits the fit computed
    (see :class:`FittedCalibration`). The model is frozen and moved to the fit's device; if the fit
    fails, its flags and mode are restored. A Neural Clamping fit that fell back to temperature
    scaling warns (:class:`TemperatureScalingFallbackWarning`) on the main process. ``method="auto"``
    fits the method it chooses (:mod:`.auto.selection`): the result's config, options and calibrator are that method's.
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
        selection = (prepare(validation_data, "validation data"), prepare(temperature_data, "temperature data"))
        calibrator, summary, method_options = method.fit(backbone, data, method_options, engine, selection)
    kept = engine.kept_logits.take() if keep_logits else None
    calibrator.is_fitted = True
    preprocessor = contract_preprocessor(engine_settings.preprocessor, contract)
    provenance = _provenance(model, data, data_sources, naming, engine, method_options)
    provenance["input_contract"] = {**contract, "outputs": PROBABILITIES} if backbone.outputs == PROBABILITIES else contract
    if backbone.outputs == PROBABILITIES:
        summary["warnings"] = [PROBABILITIES_READ, *summary.get("warnings", [])]
    if data.class_names and model_label_names(backbone) is None:
        summary["class_names"] = "the calibration data's (the base model records none)"
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
        calibration_rows=CalibrationRows.of_fit(data_sources, keep_digests=engine.is_main),
        kept=kept,
    )


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
        "dataset_name": naming[0] or data_display_name(calibration_data),
        "split": naming[1] or data_split(calibration_data),
        "num_samples": len(data),
        "data_fingerprints": [fp for fp in map(data_fingerprint, data_sources) if fp is not None],
        "seed": options.seed,
        "options": options_to_dict(method_options),
        "batch_size": options.batch_size,
        "mixed_precision": options.mixed_precision or str(engine.accelerator.mixed_precision),
        "num_processes": engine.world,
        "base_fingerprint": weights_fingerprint(model),
    }


