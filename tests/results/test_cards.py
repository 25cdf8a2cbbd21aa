"""Model cards: what ``save_pretrained`` writes to README.md, read back with ``huggingface_hub.ModelCard``,
and ``push_evaluation_results``, which replaces the hub card's results with a new evaluation."""

from __future__ import annotations

import copy

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict

import datasets
import pytest
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from PIL import Image

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.results import cards, plotting
from hf_calibrate._hub import push_evaluation_results
from hf_calibrate.results.cards import DIAGRAM_FILE
from hf_calibrate.metrics import ReliabilityBins, brier_score
from hf_calibrate.modeling import TemperatureScalingFallbackWarning
from hf_calibrate.serialization import ArtifactError
from hf_calibrate.serialization.identity import repo_id_problem

METRICS = ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier")
SIDES = ("uncalibrated", "calibrated")


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


@pytest.fixture(scope="module")
def vit() -> Dict[str, Any]:
    """A ViT that records a hub id (as if loaded from "org/base"), its calibration and test data."""
    base = tm.tiny_vit(name_or_path="org/base")
    data = tm.image_data(base, 64, seed=0)
    test = tm.image_data(base, 48, seed=1)
    calibrated = tm.fit(base, data, "neural_clamping", seed=3, delta_weight=0.05)
    return {"base": base, "data": data, "test": test, "calibrated": calibrated}


@pytest.fixture(scope="module")
def evaluated_card(vit, tmp_path_factory) -> Dict[str, Any]:
    evaluation = vit["calibrated"].evaluate(vit["test"], dataset_name="digits-16px", split="test", progress=False)
    folder = tmp_path_factory.mktemp("card") / "model"
    vit["calibrated"].save_pretrained(folder, repo_id="someone/calibrated-vit")
    return {"evaluation": evaluation, "folder": folder, "card": ModelCard.load(folder / "README.md")}


def _results(card: ModelCard) -> Dict[tuple, Any]:
    """(metric type, metric config) → EvalResult, checking there is one of each."""
    results = {(r.metric_type, r.metric_config): r for r in card.data.eval_results or []}
    assert len(results) == len(card.data.eval_results or []), "duplicate model-index entries"
    return results


def test_model_index_holds_every_metric_before_and_after(evaluated_card):
    evaluation, results = evaluated_card["evaluation"], _results(evaluated_card["card"])
    for side in SIDES:
        for metric in METRICS:
            result = results[(metric, side)]
            assert result.metric_value == pytest.approx(float(evaluation[side][metric]), rel=0, abs=0)
            assert result.task_type == "image-classification"
            assert (result.dataset_name, result.dataset_split) == ("digits-16px", "test")
            assert side in result.metric_name
    # the two sides really are different numbers (a mix-up would show)
    assert results[("nll", "uncalibrated")].metric_value != results[("nll", "calibrated")].metric_value


def test_card_metadata(evaluated_card):
    data = evaluated_card["card"].data
    assert data.base_model == "org/base"
    assert data.library_name == "hf_calibrate"
    assert data.pipeline_tag == "image-classification"
    assert {"calibration", "neural-clamping", "transformers"} <= set(data.tags)
    assert data.model_name == "calibrated-vit"


def test_card_body_describes_method_hyperparameters_and_provenance(evaluated_card, vit):
    text = evaluated_card["card"].text
    assert "Neural Clamping" in text
    options = vit["calibrated"].provenance["options"]
    assert "| `delta_weight` | `[0.05]` |" in text and f"| `epochs` | `{options['epochs']}` |" in text
    assert "| `lr` | `0.01` |" in text and "| `delta_init_scale` | `0.001` |" in text  # exact, not rounded
    assert "| dataset | TensorDataset |" in text and "| split | not recorded |" in text
    assert "| samples | 64 |" in text and "| seed | 3 |" in text
    assert "[org/base](https://huggingface.co/org/base)" in text
    assert 'CalibratedModel.from_pretrained("someone/calibrated-vit")' in text
    evaluation = evaluated_card["evaluation"]
    assert f"| ECE | {evaluation['uncalibrated']['ece']:.4f} [" in text and f"| {evaluation['calibrated']['ece']:.4f} [" in text


def test_card_shows_each_metric_with_its_interval_the_paired_change_and_a_verdict(evaluated_card):
    """ECE's row holds both sides' bootstrap intervals, the paired change calibrated − uncalibrated with its interval
    and the verdict; the summary line and the note on how the intervals were made are above and below the table."""
    text, evaluation = evaluated_card["card"].text, evaluated_card["evaluation"]
    before, after = (evaluation[side]["intervals"]["ece"] for side in ("uncalibrated", "calibrated"))
    change = evaluation["difference"]["ece"]
    assert change["point"] == pytest.approx(evaluation["calibrated"]["ece"] - evaluation["uncalibrated"]["ece"], abs=1e-12)
    row = (
        f"| ECE | {evaluation['uncalibrated']['ece']:.4f} [{before['low']:.4f}, {before['high']:.4f}] "
        f"| {evaluation['calibrated']['ece']:.4f} [{after['low']:.4f}, {after['high']:.4f}] "
        f"| {change['point']:+.4f} [{change['low']:+.4f}, {change['high']:+.4f}] | {evaluation['verdicts']['ece']} |"
    )
    assert row in text
    verdict = evaluation["verdicts"]["ece"]
    said = f"ECE {verdict}" if verdict != "no detectable change at this test size" else f"ECE: {verdict}"
    assert f"**What calibration did** (paired, at this test size): {said}" in text
    assert "95% Poisson-bootstrap intervals (1000 replicates, seed 0)" in text  # the evaluation's seed, the default
    assert (before["replicates"], before["seed"]) == (1000, 0)


def test_a_card_without_intervals_shows_points_and_changes_only(vit, tmp_path):
    calibrated = copy.deepcopy(vit["calibrated"])  # its evaluation is replaced; the module's model keeps its own
    evaluation = calibrated.evaluate(vit["data"], bootstrap=0, progress=False)
    assert not {"difference", "verdicts", "bootstrap"} & set(evaluation) and "intervals" not in evaluation["calibrated"]
    calibrated.save_pretrained(tmp_path / "points")
    text = (tmp_path / "points" / "README.md").read_text(encoding="utf-8")
    change = evaluation["calibrated"]["ece"] - evaluation["uncalibrated"]["ece"]
    assert f"| ECE | {evaluation['uncalibrated']['ece']:.4f} | {evaluation['calibrated']['ece']:.4f} | {change:+.4f} |\n" in text
    assert "What calibration did" not in text and "bootstrap" not in text


def test_card_includes_the_reliability_diagram(evaluated_card):
    assert f"]({DIAGRAM_FILE})" in evaluated_card["card"].text
    path = evaluated_card["folder"] / DIAGRAM_FILE
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and min(image.size) > 100


def test_card_without_evaluation_has_no_model_index(tmp_path):
    base, data, _ = tm.make_base("timm")
    tm.fit(base, data, "temperature").save_pretrained(tmp_path / "model")
    raw = (tmp_path / "model" / "README.md").read_text()
    card = ModelCard.load(tmp_path / "model" / "README.md")
    assert card.data.eval_results is None and "model-index" not in raw
    assert "No evaluation was recorded" in card.text and "temperature scaling" in card.text
    assert not (tmp_path / "model" / DIAGRAM_FILE).exists()


def test_card_states_the_neural_clamping_selection_and_its_fallback(tmp_path):
    """A fit that fell back to TS says so, with the criterion and the temperature it kept (the
    temperature method's fit on all the calibration data)."""
    from hf_calibrate.results.cards import _fmt

    base = tm.tiny_timm(0)
    with pytest.warns(TemperatureScalingFallbackWarning):
        fallback = tm.fit(base, tm.image_data(base, 96, sharpness=8.0), "neural_clamping", temperature_init=1000.0,
                          lr=1e-12, epochs=1, holdout_fraction=0.25)
    assert fallback.fit_summary["fell_back_to_temperature_scaling"]
    fallback.save_pretrained(tmp_path / "model")
    text = ModelCard.load(tmp_path / "model" / "README.md").text
    kept = fallback.fit_summary["temperature_scaling"]["fallback_temperature"]
    assert "did not beat temperature scaling on the held-out selection data (24 samples, held-out nll" in text
    assert f"plain temperature scaling: δ = 0, T = {_fmt(kept)}." in text
    assert float(fallback.calibrator.temperature) == pytest.approx(kept, rel=1e-6)


def test_no_base_model_metadata_without_a_hub_id(tmp_path):
    base = tm.tiny_vit()  # built from a config: no hub id
    tm.fit(base, tm.image_data(base), "temperature").save_pretrained(tmp_path / "model")
    assert ModelCard.load(tmp_path / "model" / "README.md").data.base_model is None


# ----------------------------------------------------------------------------- push_evaluation_results


@pytest.mark.parametrize("evaluated_before", [True, False])
def test_push_evaluation_results(hub_online, vit, evaluated_before):
    calibrated = vit["calibrated"]
    if evaluated_before:
        calibrated.evaluate(vit["data"], dataset_name="digits-16px", split="calibration", progress=False)
    else:
        calibrated.last_evaluation = None
    repo_id = hub_online.unique_repo_id("results")
    calibrated.push_to_hub(repo_id)
    api = HfApi()
    before_card = ModelCard.load(hf_hub_download(repo_id, "README.md"))
    commits = len(api.list_repo_commits(repo_id))

    evaluation = calibrated.evaluate(vit["test"], dataset_name="digits-16px", split="test", progress=False)
    info = push_evaluation_results(repo_id, evaluation, commit_message="new results")

    history = api.list_repo_commits(repo_id)
    assert len(history) == commits + 1 and history[0].commit_id == info.commit.oid and history[0].title == "new results"
    card = ModelCard.load(hf_hub_download(repo_id, "README.md"))
    results = _results(card)
    assert {(metric, side) for metric in METRICS for side in SIDES} <= set(results)
    for side in SIDES:
        for metric in METRICS:
            assert results[(metric, side)].metric_value == float(evaluation[side][metric])
            assert results[(metric, side)].dataset_split == "test"
    assert card.text != before_card.text and "test split" in card.text  # the body tells the same story
    assert card.data.base_model == "org/base" and card.data.tags == before_card.data.tags
    assert card.data.model_name == repo_id.split("/")[-1]
    # the pushed card names its repo: title, usage snippet, no placeholder
    assert card.text.count(f"# {repo_id.split('/')[-1]}\n") == 1 and "<repo>" not in card.text
    assert f'CalibratedModel.from_pretrained("{repo_id}")' in card.text
    assert f'AutoModelFor…from_pretrained("{repo_id}", subfolder="base")' in card.text


def test_push_evaluation_results_needs_a_card(hub_online, vit):
    repo_id = hub_online.unique_repo_id("no-card")
    HfApi().create_repo(repo_id)
    evaluation = vit["calibrated"].evaluate(vit["test"], progress=False)
    with pytest.raises(ArtifactError, match="no README.md.*push_to_hub"):
        push_evaluation_results(repo_id, evaluation)
    with pytest.raises(ArtifactError, match="could not find"):
        push_evaluation_results(f"{hub_online.user}/does-not-exist", evaluation)


EXAMPLES = Path(__file__).resolve().parents[2] / "model_cards" / "examples"


@pytest.mark.parametrize("folder", sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()))
def test_committed_example_cards_match_their_runs(folder):
    """The example cards in model_cards/ parse as Hub cards and report the metrics their run recorded."""
    card = ModelCard.load(EXAMPLES / folder / "README.md")
    evaluation = json.loads((EXAMPLES / folder / "calibration_config.json").read_text())["evaluation"]
    reported = {
        (metric["type"], metric["config"]): metric["value"]
        for result in card.data.to_dict()["model-index"][0]["results"]
        for metric in result["metrics"]
    }
    for side in ("uncalibrated", "calibrated"):
        for name in ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier"):
            assert reported[(name, side)] == pytest.approx(evaluation[side][name], rel=1e-12), (folder, side, name)
    assert card.data.library_name == "hf_calibrate"
    with Image.open(EXAMPLES / folder / DIAGRAM_FILE) as image:
        assert image.size[0] > 300


# ----------------------------------------------------------------------------- what the card says is true


def _card(folder: Path) -> ModelCard:
    return ModelCard.load(folder / "README.md")


def test_a_card_saved_to_a_folder_names_it_but_shows_no_path_of_the_authors_machine(tmp_path):
    """A card is shared, and the path of the folder it was saved to (here a temporary one) means nothing to its
    readers: the title is the folder's name, the usage snippet loads a placeholder named after it, which is no repo
    id (copied unchanged, it loads nobody's model), and so it stays when new results are put into the folder."""
    base, data, _ = tm.make_base("timm")
    folder = tmp_path / "digits-resnet-ts"
    calibrated = tm.fit(base, data, "temperature")
    calibrated.save_pretrained(folder)
    push_evaluation_results(folder, calibrated.evaluate(data, dataset_name="digits", progress=False))
    card = _card(folder)
    assert card.data.model_name == "digits-resnet-ts" and "\n# digits-resnet-ts\n" in card.text
    for path in {str(tmp_path), str(tmp_path.resolve()), tempfile.gettempdir()}:
        assert path not in str(card), path
    placeholder = "<user>/digits-resnet-ts"
    assert repo_id_problem(placeholder) and f"replace `{placeholder}` with the repo" in card.text
    assert f'CalibratedModel.from_pretrained("{placeholder}")' in card.text
    assert f'timm.create_model("hf-hub:{placeholder}", pretrained=True)' in card.text
    # a repo id, when the save is given one, is what the card loads
    calibrated.save_pretrained(tmp_path / "named", repo_id="someone/digits-resnet-ts")
    named = _card(tmp_path / "named")
    assert 'CalibratedModel.from_pretrained("someone/digits-resnet-ts")' in named.text and "<user>" not in str(named)


def test_card_names_the_base_model_for_the_hub_model_tree(tmp_path):
    """The base's hub id is ``base_model``; a calibration fits parameters on the frozen base: an adapter."""
    base = tm.tiny_vit(name_or_path="org/base")
    data = tm.image_data(base, 32)
    tm.fit(base, data, "temperature").save_pretrained(tmp_path / "ts")
    metadata = _card(tmp_path / "ts").data.to_dict()
    assert (metadata["base_model"], metadata["base_model_relation"]) == ("org/base", "adapter")
    timm_base, timm_data, _ = tm.make_base("timm")
    tm.fit(timm_base, timm_data, "temperature").save_pretrained(tmp_path / "timm", base_model_id="timm/resnet10t.c3_in1k")
    metadata = _card(tmp_path / "timm").data.to_dict()
    assert (metadata["base_model"], metadata["base_model_relation"]) == ("timm/resnet10t.c3_in1k", "adapter")


def test_card_states_the_brier_definition_without_claims_about_other_libraries(evaluated_card, vit):
    """The card's Brier is the squared distance to the one-hot label summed over the classes (range [0, 2])."""
    text = evaluated_card["card"].text
    assert "sklearn" not in text and "scikit" not in text
    assert "summed over the classes" in text and "from 0 to 2" in text
    probs = torch.softmax(torch.randn(50, 4, generator=torch.Generator().manual_seed(0)), dim=1).double()
    labels = torch.arange(50) % 4
    assert brier_score(probs, labels) == pytest.approx(float(((probs - torch.eye(4)[labels]) ** 2).sum(1).mean()))


def test_card_says_what_preprocessing_images_need(evaluated_card):
    usage = evaluated_card["card"].text.split("## How to use")[1].split("## Limitations")[0]
    # the test ViT is calibrated on tensors: only their measured size is known
    assert "The calibration data were preprocessed by the user into 16×16 inputs: preprocess inputs the same way." in usage
    assert "The calibration holds for inputs preprocessed like that only" in usage


def test_card_says_what_preprocessing_texts_need(tmp_path):
    tokenizer = tm.minilm_tokenizer()
    base = tm.tiny_bert(vocab_size=len(tokenizer))
    rows = datasets.Dataset.from_dict({"text": tm.sentences(32), "label": [i % tm.NUM_CLASSES for i in range(32)]})
    tm.fit(base, rows, "temperature", preprocessor=tokenizer, max_length=12).save_pretrained(tmp_path / "model")
    usage = _card(tmp_path / "model").text.split("## How to use")[1].split("## Limitations")[0]
    assert "Texts are tokenized by the saved tokenizer and truncated to 12 tokens" in usage and "truncation=True" in usage


def test_processor_inputs_are_described_in_plain_words():
    """An image processor's contract in words: resize, rescale, normalise, and that the processor is saved."""
    record = {"base_model": {"task": "image-classification"}, "input_contract": {
        "input_size": [3, 16, 16], "preprocessing": {
            "source": "ViTImageProcessor", "do_resize": True, "size": {"height": 16, "width": 16}, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}}}
    [images, holds] = cards.input_notes(record)
    assert images.startswith("Images are resized to {'height': 16, 'width': 16}, rescaled by 0.00392157, normalised with "
                             "mean 0.5 (every channel) and std 0.5 (every channel)")
    assert "ViTImageProcessor" in images and "saved with the model" in images and "preprocessed like that" in holds


@pytest.fixture(scope="module")
def in_sample_folder(vit, tmp_path_factory) -> Path:
    """The ViT calibration evaluated on its own calibration data (as a CLI fit without a held-out split does)."""
    calibrated = vit["calibrated"]
    calibrated.evaluate(vit["data"], dataset_name="digits-16px", split="calibration", progress=False)
    folder = tmp_path_factory.mktemp("in-sample") / "model"
    calibrated.save_pretrained(folder)
    return folder


def test_in_sample_results_are_labelled_in_the_card_and_model_index(in_sample_folder):
    card = _card(in_sample_folder)
    assert "**In-sample results.** Evaluated on **digits-16px, calibration split, 64 samples**" in card.text
    assert "optimistic" in card.text and "calibration (in-sample: data the calibration was fitted on, so optimistic)](" in card.text  # the alt text
    for result in card.data.eval_results:
        assert result.dataset_name == "digits-16px (in-sample: the calibration data)" and "in-sample" in result.metric_name
    record = json.loads((in_sample_folder / "calibration_config.json").read_text())
    assert {key: record["evaluation"][key] for key in ("in_sample", "split", "calibration_split")} == {
        "in_sample": True, "split": "calibration", "calibration_split": None}


def test_held_out_results_name_both_datasets(evaluated_card):
    card, record = evaluated_card["card"], json.loads((evaluated_card["folder"] / "calibration_config.json").read_text())
    assert "In-sample" not in card.text and "in-sample" not in str(card.data.to_dict())
    assert "Evaluated on **digits-16px, test split, 48 samples** (15 bins); the calibration was\nfitted on TensorDataset." in card.text
    assert record["evaluation"]["in_sample"] is False


def test_a_card_rendered_later_from_the_saved_record_says_the_same(in_sample_folder):
    """The record carries in_sample and the split names, so any later rendering labels the results the same."""
    record = json.loads((in_sample_folder / "calibration_config.json").read_text())
    later = cards.render_card(record, repo_id="someone/model")
    assert "**In-sample results.**" in later.text
    assert {r.dataset_name for r in later.data.eval_results} == {"digits-16px (in-sample: the calibration data)"}
    reloaded = CalibratedModel.from_pretrained(in_sample_folder)
    assert reloaded.last_evaluation["in_sample"] is True


def test_results_whose_in_sample_could_not_be_checked_say_so(in_sample_folder):
    """``in_sample`` None (rows that cannot be compared): the card and the diagram's title say it was not checked,
    rather than passing the results off as held out."""
    record = json.loads((in_sample_folder / "calibration_config.json").read_text())
    record["evaluation"] = {**record["evaluation"], "in_sample": None, "in_sample_rows": None}
    text = cards.render_card(record, repo_id="someone/model").text
    assert "(15 bins; in-sample not checked: whether these are data the calibration was fitted on is unknown)" in text
    assert "**In-sample results.**" not in text
    rendered = cards.render_card(record, repo_id="someone/model")
    assert {result.dataset_name for result in rendered.data.eval_results} == {"digits-16px (in-sample not checked)"}
    assert cards.diagram_title(record["evaluation"]).endswith("\nIn-sample not checked: whether these are data the "
                                                             "calibration was fitted on is unknown")


def test_a_record_saved_before_in_sample_was_recorded_is_read_by_its_splits():
    """Older records lack ``in_sample``: an evaluation on the split the calibration was fitted on counts as in-sample."""
    record = json.loads((EXAMPLES / "digits-timm-resnet10t-temperature" / "calibration_config.json").read_text())
    old = {key: value for key, value in record["evaluation"].items() if key not in ("in_sample", "calibration_split")}
    for fit_split, in_sample in (("test", True), ("calibration", False)):
        rendered = cards.render_card({**record, "evaluation": old, "fit": {**record["fit"], "split": fit_split}})
        assert ("**In-sample results.**" in rendered.text) is in_sample, fit_split


def test_evaluate_detects_its_own_calibration_data(vit):
    """The very calibration data object, a datasets.Dataset with its fingerprint, or one derived from it holding its rows
    (a select of the calibration rows included, which must not count as held-out) is in-sample; other data are not."""
    calibrated = vit["calibrated"]
    assert calibrated.evaluate(vit["data"], progress=False)["in_sample"] is True
    assert calibrated.evaluate(vit["test"], progress=False)["in_sample"] is False
    assert calibrated.evaluate(vit["test"], in_sample=True, progress=False)["in_sample"] is True
    base, _, _ = tm.make_base("timm")
    rows = datasets.Dataset.from_dict({"pixel_values": tm.image_tensors(24).numpy(), "label": [i % 4 for i in range(24)]})
    fitted = tm.fit(base, rows, "temperature")
    again = datasets.Dataset.from_dict({"pixel_values": tm.image_tensors(24).numpy(), "label": [i % 4 for i in range(24)]})
    assert again is not rows and fitted.evaluate(again, progress=False)["in_sample"] is True
    assert fitted.evaluate(rows.select(range(12)), progress=False)["in_sample"] is True


def test_evaluate_returns_plain_json_data(vit, in_sample_folder):
    """``json.dumps(calibrated.evaluate(test))`` works and reads back; so does the saved record's evaluation."""
    evaluation = vit["calibrated"].evaluate(vit["test"], dataset_name="digits-16px", split="test", progress=False)
    assert json.loads(json.dumps(evaluation)) == evaluation
    for side in ("uncalibrated", "calibrated"):
        bins = ReliabilityBins.from_dict(evaluation["reliability"][side])
        assert bins.ece == pytest.approx(evaluation[side]["ece"], abs=1e-9)
    saved = json.loads((in_sample_folder / "calibration_config.json").read_text())["evaluation"]
    assert json.loads(json.dumps(saved)) == saved
    reloaded = CalibratedModel.from_pretrained(in_sample_folder).last_evaluation
    assert json.loads(json.dumps(reloaded)) == reloaded


def test_the_diagram_title_names_the_data_and_says_in_sample(in_sample_folder, evaluated_card, monkeypatch):
    """The saved diagram's title says what it was computed on, and in-sample on its own line."""
    titles = []
    draw = plotting.compare_reliability_diagrams

    def recording(diagrams, **kwargs):
        figure = draw(diagrams, **kwargs)
        titles.append((figure.get_suptitle(), [ax.get_title().split("\n")[0] for ax in figure.axes[0::2]]))
        return figure

    monkeypatch.setattr(plotting, "compare_reliability_diagrams", recording)
    for folder in (in_sample_folder, evaluated_card["folder"]):
        cards.write_diagram(folder, json.loads((folder / "calibration_config.json").read_text())["evaluation"])
    (in_sample, in_panels), (held_out, held_panels) = titles
    assert in_sample == ("Reliability on digits-16px, calibration split, 64 samples\n"
                         "In-sample: data the calibration was fitted on, so optimistic")
    assert held_out == "Reliability on digits-16px, test split, 48 samples"
    assert in_panels == held_panels == ["uncalibrated", "calibrated"]


def test_a_neural_clamping_fallback_warns_at_the_users_line():
    """A fit that fell back to temperature scaling says so: a warning pointing at the caller, and the summary's flag."""
    base = tm.tiny_timm(0)
    data = tm.image_data(base, 96, sharpness=8.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = CalibratedModel.fit(base, data, method="neural_clamping", temperature_init=1000.0, lr=1e-12, epochs=1,
                                       holdout_fraction=0.25, batch_size=32, progress=False)
    [warning] = [w for w in caught if issubclass(w.category, TemperatureScalingFallbackWarning)]
    assert issubclass(warning.category, UserWarning) and warning.filename == __file__
    assert "did not beat temperature scaling" in str(warning.message) and "method 'temperature'" in str(warning.message)
    assert fallback.fit_summary["fell_back_to_temperature_scaling"] is True
    assert float(fallback.calibrator.delta.abs().max()) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", TemperatureScalingFallbackWarning)
        kept = CalibratedModel.fit(base, data, method="neural_clamping", epochs=1, holdout_fraction=0.0, batch_size=32,
                                   progress=False)
    assert kept.fit_summary["fell_back_to_temperature_scaling"] is False


def test_the_record_schema_checks_the_new_evaluation_keys_and_old_records_still_load():
    """``in_sample``, the split names and the fit's data fingerprints are optional keys of the record's schema."""
    from hf_calibrate.serialization.schema import seal_record, validate_record

    record = json.loads((EXAMPLES / "digits-timm-resnet10t-temperature" / "calibration_config.json").read_text())
    old = dict(record, evaluation={k: v for k, v in record["evaluation"].items()
                                   if k not in ("in_sample", "calibration_dataset", "calibration_split")},
               fit={k: v for k, v in record["fit"].items() if k != "data_fingerprints"})
    validate_record(seal_record(old), "old")
    for key, bad in (("in_sample", "yes"), ("calibration_split", 3)):
        broken = seal_record(dict(record, evaluation={**record["evaluation"], key: bad}))
        with pytest.raises(ArtifactError, match=f"'evaluation.{key}'"):
            validate_record(broken, "broken")
    with pytest.raises(ArtifactError, match="'fit.data_fingerprints'"):
        validate_record(seal_record(dict(record, fit={**record["fit"], "data_fingerprints": "abc"})), "broken")


def test_every_method_describes_itself_for_its_card():
    """Title, description and citation are attributes of each calibrator class; the card reads them."""
    from hf_calibrate.calibrators import CALIBRATORS

    for method, cls in CALIBRATORS.items():
        assert cls.title and cls.description and cls.citation.startswith("@"), method
    assert [method for method, cls in CALIBRATORS.items() if cls.preserves_argmax] == ["temperature"]
    assert CALIBRATORS["vtst"].citation == CALIBRATORS["tst"].citation
    assert "Stochastic Masking" in CALIBRATORS["mac_cal"].citation


@pytest.mark.parametrize("method", ["temperature", "tst"])
def test_the_card_says_whether_predictions_may_change_from_the_class(method):
    record = json.loads((EXAMPLES / "digits-timm-resnet10t-temperature" / "calibration_config.json").read_text())
    from hf_calibrate.calibrators import calibrator_class

    card = cards.render_card({**record, "method": method})
    cls = calibrator_class(method)
    assert f"## Calibration method: {cls.title}" in card.text and cls.description in card.text
    assert ("it may change a few predictions" in card.text) == (not cls.preserves_argmax)
    assert cls.citation in card.text and "github.com/hf-calibrate" not in card.text


def test_a_partly_in_sample_evaluation_keeps_its_count_in_the_record_and_the_model_index(tmp_path):
    """30 calibration rows among 150 (a datasets table): the record keeps ``in_sample_rows``, and the model-index
    says 'partly in-sample' with the count, in the saved card and in one rendered later from the record."""
    generator = torch.Generator().manual_seed(0)

    def table(rows: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"input": torch.randn(rows, 6, generator=generator).tolist(),
                                           "labels": torch.randint(0, 4, (rows,), generator=generator).tolist()})

    calibration = table(120)
    calibrated = CalibratedModel.fit(torch.nn.Linear(6, 4).eval(), calibration, method="temperature", progress=False)
    mixed = datasets.concatenate_datasets([table(120), calibration.select(range(30))])
    calibrated.evaluate(mixed, dataset_name="rows", bootstrap=0, progress=False)
    calibrated.save_pretrained(tmp_path / "model")
    record = json.loads((tmp_path / "model" / "calibration_config.json").read_text())
    assert (record["evaluation"]["in_sample"], record["evaluation"]["in_sample_rows"]) == (
        True, {"calibration": 30, "total": 150})
    expected = {"rows (partly in-sample: 30 of 150 rows are calibration data)"}
    assert {result.dataset_name for result in _card(tmp_path / "model").data.eval_results} == expected
    assert {result.dataset_name for result in cards.render_card(record).data.eval_results} == expected
    text = (tmp_path / "model" / "README.md").read_text(encoding="utf-8")
    assert "partly in-sample: 30 of 150 rows are data the calibration was fitted on, so optimistic." in text
    assert {result.metric_name.endswith("partly in-sample)") for result in _card(tmp_path / "model").data.eval_results} == {True}
