"""The ``hf-calibrate`` command line, driven as a subprocess on real models and real data.

The model is the zoo's timm CNN trained on scikit-learn digits (a timm ``local-dir`` folder);
the data are its calibration and test splits written as image folders
(``<split>/<class>/<n>.png``), exactly what a user would point the command at.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from _files import format_one_artifact, write_image_folder
from _results import flat, table_values

from hf_calibrate.cli import main, parse_option

REPO_ROOT = Path(__file__).resolve().parents[2]
ERROR_PREFIX = "hf-calibrate: error:"


def run_cli(*args: str, env: Optional[Dict[str, str]] = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m hf_calibrate.cli ARGS`` in a fresh process (the console script's entry point)."""
    return subprocess.run(
        [sys.executable, "-m", "hf_calibrate.cli", *args], capture_output=True, text=True, timeout=timeout,
        env=env if env is not None else dict(os.environ), cwd=REPO_ROOT,
    )


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Non-zero exit, exactly one ``hf-calibrate: error:`` line on stderr, no traceback; returns the line."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------- data on disk


@pytest.fixture(scope="module")
def digits_folder(digits_cnn, tmp_path_factory) -> Path:
    dataset = digits_cnn.dataset
    return write_image_folder(tmp_path_factory.mktemp("digits"), {"calibration": dataset["calibration"], "test": dataset["test"]})


@pytest.fixture(scope="module")
def fitted(digits_cnn, digits_folder, hub_server, tmp_path_factory) -> Dict[str, object]:
    """One Neural Clamping fit through the CLI (1 epoch), saved to a folder and pushed to the test Hub."""
    output = tmp_path_factory.mktemp("fit") / "calibrated"
    repo_id = hub_server.unique_repo_id("cli-digits-nc")
    with hub_server.configure_client():
        result = run_cli(
            "fit", "--model", str(digits_cnn.path), "--dataset", str(digits_folder), "--split", "calibration",
            "--eval-split", "test", "--method", "neural_clamping", "--option", "epochs=1", "--option", "gamma=[0,1]",
            "--batch-size", "200", "--output", str(output), "--push-to-hub", repo_id, "--no-progress",
        )
    assert_ok(result)
    return {"output": output, "repo_id": repo_id, "stdout": result.stdout}


def evaluate_json(model: str, dataset: Path, split: str, *extra: str, env: Optional[Dict[str, str]] = None) -> dict:
    result = run_cli("evaluate", "--model", model, "--dataset", str(dataset), "--split", split, "--json", "--no-progress", *extra, env=env)
    assert_ok(result)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def local_evaluation(fitted, digits_folder) -> dict:
    """``evaluate --json`` of the fitted folder on the test split."""
    return evaluate_json(str(fitted["output"]), digits_folder, "test")


# ----------------------------------------------------------------------------- the happy path


def test_option_values_are_json_when_they_parse():
    assert parse_option("gamma=[0,1,2]") == ("gamma", [0, 1, 2])
    assert parse_option("epochs=5") == ("epochs", 5)
    assert parse_option("augment=true") == ("augment", True)
    assert parse_option("select-metric=nll") == ("select_metric", "nll")


@pytest.mark.parametrize("text", ["candidates=[\"mac_cal\",\"vector\"]", "candidates=['mac_cal', 'vector']",
                                  "candidates=[mac_cal,vector]", "candidates=[ mac_cal , vector ]"])
def test_a_list_option_reads_as_json_as_the_python_the_messages_write_or_as_the_shell_leaves_it(text):
    """The library's messages write ``candidates=['mac_cal']``; unquoted in a shell it arrives as ``[mac_cal]``."""
    assert parse_option(text) == ("candidates", ["mac_cal", "vector"])


def test_option_values_that_are_no_literal_stay_text():
    assert parse_option("classifier=head.fc") == ("classifier", "head.fc")
    assert parse_option("budget=10m") == ("budget", "10m")
    assert parse_option("gamma=[]") == ("gamma", [])
    assert parse_option("delta_init=None") == ("delta_init", None)
    assert parse_option("x=__import__('os')") == ("x", "__import__('os')")


def test_fit_saves_model_card_diagram_and_prints_the_table(fitted):
    output = fitted["output"]
    for name in ("README.md", "calibration_config.json", "calibration.safetensors", "reliability_diagram.png", "model.safetensors"):
        assert (output / name).is_file(), name
    record = json.loads((output / "calibration_config.json").read_text())
    assert record["method"] == "neural_clamping"
    assert record["options"]["epochs"] == 1 and record["options"]["gamma"] == [0.0, 1.0]
    assert record["evaluation"]["split"] == "test"
    stdout = fitted["stdout"]
    for title in ("accuracy", "ECE", "AdaECE", "classwise ECE", "NLL", "Brier"):
        assert any(line.startswith(title + " ") for line in stdout.splitlines()), title
    ece_line = next(line for line in stdout.splitlines() if line.startswith("ECE "))
    before, after = table_values(ece_line)[:2]
    assert (before, after) == (
        round(record["evaluation"]["uncalibrated"]["ece"], 4), round(record["evaluation"]["calibrated"]["ece"], 4)
    )
    assert "calibration split" not in stdout  # an evaluation split was given


def test_evaluate_then_evaluate_again_from_the_pushed_repo(fitted, local_evaluation, digits_folder, hub_online):
    """fit and push (fixture) → evaluate the folder → evaluate from the repo id: the same numbers."""
    output, local = fitted["output"], local_evaluation
    record = json.loads((output / "calibration_config.json").read_text())
    for side in ("uncalibrated", "calibrated"):
        for key, value in flat(record["evaluation"][side]).items():
            assert flat(local[side])[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (side, key)
    assert f"pushed to {fitted['repo_id']}" in fitted["stdout"]

    remote = evaluate_json(fitted["repo_id"], digits_folder, "test", env=dict(os.environ))
    for side in ("uncalibrated", "calibrated"):
        assert flat(remote[side]) == pytest.approx(flat(local[side]), rel=1e-9, abs=1e-12), side
    assert remote["split"] == "test" and remote["dataset"] == local["dataset"]


def test_push_results_rewrites_the_card_metadata(fitted, digits_folder, hub_online):
    from huggingface_hub import ModelCard

    result = run_cli(
        "evaluate", "--model", str(fitted["output"]), "--dataset", str(digits_folder), "--split", "calibration",
        "--push-results", fitted["repo_id"], "--no-progress", env=dict(os.environ),
    )
    assert_ok(result)
    card = ModelCard.load(fitted["repo_id"])
    assert {entry.dataset_split for entry in card.data.eval_results} == {"calibration"}
    ece = {entry.metric_config: entry.metric_value for entry in card.data.eval_results if entry.metric_type == "ece"}
    printed = next(line for line in result.stdout.splitlines() if line.startswith("ECE "))
    assert table_values(printed)[:2] == [round(ece["uncalibrated"], 4), round(ece["calibrated"], 4)]


def test_push_results_into_a_local_folder_rewrites_its_card_in_place(fitted, digits_folder, tmp_path):
    """A saved folder takes new results like a hub repo: its card's model-index changes, nothing else does."""
    import shutil

    from huggingface_hub import ModelCard

    folder = Path(shutil.copytree(fitted["output"], tmp_path / "calibrated"))
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    result = run_cli("evaluate", "--model", str(folder), "--dataset", str(digits_folder), "--split", "calibration",
                     "--push-results", str(folder), "--no-progress")
    assert_ok(result)
    assert {entry.dataset_split for entry in ModelCard.load(folder / "README.md").data.eval_results} == {"calibration"}
    after = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    assert set(after) == set(before) and {name for name in after if after[name] != before[name]} == {
        "README.md", "reliability_diagram.png", "calibration_config.json"}


@pytest.mark.parametrize("target, words", [
    ("empty-folder", ("has no calibration_config.json or README.md", "save_pretrained")),
    ("user/nowhere", ("not a local folder", "offline mode")),
    ("not a repo id!", ("neither a local folder nor a hub repo id",)),
])
def test_push_results_target_is_checked_before_the_evaluation(tmp_path, capsys, monkeypatch, target, words):
    """Checked before the model is even loaded (the model and data here do not exist)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty-folder").mkdir()
    pushed = str(tmp_path / target) if target == "empty-folder" else target
    assert main(["evaluate", "--model", str(tmp_path / "no-model"), "--dataset", str(tmp_path / "no-data"),
                 "--push-results", pushed, "--no-progress"]) == 1
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    for word in ("--push-results:", *words):
        assert word in line, line


@pytest.fixture(scope="module")
def validation_and_test_folder(digits_cnn, tmp_path_factory) -> Path:
    """A dataset whose calibration split is called 'validation', beside a 'test' split."""
    dataset = digits_cnn.dataset
    return write_image_folder(tmp_path_factory.mktemp("vt") / "digits-vt", {"validation": dataset["calibration"], "test": dataset["test"]})


@pytest.fixture(scope="module")
def held_out_by_default(digits_cnn, validation_and_test_folder, hub_server, tmp_path_factory) -> Dict[str, object]:
    """``fit`` of a base given by its hub repo id, without --eval-split, on a dataset with 'validation' and 'test'."""
    import timm

    base_repo = hub_server.unique_repo_id("digits-cnn-base")
    output = tmp_path_factory.mktemp("held-out") / "digits-ts"
    with hub_server.configure_client():
        timm.models.push_to_hf_hub(digits_cnn.model, base_repo)
        result = run_cli("fit", "--model", base_repo, "--dataset", str(validation_and_test_folder), "--method", "temperature",
                         "--output", str(output), "--no-progress")
    assert_ok(result)
    return {"output": output, "base_repo": base_repo, "stdout": result.stdout, "stderr": result.stderr}


def test_fit_evaluates_on_the_held_out_split_by_default_and_names_it_the_same_everywhere(held_out_by_default):
    """'validation' calibrates, 'test' evaluates (and the command says so); the CLI, the card, its model-index and
    the record name the dataset and both splits the same way; the base's hub id is the card's base_model."""
    from huggingface_hub import ModelCard

    stdout, output = held_out_by_default["stdout"], held_out_by_default["output"]
    record = json.loads((output / "calibration_config.json").read_text())
    evaluation = record["evaluation"]
    assert {key: evaluation[key] for key in ("dataset", "split", "in_sample", "calibration_dataset", "calibration_split")} == {
        "dataset": "digits-vt", "split": "test", "in_sample": False, "calibration_dataset": "digits-vt",
        "calibration_split": "validation"}
    samples = evaluation["calibrated"]["num_samples"]
    assert "evaluating on the split 'test', which the fit does not use" in stdout
    assert f"evaluated on digits-vt, test split, {samples} samples:" in stdout and "warning" not in held_out_by_default["stderr"]
    card = ModelCard.load(output / "README.md")
    assert "| dataset | digits-vt |" in card.text and "| split | validation |" in card.text
    assert f"Evaluated on **digits-vt, test split, {samples} samples**" in card.text
    assert "fitted on digits-vt, validation split." in card.text
    assert {(r.dataset_name, r.dataset_split) for r in card.data.eval_results} == {("digits-vt", "test")}
    assert card.data.base_model == held_out_by_default["base_repo"] and card.data.to_dict()["base_model_relation"] == "adapter"
    assert card.data.model_name == "digits-ts" and "<repo>" not in card.text


@pytest.fixture(scope="module")
def in_sample_fallback(digits_cnn, tmp_path_factory) -> Dict[str, object]:
    """A Neural Clamping ``fit`` on a dataset with only a 'validation' split, set up so δ cannot beat temperature scaling."""
    folder = write_image_folder(tmp_path_factory.mktemp("only") / "digits-val", {"validation": digits_cnn.dataset["calibration"]})
    output = tmp_path_factory.mktemp("in-sample") / "calibrated"
    result = run_cli("fit", "--model", str(digits_cnn.path), "--dataset", str(folder), "--method", "neural_clamping",
                     "--option", "epochs=1", "--option", "lr=1e-12", "--option", "temperature_init=1000.0",
                     "--batch-size", "200", "--output", str(output), "--no-progress")
    assert_ok(result)
    return {"output": output, "folder": folder, "stdout": result.stdout, "stderr": result.stderr}


def test_fit_without_a_held_out_split_labels_its_results_in_sample(in_sample_fallback):
    from huggingface_hub import ModelCard

    stdout, stderr, output = in_sample_fallback["stdout"], in_sample_fallback["stderr"], in_sample_fallback["output"]
    assert "evaluated on digits-val, validation split" in stdout and "(in-sample: data the calibration was fitted on" in stdout
    [warning] = [line for line in stderr.splitlines() if line.startswith("warning: these results are in-sample")]
    assert "optimistic" in warning and "--eval-split" in warning and "['validation']" in warning
    evaluation = json.loads((output / "calibration_config.json").read_text())["evaluation"]
    assert (evaluation["in_sample"], evaluation["split"], evaluation["calibration_split"]) == (True, "validation", "validation")
    card = ModelCard.load(output / "README.md")
    assert "**In-sample results.** Evaluated on **digits-val, validation split" in card.text
    assert {r.dataset_name for r in card.data.eval_results} == {"digits-val (in-sample: the calibration data)"}


def test_fit_says_when_neural_clamping_fell_back_to_temperature_scaling(in_sample_fallback):
    """One line: δ did not help on the held-out part, the saved model is plain temperature scaling, what to try."""
    stderr = in_sample_fallback["stderr"]
    [line] = [line for line in stderr.splitlines() if "did not beat temperature scaling" in line]
    assert line.startswith("warning: ") and "The saved model is this temperature scaling" in line
    assert "--method temperature" in line and "--option epochs" in line
    assert "TemperatureScalingFallbackWarning" not in stderr  # the library's warning is not shown twice
    record = json.loads((in_sample_fallback["output"] / "calibration_config.json").read_text())
    assert record["fit"]["summary"]["fell_back_to_temperature_scaling"] is True


def test_fit_auto_prints_its_choice_and_every_candidate(digits_cnn, digits_folder, tmp_path):
    """``--method auto`` names the method it chose in the headline, says why, prints each candidate's held-out NLL
    with its interval, and saves a model of the chosen method whose card carries the same table."""
    output = tmp_path / "auto"
    result = run_cli("fit", "--model", str(digits_cnn.path), "--dataset", str(digits_folder), "--split", "calibration",
                     "--eval-split", "test", "--method", "auto", "--option", 'candidates=["histogram","isotonic"]',
                     "--output", str(output), "--no-progress")
    assert_ok(result)
    record = json.loads((output / "calibration_config.json").read_text())
    chosen = record["method"]
    assert chosen in ("temperature", "histogram", "isotonic") and record["fit"]["summary"]["auto"]["chosen"] == chosen
    assert f"auto ({chosen}) calibration of" in result.stdout
    assert f"auto chose {chosen} by 5-fold cross-fitted NLL on the" in result.stdout
    first_cells = [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")]
    start = first_cells.index("candidate")
    assert first_cells[start + 1:start + 5] == ["uncalibrated", "temperature", "histogram", "isotonic"]
    assert "| candidate | held-out NLL | minus temperature scaling | seconds |" in (output / "README.md").read_text()


def test_evaluate_on_the_calibration_split_is_in_sample(in_sample_fallback):
    """A later ``evaluate`` on the split the model was calibrated on knows it (same data, same fingerprint)."""
    result = run_cli("evaluate", "--model", str(in_sample_fallback["output"]), "--dataset", str(in_sample_fallback["folder"]),
                     "--json", "--no-progress")
    assert_ok(result)
    assert json.loads(result.stdout)["in_sample"] is True
    assert "warning: these results are in-sample" in result.stderr


def test_evaluate_diagram_title_names_the_method_as_fits_does(in_sample_fallback, tmp_path, monkeypatch):
    """``evaluate --diagram`` titles the diagram with the calibration's method, as the card's diagram ``fit`` saved
    does (here Neural Clamping that fell back to temperature scaling), beside the model and the data."""
    from hf_calibrate.cli import commands
    from hf_calibrate.results.cards import method_title

    titles: List[str] = []
    monkeypatch.setattr(commands, "draw_diagram", lambda evaluation, path, title: titles.append(title))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["evaluate", "--model", str(in_sample_fallback["output"]), "--dataset", str(in_sample_fallback["folder"]),
                 "--diagram", str(tmp_path / "diagram.png"), "--no-progress"]) == 0
    record = json.loads((in_sample_fallback["output"] / "calibration_config.json").read_text())
    [title] = titles
    assert title.startswith("calibrated: ") and method_title(record) in title and "digits-val, validation split" in title


def test_a_calibration_of_format_one_is_refused_in_one_line(fitted, digits_folder, tmp_path):
    """A format-1 folder (no digests, before the first release) is refused in one error line naming the format and
    the fix."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(fitted["output"], old)
    format_one_artifact(old)
    result = run_cli("evaluate", "--model", str(old), "--dataset", str(digits_folder), "--split", "test", "--no-progress")
    assert_user_error(result, "format_version 1", "fit the calibration again")


def test_evaluate_json_is_the_whole_evaluation(local_evaluation):
    """``--json`` prints plain JSON data: every metric, what it was computed on, and the reliability bins."""
    from hf_calibrate.metrics import ReliabilityBins

    assert json.loads(json.dumps(local_evaluation)) == local_evaluation
    assert (local_evaluation["split"], local_evaluation["in_sample"], local_evaluation["calibration_split"]) == (
        "test", False, "calibration")
    for side in ("uncalibrated", "calibrated"):
        bins = ReliabilityBins.from_dict(local_evaluation["reliability"][side])
        assert bins.ece == pytest.approx(local_evaluation[side]["ece"], abs=1e-9)


def test_evaluate_plain_model_reports_the_base_metrics(local_evaluation, digits_cnn, digits_folder, tmp_path):
    diagram = tmp_path / "plain.png"
    plain = evaluate_json(str(digits_cnn.path), digits_folder, "test", "--diagram", str(diagram))
    assert "calibrated" not in plain
    assert flat(plain["uncalibrated"]) == pytest.approx(flat(local_evaluation["uncalibrated"]), rel=1e-6, abs=1e-9)
    assert diagram.read_bytes().startswith(b"\x89PNG")


def test_text_model_with_class_names_as_labels(bbc_minilm, tmp_path):
    """A transformers folder and CSV files holding two of the five classes by name: labels are matched by name."""
    names = bbc_minilm.dataset["train"].features["label"].names
    wanted = [names.index("sports"), names.index("tech")]
    for split in ("calibration", "test"):
        rows = bbc_minilm.dataset[split].filter(lambda row: row["label"] in wanted).shuffle(seed=0).select(range(30))
        rows.map(lambda row: {"topic": names[row["label"]]}).remove_columns("label").to_csv(tmp_path / f"{split}.csv")
    output = tmp_path / "minilm-ts"
    fit = run_cli(
        "fit", "--model", str(bbc_minilm.path), "--dataset", str(tmp_path), "--label-column", "topic", "--max-length", "64",
        "--method", "temperature", "--output", str(output), "--no-progress",
    )
    assert_ok(fit)
    for noise in ("Matching labels", "%|", "Token indices sequence length"):  # names matched by a Dataset.map; articles
        assert noise not in fit.stderr, fit.stderr  # longer than the tokenizer's limit are truncated, so it has nothing to say
    assert (output / "tokenizer_config.json").is_file() and (output / "base" / "config.json").is_file()
    result = evaluate_json(str(output), tmp_path, "test", "--label-column", "topic", "--max-length", "64")
    assert result["calibrated"]["num_samples"] == 30
    assert result["uncalibrated"]["accuracy"] > 0.8  # ~0 if "sports"/"tech" were read as classes 0/1


def test_fit_output_carries_no_other_librarys_noise(digits_cnn, digits_folder, tmp_path):
    """A timm model saved as a transformers folder (TimmWrapper, whose image processor has only a PIL variant): fit's
    output holds no note of transformers' that it falls back from the torchvision backend the command never asked for."""
    from transformers import TimmWrapperForImageClassification

    model = tmp_path / "timm-wrapper"
    TimmWrapperForImageClassification.from_pretrained(str(digits_cnn.path)).save_pretrained(model)
    result = run_cli(*_fit_args(str(model), str(digits_folder), str(tmp_path / "out"), "--bootstrap", "0"))
    assert_ok(result)
    assert "torchvision backend" not in result.stderr + result.stdout, result.stderr


def test_a_command_leaves_logging_and_progress_bars_as_it_found_them(tmp_path):
    """The filters ``main`` adds to other libraries' loggers and the progress bars it switches off are as they were after
    it returns (here after a failure, run in this process)."""
    import logging

    import datasets
    from transformers.utils import logging as hf_logging

    from hf_calibrate.cli.output import TORCHVISION_FALLBACK

    def state() -> tuple:
        return list(logging.getLogger(TORCHVISION_FALLBACK[0]).filters), datasets.is_progress_bar_enabled(), \
            hf_logging.is_progress_bar_enabled()

    before = state()
    assert main(_fit_args(str(tmp_path / "no-model"), str(tmp_path / "no-data"), str(tmp_path / "out"))) == 1
    assert state() == before


# ----------------------------------------------------------------------------- user errors


def _fit_args(model: str, dataset: str, output: str, *extra: str) -> List[str]:
    return ["fit", "--model", model, "--dataset", dataset, "--method", "temperature", "--output", output, "--no-progress", *extra]


def test_unknown_model(tmp_path, digits_folder):
    result = run_cli(*_fit_args("no-such-model-xyz", str(digits_folder), str(tmp_path / "out")))
    assert_user_error(result, "no-such-model-xyz")


def test_unreadable_dataset(tmp_path, digits_cnn):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.md").write_text("no data here\n")
    result = run_cli(*_fit_args(str(digits_cnn.path), str(empty), str(tmp_path / "out")))
    assert_user_error(result, str(empty), "not a dataset folder")


def test_missing_label_column(tmp_path, digits_cnn):
    table = tmp_path / "calibration.csv"
    table.write_text("text,category\nhello,a\nworld,b\n")
    result = run_cli(*_fit_args(str(digits_cnn.path), str(table), str(tmp_path / "out")))
    assert_user_error(result, "no label column", "--label-column")


def test_labels_not_matching_the_model(tmp_path, digits_cnn):
    calibration = digits_cnn.dataset["calibration"]
    rows = calibration.select([index for index, label in enumerate(calibration["label"]) if label < 2][:20])
    folder = write_image_folder(tmp_path / "pets", {"calibration": rows}, class_names=["cat", "dog"])
    result = run_cli(*_fit_args(str(digits_cnn.path), str(folder), str(tmp_path / "out")))
    assert_user_error(result, "'cat'", "'dog'", "labels of the model")


def _unwritable_folder(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root ignores permission bits; /sys refuses new folders even to root
        return Path("/sys/hf_calibrate_cli_test/out")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    return locked / "out"


def test_no_write_permission_on_the_output(tmp_path, digits_cnn, digits_folder):
    output = _unwritable_folder(tmp_path)
    result = run_cli(*_fit_args(str(digits_cnn.path), str(digits_folder), str(output)))
    assert_user_error(result, "cannot write --output", str(output))


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--dataset", "x", "--output", "y"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith(ERROR_PREFIX) and "--model" in stderr


def test_debug_shows_the_traceback(tmp_path, digits_folder):
    result = run_cli(*_fit_args("no-such-model-xyz", str(digits_folder), str(tmp_path / "out"), "--debug"))
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "UserError" in result.stderr


@pytest.mark.parametrize("command", [[], ["fit"], ["evaluate"], ["demo"]], ids=["main", "fit", "evaluate", "demo"])
def test_help_shows_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"hf-calibrate {command[0] if command else 'demo'}" in out


def test_compare_ranks_methods_on_the_held_out_split_and_writes_table_json_and_diagrams(digits_cnn, digits_folder, tmp_path, capsys):
    """Ranked by NLL (a proper score) by default; a per-method --option reaches only its method; each row is held
    against the uncalibrated model on NLL and Brier, and a row made worse is flagged in the table and in a line."""
    output = tmp_path / "compare"
    assert main(["compare", "--model", str(digits_cnn.path), "--dataset", str(digits_folder), "--methods",
                 "temperature,histogram,auto", "--option", "histogram.n_bins=5", "--option", 'auto.candidates=["isotonic"]',
                 "--bootstrap", "200", "--no-progress", "--output", str(output)]) == 0
    result = json.loads((output / "comparison.json").read_text())
    assert result["metric"] == "nll" and result["split"] == "test" and result["bootstrap"]["replicates"] == 200
    names = {row["name"] for row in result["rows"]}
    assert names - {"auto (temperature)", "auto (isotonic)"} == {"uncalibrated", "temperature", "histogram"} and len(names) == 4
    assert [row["metrics"]["nll"] for row in result["rows"]] == sorted(row["metrics"]["nll"] for row in result["rows"])
    for row in result["rows"]:
        assert set(row["versus_uncalibrated"]) == (set() if row["name"] == "uncalibrated" else {"nll", "brier"})
        worse = [key for key, interval in row["versus_uncalibrated"].items() if interval["low"] > 0]
        better = [key for key, interval in row["versus_uncalibrated"].items() if interval["high"] < 0]
        assert row["made_worse"] == worse and row["improved"] == better
        assert row["verdict"] == (None if row["name"] == "uncalibrated" else "made worse" if worse else "improved" if better
                                  else "no detectable difference")
        assert (row["fit_seconds"] is None) == (row["name"] == "uncalibrated") and (row["fit_seconds"] or 0) >= 0
    table = (output / "comparison.md").read_text(encoding="utf-8")
    assert "Ranked by NLL on" in table and "test split" in table and "vs uncalibrated" in table
    assert "| fit time |" in table and re.search(r"\| uncalibrated \|.* \| – \|\n", table)
    assert all(re.search(rf"\| {re.escape(row['name'])} \|.* \| [0-9.,]+ s \|\n", table)
               for row in result["rows"] if row["name"] != "uncalibrated")
    assert (output / "comparison.png").read_bytes().startswith(b"\x89PNG")
    err = capsys.readouterr().err
    assert all(f"warning: {row['name']} made the" in err for row in result["rows"] if row["made_worse"])
    assert "Traceback" not in err and "UserWarning" not in err  # fit warnings are plain lines, not Python warnings


def test_compare_refuses_an_option_for_a_method_it_does_not_fit(capsys, tmp_path):
    assert main(["compare", "--model", "x", "--dataset", "y", "--methods", "temperature", "--option", "vector.l2=1",
                 "--output", str(tmp_path / "z")]) == 1
    assert "'vector' is not one of --methods (temperature); write METHOD.KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "message"), [
    ("vector.foo=1", "--option for vector: unknown option(s) ['foo'] for method 'vector'. Its options: folds, l2"),
    ("neural_clamping.lr=5", "--option for neural_clamping: option lr must be a positive number in (0, 1], got 5"),
    ("batch_sise=64", "--option for temperature: unknown option(s) ['batch_sise']"),
])
def test_compare_checks_every_methods_options_before_loading_or_fitting_anything(option, message, capsys, tmp_path):
    """A typo in the last method's option fails at once, as that method's fit would fail: not after the earlier fits
    (the model "x" does not exist: the error is the option's, before anything loads)."""
    assert main(["compare", "--model", "x", "--dataset", "y", "--methods", "temperature,vector,neural_clamping",
                 "--option", option, "--output", str(tmp_path / "z")]) == 1
    err = capsys.readouterr().err
    assert message in err and "fitting" not in err and not (tmp_path / "z").exists()


def test_a_compared_linear_map_whose_check_kept_temperature_scaling_is_named_so():
    """Labels drawn at a third of the model's sharpness on 3 classes: TS is the truth, vector's check keeps it (l2 None),
    and compare's row says so; with a fixed l2 it is the map itself. auto's row names its choice."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from types import SimpleNamespace

    from hf_calibrate import CalibratedModel
    from hf_calibrate.cli.commands import _row_name

    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    with torch.no_grad():
        model.weight.mul_(6)
    inputs = torch.randn(400, 6)
    labels = torch.distributions.Categorical(logits=model(inputs).detach() / 3).sample()
    data = TensorDataset(inputs, labels)
    kept = CalibratedModel.fit(model, data, method="vector", progress=False)
    assert kept.fit_summary["l2"] is None and _row_name("vector", kept) == "vector (temperature)"
    fixed = CalibratedModel.fit(model, data, method="vector", progress=False, l2=1.0)
    assert _row_name("vector", fixed) == "vector"
    assert _row_name("auto", SimpleNamespace(method="matrix", fit_summary={})) == "auto (matrix)"


def test_compare_refuses_a_dataset_without_a_held_out_split(digits_cnn, tmp_path, capsys):
    only = write_image_folder(tmp_path / "only", {"calibration": digits_cnn.dataset["calibration"]})
    assert main(["compare", "--model", str(digits_cnn.path), "--dataset", str(only), "--methods", "temperature",
                 "--no-progress", "--output", str(tmp_path / "out")]) == 1
    assert "compare ranks methods on a split the fits do not use" in capsys.readouterr().err
    assert not (tmp_path / "out" / "comparison.json").exists()


def test_compare_refuses_to_rank_on_a_split_the_fits_use_or_without_intervals(digits_cnn, digits_folder, tmp_path, capsys):
    common = ["compare", "--model", str(digits_cnn.path), "--dataset", str(digits_folder), "--methods", "temperature",
              "--no-progress", "--output", str(tmp_path / "out")]
    assert main([*common, "--eval-split", "calibration"]) == 1
    assert "is a split the fits use, so the ranking would be in-sample" in capsys.readouterr().err
    assert main([*common, "--bootstrap", "0"]) == 1
    assert "--bootstrap must be at least 100" in capsys.readouterr().err
    assert not (tmp_path / "out" / "comparison.json").exists()


def test_compare_refuses_unknown_or_repeated_methods(capsys):
    for methods in ("temperature,nope", "temperature,temperature"):
        with pytest.raises(SystemExit) as exit_info:
            main(["compare", "--model", "x", "--dataset", "y", "--methods", methods, "--output", "z"])
        assert exit_info.value.code == 2
        assert "--methods must name distinct methods" in capsys.readouterr().err


def test_library_warnings_are_plain_lines(capsys):
    """A warning raised under a command is one ``warning: ...`` line on stderr, not Python's file:line: Category: form."""
    import warnings

    from hf_calibrate.cli.output import Console, warnings_as_lines

    with warnings_as_lines(Console(True)):
        warnings.warn("the temperature has no minimum:\n   check the labels", UserWarning)
    assert capsys.readouterr().err == "warning: the temperature has no minimum: check the labels\n"


def test_a_validation_split_for_a_method_that_would_not_read_it_is_refused(tmp_path, capsys):
    """Before anything loads: auto and the logit methods fit on the calibration split alone."""
    assert main(["fit", "--model", str(tmp_path / "no-model"), "--dataset", str(tmp_path / "no-data"), "--method", "auto",
                 "--validation-split", "validation", "--output", str(tmp_path / "out"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--validation-split: auto does not read a validation split" in err and "drop --validation-split" in err


def test_fit_keeps_row_digests_unless_told_not_to():
    """``--no-row-digests`` reaches ``save_pretrained`` / ``push_to_hub`` as ``row_digests=False`` (default True)."""
    from hf_calibrate.cli.parser import build_parser

    common = ["fit", "--model", "m", "--dataset", "d", "--output", "out"]
    assert build_parser().parse_args(common).row_digests is True
    assert build_parser().parse_args([*common, "--no-row-digests"]).row_digests is False
