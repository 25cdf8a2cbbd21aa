"""``CalibratedModel``: a frozen base classifier plus a fitted calibrator, as a transformers model.

``CalibratedModel`` is a ``PreTrainedModel`` with its own config (``model_type
"hf_calibrate"``), registered with ``AutoConfig``, ``AutoModelForImageClassification`` and
``AutoModelForSequenceClassification`` when this module is imported (``from hf_calibrate import CalibratedModel``),
so transformers pipelines and ``Auto*.from_pretrained`` work with it. The base may be a timm model, a transformers
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
import inspect
import itertools
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification, PreTrainedModel

from . import model_evaluation
from ._probabilities import LOGITS
from .backbones import Backbone, adapt
from .calibrators import Calibrator
from .configuration import CalibratedConfig
from .data.calibration_rows import CalibrationRows
from .fitting.calibrate import (
    FittedCalibration, TemperatureScalingFallbackWarning, fallback_note, fit_calibration, resolve_method,
)
from .fitting.method_docs import with_method_list
from .hub_mixin import CalibratedHubMixin
from .results import evaluation
from .results.evaluation import EvaluationKeywords
from .serialization.record import SavedParts

__all__ = ["CalibratedConfig", "CalibratedModel", "TemperatureScalingFallbackWarning", "register_auto_classes"]


class CalibratedModel(CalibratedHubMixin, PreTrainedModel):
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
        #: the data :meth:`fit` was given, recognised later (see :meth:`fitted_on`)
        self.calibration_rows = CalibrationRows()
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
        self.backbone.warn_if_longer_than_calibrated(inputs)
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
        cls, model: nn.Module, calibration_data: Any, *, method: str = "neural_clamping", validation_data: Any = None,
        temperature_data: Any = None, dataset_name: Optional[str] = None, split: Optional[str] = None, **options: Any,
    ) -> "CalibratedModel":
        """Fit a calibration of ``model`` on held-out labelled ``calibration_data``.

        Args:
            model: a timm classifier, a transformers image/sequence classifier, or an ``nn.Module`` mapping a
                tensor to (N, C) logits. It is frozen (``requires_grad`` off, eval mode) and moved to the fit's
                device; it is not copied. If the fit fails, its flags and mode are restored.
            calibration_data: labelled samples in any of the forms docs/usage.md lists (:mod:`hf_calibrate.data`):
                a ``DataLoader`` of ``(inputs, labels)`` pairs or of dicts (``labels`` + model inputs), batching a
                map-style dataset (its sampler decides which samples are read), over pre-made batches
                (``batch_size=None``) or over an ``IterableDataset``; a torch ``Dataset`` or ``IterableDataset`` of
                samples (a plain list of samples too); a list of batches (tokenizer outputs with ``labels`` and any
                other fields); a callable returning a new iterator of batches (or of samples), or any other
                re-iterable object; a ``datasets.Dataset`` or ``datasets.IterableDataset`` (``load_dataset(...,
                streaming=True)``), whose raw ``image`` / ``text`` columns get the model's own preprocessing (or
                ``preprocessor=`` / ``preprocess=``); or a generator or other iterator, read once: every method but
                Neural Clamping, which reads its data every epoch and refuses it, naming a callable or a re-iterable
                instead. In one process every form gives the calibrator of the same samples as a map-style dataset.
                For the head methods this is the data the new head is trained on (the papers use the training split).
            method: the method's name: a registered method (docs/methods.md describes each), by family,
                <the registered methods, listed from the registry when hf_calibrate.modeling is imported>
                or ``"auto"``, the fast choice: the method cross-fitted held-out NLL shows best among the logit methods, Neural
                Clamping when its estimated time fits ``budget`` (seconds), and the head methods named in
                ``candidates`` (temperature scaling unless another beats it beyond a paired 95 % interval; the
                model is of the chosen method, and ``fit_summary["auto"]`` says why; options ``candidates``,
                ``folds``, ``budget``).
            validation_data: the selection split of Neural Clamping and the head methods (default: Neural
                Clamping cross-fits 2 folds of ``calibration_data``, or holds out ``holdout_fraction`` of it, as the
                head methods do); refused by the methods that would not read it.
            temperature_data: where head methods fit their optional temperature (``temperature=True``;
                default: the validation data).
            dataset_name, split: how the model card and evaluations name the calibration data (default: what
                a ``datasets.Dataset`` records, see :mod:`hf_calibrate.results.reporting`).
            **options: the method's options (e.g. ``NeuralClamping.Options``) and the options of every fit
                (:class:`hf_calibrate.fitting.EngineOptions`: ``batch_size``, ``seed``, ``progress``,
                ``mixed_precision``, ``preprocessor``, ...).

        Returns:
            The fitted ``CalibratedModel``; ``fit_summary`` holds the fit history. A Neural Clamping fit whose δ
            did not beat temperature scaling on the held-out selection data is plain temperature scaling: its
            ``fit_summary["fell_back_to_temperature_scaling"]`` is True and the fit warns
            (:class:`TemperatureScalingFallbackWarning`).
        """
        data = (calibration_data, validation_data, temperature_data)
        fitted = fit_calibration(model, data, resolve_method(method), options, naming=(dataset_name, split), keep_logits=False)
        return cls._from_fit(model, fitted)

    @classmethod
    def _from_fit(cls, model: nn.Module, fitted: FittedCalibration) -> "CalibratedModel":
        """The model of ``fitted`` (:func:`~hf_calibrate.fitting.calibrate.fit_calibration`'s result) over the base ``model``."""
        calibrated = cls(fitted.config, model, fitted.calibrator).eval()
        calibrated.fit_summary = fitted.summary
        calibrated._set_provenance(fitted.provenance)
        calibrated.preprocessor, calibrated.calibration_rows = fitted.preprocessor, fitted.calibration_rows
        return calibrated

    def _set_provenance(self, provenance: Dict[str, Any]) -> None:
        """Keep ``provenance`` (what the fit ran on and with); the base's outputs are read as its ``input_contract``
        records them (``"probabilities"``: through their log, :class:`~hf_calibrate.backbones.Backbone`'s ``outputs``)."""
        self.provenance = provenance
        contract = provenance.get("input_contract") or {}
        self.backbone.outputs = contract.get("outputs") or LOGITS
        limit = (contract.get("preprocessing") or {}).get("max_length") if self.backbone.modality == "text" else None
        self.backbone.calibrated_max_length = int(limit) if isinstance(limit, int) else None

    def fallback_note(self) -> Optional[str]:
        """The sentence saying this Neural Clamping fit fell back to temperature scaling, or None when it did not."""
        return fallback_note(self.fit_summary, self.provenance)

    def fitted_on(self, data: Any) -> Optional[bool]:
        """Whether ``data`` are, or hold, data this calibration was fitted on: the very calibration, validation or
        temperature data object given to :meth:`fit` (or a DataLoader over it, or the dataset of a DataLoader given);
        a ``datasets.Dataset`` with one of their fingerprints (the same rows through the same transforms); or
        ``datasets`` data or torch ``TensorDataset`` rows holding at least one of their rows: derived from them
        (``select``, ``shuffle``, ``filter``, ``train_test_split``, ``to_iterable_dataset``, a sampler's part) or the same
        rows copied (``map``, rebuilt, cloned), found by memory or by content. The rows' digests are kept at the fit and
        saved with the model, so this holds after the calibration data object is gone and for a loaded model
        (:mod:`hf_calibrate.data.lineage`). None (unknown) where rows cannot be compared: other torch datasets, a
        stream whose rows cannot be traced (a streamed ``load_dataset``, an iterable mapped, filtered, skipped or
        taken), or a model saved with ``row_digests=False``."""
        return self.calibration_rows.holds(data, self.provenance.get("data_fingerprints") or ())

    # -------------------------------------------------- evaluation
    def evaluate(
        self, data: Any, *, n_bins: int = 15, dataset_name: Optional[str] = None, split: Optional[str] = None,
        in_sample: Optional[bool] = None, bootstrap: int = evaluation.DEFAULT_BOOTSTRAP, **options: Any,
    ) -> Dict[str, Any]:
        """Metrics of the base and the calibrated model on labelled ``data``, side by side.

        ``data`` may take any form :meth:`fit` takes (docs/usage.md lists them; :mod:`hf_calibrate.data`): a
        ``DataLoader`` (of samples, of pre-made batches with ``batch_size=None``, or over an ``IterableDataset``),
        a torch ``Dataset`` or ``IterableDataset``, a list of batches, a callable returning a new iterator of
        batches, a ``datasets.Dataset`` or ``datasets.IterableDataset`` (raw ``image`` / ``text`` columns get the
        calibrated model's own preprocessing), or a generator or other iterator (read once, which an evaluation
        does). Every form gives the metrics of the same samples as a map-style dataset.

        ``options`` are those of :class:`hf_calibrate.fitting.EngineOptions` (batch size, preprocessor,
        progress, ...; the preprocessor defaults to the model's own). Runs on every process under Accelerate:
        each process scores its shard and the streaming accumulators are summed. ``dataset_name`` and
        ``split`` label the results in model cards (default: what a ``datasets.Dataset`` records).
        ``in_sample`` says whether ``data`` are data the calibration was fitted on (None: :meth:`fitted_on`
        decides); in-sample results are labelled so in the card, the diagram and the CLI. ``bootstrap``: the
        Poisson-bootstrap replicates behind the 95 % intervals of every metric and of the paired difference
        calibrated − uncalibrated (0: points only); their seed is the engine's ``seed``.

        Returns:
            Plain JSON data (``json.dumps`` takes it), described in :mod:`hf_calibrate.model_evaluation`; kept
            as ``last_evaluation``, it goes into the saved record and model card.
        """
        keywords = EvaluationKeywords(n_bins, dataset_name, split, in_sample, bootstrap)
        return model_evaluation.evaluate_model(self, data, keywords, options)

    #: ``model._accumulate(data, keywords, options)``: the (uncalibrated, calibrated) accumulators of an evaluation on
    #: ``data`` (``keywords``: :meth:`evaluate`'s, an :class:`EvaluationKeywords`; ``options``: engine options), the hook
    #: :func:`hf_calibrate.results.comparison.compare` pairs models through. It is
    #: :func:`hf_calibrate.model_evaluation.accumulate` itself.
    _accumulate = model_evaluation.accumulate

    # -------------------------------------------------- loading (save_pretrained, from_pretrained, push_to_hub: CalibratedHubMixin)
    @classmethod
    def _from_parts(cls, parts: SavedParts) -> "CalibratedModel":
        """The model of a verified saved folder (:func:`hf_calibrate.serialization.record.load_parts`' result)."""
        model = cls(CalibratedConfig(**parts.config), parts.base, parts.calibrator)
        model.fit_summary, model.last_evaluation = parts.fit_summary, parts.evaluation
        model._set_provenance(parts.provenance)
        model.preprocessor, model.calibration_rows = parts.preprocessor, CalibrationRows(saved=parts.kept_rows)
        return model

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



#: fit's docstring names every registered method (:mod:`hf_calibrate.fitting.method_docs`), in place of its placeholder
CalibratedModel.fit.__func__.__doc__ = with_method_list(
    CalibratedModel.fit.__doc__, inspect.signature(CalibratedModel.fit).parameters["method"].default)
register_auto_classes()  # importing the model makes transformers' pipelines know it (idempotent)
