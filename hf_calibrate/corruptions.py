"""Corrupted copies of test data, to measure calibration under distribution shift.

Images (PIL, before the model's preprocessing): Gaussian noise, Gaussian blur, rotation.
Text: token dropout, character noise. Five severities each, in the spirit of CIFAR-10-C /
ImageNet-C (Hendrycks & Dietterich, 2019); both TST and MaC-Cal report calibration under such
shifts. Every corruption is deterministic given ``seed`` and the row index.

Severity parameters (index = severity − 1):

=================  =====================================================================
gaussian_noise     σ = 0.05, 0.10, 0.15, 0.20, 0.30 on pixels scaled to [0, 1]
gaussian_blur      radius = 0.5, 0.75, 1.0, 1.5, 2.0 × (shorter side / 16) pixels
rotation           ±10°, ±20°, ±30°, ±45°, ±60° (random sign)
token_dropout      each whitespace token dropped with p = 0.1, 0.2, 0.3, 0.4, 0.5
character_noise    each character replaced, deleted, duplicated or swapped with
                   p = 0.02, 0.05, 0.10, 0.15, 0.20
=================  =====================================================================
"""

from __future__ import annotations

import string
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

IMAGE_CORRUPTIONS = ("gaussian_noise", "gaussian_blur", "rotation")
TEXT_CORRUPTIONS = ("token_dropout", "character_noise")
SEVERITIES = (1, 2, 3, 4, 5)

_NOISE_SIGMA = (0.05, 0.10, 0.15, 0.20, 0.30)
_BLUR_FACTOR = (0.5, 0.75, 1.0, 1.5, 2.0)
_ROTATION_DEGREES = (10, 20, 30, 45, 60)
_TOKEN_DROP = (0.1, 0.2, 0.3, 0.4, 0.5)
_CHAR_NOISE = (0.02, 0.05, 0.10, 0.15, 0.20)
_LETTERS = string.ascii_lowercase


def _check(kind: str, severity: int, kinds: Tuple[str, ...]) -> int:
    if kind not in kinds:
        raise ValueError(f"unknown corruption {kind!r}; choose one of {kinds}.")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}.")
    return severity - 1


def corrupt_image(image: Any, kind: str, severity: int, rng: np.random.Generator) -> Any:
    """A corrupted copy of a PIL image (same size and mode)."""
    from PIL import Image, ImageFilter

    level = _check(kind, severity, IMAGE_CORRUPTIONS)
    if kind == "gaussian_blur":
        return image.filter(ImageFilter.GaussianBlur(_BLUR_FACTOR[level] * min(image.size) / 16))
    if kind == "rotation":
        angle = _ROTATION_DEGREES[level] * rng.choice((-1, 1))
        return image.rotate(float(angle), resample=Image.BILINEAR)
    pixels = np.asarray(image, dtype=np.float64) / 255.0
    noisy = np.clip(pixels + rng.normal(0.0, _NOISE_SIGMA[level], pixels.shape), 0.0, 1.0)
    return Image.fromarray((noisy * 255.0).round().astype(np.uint8), mode=image.mode)


def corrupt_text(text: str, kind: str, severity: int, rng: np.random.Generator) -> str:
    """A corrupted copy of a string."""
    level = _check(kind, severity, TEXT_CORRUPTIONS)
    if kind == "token_dropout":
        tokens = text.split()
        kept = [token for token in tokens if rng.random() >= _TOKEN_DROP[level]]
        return " ".join(kept or tokens[:1])
    chars, out, i = list(text), [], 0
    while i < len(chars):
        char = chars[i]
        if rng.random() >= _CHAR_NOISE[level]:
            out.append(char)
        else:
            edit = rng.integers(4)
            if edit == 0:
                out.append(_LETTERS[rng.integers(len(_LETTERS))])  # replace
            elif edit == 2:
                out.extend((char, char))  # duplicate
            elif edit == 3 and i + 1 < len(chars):
                out.extend((chars[i + 1], char))  # swap with the next one
                i += 1
            # edit == 1 (or a swap at the end): delete
        i += 1
    return "".join(out)


def corrupt_dataset(
    dataset: Any, kind: str, severity: int, *, seed: int = 0, column: Optional[str] = None
) -> Any:
    """A ``datasets.Dataset`` with ``column`` (default ``image`` or ``text``) corrupted row by row."""
    _check(kind, severity, IMAGE_CORRUPTIONS + TEXT_CORRUPTIONS)
    if column is None:
        column = "image" if kind in IMAGE_CORRUPTIONS else "text"
    if column not in dataset.column_names:
        raise ValueError(f"column {column!r} is not in the dataset; its columns are {dataset.column_names}.")
    corrupt: Callable[[Any, str, int, np.random.Generator], Any] = corrupt_image if kind in IMAGE_CORRUPTIONS else corrupt_text

    def apply(row: Dict[str, Any], index: int) -> Dict[str, Any]:
        rng = np.random.default_rng([seed, severity, (IMAGE_CORRUPTIONS + TEXT_CORRUPTIONS).index(kind), index])
        return {column: corrupt(row[column], kind, severity, rng)}

    return dataset.map(apply, with_indices=True, keep_in_memory=True, load_from_cache_file=False, desc=f"{kind} s{severity}")


def corrupted_versions(
    dataset: Any, modality: str, *, severities: Tuple[int, ...] = SEVERITIES, seed: int = 0
) -> Iterator[Tuple[str, int, Any]]:
    """Yield (kind, severity, corrupted dataset) for every corruption of ``modality`` ("image" or "text")."""
    kinds = {"image": IMAGE_CORRUPTIONS, "text": TEXT_CORRUPTIONS}.get(modality)
    if kinds is None:
        raise ValueError(f"modality must be 'image' or 'text', got {modality!r}.")
    for kind in kinds:
        for severity in severities:
            yield kind, severity, corrupt_dataset(dataset, kind, severity, seed=seed)
