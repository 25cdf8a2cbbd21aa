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
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

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

from . import _hub, cards, serialization
from .backbones import Backbone, adapt
from .calibrators import Calibrator, calibrator_class, options_to_dict, parse_options
from .data import prepare_data
from .fitting import Engine, EngineOptions, fit_calibrator
from .metrics import CalibrationMetrics, ReliabilityBins
from .version import __version__

TASKS = {"image": "image-classification", "text": "text-classification", "tensor": "tensor-classification"}


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


def _split_options(method: str, options: Dict[str, Any]):
    method_class = calibrator_class(method)
    engine_names = {field.name for field in dataclasses.fields(EngineOptions)}
    method_names = {field.name for field in dataclasses.fields(method_class.Options)}
    unknown = sorted(set(options) - engine_names - method_names)
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown} for method {method!r}. Its options: {', '.join(sorted(method_names)) or 'none'}; "
            f"options of every fit: {', '.join(sorted(engine_names))}."
        )
    engine_options = EngineOptions(**{key: value for key, value in options.items() if key in engine_names})
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
        self.backbone: Backbone = adapt(base_model, num_classes=calibrator.num_classes)
        self.main_input_name = self.backbone.input_key
        base_model.requires_grad_(False).eval()
        calibrator.requires_grad_(False)  # fitted: calling the model must not build a graph
        self.fit_summary: Dict[str, Any] = {}
        self.provenance: Dict[str, Any] = {}
        self.last_evaluation: Optional[Dict[str, Any]] = None
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
            **options: the method's options (e.g. ``NeuralClamping.Options``) and the options
                of every fit (:class:`hf_calibrate.fitting.EngineOptions`: ``batch_size``,
                ``seed``, ``progress``, ``mixed_precision``, ``preprocessor``, ...).

        Returns:
            The fitted ``CalibratedModel``; ``fit_summary`` holds the fit history.
        """
        engine_options, method_options = _split_options(method, options)
        engine = Engine(engine_options)
        backbone = adapt(model)
        with frozen(model):
            model.to(engine.device)
            prepare = lambda source: None if source is None else prepare_data(source, backbone, **engine_options.data_options())  # noqa: E731
            data = prepare(calibration_data)
            calibrator, summary = fit_calibrator(
                backbone, data, method, method_options, engine,
                validation=prepare(validation_data), temperature_data=prepare(temperature_data),
            )
        calibrator.is_fitted = True
        config = CalibratedConfig(
            base_library=backbone.library,
            base_task=TASKS[backbone.modality],
            calibration_method=method,
            id2label=backbone.id2label or {index: f"LABEL_{index}" for index in range(calibrator.num_classes)},
        )
        calibrated = cls(config, model, calibrator).eval()
        calibrated.fit_summary = summary
        calibrated.preprocessor = engine_options.preprocessor
        calibrated.provenance = {
            "dataset": data.description,
            "dataset_name": data.name,
            "split": data.split,
            "num_samples": len(data),
            "seed": engine_options.seed,
            "options": options_to_dict(method_options),
            "batch_size": engine_options.batch_size,
            "mixed_precision": engine_options.mixed_precision or str(engine.accelerator.mixed_precision),
            "num_processes": engine.world,
            "base_fingerprint": serialization.weights_fingerprint(model),
        }
        return calibrated

    # -------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(
        self, data: Any, *, n_bins: int = 15, dataset_name: Optional[str] = None, split: Optional[str] = None, **options: Any
    ) -> Dict[str, Any]:
        """Metrics of the base and the calibrated model on labelled ``data``, side by side.

        ``options`` are those of :class:`hf_calibrate.fitting.EngineOptions` (batch size,
        preprocessor, progress, ...; the preprocessor defaults to the model's own). Runs on every
        process under Accelerate: each process scores its shard and the streaming accumulators
        are summed. ``dataset_name`` and ``split`` label the results in model cards (default:
        what a ``datasets.Dataset`` records). The result is kept as ``last_evaluation`` and
        goes into the saved record and model card.

        Returns:
            ``{"uncalibrated": metrics, "calibrated": metrics, "reliability": {...}, "dataset": str}``
            where metrics are the dicts of :class:`hf_calibrate.metrics.CalibrationMetrics`
            and ``reliability`` holds the :class:`~hf_calibrate.metrics.ReliabilityBins` of each.
        """
        options.setdefault("preprocessor", self.preprocessor)
        engine = Engine(EngineOptions(**options))
        prepared = prepare_data(data, self.backbone, **engine.options.data_options())
        self.to(engine.device)
        uncalibrated = CalibrationMetrics(self.calibrator.num_classes, n_bins)
        calibrated = CalibrationMetrics(self.calibrator.num_classes, n_bins)
        logit_space = self.calibrator.input_perturbation is None and self.calibrator.head is None
        batches = engine.global_batches(torch.arange(len(prepared)), shuffle=False)
        with engine.progress(len(batches), "evaluating") as bar:
            for _, micro_batches in engine.batches(prepared, batches):
                for _, inputs, labels in micro_batches:
                    with engine.autocast():
                        base_logits = self.backbone.logits(inputs).float()
                        if logit_space:
                            calibrated_logits = self.calibrator(base_logits).float()
                        else:
                            calibrated_logits = self._calibrated_forward(inputs)[0].float()
                    engine.check_labels(labels, self.calibrator.num_classes)
                    uncalibrated.update(base_logits, labels, from_logits=True)
                    calibrated.update(calibrated_logits, labels, from_logits=True)
                bar.update(1)
        result = {
            "uncalibrated": uncalibrated.compute(),
            "calibrated": calibrated.compute(),
            "reliability": {"uncalibrated": uncalibrated.reliability(), "calibrated": calibrated.reliability()},
            "dataset": dataset_name or prepared.name or prepared.description,
            "split": split or prepared.split,
            "n_bins": n_bins,
        }
        self.last_evaluation = result
        return result

    # -------------------------------------------------- saving, loading, pushing
    def calibration_record(
        self, *, base_weights: str = "included", base_model_id: Optional[str] = None, base_revision: Optional[str] = None
    ) -> Dict[str, Any]:
        """The ``calibration_config.json`` contents (DESIGN §4) for this model."""
        reference = serialization.hub_reference(self.base_model, self.backbone.library)
        delta = self.calibrator.input_perturbation
        fit = {key: value for key, value in self.provenance.items() if key not in ("options", "base_fingerprint")}
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
            },
            "input_contract": {
                "space": self.backbone.delta_space,
                "shape": list(delta.shape) if delta is not None else None,
                "preprocessing": self.backbone.preprocessing(),
            },
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
        """Save the artifact of DESIGN §4 into ``save_directory`` (atomically).

        Args:
            include_base: save the base model's own files (default). With False the repo is
                reference-only: it names the base repo and commit (``base_model_id`` /
                ``base_revision``, default: what the base model records) and loads it from there.
            preprocessor: image processor or tokenizer to save beside it (default: the one
                given to :meth:`fit`), so pipelines find it.
            overwrite_card: replace a ``README.md`` in the folder that hf_calibrate did not write.
            repo_id: the hub id the card's usage snippet shows.
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
        self.config.architectures = [type(self).__name__]
        evaluation = self.last_evaluation or {}
        return serialization.save_artifact(
            Path(save_directory), record=record, config_json=self.config.to_dict(), base_model=self.base_model,
            calibrator=self.calibrator, preprocessor=preprocessor if preprocessor is not None else self.preprocessor,
            reliability=evaluation.get("reliability"), repo_id=repo_id, overwrite_card=overwrite_card,
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
        **kwargs: Any,
    ) -> "CalibratedModel":
        """Load a calibrated model from a folder or a hub repo id (``revision`` pins a commit).

        Verifies the artifact (format, tensors, δ's shape, labels, base fingerprint) and
        raises :class:`~hf_calibrate.serialization.ArtifactError` naming the file and the fix.
        ``base_model`` supplies the base for calibrations of plain modules (or overrides the
        saved base, which must still match the recorded fingerprint). ``dtype`` casts the
        base after verification; the calibrator stays float32. Works offline from the cache
        with ``HF_HUB_OFFLINE=1``. Also reached by ``AutoModelFor...from_pretrained`` and
        ``pipeline(task, model=...)`` after ``import hf_calibrate``.
        """
        if model_args:
            raise TypeError("CalibratedModel.from_pretrained takes no positional model arguments.")
        unknown = set(kwargs) - _TRANSFORMERS_LOAD_KWARGS
        if unknown:
            raise TypeError(f"from_pretrained() got unexpected keyword argument(s) {sorted(unknown)}.")
        hub_options = dict(token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        root = _hub.resolve_folder(
            pretrained_model_name_or_path, revision=revision, force_download=force_download, subfolder=subfolder, **hub_options
        )
        record = serialization.read_record(root)
        calibrator = serialization.load_calibrator(root, record)
        base = base_model if base_model is not None else serialization.load_base(root, record, **hub_options)
        backbone = adapt(base, num_classes=calibrator.num_classes)
        serialization.verify_against_base(root, record, backbone, calibrator, base_passed=base_model is not None)
        if isinstance(dtype, torch.dtype):
            base.to(dtype)
        base_info = record["base_model"]
        config = CalibratedConfig(
            base_library=base_info["library"], base_task=base_info["task"], calibration_method=record["method"],
            id2label={int(k): v for k, v in base_info["id2label"].items()},
        )
        model = cls(config, base, calibrator.to(backbone_device(base)))
        model.fit_summary = dict(record["fit"].get("summary") or {})
        model.provenance = {key: value for key, value in record["fit"].items() if key != "summary"}
        model.provenance.update(options=record.get("options", {}), base_fingerprint=base_info.get("fingerprint"))
        model.last_evaluation = _evaluation_from_record(record.get("evaluation"))
        model.preprocessor = serialization.load_preprocessor(root)
        return model.eval()

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


def register_auto_classes() -> None:
    """Make ``AutoConfig`` / ``AutoModelFor{Image,Sequence}Classification`` (and pipelines) know ``hf_calibrate``."""
    AutoConfig.register(CalibratedConfig.model_type, CalibratedConfig, exist_ok=True)
    AutoModelForImageClassification.register(CalibratedConfig, CalibratedModel, exist_ok=True)
    AutoModelForSequenceClassification.register(CalibratedConfig, CalibratedModel, exist_ok=True)


_TRANSFORMERS_SAVE_KWARGS = {"state_dict", "safe_serialization", "max_shard_size", "variant", "token", "save_function", "push_to_hub"}
# What AutoModelFor*.from_pretrained and pipeline(...) may pass on; none of them changes how we load.
_TRANSFORMERS_LOAD_KWARGS = {
    "config", "trust_remote_code", "adapter_kwargs", "device_map", "torch_dtype", "attn_implementation",
    "low_cpu_mem_usage", "use_safetensors", "_from_auto", "_from_pipeline", "_commit_hash", "code_revision", "proxies",
}


def backbone_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _evaluation_record(evaluation: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The JSON-able part of :meth:`CalibratedModel.evaluate`'s result, for the record and card."""
    if not evaluation:
        return None
    return {
        "dataset": evaluation["dataset"],
        "split": evaluation.get("split"),
        "n_bins": evaluation.get("n_bins"),
        **cards.card_metrics(evaluation),
        "reliability": {side: bins.to_dict() for side, bins in evaluation["reliability"].items()},
    }


def _evaluation_from_record(record: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if not record:
        return None
    evaluation = {key: value for key, value in record.items() if key != "reliability"}
    evaluation["reliability"] = {side: ReliabilityBins.from_dict(data) for side, data in (record.get("reliability") or {}).items()}
    return evaluation
