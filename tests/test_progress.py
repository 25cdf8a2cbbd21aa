"""Progress bars: redrawn in a terminal, one line per stage in a log (``hf_calibrate._progress``)."""

from __future__ import annotations

import io
import re
import sys

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
