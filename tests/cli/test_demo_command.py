"""``hf-calibrate demo --quick`` end to end, as a subprocess on the cached zoo models; what its table says of its evaluations."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_calibrate.cli import DEMO_METRICS
from hf_calibrate.demo.command import DEMO_MODELS, NC_LEFT_OUT, demo_folder

REPO_ROOT = Path(__file__).resolve().parents[2]
#: each demo model's name and its methods
MODELS = {spec.name: spec.methods for spec in DEMO_MODELS.values()}
_SIGNED = r"[+-]\d\.\d(?:\d{3}|e-\d\d)"  # +0.0123, or -3.2e-05 for an end too close to 0 for 4 decimals
#: a Neural Clamping row whose δ did not help held out is marked so; auto's row names its choice
FELL_BACK = r"(?: \((?P<fell_back>fell back to TS)\)| \((?P<chosen>[a-z_]+)\))?"
CHANGE = re.compile(rf"^(?P<model>\S+)\s+(?P<method>\S+){FELL_BACK}\s+(?P<change>{_SIGNED}) \[(?P<low>{_SIGNED}), "
                    rf"(?P<high>{_SIGNED})\] (?P<verdict>improved|worse|no change)\s")
SHORT_VERDICTS = {"improved": "improved", "made worse": "worse", "no detectable change at this test size": "no change",
                  "unchanged": "unchanged"}
ROW = re.compile(rf"^(?P<model>\S+)\s+(?P<method>\S+){FELL_BACK}\s+(?P<n>\d+)\s+(?P<values>(?:\d\.\d{{4}} → \d\.\d{{4}}\s*)+)$")


@pytest.mark.slow
def test_demo_quick_prints_the_table_and_writes_cards(bbc_minilm, digits_cnn, tmp_path):
    """bbc_minilm / digits_cnn: the zoo is trained (or found in the cache) before the timed run."""
    output = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "hf_calibrate.cli", "demo", "--quick", "--no-progress", "--output", str(output)],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Every method ran with the library's defaults, as fit() runs it" in result.stdout

    rows, changes, fell_back, chosen = {}, {}, {}, {}
    for line in result.stdout.splitlines():
        change = CHANGE.match(line.strip())
        if change:
            changes[change["model"], change["method"]] = change
        match = ROW.match(line.strip())
        if match:
            pairs = re.findall(r"(\d\.\d{4}) → (\d\.\d{4})", match["values"])
            rows[match["model"], match["method"]] = (int(match["n"]), dict(zip(DEMO_METRICS, pairs)))
            fell_back[match["model"], match["method"]] = bool(match["fell_back"])
            chosen[match["model"], match["method"]] = match["chosen"]
    assert set(rows) == {(model, method) for model, methods in MODELS.items() for method in methods}, result.stdout
    assert NC_LEFT_OUT.format(name="bbc-minilm-l6") in " ".join(result.stdout.split())  # says why NC is not run there

    for (model, method), (count, printed) in rows.items():
        folder = output / demo_folder(model, method)
        card = (folder / "README.md").read_text(encoding="utf-8")
        assert card.startswith("---") and "model-index" in card
        assert f"\n# {folder.name}\n" in card and "<repo>" not in card  # named after its folder, no placeholder
        dataset = "BBC News" if model.startswith("bbc") else "scikit-learn digits"  # one name everywhere
        assert f"| dataset | {dataset} |\n| split | calibration |" in card
        assert f"Evaluated on **{dataset}, test split, {count} samples**" in card
        assert (folder / "reliability_diagram.png").read_bytes().startswith(b"\x89PNG")
        record = json.loads((folder / "calibration_config.json").read_text())
        evaluation = record["evaluation"]
        summary_fell_back = bool(record["fit"]["summary"].get("fell_back_to_temperature_scaling"))
        assert fell_back[model, method] == summary_fell_back  # the row is marked exactly when the fit fell back
        assert chosen[model, method] == (record["method"] if method == "auto" else None), record["method"]
        assert record["options"].get("optimizer") in (None, "lbfgs")  # the default optimiser, not the authors' SGD
        assert ("Calibration method: Temperature scaling (Neural Clamping fell back" in card) == summary_fell_back
        assert evaluation["split"] == "test" and evaluation["calibrated"]["num_samples"] == count
        assert (evaluation["in_sample"], evaluation["calibration_split"]) == (False, "calibration")
        for key, (before, after) in printed.items():
            assert float(before) == round(evaluation["uncalibrated"][key], 4), (model, method, key)
            assert float(after) == round(evaluation["calibrated"][key], 4), (model, method, key)
            assert f"{evaluation['calibrated'][key]:.4f}" in card  # the card's results table
        # The second table: ECE's paired change calibrated − uncalibrated, its interval and verdict, as recorded.
        difference, printed_change = evaluation["difference"]["ece"], changes[model, method]
        for printed_key, key in (("change", "point"), ("low", "low"), ("high", "high")):
            assert abs(float(printed_change[printed_key]) - difference[key]) <= 5e-5 + 1e-12, (model, method, key)
        assert printed_change["verdict"] == SHORT_VERDICTS[evaluation["verdicts"]["ece"]]
        assert "What calibration did" in card and "Poisson-bootstrap intervals (1000 replicates" in card
    # Every method is evaluated on the same test rows with the same base model.
    for model, methods in MODELS.items():
        assert {rows[model, method][1]["ece"][0] for method in methods} == {rows[model, "temperature"][1]["ece"][0]}


@pytest.mark.parametrize("sample", [
    {"in_sample": True, "in_sample_rows": {"calibration": 2, "total": 300}},
    {"in_sample": True, "in_sample_rows": {"calibration": 300, "total": 300}},
    {"in_sample": None},
    {"in_sample": False},
], ids=["partly", "wholly", "unknown", "held-out"])
def test_the_table_names_in_sample_results_as_the_card_does(sample, tmp_path, monkeypatch, capsys):
    """Each row whose evaluation is (partly) in-sample, or not known not to be, is named under the table in the words
    of ``fit``'s output, the card and the diagram (``evaluation_label``, ``in_sample_note``); held-out rows are not.
    The zoo model and the fits are stand-ins: only what the demo prints of their evaluation is under test."""
    from hf_calibrate._console import Console
    from hf_calibrate.demo import command
    from hf_calibrate.results.reporting import UNKNOWN_SAMPLE_NOTE, evaluation_label, in_sample_note

    metrics = {"accuracy": 0.9, "ece": 0.05, "ada_ece": 0.05, "nll": 0.3, "brier": 0.1, "num_samples": 300}
    evaluation = {"dataset": "BBC News", "split": "test", "uncalibrated": metrics, "calibrated": metrics, **sample}
    model = SimpleNamespace(name="bbc-minilm-l6", dataset={"calibration": [0] * 10, "test": [0] * 10},
                            preprocessor=SimpleNamespace())
    monkeypatch.setattr(command, "_zoo_model", lambda spec, args, state: model)
    monkeypatch.setattr(command, "_calibrate", lambda *arguments: (evaluation, arguments[3]))  # (evaluation, row label)
    args = argparse.Namespace(models=["minilm"], quick=False, output=tmp_path / "demo", bootstrap=0, progress=False,
                              cache_dir=None)
    command.run_demo(args, SimpleNamespace(is_main_process=True), Console(True))
    out = capsys.readouterr().out
    if sample["in_sample"] is False:
        assert "in-sample" not in out and "evaluated on" not in out, out
        return
    note = in_sample_note(evaluation) if sample["in_sample"] else UNKNOWN_SAMPLE_NOTE
    lines = [line for line in out.splitlines() if line.endswith(f"evaluated on {evaluation_label(evaluation)}")]
    methods = command.DEMO_MODELS["minilm"].methods
    assert len(lines) == len(methods) and all(note in line for line in lines), out
    assert [line.split(":")[0] for line in lines] == [f"bbc-minilm-l6, {method}" for method in methods]
