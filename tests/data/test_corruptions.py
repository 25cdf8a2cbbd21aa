"""Corrupted test data for calibration under shift: deterministic, graded, shape-preserving."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset
from PIL import Image

from hf_calibrate.corruptions import (
    IMAGE_CORRUPTIONS,
    TEXT_CORRUPTIONS,
    corrupt_dataset,
    corrupt_text,
    corrupted_versions,
)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(6)]
    return Dataset.from_dict({"image": pictures, "label": list(range(6))})


@pytest.fixture(scope="module")
def texts():
    sentence = "the quick brown fox jumps over the lazy dog while the markets rally on strong earnings"
    return Dataset.from_dict({"text": [sentence] * 6, "label": list(range(6))})


def _pixels(dataset):
    return np.stack([np.asarray(image, dtype=np.float64) for image in dataset["image"]])


@pytest.mark.parametrize("kind", IMAGE_CORRUPTIONS)
def test_image_corruptions_grow_with_severity_and_repeat(images, kind):
    clean = _pixels(images)
    changes = [np.abs(_pixels(corrupt_dataset(images, kind, s)) - clean).mean() for s in (1, 3, 5)]
    assert changes[0] > 0 and changes[0] < changes[2]
    again = _pixels(corrupt_dataset(images, kind, 3))
    np.testing.assert_array_equal(again, _pixels(corrupt_dataset(images, kind, 3)))
    other_seed = _pixels(corrupt_dataset(images, kind, 3, seed=1))
    assert kind == "gaussian_blur" or not np.array_equal(again, other_seed)  # blur has no randomness
    assert corrupt_dataset(images, kind, 5)[0]["image"].size == (16, 16)
    assert corrupt_dataset(images, kind, 5)["label"] == images["label"]


def test_token_dropout_drops_more_at_higher_severity(texts):
    counts = [np.mean([len(t.split()) for t in corrupt_dataset(texts, "token_dropout", s)["text"]]) for s in (1, 5)]
    full = len(texts[0]["text"].split())
    assert full > counts[0] > counts[1] > 0


def test_character_noise_edits_text_deterministically():
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    text = "calibration under shift " * 10
    noisy = corrupt_text(text, "character_noise", 5, rng())
    assert noisy != text and noisy == corrupt_text(text, "character_noise", 5, rng())
    assert corrupt_text("", "token_dropout", 5, rng()) == ""


def test_versions_cover_every_kind_and_severity(texts):
    seen = [(kind, severity) for kind, severity, _ in corrupted_versions(texts, "text", severities=(1, 2))]
    assert seen == [(kind, s) for kind in TEXT_CORRUPTIONS for s in (1, 2)]


def test_bad_arguments_are_named(images):
    with pytest.raises(ValueError, match="unknown corruption 'fog'"):
        corrupt_dataset(images, "fog", 1)
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt_dataset(images, "rotation", 6)
    with pytest.raises(ValueError, match="column 'text' is not in the dataset"):
        corrupt_dataset(images, "token_dropout", 1)
    with pytest.raises(ValueError, match="modality must be"):
        list(corrupted_versions(images, "audio"))
