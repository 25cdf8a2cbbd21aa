"""Model cards: what ``save_pretrained`` writes to README.md, read back with ``huggingface_hub.ModelCard``,
and ``push_evaluation_results``, which replaces the hub card's results with a new evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from PIL import Image

import _tiny_models as tm
from hf_calibrate._hub import push_evaluation_results
from hf_calibrate.cards import DIAGRAM_FILE
from hf_calibrate.serialization import ArtifactError

METRICS = ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier")
SIDES = ("uncalibrated", "calibrated")


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    with tm.torch_threads(1):
        yield


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
    assert "| dataset | TensorDataset(64 samples) |" in text
    assert "| samples | 64 |" in text and "| seed | 3 |" in text
    assert "[org/base](https://huggingface.co/org/base)" in text
    assert 'CalibratedModel.from_pretrained("someone/calibrated-vit")' in text
    evaluation = evaluated_card["evaluation"]
    assert f"| ECE | {evaluation['uncalibrated']['ece']:.4f} | {evaluation['calibrated']['ece']:.4f} |" in text


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
    from hf_calibrate.cards import _fmt

    base = tm.tiny_timm(0)
    fallback = tm.fit(base, tm.image_data(base, 96, sharpness=8.0), "neural_clamping", temperature_init=1000.0, lr=1e-12,
                      epochs=1, holdout_fraction=0.25)
    assert fallback.fit_summary["fell_back_to_temperature_scaling"]
    fallback.save_pretrained(tmp_path / "model")
    text = ModelCard.load(tmp_path / "model" / "README.md").text
    kept = fallback.fit_summary["temperature_scaling"]["fallback_temperature"]
    assert "did not beat temperature scaling (held-out nll" in text and f"T = {_fmt(kept)})" in text
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
    assert len(history) == commits + 1 and history[0].commit_id == info.oid and history[0].title == "new results"
    card = ModelCard.load(hf_hub_download(repo_id, "README.md"))
    results = _results(card)
    assert {(metric, side) for metric in METRICS for side in SIDES} <= set(results)
    for side in SIDES:
        for metric in METRICS:
            assert results[(metric, side)].metric_value == float(evaluation[side][metric])
            assert results[(metric, side)].dataset_split == "test"
    assert card.text == before_card.text  # the body is kept
    assert card.data.base_model == "org/base" and card.data.tags == before_card.data.tags
    assert card.data.model_name == repo_id.split("/")[-1]


def test_push_evaluation_results_needs_a_card(hub_online, vit):
    repo_id = hub_online.unique_repo_id("no-card")
    HfApi().create_repo(repo_id)
    evaluation = vit["calibrated"].evaluate(vit["test"], progress=False)
    with pytest.raises(ArtifactError, match="no README.md.*push_to_hub"):
        push_evaluation_results(repo_id, evaluation)
    with pytest.raises(ArtifactError, match="could not find"):
        push_evaluation_results(f"{hub_online.user}/does-not-exist", evaluation)


EXAMPLES = Path(__file__).resolve().parents[1] / "model_cards" / "examples"


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
