"""Atomic saving: a save that fails before its commit leaves the previous folder byte-identical, one that
fails after it is finished by the next load, and a save never loses a user's own README.md (unless
``overwrite_card=True``) or their other files. (Kills at every step: test_reliability_artifacts.py.)"""

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
    """Temporaries of a save of ``parent / name``: siblings (format 1) and the journal / staging inside it."""
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


def _fail_in_commit(monkeypatch) -> None:
    # the journal's rename is the commit point: failing it must leave the old artifact as it was
    _fail_replace(monkeypatch, lambda name, _: name == serialization.JOURNAL_FILE)


FAILURES = {"calibrator": _fail_after_calibrator, "card": _fail_in_card, "diagram": _fail_in_diagram, "commit": _fail_in_commit}


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


def test_failure_after_the_commit_is_finished_by_the_next_load(models, target, monkeypatch):
    """Committed (journal written), then an install fails: the next load rolls the save forward."""
    before = tm.file_hashes(target)
    with monkeypatch.context() as patch:
        _fail_replace(patch, lambda name, number: number == 3)  # 1: the journal, 2: the first file, 3: the second
        with pytest.raises(OSError, match="simulated failure"):
            models["second"].save_pretrained(target)
    assert (target / serialization.JOURNAL_FILE).exists()  # the interrupted save is on record
    reloaded = CalibratedModel.from_pretrained(target)
    assert reloaded.method == "neural_clamping"  # the new artifact, complete
    assert _leftovers(target.parent, target.name) == []
    assert (target / "notes.txt").read_text() == "my notes"
    reference_folder = target.parent / "reference" / target.name
    models["second"].save_pretrained(reference_folder)  # the same save, not interrupted
    after = {name: digest for name, digest in tm.file_hashes(target).items() if name != "notes.txt"}
    reference = tm.file_hashes(reference_folder)
    differing = sorted(name for name in after.keys() | reference.keys() if after.get(name) != reference.get(name))
    assert differing == ["README.md"]  # the card's usage snippet loads the folder it is in: otherwise the same
    card = (target / "README.md").read_text().replace(str(target), str(reference_folder))
    assert card == (reference_folder / "README.md").read_text()
    assert after != before


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


def _format_one(folder: Path) -> None:
    """Rewrite the folder's record as format 1 wrote it: no manifest, no digests, no format-2 keys."""
    record = json.loads((folder / serialization.CALIBRATION_CONFIG).read_text())
    record["format_version"] = 1
    for key in ("manifest", "sha256"):
        record["files"].pop(key)
    for part, key in (("base_model", "classifier"), ("input_contract", "input_size"), ("input_contract", "value_range"), ("fit", "data_fingerprints")):
        record[part].pop(key, None)
    record.pop("record_sha256")
    record.pop("evaluation", None)
    (folder / serialization.CALIBRATION_CONFIG).write_text(json.dumps(record))


USERS_PREPROCESSOR_FILES = {"tokenizer.json": "{\"mine\": 1}", "vocab.txt": "my\nwords\n",
                            "special_tokens_map.json": "{\"mine\": 2}", "preprocessor_config.json": "{\"mine\": 3}"}


def test_a_save_over_a_format_one_folder_never_deletes_unproven_files(tmp_path):
    """A format-1 timm folder holding a user's tokenizer and processor files (names format 1 could have written, but
    a timm save never does): nothing proves they are the library's, so the save is refused naming them, and every
    file stays as it was."""
    base, data, _ = tm.make_base("timm")
    target = tmp_path / "model"
    tm.fit(base, data, "temperature").save_pretrained(target)
    _format_one(target)
    for name, text in {**USERS_PREPROCESSOR_FILES, "notes.txt": "my notes"}.items():
        (target / name).write_text(text)
    before = {path.name: path.read_bytes() for path in target.iterdir()}
    with pytest.raises(FileExistsError) as refused:
        tm.fit(base, data, "histogram").save_pretrained(target)
    message = str(refused.value)
    assert all(name in message for name in USERS_PREPROCESSOR_FILES) and "notes.txt" not in message
    assert "format 1" in message and "Move them elsewhere" in message
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before


def test_a_format_one_folder_re_saved_in_place_keeps_what_is_rewritten_identically(models, tmp_path):
    """Loading a format-1 ViT folder unverified and saving it back: its preprocessor_config.json is written again
    byte for byte (nothing lost), so the save goes through, seals the record and keeps the user's notes."""
    target = tmp_path / "model"
    models["first"].save_pretrained(target)
    (target / "notes.txt").write_text("my notes")
    _format_one(target)
    with pytest.warns(serialization.UnverifiedArtifactWarning):
        loaded = CalibratedModel.from_pretrained(target, allow_unverified=True)
    loaded.save_pretrained(target)
    record = json.loads((target / serialization.CALIBRATION_CONFIG).read_text())
    assert record["format_version"] == 2 and "preprocessor_config.json" in record["files"]["manifest"]
    assert (target / "notes.txt").read_text() == "my notes"
    assert CalibratedModel.from_pretrained(target).method == "temperature"


def _format_one_vit(models, target: Path) -> None:
    """A format-1 ViT folder, its transformers base included in ``base/`` (no evaluation, so no diagram)."""
    models["first"].save_pretrained(target)
    _format_one(target)
    (target / cards.DIAGRAM_FILE).unlink()


def test_a_save_over_a_format_one_folder_keeps_unproven_base_files(models, tmp_path):
    """In ``base/`` a format-1 save of a classifier wrote its config and its weights: one ``model.safetensors`` or,
    for a large base, an index and its shards, never both, and never a ``generation_config.json`` (a classifier does
    not generate). So beside ``model.safetensors`` a shard-named file, an index or a generation config is the user's:
    a re-save that drops the base (reference-only) deletes the base's own files and keeps those."""
    target = tmp_path / "model"
    _format_one_vit(models, target)
    users = {"generation_config.json": "{\"mine\": 1}", "model-00001-of-00002.safetensors": "mine",
             "model.safetensors.index.json": "{\"mine\": 2}", "notes.txt": "my notes"}
    for name, text in users.items():
        (target / "base" / name).write_text(text)
    models["first"].save_pretrained(target, include_base=False, base_model_id="org/base", base_revision="0" * 40)
    assert {path.name: path.read_text() for path in (target / "base").iterdir()} == users


def test_a_save_over_a_format_one_folder_drops_its_sharded_base(models, tmp_path):
    """A format-1 folder whose base was saved in shards (an index and no model.safetensors): index and shards were
    the base's own, so a reference-only re-save deletes them with the rest of ``base/``."""
    target = tmp_path / "model"
    _format_one_vit(models, target)
    (target / "base" / "model.safetensors").unlink()
    models["base"].save_pretrained(target / "base", max_shard_size="4KB")
    assert (target / "base" / "model.safetensors.index.json").is_file() and not (target / "base" / "model.safetensors").exists()
    with pytest.warns(serialization.UnverifiedArtifactWarning):
        loaded = CalibratedModel.from_pretrained(target, allow_unverified=True)
    loaded.save_pretrained(target, include_base=False, base_model_id="org/base", base_revision="0" * 40)
    assert not (target / "base").exists()


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


def test_durable_write_through_a_scratch_folder_leaves_nothing_there(tmp_path, monkeypatch):
    """The save journal's form: written in the staging folder, flushed, renamed into place; a failed rename
    leaves the target as it was and no temporary in the scratch folder."""
    scratch, path = tmp_path / "staging", tmp_path / "journal.json"
    scratch.mkdir()
    _atomic.write_text_atomically(path, '{"a": 1}', durable=True, scratch_folder=scratch)
    assert path.read_text() == '{"a": 1}' and list(scratch.iterdir()) == []
    _fail_replace(monkeypatch, lambda name, _: name == path.name)
    with pytest.raises(OSError, match="simulated failure"):
        _atomic.write_text_atomically(path, '{"a": 2}', durable=True, scratch_folder=scratch)
    assert path.read_text() == '{"a": 1}' and list(scratch.iterdir()) == []


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
