"""Adapters for transformers image- and sequence-classification models.

Vision: δ has the shape of one ``pixel_values`` sample and is added after the image
processor's normalisation. Text: δ is one vector of the hidden size added to the word
embedding of every non-padding token (position-independent) — our extension of Neural
Clamping to text; the model is then run from ``inputs_embeds``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .._warnings import warn_user
from .base import Backbone, Inputs
from .preprocessing import image_preprocessing, is_tokenizer, processor_sizes, timm_facts, tokenizer_facts


def _is_pretrained_model(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return False
    return isinstance(model, PreTrainedModel)


def transformers_task(model: nn.Module) -> Optional[str]:
    """``"image-classification"``, ``"text-classification"`` or None for other models."""
    if not _is_pretrained_model(model):
        return None
    name = type(model).__name__
    if name.endswith("ForImageClassification") and model.main_input_name == "pixel_values":
        return "image-classification"
    if name.endswith("ForSequenceClassification") and model.main_input_name == "input_ids":
        return "text-classification"
    return None


@functools.lru_cache(maxsize=None)
def _forward_inputs(model_class: type) -> Tuple[frozenset, bool]:
    """(the named arguments of ``model_class.forward`` that can carry data, whether it also takes ``**kwargs``)."""
    parameters = inspect.signature(model_class.forward).parameters
    named = frozenset(
        name for name, parameter in parameters.items()
        if parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        and name not in _NOT_INPUTS and not name.startswith(("output_", "return_"))
    )
    return named, any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())


_NOT_INPUTS = frozenset({"self", "labels", "use_cache"})


class _TransformersBackbone(Backbone):
    library = "transformers"

    @property
    def num_classes(self) -> int:
        return int(self.model.config.num_labels)

    @property
    def id2label(self) -> Dict[int, str]:
        return {int(index): str(name) for index, name in self.model.config.id2label.items()}

    def takes_input(self, name: str) -> bool:
        """An argument of the model's ``forward`` (``input_ids``, ``attention_mask``, ...) other than the labels
        and output switches, or — when that ``forward`` takes ``**kwargs``, as a subclass passing them on
        to its base model does — an argument of the base model's ``forward`` (``token_type_ids``).
        A pre-tokenized dataset's ``text`` or ``idx`` columns are neither."""
        named, passes_on = _forward_inputs(type(self.model))
        if name in named:
            return True
        base = getattr(self.model, "base_model", self.model)
        return passes_on and base is not self.model and name in _forward_inputs(type(base))[0]

    def _run(self, inputs: Inputs) -> Tuple[torch.Tensor, Any]:
        output = self.model(**inputs)
        return self.check_logits(output.logits), output

    def wrap_output(self, logits: torch.Tensor, raw_output: Any, positional: bool, loss: Optional[torch.Tensor]) -> Any:
        raw_output["logits"] = logits
        if loss is not None:
            raw_output["loss"] = loss
        return raw_output


class TransformersVisionBackbone(_TransformersBackbone):
    """``AutoModelForImageClassification`` models (including transformers' timm wrapper)."""

    modality = "image"
    delta_space = "pixel_values"
    input_key = "pixel_values"

    def default_delta_shape(self) -> Optional[Tuple[int, ...]]:
        config = self.model.config
        pretrained_cfg = getattr(config, "pretrained_cfg", None)
        if isinstance(pretrained_cfg, dict) and "input_size" in pretrained_cfg:
            return tuple(int(v) for v in pretrained_cfg["input_size"])
        size = getattr(config, "image_size", None)
        channels = getattr(config, "num_channels", None)
        if size is None or channels is None:
            return None
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        return (int(channels), int(height), int(width))

    def declared_input_sizes(self, preprocessor: Any = None) -> List[Tuple[str, Tuple[int, ...]]]:
        declared = self.default_delta_shape()
        return ([("its config", declared)] if declared is not None else []) + processor_sizes(preprocessor)

    def preprocessing(self, preprocessor: Any = None, *, max_length: Optional[int] = None,
                      input_size: Optional[Tuple[int, ...]] = None) -> Dict[str, Any]:
        pretrained_cfg = getattr(self.model.config, "pretrained_cfg", None)
        model_facts = {"source": "config pretrained_cfg", **timm_facts(pretrained_cfg)} if isinstance(pretrained_cfg, dict) else {}
        return image_preprocessing(model_facts, preprocessor, input_size)

    def forward(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Any]:
        if delta is not None:
            pixels = inputs[self.input_key]
            self.check_delta(pixels, delta, per_sample_dims=delta.ndim)
            inputs = {**inputs, self.input_key: pixels + delta.to(pixels.dtype)}
        return self._run(inputs)


def outside_vocabulary(key: str, size: int) -> str:
    """The rest of an error about ids of the input ``key`` outside the ``size`` ids its embedding has rows for: what it
    means and the fix."""
    if key != "token_type_ids":
        return (
            f"outside this model's vocabulary of {size} tokens (ids 0 to {size - 1}); the texts were tokenized "
            "with another tokenizer, or the ids were changed. Tokenize them with the model's own tokenizer (or pass the raw "
            "texts with preprocessor=<its tokenizer>)."
        )
    return (
        f"outside this model's {size} token type(s) (ids 0 to {size - 1}); the texts were tokenized for another model "
        "(e.g. as sentence pairs, by a tokenizer whose model has more token types). Tokenize them with the model's own "
        "tokenizer, or drop token_type_ids."
    )


class TransformersTextBackbone(_TransformersBackbone):
    """``AutoModelForSequenceClassification`` models; δ lives in word-embedding space."""

    modality = "text"
    delta_space = "inputs_embeds"
    input_key = "input_ids"
    #: a text longer than ``calibrated_max_length`` was warned about (once per model; set on the instance)
    _warned_length = False

    def default_delta_shape(self) -> Tuple[int, ...]:
        return (int(self.model.get_input_embeddings().embedding_dim),)

    def input_size(self, inputs: Inputs) -> None:
        """Texts have no fixed size; their preprocessing contract is the tokenizer's ``max_length``."""
        return None

    def delta_shape(self, inputs: Inputs) -> Tuple[int, ...]:
        return self.default_delta_shape()

    def preprocessing(self, preprocessor: Any = None, *, max_length: Optional[int] = None,
                      input_size: Optional[Tuple[int, ...]] = None) -> Dict[str, Any]:
        if is_tokenizer(preprocessor):
            return tokenizer_facts(preprocessor, max_length)
        return {"max_length": max_length} if max_length is not None else {}

    def token_mask(self, inputs: Inputs) -> torch.Tensor:
        """(N, L) float mask of the tokens δ is added to: every non-padding token."""
        if inputs.get("attention_mask") is not None:
            return inputs["attention_mask"].to(torch.float32)
        pad_id = getattr(self.model.config, "pad_token_id", None)
        input_ids = inputs[self.input_key]
        if pad_id is None:
            return torch.ones(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        return (input_ids != pad_id).to(torch.float32)

    def warn_if_longer_than_calibrated(self, inputs: Inputs) -> None:
        """Warn, once per model, when a text is longer than the ``max_length`` the calibration was fitted at: its
        confidences hold for the texts it saw, truncated there."""
        limit, padded = self.calibrated_max_length, inputs.get(self.input_key)
        if limit is None or self._warned_length or (isinstance(padded, torch.Tensor) and padded.shape[-1] <= limit):
            return  # no text of the batch can be longer (and the counts below would wait for the device)
        tokens = self._token_counts(inputs)
        if tokens is None or int(tokens.max()) <= limit:
            return
        self._warned_length = True
        warn_user(f"this input holds a text of {int(tokens.max())} tokens, longer than the max_length={limit} the "
                  f"calibration was fitted at (its texts were truncated there), so its calibrated confidence is not "
                  f"known to hold. {self.truncation_advice(limit)} (Said once per model.)")

    def _token_counts(self, inputs: Inputs) -> Optional[torch.Tensor]:
        """(N,) each text's tokens: its attention mask's ones (padding left out), else the batch's length."""
        ids = inputs.get(self.input_key)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] == 0:
            return None
        mask = inputs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
            return mask.sum(dim=1)
        return torch.full((ids.shape[0],), ids.shape[1])

    def token_vocabularies(self) -> Dict[str, int]:
        """``input_ids``' vocabulary size and, when the model embeds token types, ``token_type_ids``' count of them
        (``config.type_vocab_size``; a model with 0 ignores them)."""
        sizes = {self.input_key: int(self.model.get_input_embeddings().num_embeddings)}
        types = getattr(self.model.config, "type_vocab_size", None)
        if isinstance(types, int) and types > 0 and self.takes_input("token_type_ids"):
            sizes["token_type_ids"] = types
        return sizes

    def check_token_ids(self, inputs: Inputs) -> None:
        """Refuse ``input_ids`` (or ``token_type_ids``) outside what the model embeds (the embedding would fail with a
        bare IndexError)."""
        for key, size in self.token_vocabularies().items():
            ids = inputs.get(key)
            if not isinstance(ids, torch.Tensor) or ids.numel() == 0:
                continue
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise ValueError(f"{key} must hold integer token ids, got dtype {ids.dtype}: convert them with .long().")
            low, high = (int(value) for value in torch.stack(torch.aminmax(ids)).tolist())
            if low < 0 or high >= size:
                raise ValueError(f"{key} holds token id {low if low < 0 else high}, {outside_vocabulary(key, size)}")

    def position_limit(self) -> Optional[int]:
        """The most tokens the model's absolute position embeddings take (``max_position_embeddings``, less the
        positions RoBERTa-style models skip after the padding id); None when it has no absolute positions."""
        config = self.model.config
        limit = getattr(config, "max_position_embeddings", None)
        absolute = getattr(config, "position_embedding_type", "absolute") == "absolute"
        relative_only = getattr(config, "relative_attention", False) and not getattr(config, "position_biased_input", True)
        if not isinstance(limit, int) or not absolute or relative_only:
            return None
        embeddings = getattr(getattr(self.model, "base_model", None), "embeddings", None)
        offset = getattr(embeddings, "padding_idx", None)  # RoBERTa's positions start after the padding id
        return limit - (offset + 1) if isinstance(offset, int) else limit

    def check_length(self, inputs: Inputs) -> None:
        """Refuse sequences longer than :meth:`position_limit` (the model would fail with a bare tensor-size error)."""
        ids = inputs.get(self.input_key)
        limit = self.position_limit()
        if isinstance(ids, torch.Tensor) and ids.ndim == 2 and limit is not None and ids.shape[1] > limit:
            raise ValueError(f"the input has {ids.shape[1]} tokens, more than the {limit} positions this model takes. "
                             f"{self.truncation_advice(limit)}")

    def truncation_advice(self, limit: int) -> str:
        """How to truncate texts: at the calibrated ``max_length`` when one is recorded and the model takes it, else at
        ``limit`` tokens."""
        length = min(self.calibrated_max_length or limit, limit)
        calibrated = f" at the max_length={length} they were calibrated at" if self.calibrated_max_length == length else ""
        return (f"Truncate the texts{calibrated}: pipe(texts, truncation=True, max_length={length}) in a pipeline, "
                f"tokenizer(texts, truncation=True, max_length={length}) with the tokenizer.")

    def forward(self, inputs: Inputs, delta: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Any]:
        self.check_token_ids(inputs)
        self.check_length(inputs)
        if delta is None:
            return self._run(inputs)
        if inputs.get("inputs_embeds") is not None:
            raise ValueError(
                "a calibrated text model adds δ to the word embeddings of input_ids; "
                "pass input_ids instead of inputs_embeds."
            )
        embeddings = self.model.get_input_embeddings()(inputs[self.input_key])
        self.check_delta(embeddings, delta, per_sample_dims=1)
        mask = self.token_mask(inputs).to(embeddings.dtype)
        embeddings = embeddings + mask[..., None] * delta.to(embeddings.dtype)
        rest = {key: value for key, value in inputs.items() if key != self.input_key}
        return self._run({**rest, "inputs_embeds": embeddings})
