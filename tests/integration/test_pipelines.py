"""transformers pipelines serve calibrated probabilities.

Tasks covered:

* ``image-classification`` — a transformers ViT base (with its ``ViTImageProcessor``) and a
  timm base (with transformers' ``TimmWrapperImageProcessor`` built from the model's
  ``pretrained_cfg``);
* ``text-classification`` — a tiny BERT with the real all-MiniLM-L6-v2 tokenizer.

For each, three ways to build the pipeline: from the in-memory ``CalibratedModel`` (plus its
preprocessor), from a folder written by ``save_pretrained`` (``pipeline(task, model=folder)``,
nothing else), and from a hub repo id after ``push_to_hub`` (local test Hub). With
``top_k=None`` every class score must equal softmax of the calibrated logits computed here from
the same preprocessed input (to 1e-6), and differ from the uncalibrated softmax.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from transformers import pipeline
from transformers.models.timm_wrapper import TimmWrapperImageProcessor

import _tiny_models as tm
from hf_calibrate import CalibratedModel

TASKS = {"timm": "image-classification", "vit": "image-classification", "bert": "text-classification"}
TEMPERATURE = 0.2  # set on the fitted calibration: clearly not 1


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


def _preprocessor(kind: str, base: Any, default: Any) -> Any:
    return TimmWrapperImageProcessor(pretrained_cfg=base.pretrained_cfg) if kind == "timm" else default


def _model_inputs(kind: str, preprocessor: Any, raw: List[Any]) -> List[Dict[str, torch.Tensor]]:
    """One batch of model inputs per raw input, preprocessed as the pipeline does it (one at a time)."""
    if kind == "bert":
        return [dict(preprocessor(text, return_tensors="pt")) for text in raw]
    return [{"pixel_values": preprocessor(image, return_tensors="pt")["pixel_values"]} for image in raw]


@pytest.fixture(scope="module", params=list(TASKS))
def case(request) -> Dict[str, Any]:
    """A Neural Clamping calibration with a large δ and T = 0.2, its inputs and expected scores."""
    kind = request.param
    base, data, default_preprocessor = tm.make_base(kind)
    preprocessor = _preprocessor(kind, base, default_preprocessor)
    calibrated = tm.fit(base, data, "neural_clamping", preprocessor=preprocessor)
    tm.enlarge_delta(calibrated, scale=0.1)
    tm.set_temperature(calibrated, TEMPERATURE)
    raw = tm.sentences(4, seed=11) if kind == "bert" else tm.pil_images(4, seed=11)
    expected, uncalibrated = [], []
    for inputs in _model_inputs(kind, preprocessor, raw):
        with torch.no_grad():
            expected.append(torch.softmax(tm.logits_of(calibrated, inputs)[0].double(), -1))
            uncalibrated.append(torch.softmax(calibrated.backbone.logits(inputs)[0].double(), -1))
    return {"kind": kind, "task": TASKS[kind], "calibrated": calibrated, "preprocessor": preprocessor, "raw": raw,
            "expected": torch.stack(expected), "uncalibrated": torch.stack(uncalibrated)}


def _scores(pipe: Any, case: Dict[str, Any]) -> torch.Tensor:
    """The pipeline's class scores, as an (N, C) tensor in class-index order."""
    label2id = {label: int(index) for index, label in case["calibrated"].config.id2label.items()}
    outputs = pipe(case["raw"], top_k=None)
    assert len(outputs) == len(case["raw"])
    scores = torch.zeros(len(outputs), len(label2id), dtype=torch.float64)
    for row, output in enumerate(outputs):
        assert sorted(item["label"] for item in output) == sorted(label2id)
        for item in output:
            scores[row, label2id[item["label"]]] = item["score"]
    return scores


def _check(scores: torch.Tensor, case: Dict[str, Any]) -> None:
    assert torch.allclose(scores, case["expected"], atol=1e-6, rtol=0)
    assert (scores - case["uncalibrated"]).abs().max() > 1e-3


def _pipeline_kwargs(case: Dict[str, Any]) -> Dict[str, Any]:
    key = "tokenizer" if case["kind"] == "bert" else "image_processor"
    return {key: case["preprocessor"]}


def test_calibration_changes_the_scores(case):
    """Guard for the checks below: calibrated and uncalibrated probabilities really differ."""
    assert (case["expected"] - case["uncalibrated"]).abs().max() > 1e-3


def test_pipeline_from_the_model_object(case):
    pipe = pipeline(case["task"], model=case["calibrated"], **_pipeline_kwargs(case))
    _check(_scores(pipe, case), case)


def test_pipeline_from_a_saved_folder(case, tmp_path):
    preprocessor = None if case["kind"] == "timm" else case["preprocessor"]  # timm: config.json suffices
    case["calibrated"].save_pretrained(tmp_path / "model", preprocessor=preprocessor)
    pipe = pipeline(case["task"], model=str(tmp_path / "model"))
    assert isinstance(pipe.model, CalibratedModel)
    _check(_scores(pipe, case), case)


def test_pipeline_from_the_hub(case, hub_online):
    repo_id = hub_online.unique_repo_id(f"pipeline-{case['kind']}")
    case["calibrated"].push_to_hub(repo_id)  # the preprocessor given to fit() is pushed with it
    pipe = pipeline(case["task"], model=repo_id)
    assert isinstance(pipe.model, CalibratedModel)
    _check(_scores(pipe, case), case)


def test_a_text_longer_than_the_model_takes_is_refused_naming_truncation():
    """A pipeline called on a long text without truncation gets an error naming the call that works (the base alone
    fails with a bare tensor-size RuntimeError); that call gives calibrated scores."""
    base, data, tokenizer = tm.make_base("bert")
    pipe = pipeline("text-classification", model=tm.fit(base, data, "temperature", preprocessor=tokenizer), tokenizer=tokenizer)
    text = " ".join(tm.sentences(40, seed=1))
    limit = base.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"more than the {limit} positions this model takes.*truncation=True, max_length={limit}"):
        pipe(text)
    [output] = pipe(text, truncation=True, max_length=limit)
    assert output["label"] in base.config.id2label.values() and 0 < output["score"] <= 1


@pytest.mark.parametrize("kind", ["timm", "vit"])
def test_a_base_without_class_names_takes_them_from_the_calibration_data(kind, tmp_path):
    """A timm base without label names, or a transformers one with only LABEL_i, calibrated on a ``datasets``
    ClassLabel column: the calibrated model, its saved folder and a pipeline built from that folder show the data's
    names (not LABEL_3); the fit summary says where they came from."""
    import datasets

    base = tm.tiny_timm(0, label_names=None) if kind == "timm" else tm.tiny_vit(0)
    if kind == "vit":  # transformers' defaults when a config is made without labels
        base.config.id2label = {index: f"LABEL_{index}" for index in range(tm.NUM_CLASSES)}
        base.config.label2id = {f"LABEL_{index}": index for index in range(tm.NUM_CLASSES)}
    pixels, labels = tm.image_data(base, 48).tensors
    names = ["zero", "one", "two", "three"]
    features = datasets.Features({"pixel_values": datasets.Array3D(shape=tuple(pixels.shape[1:]), dtype="float32"),
                                  "label": datasets.ClassLabel(names=names)})
    data = datasets.Dataset.from_dict({"pixel_values": pixels.numpy(), "label": labels.tolist()}, features=features)
    preprocessor = TimmWrapperImageProcessor(pretrained_cfg=base.pretrained_cfg) if kind == "timm" else tm.vit_image_processor()
    calibrated = tm.fit(base, data.with_format("torch"), "temperature", preprocessor=preprocessor)
    assert calibrated.config.id2label == dict(enumerate(names))
    assert "calibration data" in calibrated.fit_summary["class_names"]
    calibrated.save_pretrained(tmp_path)
    outputs = pipeline("image-classification", model=str(tmp_path))(tm.pil_images(2, seed=3), top_k=None)
    assert all(sorted(item["label"] for item in output) == sorted(names) for output in outputs)


def test_a_base_with_class_names_keeps_them_whatever_the_data_call_them():
    import datasets

    base = tm.tiny_timm(0)
    pixels, labels = tm.image_data(base, 48).tensors
    order = list(reversed(tm.LABELS))  # the model's names in another order: matched, not adopted
    features = datasets.Features({"pixel_values": datasets.Array3D(shape=tuple(pixels.shape[1:]), dtype="float32"),
                                  "label": datasets.ClassLabel(names=order)})
    data = datasets.Dataset.from_dict({"pixel_values": pixels.numpy(), "label": [order.index(tm.LABELS[i]) for i in labels]},
                                      features=features)
    calibrated = tm.fit(base, data.with_format("torch"), "temperature")
    assert calibrated.config.id2label == dict(enumerate(tm.LABELS)) and "class_names" not in calibrated.fit_summary


def test_texts_longer_than_the_calibrated_max_length_are_named():
    """Calibrated at max_length=16: a text longer than the model takes is refused naming max_length=16 (not the model's
    limit), a text between the two warns once per model, and the saved tokenizer's truncation=True gives no warning."""
    import warnings

    import datasets

    base, _, tokenizer = tm.make_base("bert")
    texts = tm.sentences(48, seed=2)
    data = datasets.Dataset.from_dict({"text": texts, "label": [index % tm.NUM_CLASSES for index in range(len(texts))]})
    model = CalibratedModel.fit(base, data, method="temperature", preprocessor=tokenizer, max_length=16, progress=False)
    pipe = pipeline("text-classification", model=model, tokenizer=model.preprocessor)
    medium, long = " ".join(tm.sentences(4, seed=3)), " ".join(tm.sentences(40, seed=1))
    with pytest.raises(ValueError, match=r"positions this model takes\. Truncate the texts at the max_length=16 they were "
                                         r"calibrated at: pipe\(texts, truncation=True, max_length=16\)"):
        pipe(long)
    with pytest.warns(UserWarning, match=r"a text of \d+ tokens, longer than the max_length=16 the calibration was fitted at") as said:
        pipe(medium)
    assert said[0].filename == __file__  # the user's line, not the pipeline's or torch's that call the model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe(medium)  # said once per model
        pipe(long, truncation=True)


def test_a_calibrated_max_length_beyond_the_models_positions_is_not_advised():
    """Calibrated without max_length, the tokenizer's 512 is recorded, beyond the 64 positions the tiny model takes: the
    refusal advises truncating at 64 (following it works), not at 512."""
    import datasets

    base, _, tokenizer = tm.make_base("bert")
    texts = tm.sentences(32, seed=4)
    data = datasets.Dataset.from_dict({"text": texts, "label": [index % tm.NUM_CLASSES for index in range(len(texts))]})
    model = CalibratedModel.fit(base, data, method="temperature", preprocessor=tokenizer, progress=False)
    limit = base.config.max_position_embeddings
    assert model.backbone.calibrated_max_length > limit
    pipe = pipeline("text-classification", model=model, tokenizer=tokenizer)
    long = " ".join(tm.sentences(40, seed=1))
    with pytest.raises(ValueError, match=rf"Truncate the texts: pipe\(texts, truncation=True, max_length={limit}\)"):
        pipe(long)
    [output] = pipe(long, truncation=True, max_length=limit)
    assert 0 < output["score"] <= 1


def test_a_timm_wrapper_base_loads_back_with_its_image_processor(digits_cnn, tmp_path):
    """A timm model loaded through transformers (``TimmWrapperForImageClassification``): transformers saves no image
    processor beside it, so the loaded calibration rebuilds it from the base's config. It used to load with none, and
    raw images were refused ("raw images need the model's image processor"); its scores equal the fitted model's."""
    from transformers import AutoImageProcessor, TimmWrapperForImageClassification

    base = TimmWrapperForImageClassification.from_pretrained(str(digits_cnn.path))
    processor = AutoImageProcessor.from_pretrained(str(digits_cnn.path))
    calibration, test = digits_cnn.dataset["calibration"], digits_cnn.dataset["test"].select(range(40))
    fitted = CalibratedModel.fit(base, calibration, method="temperature", preprocessor=processor, progress=False)
    fitted.save_pretrained(tmp_path / "model")
    loaded = CalibratedModel.from_pretrained(tmp_path / "model")
    assert type(loaded.preprocessor).__name__ == "TimmWrapperImageProcessor"
    assert loaded.evaluate(test, bootstrap=0, progress=False)["calibrated"] == fitted.evaluate(test, bootstrap=0, progress=False)["calibrated"]
    pipe = pipeline("image-classification", model=loaded, image_processor=loaded.preprocessor)
    scores = {row["label"]: row["score"] for row in pipe(test[0]["image"], top_k=len(loaded.config.id2label))}
    inputs = loaded.preprocessor(test[0]["image"].convert("RGB"), return_tensors="pt")
    with torch.no_grad():
        expected = torch.softmax(loaded(**inputs).logits[0], dim=0)
    assert [scores[loaded.config.id2label[index]] for index in range(len(expected))] == pytest.approx(expected.tolist(), abs=1e-6)
