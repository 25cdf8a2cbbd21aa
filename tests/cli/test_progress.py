"""Progress bars: redrawn in a terminal, one line per stage in a log (``hf_calibrate._progress``)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset
from tqdm.auto import tqdm

from hf_calibrate import CalibratedModel
from hf_calibrate import _progress
from hf_calibrate._progress import StageLine, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_stage_writes_one_line_with_its_count_time_and_last_values(capsys):
    bar = progress_bar(range(4), desc="training", unit="epoch")
    assert isinstance(bar, StageLine)  # pytest's captured stderr is no terminal
    for _ in bar:
        bar.set_postfix(loss="0.1234")
    with progress_bar(total=10, desc="held-out check") as check:
        check.update(6)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "\r" not in "".join(lines)
    assert lines[0].startswith("training: 4/4 epoch in ") and lines[0].endswith(" s, loss=0.1234")
    assert lines[1].startswith("held-out check: 6/10 it in ")


def test_in_a_terminal_the_bar_is_tqdms(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(total=3, desc="x")
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()


def test_a_disabled_bar_writes_nothing(capsys):
    for _ in progress_bar(range(3), desc="quiet", enabled=False):
        pass
    assert capsys.readouterr().err == ""


def test_a_fit_logged_to_a_file_has_no_redraws(capsys, monkeypatch):
    """What a CI log of a fit holds: lines of its stages (every stage here, by a zero heartbeat), none of
    tqdm's carriage-return redraws."""
    monkeypatch.setattr(_progress, "HEARTBEAT_SECONDS", 0.0)
    logits = torch.randn(300, 4) * 3
    labels = torch.distributions.Categorical(logits=logits / 2).sample()
    CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method="temperature", progress=True, batch_size=100)
    err = capsys.readouterr().err
    assert "\r" not in err and err.strip(), err
    assert all(re.match(r"^[^:]+: \d+(/\d+)? \w+ (in \d+\.\d s|\d+ s so far)", line) for line in err.strip().splitlines()), err


def test_a_running_stage_says_so_every_heartbeat(capsys, monkeypatch):
    """A long stage is not silent until it ends: interim lines at most every HEARTBEAT_SECONDS."""
    monkeypatch.setattr(_progress, "HEARTBEAT_SECONDS", 0.0)
    with progress_bar(total=2, desc="base logits") as bar:
        bar.update()
        bar.update()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" s")[0].rsplit(" ", 1)[0] for line in lines] == ["base logits: 1/2 it", "base logits: 2/2 it", "base logits: 2/2 it in"]
    assert lines[0].endswith(" s so far")


def test_a_short_transient_stage_writes_nothing(capsys):
    with progress_bar(total=3, desc="held-out check", leave=False) as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""


def test_tqdm_disable_and_a_missing_stderr_silence_the_lines(capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    for _ in progress_bar(range(2), desc="x"):
        pass
    monkeypatch.delenv("TQDM_DISABLE")
    monkeypatch.setattr(sys, "stderr", None)
    for _ in progress_bar(range(2), desc="y"):
        pass
    monkeypatch.undo()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_an_ipython_kernel_keeps_the_redrawing_bar(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # any module object: only its presence is read
    assert _progress.redraws()


STAGE_LINE = re.compile(r"^[^:]+: \d+(/\d+)? \w+ (in \d+\.\d s|\d+ s so far)")


def test_a_command_logged_to_a_file_writes_lines_not_redraws(digits_cnn, tmp_path):
    """``hf-calibrate fit`` with its progress bars on (the default) and stdout and stderr going to one file, as
    in CI or a batch job: no carriage return, no tqdm bar (ours, datasets' or transformers'), and only the
    command's own lines — its notes, the table and at most one line per stage."""
    from _files import write_image_folder

    rows = {split: digits_cnn.dataset[split].select(range(120)) for split in ("calibration", "test")}
    folder = write_image_folder(tmp_path / "digits", rows)
    log = tmp_path / "fit.log"
    with open(log, "w", encoding="utf-8") as stream:
        result = subprocess.run(
            [sys.executable, "-m", "hf_calibrate.cli", "fit", "--model", str(digits_cnn.path), "--dataset", str(folder),
             "--method", "temperature", "--bootstrap", "0", "--output", str(tmp_path / "out")],
            stdout=stream, stderr=subprocess.STDOUT, timeout=600, cwd=Path(__file__).resolve().parents[2],
        )
    text = log.read_text(encoding="utf-8")
    assert result.returncode == 0, text
    assert "\r" not in text and "%|" not in text and "it/s" not in text, text
    lines = text.splitlines()
    table = lines.index(next(line for line in lines if line.startswith("metric ")))
    stages = [line for line in lines if STAGE_LINE.match(line)]
    assert len(lines) - len(stages) == table + 2 + 7 + 2, text  # notes, header and rule, 7 metrics, fitted, the saved note
    assert len(stages) <= 3, text  # a stage of a short fit writes nothing, a long one one line


def test_progress_off_shows_no_bar_of_datasets_and_leaves_its_setting(digits_cnn, capsys):
    """``progress=False``: a fit and an evaluation on a ``datasets.Dataset`` whose labels are class names (matched to the
    model's by a ``Dataset.map``, which shows a datasets bar) print no bar; datasets' own setting (on here) is on after."""
    import datasets

    rows = digits_cnn.dataset["calibration"].select(range(100))
    names = rows.features["label"].names
    data = datasets.Dataset.from_dict({"image": rows["image"], "label": [names[label] for label in rows["label"]]})
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.enable_progress_bars()
    capsys.readouterr()
    try:
        calibrated = CalibratedModel.fit(digits_cnn.model, data, method="temperature", progress=False)
        calibrated.evaluate(data, bootstrap=0, progress=False)
        assert datasets.is_progress_bar_enabled()
    finally:
        if not was_enabled:
            datasets.disable_progress_bars()
    err = capsys.readouterr().err
    assert "Matching labels" not in err and "%|" not in err and "\r" not in err, err
