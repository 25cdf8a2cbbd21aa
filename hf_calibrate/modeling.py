"""``CalibratedModel``: a frozen base classifier plus a fitted calibrator, as a transformers model.

``CalibratedModel`` is a ``PreTrainedModel`` with its own config (``model_type
"hf_calibrate"``), registered with ``AutoConfig``, ``AutoModelForImageClassification`` and
``AutoModelForSequenceClassification`` on ``import hf_calibrate``, so transformers pipelines
and ``Auto*.from_pretrained`` work with it. The base may be a timm model, a transformers
image/sequence classifier or a plain ``nn.Module``; a backbone adapter (``hf_calibrate.backbones``)
hides the difference.

It is called exactly like its base: a timm or plain base takes a tensor and returns logits
(``model(x)``), or keywords (``model(pixel_values=x)``, as pipelines call it) and returns an
``ImageClassifierOutput``; a transformers base takes its usual keyword batch and returns its
usual ``ModelOutput`` with calibrated ``logits`` (and a cross-entropy ``loss`` of the
calibrated logits when ``labels`` are passed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    PreTrainedConfig,
    PreTrainedModel,
)

from . import _hub, cards, evaluation, reporting, scoring, serialization
from ._warnings import warn_user
from .backbones import Backbone, adapt
from .backbones.preprocessing import contract_preprocessor, evaluation_options, fallback_contract
from .calibrators import Calibrator, calibrator_class, options_to_dict, parse_options
from .calibrators.neural_clamping import recorded_select_metric
from .data import prepare_data
from .data.sources import is_one_shot
from .fitting import Engine, EngineOptions, fit_calibrator, input_contract
from .fitting.kept_logits import KeptLogits
from .metrics import CalibrationMetrics, ReliabilityBins
from .metrics._checks import check_n_bins
from .version import __version__

TASKS = {"image": "image-classification", "text": "text-classification", "tensor": "tensor-classification"}


class TemperatureScalingFallbackWarning(UserWarning):
    """A Neural Clamping fit fell back to plain temperature scaling: δ did not help on the held-out selection data."""


def _refuse_one_shot_twice(data_sources: Tuple[Any, Any, Any]) -> None:
    """Refuse one iterator given for two of (calibration, validation, temperature) data: each would get part of it."""
    one_shot = [source for source in data_sources if source is not None and is_one_shot(source)]
    if len({id(source) for source in one_shot}) < len(one_shot):
        raise ValueError(
            "the same one-shot iterator (e.g. a generator) was given for two of calibration_data, validation_data and "
            "temperature_data: each would read only part of it. Pass separate data for each, or one re-iterable "
            "(a list of batches, a DataLoader, a callable returning a new iterator) for both."
        )


def _weakly_referable(source: Any) -> bool:
    if source is None:
        return False
    try:
        weakref.ref(source)
    except TypeError:
        return False
    return True


class CalibratedConfig(PreTrainedConfig):
    """transformers-facing config of a calibrated model (the full record is ``calibration_config.json``).

    Attributes:
        base_library: ``"timm"``, ``"transformers"`` or ``"torch"``.
        base_task: ``"image-classification"``, ``"text-classification"`` or ``"tensor-classification"``.
        calibration_method: the method name, e.g. ``"neural_clamping"``.
    """

    model_type = "hf_calibrate"
    base_library: str = "transformers"
    base_task: str = "image-classification"
    calibration_method: str = "temperature"

    def __post_init__(self, **kwargs: Any) -> None:
        """As transformers' configs, plus ``label2id`` derived from ``id2label`` when not given."""
        super().__post_init__(**kwargs)
        if self.label2id is None and self.id2label:
            self.label2id = {label: index for index, label in self.id2label.items()}


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


def _engine_options(options: Dict[str, Any], where: str, own_names: Sequence[str]) -> EngineOptions:
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


#: ``evaluate``'s own keywords (beside the engine options) and their defaults
EVALUATION_KEYWORDS: Dict[str, Any] = {
    "n_bins": 15, "dataset_name": None, "split": None, "in_sample": None, "bootstrap": evaluation.DEFAULT_BOOTSTRAP,
}


def _check_evaluation_arguments(own: Dict[str, Any], options: Dict[str, Any]) -> None:
    """``evaluate``'s arguments (``own``: its :data:`EVALUATION_KEYWORDS`), checked before any work
    (``fit_and_evaluate`` checks them before fitting)."""
    check_n_bins(own["n_bins"])
    evaluation.check_bootstrap(own["bootstrap"])
    for name in ("dataset_name", "split"):
        if own[name] is not None and not isinstance(own[name], str):
            raise TypeError(f"{name} must be a string or None, got {own[name]!r} ({type(own[name]).__name__}).")
    if own["in_sample"] is not None and not isinstance(own["in_sample"], bool):
        raise TypeError(f"in_sample must be True, False or None, got {own['in_sample']!r}.")
    _engine_options(options, "evaluate", tuple(EVALUATION_KEYWORDS))


def _split_options(method: str, options: Dict[str, Any]):
    """(engine options, method options) of ``fit``'s keywords, each checked for name, type and range."""
    method_class = calibrator_class(method)
    method_names = [field.name for field in dataclasses.fields(method_class.Options)]
    engine_options = _engine_options(options, f"method {method!r}", method_names)
    method_options = parse_options(method_class.Options, {k: v for k, v in options.items() if k in method_names}, method)
    return engine_options, method_options


class CalibratedModel(PreTrainedModel):
    """A frozen base classifier and a fitted calibrator; build one with :meth:`fit` or :meth:`from_pretrained`.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> base = torch.nn.Linear(4, 3)
        >>> x = torch.randn(200, 4); y = (3 * base(x)).argmax(1)   # base is under-confident
        >>> calibrated = CalibratedModel.fit(base, TensorDataset(x, y), method="temperature", progress=False)
        >>> calibrated(x[:2]).shape
        torch.Size([2, 3])
        >>> report = calibrated.evaluate(TensorDataset(x, y), progress=False)
        >>> report["calibrated"]["nll"] < report["uncalibrated"]["nll"]
        True
    """

    config_class = CalibratedConfig
    base_model_prefix = "base_model"
    main_input_name = "pixel_values"
    _no_split_modules: list = []
    _supports_sdpa = _supports_flash_attn = _supports_flex_attn = True
    accepts_loss_kwargs = False

    def __init__(self, config: CalibratedConfig, base_model: nn.Module, calibrator: Calibrator) -> None:
        super().__init__(config)
        self.base_model = base_model
        self.calibrator = calibrator
        self.backbone: Backbone = adapt(base_model, num_classes=calibrator.num_classes,
                                        classifier=getattr(calibrator, "classifier", None))
        self.main_input_name = self.backbone.input_key
        base_model.requires_grad_(False).eval()
        calibrator.requires_grad_(False)  # fitted: calling the model must not build a graph
        self.fit_summary: Dict[str, Any] = {}
        self.provenance: Dict[str, Any] = {}
        self.last_evaluation: Optional[Dict[str, Any]] = None
        #: weak references to the data objects :meth:`fit` was given (see :meth:`fitted_on`)
        self._fitted_data: List[weakref.ref] = []
        #: the image processor or tokenizer saved beside the model (from fit or the saved folder)
        self.preprocessor: Any = None
        self.post_init()

    # -------------------------------------------------- transformers plumbing
    @property
    def base_model(self) -> nn.Module:  # PreTrainedModel.base_model would return self
        return self._modules["base_model"]

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing to initialise: the base is pretrained and the calibrator is fitted."""

    def init_weights(self) -> None:
        """Never re-initialise (transformers would overwrite a timm or plain base)."""

    @property
    def device(self) -> torch.device:
        """The base's device; a base without parameters (a plain function module) goes by the calibrator's."""
        tensor = next(itertools.chain(self.parameters(), self.buffers()), None)
        return tensor.device if tensor is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return next((p.dtype for p in self.base_model.parameters() if p.is_floating_point()), torch.float32)

    def train(self, mode: bool = True) -> "CalibratedModel":
        """The base always stays in eval mode (frozen batch-norm statistics, no dropout)."""
        super().train(mode)
        self.base_model.eval()
        return self

    @property
    def method(self) -> str:
        return self.calibrator.method

    # -------------------------------------------------- prediction
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call exactly like the base model; see the module docstring for what comes back."""
        labels = kwargs.pop("labels", None)
        inputs, positional = self.backbone.parse_call(args, kwargs)
        self._check_device(inputs)
        calibrated, raw_output = self._calibrated_forward(inputs)
        loss = F.cross_entropy(calibrated.float(), labels.to(calibrated.device)) if labels is not None else None
        return self.backbone.wrap_output(calibrated, raw_output, positional, loss)

    def _calibrated_forward(self, inputs: Dict[str, Any]):
        """(calibrated logits, the base's raw output): δ added, head replaced, then the logit map."""
        head = self.calibrator.head
        with self.backbone.head_replaced(head) if head is not None else contextlib.nullcontext():
            logits, raw_output = self.backbone.forward(inputs, self.calibrator.input_perturbation)
        return self.calibrator(logits), raw_output

    def _check_device(self, inputs: Dict[str, Any]) -> None:
        main = inputs.get(self.backbone.input_key)
        if isinstance(main, torch.Tensor) and main.device != self.device:
            raise ValueError(
                f"the input is on {main.device} but the calibrated model is on {self.device}; move the input "
                f"(e.g. x.to(model.device)) or the model (model.to(device))."
            )

    # -------------------------------------------------- fitting
    @classmethod
    def fit(
        cls,
        model: nn.Module,
        calibration_data: Any,
        *,
        method: str = "neural_clamping",
        validation_data: Any = None,
        temperature_data: Any = None,
        dataset_name: Optional[str] = None,
        split: Optional[str] = None,
        **options: Any,
    ) -> "CalibratedModel":
        """Fit a calibration of ``model`` on held-out labelled ``calibration_data``.

        Args:
            model: a timm classifier, a transformers image/sequence classifier, or an
                ``nn.Module`` mapping a tensor to (N, C) logits. It is frozen (``requires_grad``
                off, eval mode) and moved to the fit's device; it is not copied. If the fit
                fails, its flags and mode are restored.
            calibration_data: a ``DataLoader`` (of a map-style dataset), a torch ``Dataset``
                or a ``datasets.Dataset`` (see :mod:`hf_calibrate.data`). For the head methods
                this is the data the new head is trained on (the papers use the training split).
            method: ``"neural_clamping"`` (default), ``"temperature"``, ``"vector"``,
                ``"matrix"``, ``"dirichlet"``, ``"histogram"``, ``"isotonic"``, or the head
                methods ``"tst"``, ``"vtst"``, ``"mac_cal"``.
            validation_data: the selection split of Neural Clamping and the head methods
                (default: they hold out ``holdout_fraction`` of ``calibration_data``).
            temperature_data: where head methods fit their optional temperature
                (``temperature=True``; default: the validation data).
            dataset_name, split: how the model card and evaluations name the calibration data
                (default: what a ``datasets.Dataset`` records, see :mod:`hf_calibrate.reporting`).
            **options: the method's options (e.g. ``NeuralClamping.Options``) and the options
                of every fit (:class:`hf_calibrate.fitting.EngineOptions`: ``batch_size``,
                ``seed``, ``progress``, ``mixed_precision``, ``preprocessor``, ...).

        Returns:
            The fitted ``CalibratedModel``; ``fit_summary`` holds the fit history. A Neural Clamping
            fit whose δ did not beat temperature scaling on the held-out selection data is plain
            temperature scaling: its ``fit_summary["fell_back_to_temperature_scaling"]`` is True and
            the fit warns (:class:`TemperatureScalingFallbackWarning`).
        """
        data = (calibration_data, validation_data, temperature_data)
        return cls._fit(model, data, method, options, naming=(dataset_name, split), keep_logits=False)[0]

    @classmethod
    def _fit(
        cls,
        model: nn.Module,
        data_sources: Tuple[Any, Any, Any],
        method: str,
        options: Dict[str, Any],
        *,
        naming: Tuple[Optional[str], Optional[str]],
        keep_logits: bool,
    ) -> Tuple["CalibratedModel", Optional[Tuple[torch.Tensor, torch.Tensor]]]:
        """:meth:`fit` of (calibration, validation, temperature) ``data_sources``, the calibration data named
        ``naming`` (display name, split); with ``keep_logits`` also the base logits (N, C) float32 and labels (N,)
        of every calibration sample in dataset order, as the fit computed them (None when it did not compute all)."""
        engine_options, method_options = _split_options(method, options)
        engine = Engine(engine_options)
        backbone = adapt(model, classifier=getattr(method_options, "classifier", None))
        calibration_data, validation_data, temperature_data = data_sources
        _refuse_one_shot_twice(data_sources)
        with frozen(model):
            model.to(engine.device)
            prepare = lambda source: None if source is None else prepare_data(source, backbone, **engine_options.data_options())  # noqa: E731
            data = prepare(calibration_data)
            engine.kept_logits = KeptLogits(data) if keep_logits else None
            contract = input_contract(backbone, data, engine)
            calibrator, summary = fit_calibrator(
                backbone, data, method, method_options, engine,
                validation=prepare(validation_data), temperature_data=prepare(temperature_data),
            )
        kept = engine.kept_logits.take() if keep_logits else None
        calibrator.is_fitted = True
        config = CalibratedConfig(
            base_library=backbone.library,
            base_task=TASKS[backbone.modality],
            calibration_method=method,
            id2label=backbone.id2label or {index: f"LABEL_{index}" for index in range(calibrator.num_classes)},
        )
        calibrated = cls(config, model, calibrator).eval()
        calibrated.fit_summary = summary
        calibrated.preprocessor = contract_preprocessor(engine_options.preprocessor, contract)
        calibrated.provenance = {
            "dataset": data.description,
            "dataset_name": naming[0] or reporting.data_display_name(calibration_data),
            "split": naming[1] or reporting.data_split(calibration_data),
            "num_samples": len(data),
            "data_fingerprints": [fp for fp in map(reporting.data_fingerprint, data_sources) if fp is not None],
            "seed": engine_options.seed,
            "options": options_to_dict(method_options),
            "batch_size": engine_options.batch_size,
            "mixed_precision": engine_options.mixed_precision or str(engine.accelerator.mixed_precision),
            "num_processes": engine.world,
            "base_fingerprint": serialization.weights_fingerprint(model),
            "input_contract": contract,
        }
        identities = (reporting.data_identity(source) for source in data_sources if source is not None)
        calibrated._fitted_data = [weakref.ref(identity) for identity in identities if _weakly_referable(identity)]
        note = calibrated.fallback_note()
        if note is not None and engine.is_main:
            warn_user(f"{note} {reporting.FALLBACK_ADVICE}", TemperatureScalingFallbackWarning)
        return calibrated, kept

    def fallback_note(self) -> Optional[str]:
        """The sentence saying this Neural Clamping fit fell back to temperature scaling, or None when it did not."""
        return reporting.fallback_note(self.fit_summary, recorded_select_metric(self.provenance.get("options")))

    def fitted_on(self, data: Any) -> bool:
        """Whether ``data`` are data this calibration was fitted on: the very calibration, validation or temperature
        data object given to :meth:`fit` (or a DataLoader over it, or the dataset of a DataLoader given), or a
        ``datasets.Dataset`` with one of their fingerprints (the same rows through the same transforms; recorded,
        so this holds for a loaded model too)."""
        identity = reporting.data_identity(data)
        if any(reference() is identity for reference in self._fitted_data):
            return True
        fingerprint = reporting.data_fingerprint(data)
        return fingerprint is not None and fingerprint in (self.provenance.get("data_fingerprints") or ())

    # -------------------------------------------------- evaluation
    def evaluate(
        self,
        data: Any,
        *,
        n_bins: int = 15,
        dataset_name: Optional[str] = None,
        split: Optional[str] = None,
        in_sample: Optional[bool] = None,
        bootstrap: int = evaluation.DEFAULT_BOOTSTRAP,
        **options: Any,
    ) -> Dict[str, Any]:
        """Metrics of the base and the calibrated model on labelled ``data``, side by side.

        ``options`` are those of :class:`hf_calibrate.fitting.EngineOptions` (batch size,
        preprocessor, progress, ...; the preprocessor defaults to the model's own). Runs on every
        process under Accelerate: each process scores its shard and the streaming accumulators
        are summed. ``dataset_name`` and ``split`` label the results in model cards (default:
        what a ``datasets.Dataset`` records). ``in_sample`` says whether ``data`` are data the
        calibration was fitted on (None: :meth:`fitted_on` decides); in-sample results are
        labelled so in the card, the diagram and the CLI. The result is kept as
        ``last_evaluation`` and goes into the saved record and model card. ``bootstrap``: the
        Poisson-bootstrap replicates behind the 95 % intervals of every metric and of the paired
        difference calibrated − uncalibrated (0: points only); their seed is the engine's ``seed``.

        Returns:
            Plain JSON data (``json.dumps`` takes it): ``{"uncalibrated": metrics, "calibrated":
            metrics, "reliability": {side: bins}, "dataset": str, "split": str or None, "n_bins": int,
            "in_sample": bool, "calibration_dataset": str, "calibration_split": str or None,
            "difference": {metric: interval}, "verdicts": {metric: str}, "bootstrap": {...}}``, where
            metrics are the dicts of :class:`hf_calibrate.metrics.CalibrationMetrics` plus ``smooth_ece``
            and their ``intervals``, and bins are ``ReliabilityBins.to_dict()`` (``ReliabilityBins.from_dict``
            reads them back; the plotting functions take them as they are); :mod:`hf_calibrate.evaluation`
            describes the intervals and verdicts.
        """
        own = {"n_bins": n_bins, "dataset_name": dataset_name, "split": split, "in_sample": in_sample, "bootstrap": bootstrap}
        return self._evaluate(data, own, options, kept=None)

    @torch.no_grad()
    def _evaluate(
        self, data: Any, own: Dict[str, Any], options: Dict[str, Any], *, kept: Optional[Tuple[torch.Tensor, torch.Tensor]]
    ) -> Dict[str, Any]:
        """:meth:`evaluate` (``own``: its :data:`EVALUATION_KEYWORDS`); ``kept``: the base logits (N, C) and labels (N,)
        of every sample of ``data`` in dataset order (from :meth:`_fit`), used instead of running the base model again."""
        uncalibrated, calibrated = self._accumulate(data, own, options, kept=kept)
        result = {
            **evaluation.summarize(uncalibrated, calibrated),
            "reliability": {"uncalibrated": uncalibrated.reliability().to_dict(), "calibrated": calibrated.reliability().to_dict()},
            "dataset": own["dataset_name"] or reporting.data_display_name(data),
            "split": own["split"] or reporting.data_split(data),
            "n_bins": own["n_bins"],
            "in_sample": own["in_sample"] if own["in_sample"] is not None else self.fitted_on(data),
            "calibration_dataset": self.provenance.get("dataset_name"),
            "calibration_split": self.provenance.get("split"),
        }
        self.last_evaluation = result
        return result

    @torch.no_grad()
    def _accumulate(
        self, data: Any, own: Dict[str, Any], options: Dict[str, Any], *, kept: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[CalibrationMetrics, CalibrationMetrics]:
        """The (uncalibrated, calibrated) accumulators of :meth:`_evaluate`, checked arguments and all (also what
        :mod:`hf_calibrate.comparison` pairs across methods)."""
        _check_evaluation_arguments(own, options)
        options = evaluation_options(self.provenance.get("input_contract"), options, self.preprocessor)
        engine = Engine(_engine_options(options, "evaluate", tuple(EVALUATION_KEYWORDS)))
        scorer = scoring.Scorer(self.backbone, self.calibrator, lambda inputs: self._calibrated_forward(inputs)[0])
        needs_data = kept is None or not scorer.logit_space or not is_one_shot(data)  # a read generator is not read again
        prepared = prepare_data(data, self.backbone, **engine.options.data_options()) if needs_data else None
        self.to(engine.device)
        return scoring.score(scorer, engine, prepared, (own["n_bins"], own["bootstrap"]), kept)

    # -------------------------------------------------- saving, loading, pushing
    def calibration_record(
        self, *, base_weights: str = "included", base_model_id: Optional[str] = None, base_revision: Optional[str] = None
    ) -> Dict[str, Any]:
        """The ``calibration_config.json`` contents for this model (schema: ``serialization.schema.RECORD_SCHEMA``, docs/artifact.md)."""
        reference = serialization.hub_reference(self.base_model, self.backbone.library)
        delta = self.calibrator.input_perturbation
        delta_shape = list(delta.shape) if delta is not None else None
        contract = self.provenance.get("input_contract") or fallback_contract(self.backbone, delta_shape)
        fit = {key: value for key, value in self.provenance.items() if key not in ("options", "base_fingerprint", "input_contract")}
        fit["summary"] = {key: value for key, value in self.fit_summary.items() if key != "history"}
        return {
            "format_version": serialization.FORMAT_VERSION,
            "library_version": __version__,
            "method": self.method,
            "calibrator": self.calibrator.config(),
            "options": self.provenance.get("options", {}),
            "base_model": {
                "library": self.backbone.library,
                "task": self.config.base_task,
                "repo_id": base_model_id or reference["repo_id"],
                "revision": base_revision or reference["revision"],
                "num_labels": self.calibrator.num_classes,
                "id2label": {str(k): v for k, v in self.config.id2label.items()},
                "fingerprint": self.provenance.get("base_fingerprint"),
                "weights": base_weights,
                "classifier": self.backbone.classifier_name if self.calibrator.head is not None else None,
            },
            "input_contract": {**contract, "shape": delta_shape},
            "fit": fit,
            "evaluation": _evaluation_record(self.last_evaluation),
            "files": {
                "weights": serialization.CALIBRATION_WEIGHTS,
                "base": serialization.BASE_FOLDER if base_weights == "included" and self.backbone.library == "transformers" else None,
            },
        }

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        *,
        include_base: bool = True,
        base_model_id: Optional[str] = None,
        base_revision: Optional[str] = None,
        preprocessor: Any = None,
        overwrite_card: bool = False,
        repo_id: Optional[str] = None,
        is_main_process: bool = True,
        **transformers_kwargs: Any,
    ) -> Optional[Path]:
        """Save the artifact (docs/artifact.md) into ``save_directory``, crash-atomically.

        Replaces only the files of the previous artifact there (its manifest); a user's other
        files, folders and links are kept (overwriting one is a ``FileExistsError``).

        Args:
            include_base: save the base model's own files (default). With False the repo is
                reference-only: it names the base repo and commit (``base_model_id`` /
                ``base_revision``, default: what the base model records) and loads it from there.
            preprocessor: image processor or tokenizer to save beside it (default: the one
                given to :meth:`fit`), so pipelines find it.
            overwrite_card: replace a ``README.md`` in the folder that hf_calibrate did not write.
            repo_id: the hub id the card's title and usage snippet show (default: this folder).
            is_main_process: only the main process writes (as in transformers).
            **transformers_kwargs: accepted for compatibility with ``Trainer`` and
                ``PreTrainedModel.push_to_hub`` (``state_dict``, ``safe_serialization``,
                ``max_shard_size``, ...); the calibration always saves in safetensors.
        """
        unknown = set(transformers_kwargs) - _TRANSFORMERS_SAVE_KWARGS
        if unknown:
            raise TypeError(f"save_pretrained() got unexpected keyword argument(s) {sorted(unknown)}.")
        if not is_main_process:
            return None
        if self.backbone.library == "torch":
            weights = "not_saved"
        elif include_base:
            weights = "included"
        else:
            weights = "reference"
        record = self.calibration_record(base_weights=weights, base_model_id=base_model_id, base_revision=base_revision)
        if weights == "reference" and not record["base_model"]["repo_id"]:
            raise ValueError(
                "a reference-only save needs the base model's hub repo id; pass base_model_id=... (and "
                "base_revision=<commit>) or save with include_base=True."
            )
        problem = base_model_id is not None and serialization.repo_id_problem(base_model_id)
        if problem:
            raise ValueError(f"base_model_id={base_model_id!r} {problem}; pass the base's hub repo id, e.g. 'org/name'.")
        self.config.architectures = [type(self).__name__]
        # save_artifact hands `reliability` to cards.write_diagram, which draws the evaluation's bins and titles them
        # with what they were computed on; `repo_id` goes to cards.render_card: a str is a hub repo id, a Path the folder.
        return serialization.save_artifact(
            Path(save_directory), record=record, config_json=self.config.to_dict(), base_model=self.base_model,
            calibrator=self.calibrator, preprocessor=preprocessor if preprocessor is not None else self.preprocessor,
            reliability=record["evaluation"], repo_id=repo_id if repo_id is not None else Path(save_directory),
            overwrite_card=overwrite_card,
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args: Any,
        revision: Optional[str] = None,
        token: Optional[str | bool] = None,
        cache_dir: Optional[str | os.PathLike] = None,
        local_files_only: bool = False,
        force_download: bool = False,
        subfolder: Optional[str] = None,
        base_model: Optional[nn.Module] = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        device_map: Any = None,
        **kwargs: Any,
    ) -> "CalibratedModel":
        """Load a calibrated model from a folder or a hub repo id (``revision`` pins a commit).

        Verifies the artifact (record schema and digest, tensors, δ, labels, base fingerprint;
        an :class:`~hf_calibrate.serialization.ArtifactError` names the file, key and fix) after
        finishing a save of the folder that a crash interrupted. ``base_model`` supplies the base
        of a plain-module calibration (or overrides the saved one; its fingerprint must match).

        ``dtype`` (``torch_dtype`` is its older name): None or ``"auto"`` keep the dtype the base
        was saved and fitted in (the one its fingerprint verifies); a floating ``torch.dtype`` or
        its name (``"bfloat16"``) casts the base after verification. The calibrator stays
        float32. ``device_map``: one device for the whole model (``"cpu"``, ``"cuda:0"``, ``0``,
        ``{"": "cuda:0"}``; ``"auto"``: the first accelerator, else the CPU); a map splitting the
        model is refused. Works offline from the cache (``HF_HUB_OFFLINE=1``); also reached by
        ``AutoModelFor...from_pretrained`` and ``pipeline(task, model=...)``.
        """
        if model_args:
            raise TypeError("CalibratedModel.from_pretrained takes no positional model arguments.")
        unknown = set(kwargs) - _TRANSFORMERS_LOAD_KWARGS
        if unknown:
            raise TypeError(f"from_pretrained() got unexpected keyword argument(s) {sorted(unknown)}.")
        target_dtype, device = _load_dtype(dtype, torch_dtype), _load_device(device_map)
        hub_options = dict(token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        serialization.recover_legacy_save(Path(pretrained_model_name_or_path))
        root = _hub.resolve_folder(
            pretrained_model_name_or_path, revision=revision, force_download=force_download, subfolder=subfolder, **hub_options
        )
        record, calibrator, base, preprocessor = _load_verified(root, base_model, hub_options)
        base_info = record["base_model"]
        id2label = {int(k): v for k, v in base_info["id2label"].items()}
        config = CalibratedConfig(
            base_library=base_info["library"], base_task=base_info["task"], calibration_method=record["method"],
            id2label=id2label, label2id=_label2id(base, id2label),
        )
        if calibrator.head is not None:  # the base layer the head replaces, as fitted
            calibrator.classifier = base_info.get("classifier")
        model = cls(config, base, calibrator.to(backbone_device(base)))
        model.fit_summary = dict(record["fit"].get("summary") or {})
        model.provenance = {key: value for key, value in record["fit"].items() if key != "summary"}
        model.provenance.update(
            options=record.get("options", {}), base_fingerprint=base_info.get("fingerprint"), input_contract=record.get("input_contract")
        )
        model.last_evaluation = _evaluation_from_record(record, root)
        model.preprocessor = preprocessor
        if target_dtype is not None:
            model.base_model.to(target_dtype)
        return model.to(device).eval() if device is not None else model.eval()

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: Optional[bool] = None,
        revision: Optional[str] = None,
        commit_message: Optional[str] = None,
        token: Optional[str | bool] = None,
        include_base: bool = True,
        base_model_id: Optional[str] = None,
        base_revision: Optional[str] = None,
        preprocessor: Any = None,
        overwrite_card: bool = False,
    ) -> Any:
        """Save and upload to ``repo_id`` (created if missing) as one commit; returns the ``CommitInfo``.

        ``revision`` names the branch (created if missing). A README.md already on the hub
        that hf_calibrate did not write is kept unless ``overwrite_card``.
        """
        with tempfile.TemporaryDirectory(prefix="hf_calibrate_push_") as tmp:
            folder = self.save_pretrained(
                Path(tmp) / "repo", include_base=include_base, base_model_id=base_model_id, base_revision=base_revision,
                preprocessor=preprocessor, overwrite_card=True, repo_id=repo_id,
            )
            return _hub.push_folder(
                folder, repo_id, private=private, revision=revision, commit_message=commit_message, token=token,
                overwrite_card=overwrite_card,
            )

    def push_evaluation_results(
        self,
        repo_id: str,
        evaluation: Optional[Dict[str, Any]] = None,
        *,
        token: Optional[str | bool] = None,
        revision: Optional[str] = None,
        commit_message: Optional[str] = None,
    ) -> Any:
        """Put ``evaluation`` (default: ``last_evaluation``) into the model-index of ``repo_id``'s card; one commit."""
        evaluation = evaluation if evaluation is not None else self.last_evaluation
        if not evaluation:
            raise ValueError("nothing to push: run calibrated.evaluate(test_data) first, or pass evaluation=....")
        return _hub.push_evaluation_results(repo_id, evaluation, token=token, revision=revision, commit_message=commit_message)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self.calibrator, "is_fitted", False):
            raise RuntimeError(
                "this CalibratedModel's calibrator has not been fitted; build it with CalibratedModel.fit(...) "
                "or CalibratedModel.from_pretrained(...)."
            )
        return super().__call__(*args, **kwargs)


def fit_and_evaluate(
    model: nn.Module,
    calibration_data: Any,
    evaluation_data: Any = None,
    *,
    method: str = "neural_clamping",
    validation_data: Any = None,
    temperature_data: Any = None,
    dataset_name: Optional[str] = None,
    split: Optional[str] = None,
    evaluation_options: Optional[Dict[str, Any]] = None,
    **options: Any,
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
    evaluation_options = dict(evaluation_options or {})
    own = {key: evaluation_options.pop(key, default) for key, default in EVALUATION_KEYWORDS.items()}
    _check_evaluation_arguments(own, evaluation_options)
    reuse = (evaluation_data is None or evaluation_data is calibration_data) and _same_base_pass(options, evaluation_options)
    if (evaluation_data is None or evaluation_data is calibration_data) and is_one_shot(calibration_data):
        _require_logit_space_for_one_pass(method, reuse)
    calibrated, kept = CalibratedModel._fit(
        model, (calibration_data, validation_data, temperature_data), method, options,
        naming=(dataset_name, split), keep_logits=reuse,
    )
    data = calibration_data if evaluation_data is None else evaluation_data
    evaluation = calibrated._evaluate(data, own, evaluation_options, kept=kept)
    return calibrated, evaluation


def _require_logit_space_for_one_pass(method: str, reuse: bool) -> None:
    """Refuse, before fitting, to fit and evaluate on one-shot data when the evaluation would have to read them again."""
    cls = calibrator_class(method)
    if reuse and not (cls.needs_features or cls.needs_base_model):
        return
    raise ValueError(
        f"the calibration data can be read only once (a generator or other iterator), and evaluating a {method!r} "
        "calibration on them reads them a second time"
        + ("" if reuse else " (the evaluation runs the base model with other options than the fit)")
        + ". Pass a callable that returns a new iterator each time it is called, or a re-iterable (a list of batches, "
        "a DataLoader, an IterableDataset)."
    )


#: engine options that change no base logit: a fit and an evaluation may differ in them and share the base's pass
_PASS_NEUTRAL_OPTIONS = ("progress", "num_workers", "seed", "cache_bytes")


def _same_base_pass(fit_options: Dict[str, Any], evaluation_options: Dict[str, Any]) -> bool:
    """Whether an evaluation with ``evaluation_options`` runs the base model over the data exactly as a fit with
    ``fit_options`` does: the same preprocessing, batches, precision and processes (an unset evaluation
    ``preprocessor`` is the calibrated model's own, the fit's)."""
    names = {field.name for field in dataclasses.fields(EngineOptions)} - set(_PASS_NEUTRAL_OPTIONS)
    for name in names:
        fitted, evaluated = fit_options.get(name), evaluation_options.get(name)
        if name == "preprocessor" and evaluated is None:
            continue
        if evaluated is not fitted and evaluated != fitted:
            return False
    return True


def register_auto_classes() -> None:
    """Make ``AutoConfig`` / ``AutoModelFor{Image,Sequence}Classification`` (and pipelines) know ``hf_calibrate``."""
    AutoConfig.register(CalibratedConfig.model_type, CalibratedConfig, exist_ok=True)
    AutoModelForImageClassification.register(CalibratedConfig, CalibratedModel, exist_ok=True)
    AutoModelForSequenceClassification.register(CalibratedConfig, CalibratedModel, exist_ok=True)


_TRANSFORMERS_SAVE_KWARGS = {"state_dict", "safe_serialization", "max_shard_size", "variant", "token", "save_function", "push_to_hub"}
# What AutoModelFor*.from_pretrained and pipeline(...) may pass on and that does not change how we load
# (device_map, dtype and torch_dtype are arguments of their own).
_TRANSFORMERS_LOAD_KWARGS = {
    "config", "trust_remote_code", "adapter_kwargs", "attn_implementation",
    "low_cpu_mem_usage", "use_safetensors", "_from_auto", "_from_pipeline", "_commit_hash", "code_revision", "proxies",
}
# device_map strategies of transformers; one calibrated model always goes to one device
_DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def backbone_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


#: what an evaluation names, kept in the record beside its metrics (see :mod:`hf_calibrate.reporting`)
_EVALUATION_NAMES = ("dataset", "split", "n_bins", "in_sample", "calibration_dataset", "calibration_split")


def _evaluation_record(evaluation: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The record's part of :meth:`CalibratedModel.evaluate`'s result: what it names, the card's metrics with their
    intervals, the paired differences and verdicts, the bins."""
    if not evaluation:
        return None
    named = {key: evaluation[key] for key in _EVALUATION_NAMES if key in evaluation}
    return {**named, **cards.card_metrics(evaluation), "reliability": dict(evaluation["reliability"])}


def _evaluation_from_record(record: Dict[str, Any], root: Optional[Path] = None) -> Optional[Dict[str, Any]]:
    """:meth:`CalibratedModel.evaluate`'s result from the ``evaluation`` of ``record`` (ArtifactError when malformed);
    an evaluation saved before the record named whether it was in-sample is completed from the record's ``fit``."""
    evaluation = record.get("evaluation")
    if not evaluation:
        return None
    try:
        for bins in (evaluation.get("reliability") or {}).values():
            ReliabilityBins.from_dict(bins)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, OverflowError) as error:
        file = (root or Path(".")) / serialization.CALIBRATION_CONFIG
        raise serialization.ArtifactError(
            f"{file}: key 'evaluation.reliability' is not a set of reliability bins ({type(error).__name__}: {error}); "
            f"{serialization.RESAVE}"
        ) from None
    return reporting.completed_evaluation(evaluation, record["fit"])


def _load_verified(
    root: Path, base_model: Optional[nn.Module], hub_options: Dict[str, Any]
) -> Tuple[Dict[str, Any], Calibrator, nn.Module, Any]:
    """(record, calibrator, base, preprocessor) of the artifact in ``root``, each verified, under the folder's read lock."""
    with serialization.reading(root):
        record = serialization.read_record(root)
        calibrator = serialization.load_calibrator(root, record)
        base = base_model if base_model is not None else serialization.load_base(root, record, **hub_options)
        backbone = adapt(base, num_classes=calibrator.num_classes)
        serialization.verify_against_base(root, record, backbone, calibrator, base_passed=base_model is not None)
        return record, calibrator, base, _load_preprocessor(root, record)


def _load_preprocessor(root: Path, record: Dict[str, Any]) -> Any:
    """The saved tokenizer / image processor; files that transformers cannot read are an ArtifactError."""
    try:
        return serialization.load_preprocessor(root, record)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as error:
        raise serialization.ArtifactError(
            f"{root}: the saved preprocessor (tokenizer or image processor files) cannot be loaded "
            f"({type(error).__name__}: {str(error)[:300]}); {serialization.RESAVE}"
        ) from None


def _label2id(base: nn.Module, id2label: Dict[int, str]) -> Dict[str, int]:
    """The base's own ``label2id`` when it agrees with ``id2label``, else ``id2label`` inverted."""
    recorded = getattr(getattr(base, "config", None), "label2id", None)
    inverted = {label: index for index, label in id2label.items()}
    if isinstance(recorded, dict) and all(recorded.get(label) == index for label, index in inverted.items()):
        return {str(label): int(index) for label, index in recorded.items()}
    return inverted


def _load_dtype(dtype: Any, torch_dtype: Any) -> Optional[torch.dtype]:
    """The dtype to cast the loaded base to: None keeps the saved one (``None`` or ``"auto"``).

    ``torch_dtype`` is the older name of ``dtype``; both may be given when they name the same dtype.
    """
    if torch_dtype is not None:
        if dtype is not None and _resolve_dtype(dtype) != _resolve_dtype(torch_dtype):
            raise TypeError(f"pass dtype= or torch_dtype= (its older name), not both: got {dtype!r} and {torch_dtype!r}.")
        dtype = torch_dtype
    return _resolve_dtype(dtype)


def _resolve_dtype(dtype: Any) -> Optional[torch.dtype]:
    """``dtype`` as a floating torch dtype; None for ``None`` or ``"auto"``."""
    if dtype is None or dtype == "auto":
        return None
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(
            f"dtype={dtype!r} is not a floating-point dtype; pass 'auto' (the dtype the base was saved in), a torch "
            "dtype such as torch.bfloat16, or its name ('float16', 'bfloat16', 'float32')."
        )
    return resolved


def _load_device(device_map: Any) -> Optional[torch.device]:
    """The one device ``device_map`` puts the whole model on (None: leave it where it loads)."""
    if device_map is None:
        return None
    if isinstance(device_map, dict):
        devices = {str(value) for value in device_map.values()}
        if len(devices) != 1:
            raise ValueError(
                f"device_map={device_map!r} splits the model over {sorted(devices)}; a calibrated model runs on one "
                "device (δ is added at its input, the calibration acts on its output). Pass one device, e.g. "
                "device_map='cuda:0', or 'auto'."
            )
        device_map = next(iter(device_map.values()))
    if device_map in _DEVICE_MAP_STRATEGIES:
        return _first_accelerator()
    try:
        device = torch.device(device_map)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device_map={device_map!r} names no device; pass e.g. 'cpu', 'cuda:0', 0 or 'auto'.") from None
    _check_device_available(device)
    return device


def _first_accelerator() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _check_device_available(device: torch.device) -> None:
    if device.type in ("meta", "disk"):
        raise ValueError(f"device_map={str(device)!r} cannot hold a model that must run; load to 'cpu' or an accelerator.")
    if device.type == "cpu":
        return
    module = getattr(torch, device.type, None)
    available = module is not None and hasattr(module, "is_available") and module.is_available()
    count = module.device_count() if available and hasattr(module, "device_count") else 0
    if not available or (device.index is not None and device.index >= count):
        raise ValueError(
            f"device_map={str(device)!r} but this machine has no such device ({device.type} devices available: {count}); "
            "pass device_map='cpu' or 'auto'."
        )
