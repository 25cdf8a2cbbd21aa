"""Results pushed into a model card belong to that model, and the card tells one story.

``CalibratedModel.evaluate`` names the model it was computed on (``model_identity``: the SHA-256 of the calibration's
safetensors bytes and the base's weights fingerprint, as a save records them); pushing results into the card of
another calibration is refused, naming both, through the function, the model's method and the CLI (before it
evaluates). Accepted results replace the record's ``evaluation`` and regenerate the card from it, so body, table,
diagram and ``model-index`` agree; a README.md the user wrote keeps its body. Local folders and the test Hub
(``tests/hub_server.py``) alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict

import pytest
from huggingface_hub import HfApi, ModelCard, hf_hub_download

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate._hub import push_evaluation_results
from hf_calibrate.cli import main
from hf_calibrate.results.evaluator import as_evaluation
from hf_calibrate.serialization import ArtifactError

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

CONFIG, CARD, DIAGRAM, WEIGHTS = "calibration_config.json", "README.md", "reliability_diagram.png", "calibration.safetensors"
IN_SAMPLE_WORDS = "in-sample results on digits-16px, calibration split, 64 samples"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, Any]:
    """Two temperature scalings of one ViT: ``a`` saved after an in-sample evaluation (its card says so), ``b`` saved
    after none; ``a_test``: ``a``'s evaluation on held-out data, made after the saves."""
    base = tm.tiny_vit(name_or_path="org/base")
    data, test = tm.image_data(base, 64, seed=0), tm.image_data(base, 48, seed=1)
    a, b = tm.fit(base, data, "temperature"), tm.fit(base, tm.image_data(base, 64, seed=5), "temperature")
    a.evaluate(data, dataset_name="digits-16px", split="calibration", progress=False)
    saved = tmp_path_factory.mktemp("saved")
    a.save_pretrained(saved / "a", preprocessor=tm.vit_image_processor())
    b.save_pretrained(saved / "b")
    a_test = a.evaluate(test, dataset_name="digits-16px", split="test", progress=False)
    return {"a": a, "b": b, "a_test": a_test, "saved": saved}


def _copy(models: Dict[str, Any], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(models["saved"] / name, tmp_path / name))


def _record(folder: Path) -> Dict[str, Any]:
    return json.loads((folder / CONFIG).read_text())


def _digest(folder: Path) -> str:
    return _record(folder)["files"]["sha256"][WEIGHTS]


def _assert_names_both(message: str, models: Dict[str, Any], target: str) -> None:
    """The refusal names the evaluated calibration (``a``), the target and its calibration (``b``), and the fix."""
    for part in (_digest(models["saved"] / "a")[:12], _digest(models["saved"] / "b")[:12], target,
                 "Push the results of that very model", f"evaluate {target} itself"):
        assert part in message, (part, message)


def _assert_test_story(card: ModelCard, record: Dict[str, Any], evaluation: Dict[str, Any], dataset: str) -> None:
    """Body, table, model-index and record all describe ``evaluation`` (held-out), none the in-sample results."""
    samples = evaluation["calibrated"]["num_samples"]
    assert "in-sample" not in str(card).lower()
    assert f"Evaluated on **{dataset}, test split, {samples} samples**" in card.text
    assert f"| ECE | {evaluation['uncalibrated']['ece']:.4f} [" in card.text  # the table is the new one
    assert {(entry.dataset_name, entry.dataset_split) for entry in card.data.eval_results} == {(dataset, "test")}
    ece = {entry.metric_config: entry.metric_value for entry in card.data.eval_results if entry.metric_type == "ece"}
    assert ece == {side: evaluation[side]["ece"] for side in ("uncalibrated", "calibrated")}
    kept = record["evaluation"]
    assert (kept["dataset"], kept["split"], kept["in_sample"]) == (dataset, "test", False)
    assert kept["calibrated"]["ece"] == evaluation["calibrated"]["ece"]


# ----------------------------------------------------------------------------- whose results


def test_an_evaluation_names_the_model_as_its_save_records_it(models):
    identity, record = models["a_test"]["model_identity"], _record(models["saved"] / "a")
    assert identity["calibration_sha256"] == record["files"]["sha256"][WEIGHTS]
    assert identity["base_fingerprint"] == record["base_model"]["fingerprint"]
    assert identity["calibration_sha256"] != _digest(models["saved"] / "b")


@pytest.mark.parametrize("how", ["function", "method"])
def test_results_of_another_model_are_refused_for_a_folder(models, tmp_path, how):
    folder = _copy(models, "b", tmp_path)
    before = tm.file_hashes(folder)
    with pytest.raises(ArtifactError) as refused:
        if how == "function":
            push_evaluation_results(folder, models["a_test"])
        else:
            models["a"].push_evaluation_results(folder)  # its last evaluation: a_test
    _assert_names_both(str(refused.value), models, str(folder))
    assert tm.file_hashes(folder) == before


def test_results_of_another_model_are_refused_for_a_hub_repo(models, hub_online):
    repo_id = hub_online.unique_repo_id("other-model")
    models["b"].push_to_hub(repo_id)
    commits = len(HfApi().list_repo_commits(repo_id))
    with pytest.raises(ArtifactError) as refused:
        models["a"].push_evaluation_results(repo_id, models["a_test"])
    _assert_names_both(str(refused.value), models, repo_id)
    unnamed = as_evaluation({"ece": 0.1, "num_samples": 48}, {"ece": 0.05, "num_samples": 48}, dataset="digits")
    with pytest.raises(ValueError, match="does not say which calibrated model.*calibrated.push_evaluation_results"):
        push_evaluation_results(repo_id, unnamed)
    assert len(HfApi().list_repo_commits(repo_id)) == commits


def test_the_cli_refuses_another_models_folder_before_evaluating(models, tmp_path, capsys):
    """Refused once the model is loaded, before any data is read (the data set here does not exist)."""
    model, target = str(models["saved"] / "a"), str(_copy(models, "b", tmp_path))
    assert main(["evaluate", "--model", model, "--dataset", str(tmp_path / "no-data"), "--split", "test",
                 "--push-results", target, "--no-progress"]) == 1
    error = capsys.readouterr().err
    assert "--push-results: these results were computed on " + model in error
    _assert_names_both(" ".join(error.split()), models, target)


# ----------------------------------------------------------------------------- one story


def test_held_out_results_replace_the_in_sample_story_of_a_folder(models, tmp_path):
    folder = _copy(models, "a", tmp_path)
    assert "In-sample results" in (folder / CARD).read_text()
    diagram = (folder / DIAGRAM).read_bytes()
    update = push_evaluation_results(folder, models["a_test"])

    _assert_test_story(ModelCard.load(folder / CARD), _record(folder), models["a_test"], "digits-16px")
    assert (folder / DIAGRAM).read_bytes() != diagram
    assert str(update) == (f"replaced the card's {IN_SAMPLE_WORDS} with the results on digits-16px, test split, 48 "
                           f"samples: {CARD}, {DIAGRAM}, {CONFIG}")
    loaded = CalibratedModel.from_pretrained(folder)  # record, digests and files agree
    assert loaded.last_evaluation["split"] == "test"


def test_held_out_results_replace_the_in_sample_story_of_a_hub_repo(models, hub_online):
    """One commit on top of the one read; the model reloaded from its folder is the model ``a_test`` was computed on."""
    repo_id = hub_online.unique_repo_id("one-story")
    reloaded = CalibratedModel.from_pretrained(models["saved"] / "a")  # its last evaluation: the in-sample one
    reloaded.push_to_hub(repo_id)
    diagram = Path(hf_hub_download(repo_id, DIAGRAM)).read_bytes()
    commits = len(HfApi().list_repo_commits(repo_id))
    update = reloaded.push_evaluation_results(repo_id, models["a_test"], commit_message="held-out results")

    history = HfApi().list_repo_commits(repo_id)
    assert len(history) == commits + 1 and history[0].commit_id == update.commit.oid
    assert history[0].title == "held-out results"
    card, record = ModelCard.load(hf_hub_download(repo_id, CARD)), json.loads(Path(hf_hub_download(repo_id, CONFIG)).read_text())
    _assert_test_story(card, record, models["a_test"], "digits-16px")
    assert Path(hf_hub_download(repo_id, DIAGRAM)).read_bytes() != diagram
    assert str(update).startswith(f"replaced the card's {IN_SAMPLE_WORDS} with the results on digits-16px, test split")
    assert CalibratedModel.from_pretrained(repo_id).last_evaluation["split"] == "test"
    unbinned = as_evaluation({"ece": 0.1}, {"ece": 0.05}, dataset="digits", split="test")  # no bins: no diagram
    assert reloaded.push_evaluation_results(repo_id, unbinned).removed == (DIAGRAM,)
    assert DIAGRAM not in HfApi().list_repo_files(repo_id) and len(HfApi().list_repo_commits(repo_id)) == commits + 2


def test_a_users_own_card_keeps_its_body(models, tmp_path):
    folder = _copy(models, "a", tmp_path)
    (folder / CARD).write_text("---\nlicense: mit\n---\n# My model\n\nWritten by hand.\n")
    update = push_evaluation_results(folder, models["a_test"])

    card = ModelCard.load(folder / CARD)
    assert card.text.strip() == "# My model\n\nWritten by hand." and card.data.license == "mit"
    assert {entry.dataset_split for entry in card.data.eval_results} == {"test"}
    assert _record(folder)["evaluation"]["split"] == "test"
    assert "README.md is your own (it has no hf_calibrate marker), so its body was kept and only its model-index" in str(update)


def test_evaluator_results_drop_the_diagram_they_have_no_bins_for(models, tmp_path):
    """``as_evaluation`` results, pushed by the model whose pipeline computed them: a card without the old diagram."""
    folder = _copy(models, "a", tmp_path)
    sides = {side: {"ece": models["a_test"][side]["ece"], "accuracy": 0.5, "num_samples": 48.0}
             for side in ("uncalibrated", "calibrated")}
    evaluation = as_evaluation(sides["uncalibrated"], sides["calibrated"], dataset="digits", split="test", dataset_id="user/digits")
    update = models["a"].push_evaluation_results(folder, evaluation)

    card = ModelCard.load(folder / CARD)
    assert not (folder / DIAGRAM).exists() and DIAGRAM not in card.text and "in-sample" not in card.text.lower()
    assert "Evaluated on **digits, test split, 48 samples** (15 bins)" in card.text
    assert {(entry.dataset_name, entry.dataset_type) for entry in card.data.eval_results} == {("digits", "user/digits")}
    assert update.removed == (DIAGRAM,) and str(update).endswith(f"{CARD}, {CONFIG}; removed {DIAGRAM}")
    CalibratedModel.from_pretrained(folder).save_pretrained(folder)  # a record without bins loads and saves again
    assert CalibratedModel.from_pretrained(folder).last_evaluation["dataset"] == "digits"


def test_the_cli_says_what_it_replaced(models, tmp_path, capsys):
    """``evaluate --push-results`` into the folder it evaluates: the output names what changed, and the card names the
    data set as the CLI does, in its body and its model-index alike."""
    folder, images = _copy(models, "a", tmp_path), tmp_path / "shapes"
    for number, image in enumerate(tm.pil_images(24, seed=2)):
        (images / "test" / tm.LABELS[number % 4]).mkdir(parents=True, exist_ok=True)
        image.save(images / "test" / tm.LABELS[number % 4] / f"{number}.png")
    assert main(["evaluate", "--model", str(folder), "--dataset", str(images), "--split", "test", "--push-results",
                 str(folder), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (f"pushed the results to {folder}: replaced the card's {IN_SAMPLE_WORDS} with the results on shapes, test "
            f"split, 24 samples: {CARD}, {DIAGRAM}, {CONFIG}") in out
    card = ModelCard.load(folder / CARD)
    assert "Evaluated on **shapes, test split, 24 samples**" in card.text
    # fitted on tensors, evaluated on image files: whether they share rows cannot be checked, and the model-index says so
    assert {entry.dataset_name for entry in card.data.eval_results} == {"shapes (in-sample not checked)"}
