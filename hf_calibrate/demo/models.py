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

This module is the zoo's registry: one :class:`ZooEntry` per model in :data:`ZOO` (its recipe and
how it is trained and saved), the cache and the builders. The training loop is :mod:`.training`,
the models' own code :mod:`.digits` and :mod:`.bbc`, the folders :mod:`.folders`.

``cache_dir`` defaults to ``$HF_CALIBRATE_CACHE`` or ``~/.cache/hf_calibrate/zoo``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from torch import nn

from .bbc import train_bbc_minilm
from .data import load_bbc_news, load_digits, stratified_subset
from .digits import train_digits_timm_cnn, train_digits_vit
from .._atomic import atomic_folder
from .folders import load_zoo_folder, save_timm, save_transformers
from .training import TRAINING_THREADS, Trained, evaluation_metrics, fit_and_test, fit_classifier, predict_logits, seeded

#: Bump when a change to the training or saving code changes what is cached.
TRAINING_CODE_VERSION = 4  # 3: the recipe records the machine provenance; 4: one training thread
RECIPE_FILE = "demo_recipe.json"
CACHE_ENV = "HF_CALIBRATE_CACHE"

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


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


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: its name and library, its data, its recipe (``hparams``: the cache key) and its trainer.

    ``train(hparams, dataset, progress)`` returns (model, preprocessor, test metrics); the folder is
    saved in ``library``'s own format (:data:`SAVERS`).
    """

    name: str
    library: str
    load_data: Callable[[int], datasets.DatasetDict]
    hparams: dict[str, Any]
    train: Callable[[dict[str, Any], datasets.DatasetDict, bool], Trained]


SAVERS: dict[str, Callable[[nn.Module, Any, Path], None]] = {"timm": save_timm, "transformers": save_transformers}
_ONE_CYCLE = {"schedule": "one_cycle", "weight_decay": 0.0}

#: The zoo by name (looked up at call time, so tests can swap an entry's trainer).
ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry(
            name="digits-timm-resnet10t", library="timm", load_data=load_digits, train=train_digits_timm_cnn,
            hparams={"seed": 0, "train_examples": 300, "architecture": "resnet10t", "image_size": 32, "epochs": 60,
                     "batch_size": 64, "lr": 2e-3, **_ONE_CYCLE},
        ),
        ZooEntry(
            name="digits-vit-tiny", library="transformers", load_data=load_digits, train=train_digits_vit,
            hparams={"seed": 0, "train_examples": 400, "image_size": 32,
                     "config": {"patch_size": 4, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                                "intermediate_size": 128},
                     "epochs": 100, "batch_size": 64, "lr": 2e-3, **_ONE_CYCLE},
        ),
        ZooEntry(
            name="bbc-minilm-l6", library="transformers", load_data=load_bbc_news, train=train_bbc_minilm,
            hparams={"seed": 0, "train_examples": None, "max_length": 128, "epochs": 100, "batch_size": 64,
                     "lr": 1e-3, **_ONE_CYCLE},
        ),
    )
}


# ----------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$HF_CALIBRATE_CACHE`` or ``~/.cache/hf_calibrate/zoo``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_calibrate" / "zoo")


def cache_key(recipe: dict[str, Any]) -> str:
    """Short hash of the recipe and :data:`TRAINING_CODE_VERSION` (12 hex digits)."""
    blob = json.dumps({"recipe": recipe, "code": TRAINING_CODE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


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


# ----------------------------------------------------------------------------- training and loading


def _training_view(dataset: datasets.DatasetDict, hparams: dict[str, Any]) -> datasets.DatasetDict:
    """``dataset`` with its train split cut to a stratified ``hparams["train_examples"]`` (None: all)."""
    size = hparams["train_examples"]
    if size is None:
        return dataset
    train = dataset["train"].select(stratified_subset(dataset["train"]["label"], size, hparams["seed"]))
    return datasets.DatasetDict({**dataset, "train": train})


def _train_and_save(entry: ZooEntry, dataset: datasets.DatasetDict, folder: Path, progress: bool) -> None:
    """Train ``entry`` on ``dataset`` and save model, preprocessor and recipe into ``folder`` atomically."""
    start, start_cpu = time.perf_counter(), time.process_time()
    training_data = _training_view(dataset, entry.hparams)
    with seeded(entry.hparams["seed"]):
        model, preprocessor, metrics = entry.train(entry.hparams, training_data, progress)
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
    with atomic_folder(folder) as scratch:
        SAVERS[entry.library](model, preprocessor, scratch)
        (scratch / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")


def _from_zoo(name: str, cache_dir: PathLike | None, progress: bool) -> DemoModel:
    entry = ZOO[name]
    dataset = entry.load_data(entry.hparams["seed"])
    folder = Path(cache_dir or default_cache_dir()) / f"{entry.name}-{cache_key(entry.hparams)}"
    if not folder.is_dir():
        _train_and_save(entry, dataset, folder, progress)
    model, preprocessor = load_zoo_folder(folder, entry.library)
    recipe = json.loads((folder / RECIPE_FILE).read_text())
    differences = provenance_differences(recipe)
    if differences:
        logger.info("zoo model %s was trained elsewhere (recorded vs here: %s); its bits may differ from a local training run.",
                    folder.name, differences)
    return DemoModel(entry.name, entry.library, model, preprocessor, dataset, recipe, folder)


def digits_timm_cnn(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """timm ``resnet10t`` trained from scratch on the digits (32×32 input), trained once then cached."""
    return _from_zoo("digits-timm-resnet10t", cache_dir, progress)


def digits_vit(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """transformers ``ViTForImageClassification`` (4 layers, width 64) trained from scratch on the digits."""
    return _from_zoo("digits-vit-tiny", cache_dir, progress)


def bbc_minilm(*, cache_dir: PathLike | None = None, progress: bool = True) -> DemoModel:
    """Pretrained all-MiniLM-L6-v2 with a BBC News head (pooler + classifier, encoder frozen)."""
    return _from_zoo("bbc-minilm-l6", cache_dir, progress)


__all__ = [
    "CACHE_ENV", "RECIPE_FILE", "SAVERS", "TRAINING_CODE_VERSION", "TRAINING_THREADS", "ZOO", "DemoModel", "ZooEntry",
    "bbc_minilm", "cache_key", "default_cache_dir", "digits_timm_cnn", "digits_vit", "evaluation_metrics", "fit_and_test",
    "fit_classifier", "machine_provenance", "predict_logits", "provenance_differences",
]
