"""A calibration holds for the inputs it was fitted on: their size and preprocessing travel with it.

* A timm CNN used at a size other than its ``pretrained_cfg["input_size"]`` (1×8×8 digits on a
  one-channel resnet10t, 3×32×32 images on timm's small test_resnet) is fitted with Neural Clamping — δ takes the
  data's shape, a warning names both sizes — pushed to the local test Hub and reloaded by repo
  id in a fresh process with bit-identical logits; the record and the saved ``config.json``
  carry the calibrated size. At inference another size is a clear error naming the size to
  use; calibration samples of different sizes are a clear error too. A fresh base passed as
  ``base_model=`` takes the calibration; so does a transformers CNN whose config declares
  another ``image_size``.
* A transformers image-classification pipeline on a calibrated ViT preprocesses to the
  calibrated size, not to its image processor's default.
* A text model's ``max_length`` is recorded and re-applied: by ``evaluate`` (an explicit other
  value warns), by the saved tokenizer, and by ``hf-calibrate fit`` / ``evaluate``.
* A timm model with two classifier heads (distilled DeiT): the layer the head methods replace
  is named in a warning, the fit summary and the record, and ``classifier=`` chooses it.

Everything is tiny (a few dozen samples, one or two epochs) so each test takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict

import pytest
import timm
import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import ClassifierLayerError

N = 48
# (timm architecture, create_model options, per-sample input shape the model is used at)
CNN_CASES = {
    "digits-1x8x8": ("resnet10t", {"in_chans": 1, "num_classes": 10}, (1, 8, 8)),
    "images-3x32x32": ("test_resnet", {"num_classes": 10}, (3, 32, 32)),  # a 0.4M-parameter resnet
}
RELOAD_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from safetensors.torch import load_file, save_file
    from hf_calibrate import CalibratedModel

    torch.set_num_threads(1)
    manifest = json.load(open(sys.argv[1]))
    inputs = load_file(manifest["inputs"])
    outputs = {}
    for key, repo_id in manifest["repos"].items():
        with torch.no_grad():
            outputs[key] = CalibratedModel.from_pretrained(repo_id)(inputs[key]).contiguous()
    save_file(outputs, manifest["outputs"])
    """
)


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


def _labelled(model: torch.nn.Module, pixels: torch.Tensor, seed: int = 0) -> TensorDataset:
    """``pixels`` with labels drawn from the model's sharpened predictions (informative, mis-calibrated)."""
    with torch.no_grad():
        output = model(pixels)
    logits = getattr(output, "logits", output)  # timm: a tensor; transformers: an output object
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(pixels, torch.multinomial(torch.softmax(4 * logits.double(), 1), 1, generator=generator).squeeze(1))


def _fit_cnn(key: str) -> Dict[str, Any]:
    """Neural Clamping of the CNN of ``key`` at its (non-default) input size; the fit's warnings are kept."""
    architecture, options, shape = CNN_CASES[key]
    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False, **options).eval()
    data = _labelled(model, torch.randn(N, *shape, generator=torch.Generator().manual_seed(1)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrated = tm.fit(model, data, "neural_clamping", batch_size=24)
    tm.enlarge_delta(calibrated, scale=0.2)
    return {"model": model, "data": data, "calibrated": calibrated, "shape": shape,
            "warnings": [str(w.message) for w in caught]}


@pytest.fixture(scope="module")
def cnns() -> Dict[str, Dict[str, Any]]:
    return {key: _fit_cnn(key) for key in CNN_CASES}


@pytest.fixture(scope="module")
def pushed_cnns(cnns, hub_server, tmp_path_factory) -> Dict[str, Any]:
    """Push both calibrations, then reload them by repo id in one fresh process."""
    work = tmp_path_factory.mktemp("input_size")
    inputs = {key: case["data"].tensors[0][:6].contiguous() for key, case in cnns.items()}
    with hub_server.configure_client(offline=False):
        repos = {key: hub_server.unique_repo_id(key) for key in cnns}
        for key, case in cnns.items():
            case["calibrated"].push_to_hub(repos[key])
        save_file(inputs, str(work / "inputs.safetensors"))
        manifest = {"inputs": str(work / "inputs.safetensors"), "outputs": str(work / "outputs.safetensors"), "repos": repos}
        (work / "manifest.json").write_text(json.dumps(manifest))
        (work / "reload.py").write_text(RELOAD_SCRIPT)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        result = subprocess.run([sys.executable, str(work / "reload.py"), str(work / "manifest.json")],
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        configs = {key: json.loads(Path(hf_hub_download(repo, "config.json")).read_text()) for key, repo in repos.items()}
        records = {key: json.loads(Path(hf_hub_download(repo, "calibration_config.json")).read_text()) for key, repo in repos.items()}
    return {"inputs": inputs, "reloaded": load_file(str(work / "outputs.safetensors")), "configs": configs, "records": records}


# ----------------------------------------------------------------------------- timm CNNs at other sizes


@pytest.mark.parametrize("key", list(CNN_CASES))
def test_delta_takes_the_shape_of_the_calibration_data(cnns, key):
    case = cnns[key]
    assert tuple(case["calibrated"].calibrator.input_perturbation.shape) == case["shape"]
    declared = "×".join(str(v) for v in case["model"].pretrained_cfg["input_size"])
    used = "×".join(str(v) for v in case["shape"])
    assert any(used in message and declared in message for message in case["warnings"]), case["warnings"]


@pytest.mark.parametrize("key", list(CNN_CASES))
def test_fresh_process_reload_by_repo_id_is_bit_identical(cnns, pushed_cnns, key):
    with torch.no_grad():
        expected = cnns[key]["calibrated"](pushed_cnns["inputs"][key])
        base = cnns[key]["model"](pushed_cnns["inputs"][key])
    assert torch.equal(pushed_cnns["reloaded"][key], expected)
    assert not torch.allclose(expected, base)  # δ and T matter for the compared logits


@pytest.mark.parametrize("key", list(CNN_CASES))
def test_the_calibrated_size_is_recorded_and_saved_as_the_input_size(cnns, pushed_cnns, key):
    shape = list(cnns[key]["shape"])
    contract = pushed_cnns["records"][key]["input_contract"]
    assert contract["input_size"] == shape and contract["shape"] == shape
    assert contract["preprocessing"]["input_size"] == shape
    assert pushed_cnns["configs"][key]["pretrained_cfg"]["input_size"] == shape  # what pipelines and timm read


def test_another_input_size_at_inference_names_the_size_to_use(cnns):
    calibrated = cnns["digits-1x8x8"]["calibrated"]
    with pytest.raises(ValueError, match=r"per-sample shape \(1, 16, 16\).*calibrated on inputs of size 1×8×8.*Preprocess inputs to \(1, 8, 8\)"):
        calibrated(torch.zeros(2, 1, 16, 16))



def test_evaluating_other_inputs_warns_for_every_method():
    """A temperature scaling has no δ to refuse another size, so evaluate says it, once, at the user's line; so it does
    for un-normalised pixels of the right size; data like the calibration data say nothing."""
    base = tm.tiny_timm(0)
    data = tm.image_data(base, 48)
    calibrated = tm.fit(base, data, "temperature")
    pixels, labels = data.tensors
    larger = TensorDataset(torch.nn.functional.interpolate(pixels, scale_factor=1.5), labels)
    with pytest.warns(UserWarning, match=r"the evaluation inputs are 3×24×24 per sample, but the model was calibrated on "
                                         r"3×16×16 inputs") as caught:
        calibrated.evaluate(larger, bootstrap=0, progress=False)
    assert [w.filename for w in caught if "evaluation inputs" in str(w.message)] == [__file__]
    unnormalised = TensorDataset((pixels - pixels.min()) / (pixels.max() - pixels.min()), labels)  # [0, 1], same size
    with pytest.warns(UserWarning, match=r"pixel values lie in \[0\.\d+, 0\.\d+\], the calibration inputs. in \[-.*look preprocessed"):
        calibrated.evaluate(unnormalised, bootstrap=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrated.evaluate(data, bootstrap=0, progress=False)


def test_a_fresh_base_passed_by_the_user_takes_a_calibration_of_another_size(cnns, tmp_path):
    """``base_model=`` is a new timm model whose pretrained_cfg declares 3×176×176; δ is 1×8×8 (recorded)."""
    case = cnns["digits-1x8x8"]
    case["calibrated"].save_pretrained(tmp_path)
    fresh = timm.create_model("resnet10t", pretrained=False, in_chans=1, num_classes=10).eval()
    fresh.load_state_dict(case["model"].state_dict())
    assert tuple(fresh.pretrained_cfg["input_size"]) != case["shape"]
    reloaded = CalibratedModel.from_pretrained(tmp_path, base_model=fresh)
    pixels = case["data"].tensors[0][:4]
    with torch.no_grad():
        assert torch.equal(reloaded(pixels), case["calibrated"](pixels))



def test_a_record_without_fingerprint_keeps_the_size_check(cnns, tmp_path):
    """Only a recorded base fingerprint lets δ differ from the base's declared size: without one, nothing
    else would tie the calibration to its base."""
    from hf_calibrate import serialization

    case = cnns["digits-1x8x8"]
    case["calibrated"].save_pretrained(tmp_path)
    path = tmp_path / "calibration_config.json"
    record = json.loads(path.read_text())
    del record["base_model"]["fingerprint"]
    path.write_text(json.dumps(serialization.seal_record(record)))
    fresh = timm.create_model("resnet10t", pretrained=False, in_chans=1, num_classes=10).eval()
    fresh.load_state_dict(case["model"].state_dict())
    with pytest.raises(serialization.ArtifactError, match=r"shape \(1, 8, 8\).*another base"):
        CalibratedModel.from_pretrained(tmp_path, base_model=fresh)

def test_transformers_cnn_calibrated_at_another_size_than_its_config_reloads(tmp_path):
    """A ConvNext whose config says image_size=224, calibrated (and used) at 32×32."""
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3, image_size=224)
    model = ConvNextForImageClassification(config).eval()
    data = _labelled(model, torch.randn(N, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    with pytest.warns(UserWarning, match="input size 3×32×32, but its config declares 3×224×224"):
        calibrated = tm.fit(model, data, "neural_clamping", batch_size=24)
    tm.enlarge_delta(calibrated, scale=0.2)
    calibrated.save_pretrained(tmp_path)
    reloaded = CalibratedModel.from_pretrained(tmp_path)
    assert json.loads((tmp_path / "calibration_config.json").read_text())["input_contract"]["input_size"] == [3, 32, 32]
    pixels = data.tensors[0][:4]
    with torch.no_grad():
        assert torch.equal(reloaded(pixels).logits, calibrated(pixels).logits)
        assert not torch.allclose(calibrated(pixels).logits, model(pixels).logits)

class _MixedSizes(Dataset):
    """Digits at 8×8 and, every third sample, at 9×9: data a user forgot to resize."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(3)
        self.items = [(torch.randn(1, 9 if i % 3 == 2 else 8, 9 if i % 3 == 2 else 8, generator=generator), i % 10)
                      for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


@pytest.mark.filterwarnings("ignore:the calibration data have input size")
def test_calibration_samples_of_different_sizes_are_a_clear_error(cnns):
    model = cnns["digits-1x8x8"]["model"]
    with pytest.raises(ValueError, match=r"calibration samples differ in size.*\(1, 8, 8\).*\(1, 9, 9\).*same size"):
        tm.fit(model, _MixedSizes(12), "neural_clamping", batch_size=12, micro_batch_size=1, epochs=1)


# ----------------------------------------------------------------------------- transformers ViT pipeline


def test_vit_pipeline_preprocesses_to_the_calibrated_size(tmp_path):
    from transformers import ViTImageProcessor, pipeline

    base = tm.tiny_vit(seed=3)  # its config takes 16×16 images
    data = tm.image_data(base, N, seed=3)
    processor = ViTImageProcessor()  # its default size: 224×224
    with pytest.warns(UserWarning, match="16×16.*224×224"):
        calibrated = tm.fit(base, data, "neural_clamping", preprocessor=processor)
    tm.enlarge_delta(calibrated, scale=0.2)
    calibrated.save_pretrained(tmp_path / "vit")
    saved = json.loads((tmp_path / "vit" / "preprocessor_config.json").read_text())
    assert saved["size"] == {"height": 16, "width": 16} and processor.size["height"] == 224  # the user's one untouched

    images = tm.pil_images(3, seed=5, size=40)
    scores = pipeline("image-classification", model=str(tmp_path / "vit"))(images, top_k=None)
    resized = ViTImageProcessor(size={"height": 16, "width": 16})
    label2id = {label: int(index) for index, label in calibrated.config.id2label.items()}
    for image, output in zip(images, scores):
        with torch.no_grad():
            logits = tm.logits_of(calibrated, {"pixel_values": resized(image, return_tensors="pt")["pixel_values"]})[0]
        expected = torch.softmax(logits.double(), -1)
        got = torch.tensor([next(item["score"] for item in output if label2id[item["label"]] == c) for c in range(len(label2id))])
        assert torch.allclose(got.double(), expected, atol=1e-6)


# ----------------------------------------------------------------------------- text: max_length


@pytest.fixture(scope="module")
def text_case() -> Dict[str, Any]:
    """A tiny BERT with the real MiniLM tokenizer, raw-text splits, and a fit at max_length=5."""
    import datasets

    tokenizer = tm.minilm_tokenizer()
    base = tm.tiny_bert(seed=4, vocab_size=len(tokenizer))
    generator = torch.Generator().manual_seed(4)
    splits = {
        name: datasets.Dataset.from_dict({"text": tm.sentences(N, seed=seed),
                                          "label": torch.randint(0, tm.NUM_CLASSES, (N,), generator=generator).tolist()})
        for name, seed in (("calibration", 20), ("test", 21))
    }
    calibrated = tm.fit(base, splits["calibration"], "temperature", preprocessor=tokenizer, max_length=5)
    return {"tokenizer": tokenizer, "base": base, "splits": splits, "calibrated": calibrated}


def _metrics(evaluation: Dict[str, Any]) -> Dict[str, float]:
    return {side: evaluation[side]["nll"] for side in ("uncalibrated", "calibrated")}


def test_max_length_is_recorded(text_case):
    facts = text_case["calibrated"].calibration_record()["input_contract"]["preprocessing"]
    assert facts["max_length"] == 5 and facts["truncation"] is True
    assert facts["padding_side"] == text_case["tokenizer"].padding_side



def test_pretokenized_data_claim_no_max_length(text_case):
    """Inputs the user tokenized (at 7 tokens here): their truncation is not known, so none is recorded or re-applied."""
    tokenizer = text_case["tokenizer"]
    rows = text_case["splits"]["calibration"].map(lambda row: tokenizer(row["text"], truncation=True, max_length=7))
    calibrated = tm.fit(text_case["base"], rows, "temperature", preprocessor=tokenizer)
    facts = calibrated.calibration_record()["input_contract"]["preprocessing"]
    assert "max_length" not in facts and "tokenized by the user" in facts["source"], facts
    saved_tokenizer = calibrated.preprocessor
    assert saved_tokenizer.model_max_length == tokenizer.model_max_length


class _Rows(Dataset):
    """Pre-tokenized rows as users keep them: the model's inputs plus ``text`` and ``idx``."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return self.rows[index]


def test_only_the_models_inputs_reach_it_from_rows_with_other_fields(text_case):
    tokenizer = text_case["tokenizer"]
    rows = text_case["splits"]["calibration"].map(lambda row, i: {**tokenizer(row["text"]), "idx": i}, with_indices=True)
    assert {"text", "idx", "input_ids", "attention_mask"} <= set(rows.column_names)
    from_dataset = tm.fit(text_case["base"], rows, "temperature")
    from_torch = tm.fit(text_case["base"], _Rows([rows[i] for i in range(len(rows))]), "temperature")
    assert torch.equal(from_dataset.calibrator.log_temperature, from_torch.calibrator.log_temperature)


def _segment_bert(forward_style: str) -> torch.nn.Module:
    """A tiny BERT with two segment types whose ``forward`` is the library's, or a user's passing ``**kwargs`` on."""
    from transformers import BertConfig, BertForSequenceClassification

    class PairBertForSequenceClassification(BertForSequenceClassification):
        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)

    class WrappedBertForSequenceClassification(BertForSequenceClassification):
        def forward(self, **kwargs):
            return super().forward(**kwargs)

    cls = {"library": BertForSequenceClassification, "passes_kwargs": PairBertForSequenceClassification,
           "only_kwargs": WrappedBertForSequenceClassification}[forward_style]
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        num_labels=2, type_vocab_size=2)
    torch.manual_seed(0)
    return cls(config).eval()


@pytest.mark.parametrize("forward_style", ["library", "passes_kwargs", "only_kwargs"])
def test_inputs_a_forward_takes_through_kwargs_still_reach_it(forward_style):
    """Sentence pairs (token_type_ids) on a user's subclass whose forward passes ``**kwargs`` to the base model."""
    from hf_calibrate.backbones import adapt
    from hf_calibrate.data import prepare_data

    model = _segment_bert(forward_style)
    rows = [{"input_ids": torch.tensor([1, 5, 6, 2, 7, 8, 2]), "attention_mask": torch.ones(7, dtype=torch.long),
             "token_type_ids": torch.tensor([0, 0, 0, 0, 1, 1, 1]), "text": "a b", "idx": i, "labels": i % 2} for i in range(4)]
    inputs, _ = next(iter(prepare_data(_Rows(rows), adapt(model)).loader([[0, 1, 2, 3]])))
    assert sorted(inputs) == ["attention_mask", "input_ids", "token_type_ids"]

def test_evaluate_reapplies_max_length_and_warns_about_another(text_case):
    calibrated, test = text_case["calibrated"], text_case["splits"]["test"]
    default = _metrics(calibrated.evaluate(test, progress=False))
    assert default == _metrics(calibrated.evaluate(test, progress=False, max_length=5))
    with pytest.warns(UserWarning, match="max_length=16.*max_length=5"):
        longer = _metrics(calibrated.evaluate(test, progress=False, max_length=16))
    assert longer != default
    assert text_case["tokenizer"].model_max_length == 512  # the user's tokenizer is untouched


def test_saved_tokenizer_truncates_at_the_calibrated_length(text_case, tmp_path):
    calibrated, test = text_case["calibrated"], text_case["splits"]["test"]
    calibrated.save_pretrained(tmp_path / "bert")
    assert json.loads((tmp_path / "bert" / "tokenizer_config.json").read_text())["model_max_length"] == 5
    reloaded = CalibratedModel.from_pretrained(tmp_path / "bert")
    assert _metrics(reloaded.evaluate(test, progress=False)) == _metrics(calibrated.evaluate(test, progress=False))


def test_command_line_records_and_reapplies_max_length(text_case, tmp_path, capsys):
    from hf_calibrate.cli import main

    text_case["base"].save_pretrained(tmp_path / "model")
    text_case["tokenizer"].save_pretrained(tmp_path / "model")
    (tmp_path / "data").mkdir()
    for name, split in text_case["splits"].items():
        split.to_csv(str(tmp_path / "data" / f"{name}.csv"), index=False)
    common = ["--dataset", str(tmp_path / "data"), "--no-progress"]
    assert main(["fit", "--model", str(tmp_path / "model"), *common, "--split", "calibration", "--method", "temperature",
                 "--max-length", "5", "--output", str(tmp_path / "calibrated")]) == 0
    record = json.loads((tmp_path / "calibrated" / "calibration_config.json").read_text())
    assert record["input_contract"]["preprocessing"]["max_length"] == 5
    capsys.readouterr()
    assert main(["evaluate", "--model", str(tmp_path / "calibrated"), *common, "--split", "test", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = CalibratedModel.from_pretrained(tmp_path / "calibrated").evaluate(
        text_case["splits"]["test"], progress=False, max_length=5)
    assert printed["calibrated"]["nll"] == pytest.approx(expected["calibrated"]["nll"], abs=1e-12)


# ----------------------------------------------------------------------------- two classifier heads


@pytest.fixture(scope="module")
def deit() -> Dict[str, Any]:
    """A one-block distilled DeiT at 32×32: two nn.Linear heads with one output per class, whose mean is its logits."""
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, num_classes=tm.NUM_CLASSES,
                              img_size=32, depth=1).eval()
    return {"model": model, "data": _labelled(model, torch.randn(N, 3, 32, 32, generator=torch.Generator().manual_seed(6)))}


@pytest.mark.filterwarnings("ignore:the calibration data have input size")
@pytest.mark.parametrize("classifier", [None, "head"])
def test_a_head_whose_output_is_not_the_logits_is_refused_naming_the_fix(deit, classifier):
    """The distilled DeiT averages its two heads: a new head trained in place of either one would be scored as if it
    gave the logits, and then be averaged with the other. The guess warns (naming the layer it took), and either
    layer is refused before any head is trained."""
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ClassifierLayerError) as refused:
        warnings.simplefilter("always")
        tm.fit(deit["model"], deit["data"], "tst", epochs=1, classifier=classifier)
    layer, other = ("head", "head_dist") if classifier else ("head_dist", "head")
    assert f"the layer '{layer}' of VisionTransformerDistilled that the head methods would replace does not output its logits" in str(refused.value)
    assert f"layers of one output per class: ['{other}']" in str(refused.value) and "e.g. temperature" in str(refused.value)
    guessed = [str(warning.message) for warning in caught if "nn.Linear layers" in str(warning.message)]
    assert guessed == ([] if classifier else [
        "VisionTransformerDistilled has 2 nn.Linear layers with 4 outputs (head, head_dist); the classifier the head "
        "methods replace is 'head_dist' (the last one). Pass classifier='head_dist' to keep this choice, or name another of them."])


class _AuxiliaryHead(nn.Module):
    """A classifier with an auxiliary head of C outputs defined after its own, which its forward pass does not use."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head, self.aux = nn.Linear(6, 16), nn.Linear(16, tm.NUM_CLASSES), nn.Linear(16, tm.NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


def test_a_guessed_layer_the_forward_pass_never_calls_is_refused():
    model = _AuxiliaryHead().eval()
    with pytest.warns(UserWarning, match="the last one"), pytest.raises(ClassifierLayerError, match="'aux' .* is not called in its forward pass.*\\['head'\\]"):
        tm.fit(model, tm.plain_data(tm.plain_module(0)), "tst", epochs=1)


def test_named_classifier_is_used_saved_and_reloaded(tmp_path):
    model = _AuxiliaryHead().eval()
    data = tm.plain_data(tm.plain_module(0))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*nn.Linear layers with")
        calibrated = tm.fit(model, data, "tst", epochs=1, classifier="head")
    assert calibrated.backbone.final_layer() is model.head
    assert calibrated.fit_summary["classifier"] == calibrated.calibration_record()["base_model"]["classifier"] == "head"
    calibrated.save_pretrained(tmp_path / "aux")
    reloaded = CalibratedModel.from_pretrained(tmp_path / "aux", base_model=_AuxiliaryHead().eval())
    assert reloaded.backbone.classifier_name == "head"
    x = data.tensors[0][:4]
    with torch.no_grad():
        assert torch.equal(reloaded(x), calibrated(x))


@pytest.mark.filterwarnings("ignore:the calibration data have input size")
def test_unknown_classifier_lists_the_candidates(deit):
    with pytest.raises(ValueError, match=r"classifier='heads'.*not a layer.*\['head', 'head_dist'\]"):
        tm.fit(deit["model"], deit["data"], "tst", epochs=1, classifier="heads")


def test_samples_of_different_sizes_in_one_batch_name_both_sizes():
    """Not torch's "stack expects each tensor to be equal size": the shapes and the fix."""
    model = timm.create_model("resnet10t", pretrained=False, num_classes=3, in_chans=1).eval()
    samples = [(torch.randn(1, 8, 8), 0), (torch.randn(1, 9, 9), 1), (torch.randn(1, 8, 8), 2)]
    with pytest.raises(ValueError, match=r"differ in size: \(1, 8, 8\) and \(1, 9, 9\).*resize or crop"):
        CalibratedModel.fit(model, samples, method="temperature", progress=False)


@pytest.mark.parametrize("recorded, given, differs", [
    ([-2.1, 2.6], [-1.9, 2.2], False),   # both normalised
    ([-2.1, 2.6], [0.0, 1.0], True),     # normalised, then not
    ([0.0, 1.0], [0.0, 255.0], True),    # 0–1, then 0–255
    ([0.0, 1.0], [0.02, 0.97], False),   # both 0–1
    ([0.0, 255.0], [0.0, 250.0], False),
])
def test_pixel_ranges_that_look_preprocessed_differently(recorded, given, differs):
    from hf_calibrate.backbones.preprocessing import differently_scaled

    assert differently_scaled(recorded, given) is differs
