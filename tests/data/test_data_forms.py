"""The data users already hold, with real models: every form fits and evaluates like the map-style dataset.

Forms (docs/design.md §3.0): a ``datasets.Dataset`` of raw rows (the reference), a list of
batches, a ``DataLoader(batch_size=None)`` over pre-made batches, a ``DataLoader`` whose
``batch_sampler`` yields whole batches, a callable returning a new iterator, a torch
``IterableDataset`` of samples, a ``DataLoader`` over it, a ``datasets.IterableDataset``
(``Dataset.to_iterable_dataset``, 1 and 4 shards), and for text a list of tokenizer outputs
with extra fields and a pre-tokenized ``datasets.Dataset`` with its ``text``/``idx`` columns.

In one process a stream's samples get the same dataset indices, hold-out split and shuffles as
the map-style data, and pass through the model in the same batches (the engine joins or cuts
the user's batches into its own), so every fit is the map-style fit bit for bit: the same
float operations in the same order, on any machine. Under several processes see
``tests/data/test_data_forms_distributed.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler, TensorDataset

from hf_calibrate import CalibratedModel

pytestmark = pytest.mark.slow

NC_OPTIONS = dict(epochs=2, batch_size=150, lr=0.05, holdout_fraction=0.2)
HEAD_OPTIONS = dict(epochs=2)
BATCH = 50  # the user's own batch size (does not divide the 449 calibration images)


class Samples(IterableDataset):
    """A torch IterableDataset yielding one ``(pixels, label)`` sample at a time."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor) -> None:
        self.pixels, self.labels = pixels, labels

    def __iter__(self):
        return zip(self.pixels, self.labels)


@pytest.fixture(scope="module")
def cnn(digits_cnn):
    """(model, map-style calibration split of raw images, its pixel tensors and labels as the model sees them)."""
    import timm.data

    calibration = digits_cnn.dataset["calibration"]
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=digits_cnn.model))
    pixels = torch.stack([transform(image.convert("RGB")) for image in calibration["image"]])
    return digits_cnn.model, calibration, pixels, torch.tensor(calibration["label"])


def image_forms(calibration: Any, pixels: torch.Tensor, labels: torch.Tensor) -> Dict[str, Callable[[], Any]]:
    """Each form of the same calibration images, built fresh per fit (a stream is read by one fit)."""
    batches = [(pixels[i : i + BATCH], labels[i : i + BATCH]) for i in range(0, len(labels), BATCH)]
    dict_batches = [{"pixel_values": x, "labels": y, "idx": torch.arange(len(y))} for x, y in batches]
    tensors = TensorDataset(pixels, labels)
    return {
        "list of batches": lambda: batches,
        "list of dict batches with an extra field": lambda: dict_batches,
        "DataLoader(batch_size=None)": lambda: DataLoader(batches, batch_size=None),
        "DataLoader(batch_sampler=)": lambda: DataLoader(tensors, batch_sampler=BatchSampler(SequentialSampler(tensors), BATCH, False)),
        "callable": lambda: (lambda: iter(batches)),
        "IterableDataset of samples": lambda: Samples(pixels, labels),
        "DataLoader(IterableDataset)": lambda: DataLoader(Samples(pixels, labels), batch_size=32),
        "datasets.IterableDataset": lambda: calibration.to_iterable_dataset(),
        "datasets.IterableDataset, 4 shards": lambda: calibration.to_iterable_dataset(num_shards=4),
    }


def assert_same_calibrator(got: CalibratedModel, want: CalibratedModel) -> None:
    """Every fitted tensor bit-identical, and the same fit summary counts."""
    mine, theirs = got.calibrator.state_dict(), want.calibrator.state_dict()
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(mine[key].cpu(), value.cpu()), key
    for key in ("fit_samples", "train_samples", "validation_samples", "holdout_samples", "fell_back_to_temperature_scaling"):
        assert got.fit_summary.get(key) == want.fit_summary.get(key), key


@pytest.fixture(scope="module")
def image_references(cnn) -> Dict[str, CalibratedModel]:
    model, calibration, _, _ = cnn
    return {method: _fit(model, calibration, method) for method in ("temperature", "neural_clamping", "tst")}


def _fit(model: torch.nn.Module, data: Any, method: str, **extra: Any) -> CalibratedModel:
    options = {"neural_clamping": NC_OPTIONS, "tst": HEAD_OPTIONS}.get(method, {})
    return CalibratedModel.fit(model, data, method=method, progress=False, seed=0, **options, **extra)


@pytest.mark.parametrize("form", list(image_forms(None, torch.zeros(1), torch.zeros(1))))
def test_every_image_form_fits_the_map_style_calibrator(cnn, image_references, form):
    model, calibration, pixels, labels = cnn
    make = image_forms(calibration, pixels, labels)[form]
    for method, reference in image_references.items():
        fitted = _fit(model, make(), method)
        assert_same_calibrator(fitted, reference)
        if method == "neural_clamping":
            assert [record["loss"] for record in fitted.fit_summary["history"]] == [record["loss"] for record in reference.fit_summary["history"]]
    assert fitted.provenance["num_samples"] == len(calibration)


@pytest.mark.parametrize("method", ["vector", "matrix", "dirichlet", "isotonic", "vtst", "mac_cal"])
def test_every_other_method_fits_from_a_sharded_stream(cnn, method):
    model, calibration, _, _ = cnn
    options = {"vtst": HEAD_OPTIONS, "mac_cal": HEAD_OPTIONS}.get(method, {})
    reference = CalibratedModel.fit(model, calibration, method=method, progress=False, **options)
    streamed = CalibratedModel.fit(model, calibration.to_iterable_dataset(num_shards=4), method=method, progress=False, **options)
    assert_same_calibrator(streamed, reference)


def test_evaluations_of_a_stream_equal_the_map_style_ones(cnn, digits_cnn, image_references):
    """Points, intervals (the bootstrap keys samples by dataset index) and verdicts, for a stream read once."""
    model, _, _, _ = cnn
    calibrated = image_references["neural_clamping"]
    test = digits_cnn.dataset["test"]
    want = calibrated.evaluate(test, progress=False, bootstrap=200)
    generator = ({"image": row["image"], "label": row["label"]} for row in test)  # a one-shot stream of raw rows

    def batches():  # pre-batched pixels are what a user's own loader hands over
        return iter(DataLoader(test.with_transform(_pixels(model)), batch_size=64, collate_fn=_stack))

    for data in (test.to_iterable_dataset(num_shards=3), batches, generator):
        got = calibrated.evaluate(data, progress=False, bootstrap=200)
        for side in ("uncalibrated", "calibrated"):
            assert _flat(got[side]) == pytest.approx(_flat(want[side]), rel=1e-5, abs=1e-7), side
        assert got["verdicts"] == want["verdicts"]
    with pytest.raises(ValueError, match="yielded nothing: they are empty, or a one-shot iterator that an earlier call already read"):
        calibrated.evaluate(generator, progress=False)


def _pixels(model: torch.nn.Module) -> Callable[[Dict[str, List[Any]]], Dict[str, Any]]:
    import timm.data

    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    return lambda rows: {"pixel_values": [transform(image.convert("RGB")) for image in rows["image"]], "labels": rows["label"]}


def _stack(rows: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    return {"pixel_values": torch.stack([row["pixel_values"] for row in rows]), "labels": torch.tensor([row["labels"] for row in rows])}


def _flat(side: Dict[str, Any]) -> Dict[str, float]:
    from _results import flat

    return {key: value for key, value in flat(side).items() if isinstance(value, float)}


# ----------------------------------------------------------------------------- text

TEXTS = 96  # BBC calibration rows used here
TEXT_NC_OPTIONS = dict(epochs=1, batch_size=48, holdout_fraction=0.25)  # δ on word embeddings: a backward pass through the encoder
MAX_LENGTH = 64


@pytest.fixture(scope="module")
def bbc(bbc_minilm):
    """(model, tokenizer, TEXTS calibration rows spread over the split, so over its classes (the split is in label
    order, and a head refuses data of one class), as a datasets.Dataset of raw text)."""
    calibration = bbc_minilm.dataset["calibration"]
    return bbc_minilm.model, bbc_minilm.preprocessor, calibration.select(range(0, len(calibration), len(calibration) // TEXTS)[:TEXTS])


TEXT_FORMS = (
    "pre-tokenized datasets.Dataset with text and idx columns", "list of tokenizer batches with labels and text",
    "DataLoader(batch_size=None) over them", "datasets.IterableDataset of raw text, 2 shards",
)


def text_forms(rows: Any, tokenizer: Any) -> Dict[str, Callable[[], Any]]:
    """Each form of the same texts; the pre-batched ones as a tokenizer hands them over (padded per batch, extra fields)."""
    texts, labels = rows["text"], rows["label"]
    batches = [
        {**tokenizer(texts[i : i + 24], truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt"),
         "labels": torch.tensor(labels[i : i + 24]), "text": texts[i : i + 24]}
        for i in range(0, len(texts), 24)
    ]
    pretokenized = rows.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=MAX_LENGTH), batched=True)
    pretokenized = pretokenized.add_column("idx", list(range(len(rows))))
    forms = (lambda: pretokenized, lambda: batches, lambda: DataLoader(batches, batch_size=None),
             lambda: rows.to_iterable_dataset(num_shards=2))
    return dict(zip(TEXT_FORMS, forms))


@pytest.fixture(scope="module")
def text_references(bbc) -> Dict[str, CalibratedModel]:
    model, tokenizer, rows = bbc
    return {method: _fit_text(model, tokenizer, rows, method) for method in ("temperature", "neural_clamping", "tst")}


def _fit_text(model: torch.nn.Module, tokenizer: Any, data: Any, method: str) -> CalibratedModel:
    options = TEXT_NC_OPTIONS if method == "neural_clamping" else {"tst": HEAD_OPTIONS}.get(method, {})
    return CalibratedModel.fit(model, data, method=method, progress=False, preprocessor=tokenizer, max_length=MAX_LENGTH, **options)


@pytest.mark.parametrize("form", TEXT_FORMS)
def test_every_text_form_fits_the_map_style_calibrator(bbc, text_references, form):
    model, tokenizer, rows = bbc
    make = text_forms(rows, tokenizer)[form]
    for method, reference in text_references.items():
        assert_same_calibrator(_fit_text(model, tokenizer, make(), method), reference)


def test_a_streamed_text_evaluation_and_the_pipeline_equal_the_map_style_ones(bbc, text_references):
    """A streamed datasets.IterableDataset of the BBC rows gives the map-style metrics, and the calibrated text
    pipeline's top scores are the calibrated model's probabilities."""
    from transformers import pipeline

    model, tokenizer, rows = bbc
    calibrated = text_references["temperature"]
    options = dict(progress=False, bootstrap=200, preprocessor=tokenizer, max_length=MAX_LENGTH)
    want = calibrated.evaluate(rows, **options)
    got = calibrated.evaluate(rows.to_iterable_dataset(num_shards=2), **options)
    for side in ("uncalibrated", "calibrated"):
        assert _flat(got[side]) == pytest.approx(_flat(want[side]), rel=1e-9, abs=1e-12), side
    classifier = pipeline("text-classification", model=calibrated, tokenizer=tokenizer, top_k=None)
    scores = classifier(rows["text"][:8], truncation=True, max_length=MAX_LENGTH)
    encoded = tokenizer(rows["text"][:8], truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
    with torch.no_grad():
        probabilities = torch.softmax(calibrated(**encoded).logits, dim=1)
    names = calibrated.config.id2label
    for row, result in enumerate(scores):
        by_label = {entry["label"]: entry["score"] for entry in result}
        assert [by_label[names[k]] for k in range(len(names))] == pytest.approx(probabilities[row].tolist(), abs=1e-5)
