"""Atomic saving: a save that fails before it installs anything leaves the previous folder byte-identical, one that
fails while installing leaves a folder loading refuses (changing nothing) until the next save completes it, and a
save never loses a user's own README.md (unless ``overwrite_card=True``) or their other files. (Kills at every
step: test_reliability_artifacts.py; hostile folders: test_hostile_folders.py.)"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Dict, List

import pytest

import _tiny_models as tm
import hf_calibrate._atomic as _atomic
import hf_calibrate.results.cards as cards
import hf_calibrate.serialization as serialization
from hf_calibrate import CalibratedModel
from hf_calibrate.serialization import CARD_MARKER, saving

USER_CARD = "---\nlicense: mit\n---\n# My model\n\nMy own words.\n"


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


@pytest.fixture(scope="module")
def models() -> Dict[str, Any]:
    """Two different evaluated calibrations of one ViT (so a completed second save changes bytes)."""
    base, data, preprocessor = tm.make_base("vit")
    first = tm.fit(base, data, "temperature", preprocessor=preprocessor)
    second = tm.fit(base, data, "neural_clamping", preprocessor=preprocessor)
    tm.enlarge_delta(second)
    for model in (first, second):
        model.evaluate(data, progress=False)
    return {"first": first, "second": second, "base": base, "data": data}


@pytest.fixture(scope="module")
def first_save(models, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("first") / "model"
    models["first"].save_pretrained(folder)
    (folder / "notes.txt").write_text("my notes")  # a user's own file
    return folder


@pytest.fixture
def target(first_save, tmp_path) -> Path:
    """A private copy of the first save (with a user file) that a second save may replace."""
    return Path(shutil.copytree(first_save, tmp_path / "model"))


def _leftovers(parent: Path, name: str) -> List[str]:
    """Temporaries of a save of ``parent / name``: anything beside it, and staging folders inside it."""
    inside = parent / name
    found = [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]
    if inside.is_dir():
        found += [p.name for p in inside.iterdir() if p.name.startswith(".hf_calibrate-")]
    return sorted(found)


def _fail_after_calibrator(monkeypatch) -> None:
    real = saving.save_calibrator  # _write_files looks it up in saving, so patch it there

    def save_then_fail(calibrator: Any, path: Path) -> None:
        real(calibrator, path)
        assert path.is_file()  # the first file of the new artifact really was written
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(saving, "save_calibrator", save_then_fail)


def _fail_in_card(monkeypatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(cards, "render_card", fail)


def _fail_in_diagram(monkeypatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(cards, "write_diagram", fail)


def _fail_replace(monkeypatch, when) -> None:
    """Make ``os.replace`` fail for the calls ``when(destination name, call number)`` picks."""
    real, calls = os.replace, []

    def flaky(source: Any, destination: Any) -> None:
        calls.append(destination)
        if when(Path(destination).name, len(calls)):
            raise OSError("simulated failure")
        real(source, destination)

    monkeypatch.setattr(os, "replace", flaky)


def _fail_in_record(monkeypatch) -> None:
    # the last check before anything is installed: the record is validated before it is written
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(saving, "validate_record", fail)


FAILURES = {"calibrator": _fail_after_calibrator, "card": _fail_in_card, "diagram": _fail_in_diagram, "record": _fail_in_record}


@pytest.mark.parametrize("where", list(FAILURES))
def test_failed_save_leaves_the_previous_folder_untouched(models, target, monkeypatch, where):
    before = tm.file_hashes(target)
    assert {"calibration.safetensors", "base/model.safetensors", "README.md", "notes.txt"} <= set(before)
    with monkeypatch.context() as patch:
        FAILURES[where](patch)
        with pytest.raises((RuntimeError, OSError), match="simulated failure"):
            models["second"].save_pretrained(target)
    assert tm.file_hashes(target) == before
    assert _leftovers(target.parent, target.name) == []
    CalibratedModel.from_pretrained(target)  # still a valid artifact
    # the same save, not sabotaged, does change the folder: the comparison above is meaningful
    models["second"].save_pretrained(target)
    assert tm.file_hashes(target) != before
    assert CalibratedModel.from_pretrained(target).method == "neural_clamping"


def test_a_failure_while_installing_leaves_a_torn_folder_that_the_next_save_completes(models, target, monkeypatch):
    """An install fails at its last step (every file but the record installed): loading refuses the folder naming the
    files, and changes nothing; the next save completes it, equal to an uninterrupted save, with the user's notes kept."""
    with monkeypatch.context() as patch:
        _fail_replace(patch, lambda name, _: name == serialization.CALIBRATION_CONFIG)
        with pytest.raises(OSError, match="simulated failure") as failed:
            models["second"].save_pretrained(target)
    assert any("saved there again" in note for note in failed.value.__notes__)
    torn = tm.file_hashes(target)
    with pytest.raises(serialization.ArtifactError, match="not a complete calibration.*a save into it was interrupted"):
        CalibratedModel.from_pretrained(target)
    assert tm.file_hashes(target) == torn  # loading wrote nothing
    models["second"].save_pretrained(target)
    assert CalibratedModel.from_pretrained(target).method == "neural_clamping"
    assert _leftovers(target.parent, target.name) == []
    assert (target / "notes.txt").read_text() == "my notes"
    reference_folder = target.parent / "reference" / target.name
    models["second"].save_pretrained(reference_folder)  # the same save, not interrupted
    after = {name: digest for name, digest in tm.file_hashes(target).items() if name != "notes.txt"}
    reference = tm.file_hashes(reference_folder)
    differing = sorted(name for name in after.keys() | reference.keys() if after.get(name) != reference.get(name))
    # file for file the same (the card names its folder by its name, the same in both, never by its path)
    assert differing == []


def test_a_changed_file_of_the_artifact_is_not_replaced(models, target):
    """The user edited the saved config.json: it is no longer provably the library's, so a save refuses to replace
    it (naming it) before writing anything."""
    (target / "config.json").write_text((target / "config.json").read_text() + "\n")
    before = tm.file_hashes(target)
    with pytest.raises(FileExistsError, match="config.json.*cannot prove it wrote"):
        models["second"].save_pretrained(target)
    assert tm.file_hashes(target) == before and _leftovers(target.parent, target.name) == []


@pytest.mark.parametrize("where", ["calibrator", "card"])
def test_failed_first_save_leaves_nothing(models, tmp_path, monkeypatch, where):
    target = tmp_path / "fresh"
    FAILURES[where](monkeypatch)
    with pytest.raises(RuntimeError, match="simulated failure"):
        models["first"].save_pretrained(target)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_user_readme_survives_unless_overwrite_card(models, tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "README.md").write_text(USER_CARD)
    models["first"].save_pretrained(target)
    assert (target / "README.md").read_text() == USER_CARD
    assert (target / "calibration.safetensors").is_file()  # the artifact itself was written
    models["second"].save_pretrained(target)
    assert (target / "README.md").read_text() == USER_CARD
    models["second"].save_pretrained(target, overwrite_card=True)
    card = (target / "README.md").read_text()
    assert CARD_MARKER in card and "My own words" not in card and "Neural Clamping" in card
    # hf_calibrate's own card is refreshed by later saves without being asked
    models["first"].save_pretrained(target)
    assert "temperature scaling" in (target / "README.md").read_text()


def test_user_files_survive(models, target):
    (target / "extra").mkdir()
    (target / "extra" / "data.csv").write_text("a,b\n1,2\n")
    models["second"].save_pretrained(target)
    models["first"].save_pretrained(target)
    assert (target / "notes.txt").read_text() == "my notes"
    assert (target / "extra" / "data.csv").read_text() == "a,b\n1,2\n"


def test_files_the_previous_artifact_owned_do_not_linger(tmp_path):
    """Re-saving reference-only and unevaluated drops the old base weights and diagram, keeps user files."""
    base, data, _ = tm.make_base("timm")
    calibrated = tm.fit(base, data, "temperature")
    calibrated.evaluate(data, progress=False)
    target = tmp_path / "model"
    calibrated.save_pretrained(target)
    (target / "notes.txt").write_text("mine")
    assert (target / "model.safetensors").is_file() and (target / cards.DIAGRAM_FILE).is_file()
    again = tm.fit(base, data, "histogram")  # no evaluation this time
    again.save_pretrained(target, include_base=False, base_model_id="org/base", base_revision="0" * 40)
    assert not (target / "model.safetensors").exists()
    assert not (target / cards.DIAGRAM_FILE).exists()
    assert (target / "notes.txt").read_text() == "mine"


def test_a_save_over_an_unsealed_folder_changes_nothing(tmp_path):
    """A folder whose record carries no digests (format 1) holding a user's tokenizer and notes: nothing proves which
    files the library wrote, so the save is refused naming the record and the fix, and every file stays as it was."""
    from _files import format_one_artifact

    base, data, _ = tm.make_base("timm")
    target = tmp_path / "model"
    tm.fit(base, data, "temperature").save_pretrained(target)
    format_one_artifact(target)
    (target / "tokenizer.json").write_text("{\"mine\": 1}")
    (target / "notes.txt").write_text("my notes")
    before = {path.name: path.read_bytes() for path in target.iterdir()}
    with pytest.raises(FileExistsError) as refused:
        tm.fit(base, data, "histogram").save_pretrained(target)
    message = str(refused.value)
    assert serialization.CALIBRATION_CONFIG in message and "another folder" in message and "notes.txt" not in message
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before


def test_saved_files_get_the_umask_mode(models, tmp_path):
    """Every file of a save, the safetensors ones included (safetensors writes 0600), gets the mode the umask gives
    a new file, whatever the umask."""
    previous = os.umask(0o027)
    try:
        models["first"].save_pretrained(tmp_path / "model")
    finally:
        os.umask(previous)
    files = [path for path in (tmp_path / "model").rglob("*") if path.is_file()]
    assert any(path.suffix == ".safetensors" for path in files)
    modes = {str(path.relative_to(tmp_path)): oct(stat.S_IMODE(path.stat().st_mode)) for path in files}
    assert set(modes.values()) == {oct(0o640)}, modes


def test_saving_onto_a_file_is_refused(models, tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="not a folder"):
        models["first"].save_pretrained(target)
    assert target.read_bytes() == b"precious"
    assert _leftovers(tmp_path, target.name) == []


# ----------------------------------------------------------------------------- the one atomic-write helper (_atomic)


def test_write_atomically_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "result.json"
    _atomic.write_text_atomically(path, "old")
    with pytest.raises(RuntimeError, match="half written"):
        _atomic.write_atomically(path, lambda stream: (stream.write(b"new, but"), _raise(RuntimeError("half written"))))
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]
    _atomic.write_text_atomically(path, "new é")
    assert path.read_bytes() == "new é".encode("utf-8")


def test_atomic_folder_keeps_a_concurrent_winner_and_leaves_no_debris(tmp_path):
    target = tmp_path / "model-abc"
    with _atomic.atomic_folder(target) as scratch:
        (scratch / "mine.txt").write_text("mine")
        target.mkdir()
        (target / "theirs.txt").write_text("theirs")
    assert [p.name for p in tmp_path.iterdir()] == ["model-abc"]
    assert [p.name for p in target.iterdir()] == ["theirs.txt"]
    with pytest.raises(RuntimeError), _atomic.atomic_folder(tmp_path / "broken") as scratch:
        (scratch / "half.bin").write_bytes(b"0")
        raise RuntimeError("training failed")
    assert [p.name for p in tmp_path.iterdir()] == ["model-abc"]
    with _atomic.atomic_folder(tmp_path / "fresh") as scratch:
        (scratch / "weights.bin").write_bytes(b"1")
    assert (tmp_path / "fresh" / "weights.bin").read_bytes() == b"1"


def _raise(error: BaseException) -> None:
    raise error


def test_an_unwritable_folder_is_refused_before_anything_changes(models, target, monkeypatch):
    """``base/`` cannot be written (a read-only folder or file system): the save is refused before it deletes or
    replaces anything, instead of failing part-way and leaving the folder torn."""
    before, access = tm.file_hashes(target), os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path).name != "base" and access(path, mode))
    with pytest.raises(PermissionError, match="base is not writable.*nothing was changed"):
        models["second"].save_pretrained(target)
    assert tm.file_hashes(target) == before and _leftovers(target.parent, target.name) == []


def test_an_unsealed_record_is_named_with_the_way_out(models, target):
    """A record edited by hand (its seal no longer matches): the refusal says so and how to go on."""
    record = json.loads((target / serialization.CALIBRATION_CONFIG).read_text())
    record["fit"]["note"] = "edited by hand"
    (target / serialization.CALIBRATION_CONFIG).write_text(json.dumps(record))
    with pytest.raises(FileExistsError, match="carries no valid seal.*save into a new folder"):
        models["second"].save_pretrained(target)
