"""Every command that writes checks its target before any work.

A file is replaced only when its bytes prove an earlier write of ours made it (:mod:`hf_calibrate._output_files`);
a user's file, one edited since, or a link (written through never) is refused, naming it, before the model is
loaded: the commands here name a model and a dataset that do not exist, so any other failure would be theirs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from _files import write_image_folder

from hf_calibrate._output_files import is_signed_png
from hf_calibrate.cli import main
from hf_calibrate.cli.output import draw_diagram
from hf_calibrate.demo.command import DEMO_MODELS, demo_folder
from hf_calibrate.metrics import reliability_bins
from hf_calibrate.results import comparison

ERROR_PREFIX = "hf-calibrate: error:"


def error_line(capsys: pytest.CaptureFixture) -> str:
    """The one ``hf-calibrate: error:`` line a failed command printed."""
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR_PREFIX)]
    return line


def absent_inputs(tmp_path: Path) -> List[str]:
    """``--model`` and ``--dataset`` that do not exist: loading them fails, so an output error means an early check."""
    return ["--model", str(tmp_path / "no-model"), "--dataset", str(tmp_path / "no-data"), "--no-progress"]


def compare_args(tmp_path: Path, output: Path) -> List[str]:
    return ["compare", *absent_inputs(tmp_path), "--methods", "temperature", "--output", str(output)]


@pytest.fixture(scope="module")
def result() -> Dict[str, object]:
    """The part of a comparison result :func:`comparison.write` reads besides the table: data names, the ranking
    (order, metric and intervals of the diagrams' titles) and diagrams."""
    generator = torch.Generator().manual_seed(0)
    bins = reliability_bins(torch.softmax(torch.randn(40, 3, generator=generator), dim=1), torch.zeros(40, dtype=torch.long))
    rows = [{"name": name, "metrics": {"nll": nll}, "interval": {"low": nll - 0.1, "high": nll + 0.1}}
            for name, nll in (("temperature", 0.9), ("uncalibrated", 1.0))]
    return {"dataset": "digits", "split": "test", "metric": "nll", "rows": rows,
            "reliability": {"uncalibrated": bins.to_dict(), "temperature": bins.to_dict()}}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- compare --output


@pytest.mark.parametrize("name", comparison.FILES)
def test_compare_refuses_a_users_file_before_loading_the_model(tmp_path, capsys, name):
    output = tmp_path / "out"
    output.mkdir()
    (output / name).write_text("my own notes\n")
    assert main(compare_args(tmp_path, output)) == 1
    line = error_line(capsys)
    assert f"--output: {output / name} was not written by hf_calibrate" in line and "Move it elsewhere, or write the comparison to another folder." in line, line
    assert (output / name).read_text() == "my own notes\n" and sorted(output.iterdir()) == [output / name]


def test_compare_refuses_a_linked_comparison_md_and_leaves_its_target_alone(tmp_path, capsys, result):
    outside = tmp_path / "elsewhere.md"
    outside.write_text("not yours to replace\n")
    output = tmp_path / "out"
    output.mkdir()
    (output / "comparison.md").symlink_to(outside)
    assert main(compare_args(tmp_path, output)) == 1
    assert f"{output / 'comparison.md'} is a symbolic link (to {outside})" in error_line(capsys)
    with pytest.raises(FileExistsError, match="symbolic link"):
        comparison.write(result, "table\n", output)  # the library's own write refuses it too
    assert outside.read_text() == "not yours to replace\n" and (output / "comparison.md").is_symlink()
    assert sorted(output.iterdir()) == [output / "comparison.md"]


def test_a_second_write_replaces_its_own_files_proven_by_their_digests(tmp_path, result):
    output = tmp_path / "out"
    comparison.write(result, "first table\n", output)
    comparison.write(result, "second table\n", output)
    record = json.loads((output / "comparison.json").read_text())
    assert (output / "comparison.md").read_text() == "second table\n"
    assert record["written_by"] == comparison.WRITTEN_BY
    assert record["files"] == {name: [sha256(output / name)] for name in ("comparison.md", "comparison.png")}
    assert record["reliability"] == result["reliability"] and record["dataset"] == "digits"  # the result, as it was
    assert sorted(path.name for path in output.iterdir()) == sorted(comparison.FILES)  # no temporary left


def test_a_second_compare_into_the_same_folder_replaces_its_own_files(digits_cnn, tmp_path):
    dataset = digits_cnn.dataset
    data = write_image_folder(tmp_path / "digits", {split: dataset[split].select(range(150)) for split in ("calibration", "test")})
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("mine\n")  # files of other names are no concern of compare's
    command = ["compare", "--model", str(digits_cnn.path), "--dataset", str(data), "--methods", "temperature", "--bootstrap",
               "100", "--no-progress", "--output", str(output)]
    assert main(command) == 0
    first = (output / "comparison.md").read_text()
    assert main([*command, "--metric", "ece"]) == 0
    record = json.loads((output / "comparison.json").read_text())
    assert record["metric"] == "ece" and (output / "comparison.md").read_text() != first
    assert record["files"] == {name: [sha256(output / name)] for name in ("comparison.md", "comparison.png")}
    assert (output / "notes.txt").read_text() == "mine\n"


def test_a_comparison_md_edited_since_it_was_written_is_refused(tmp_path, capsys, result):
    output = tmp_path / "out"
    comparison.write(result, "table\n", output)
    assert main(compare_args(tmp_path, output)) == 1
    assert "no-model" in error_line(capsys)  # our own files pass the check: the command goes on to load the model
    (output / "comparison.md").write_text("table\nwith my remark\n")
    assert main(compare_args(tmp_path, output)) == 1
    assert f"{output / 'comparison.md'} was not written by hf_calibrate, or was changed since" in error_line(capsys)
    with pytest.raises(FileExistsError, match="comparison.md"):
        comparison.write(result, "table\n", output)
    assert (output / "comparison.md").read_text() == "table\nwith my remark\n"


def test_a_write_killed_midway_leaves_every_file_proven_for_the_next(tmp_path, result, monkeypatch):
    """comparison.json lists the earlier and the new digests while the other files are replaced."""
    output = tmp_path / "out"
    comparison.write(result, "first table\n", output)
    replace = comparison.write_atomically

    def killed_at_the_diagram(path, write):
        if Path(path).name == "comparison.png":
            raise KeyboardInterrupt
        replace(path, write)

    monkeypatch.setattr(comparison, "write_atomically", killed_at_the_diagram)
    with pytest.raises(KeyboardInterrupt):
        comparison.write(result, "second table\n", output)
    assert (output / "comparison.md").read_text() == "second table\n"  # new, beside the old diagram
    monkeypatch.undo()
    comparison.write(result, "third table\n", output)
    assert json.loads((output / "comparison.json").read_text())["files"]["comparison.md"] == [sha256(output / "comparison.md")]


# ----------------------------------------------------------------------------- fit --output


def test_fit_refuses_a_users_config_json_before_loading_the_model(tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "config.json").write_text('{"mine": true}\n')
    assert main(["fit", *absent_inputs(tmp_path), "--method", "temperature", "--output", str(output)]) == 1
    line = error_line(capsys)
    assert f"--output: {output / 'config.json'}" in line and "Move it elsewhere, or save to another folder" in line, line
    assert (output / "config.json").read_text() == '{"mine": true}\n'


# ----------------------------------------------------------------------------- evaluate --diagram


def evaluate_args(tmp_path: Path, diagram: Path) -> List[str]:
    return ["evaluate", *absent_inputs(tmp_path), "--diagram", str(diagram)]


def test_evaluate_refuses_a_users_image_but_replaces_its_own_diagram(tmp_path, capsys, result):
    diagram = tmp_path / "reliability.png"
    evaluation = {"reliability": {"uncalibrated": result["reliability"]["uncalibrated"]}}
    draw_diagram(evaluation, diagram, title="first")
    assert is_signed_png(diagram)
    assert main(evaluate_args(tmp_path, diagram)) == 1
    assert "no-model" in error_line(capsys)  # ours: the check passes, the model is what fails
    draw_diagram(evaluation, diagram, title="second")  # replaced without a word

    data = bytearray(diagram.read_bytes())
    data[len(data) // 2] ^= 1  # one bit of the image changed since we wrote it
    diagram.write_bytes(bytes(data))
    assert not is_signed_png(diagram)
    assert main(evaluate_args(tmp_path, diagram)) == 1
    line = error_line(capsys)
    assert f"--diagram: {diagram} was not written by hf_calibrate" in line and "another --diagram path" in line, line
    with pytest.raises(FileExistsError):
        draw_diagram(evaluation, diagram, title="third")
    assert diagram.read_bytes() == bytes(data)


def test_evaluate_never_writes_a_diagram_through_a_link(tmp_path, capsys, result):
    outside = tmp_path / "photo.png"
    draw_diagram({"reliability": {"uncalibrated": result["reliability"]["uncalibrated"]}}, outside, title="ours")
    before = outside.read_bytes()
    (tmp_path / "diagram.png").symlink_to(outside)  # even a link to a diagram of ours
    assert main(evaluate_args(tmp_path, tmp_path / "diagram.png")) == 1
    assert "is a symbolic link" in error_line(capsys)
    assert outside.read_bytes() == before


def test_evaluate_names_a_dangling_link_on_the_diagrams_way(tmp_path, capsys):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    assert main(evaluate_args(tmp_path, tmp_path / "gone" / "d.png")) == 1
    line = error_line(capsys)
    assert "gone is a symbolic link to" in line and "name another path" in line


# ----------------------------------------------------------------------------- demo --output


@pytest.fixture()
def no_zoo(monkeypatch) -> None:
    """Loading a zoo model fails loudly: the demo must refuse its output before that."""
    def load(*args, **kwargs):
        raise AssertionError("the zoo model was loaded before the output was checked")

    monkeypatch.setattr("hf_calibrate.demo.command._zoo_model", load)


def test_demo_refuses_a_users_file_in_a_calibration_folder_before_loading(tmp_path, capsys, no_zoo):
    folder = tmp_path / "demo" / demo_folder(DEMO_MODELS["cnn"].name, DEMO_MODELS["cnn"].methods[-1])
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}\n")
    assert main(["demo", "--models", "cnn", "--quick", "--no-progress", "--output", str(tmp_path / "demo")]) == 1
    assert f"--output: {folder / 'config.json'}" in error_line(capsys)


def test_demo_never_saves_through_a_linked_calibration_folder(tmp_path, capsys, no_zoo):
    (tmp_path / "demo").mkdir()
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "demo" / demo_folder(DEMO_MODELS["cnn"].name, DEMO_MODELS["cnn"].methods[0])
    link.symlink_to(tmp_path / "elsewhere")
    assert main(["demo", "--models", "cnn", "--quick", "--no-progress", "--output", str(tmp_path / "demo")]) == 1
    assert f"--output: {link} is a symbolic link" in error_line(capsys)
    assert not list((tmp_path / "elsewhere").iterdir())


def test_each_demo_model_is_named_as_the_zoo_model_it_builds(monkeypatch):
    """The demo checks its calibration folders by these names before any zoo model exists."""
    from hf_calibrate import demo as zoo
    from hf_calibrate.demo import models

    monkeypatch.setattr(models, "_from_zoo", lambda name, cache_dir, progress: name)
    assert {key: getattr(zoo, spec.build)() for key, spec in DEMO_MODELS.items()} == {
        key: spec.name for key, spec in DEMO_MODELS.items()}
