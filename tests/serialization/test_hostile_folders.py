"""Folders made to attack the loader and the next save: a loader that replays what a folder holds (a save journal,
say) can be made to delete a user's files.

Someone hands you a model folder (a download, a zip, a shared drive). Whatever it holds — an old save journal, links
out of the folder, a staging folder that is a link, a sealed record claiming a user's files — loading it writes
nothing, and neither loading nor the next save changes anything outside the folder or deletes a file the library
cannot prove it wrote. Each case is counted by ``reliability_counts`` (test_reliability_artifacts.py) as the group
``hostile``; every case checks that the folder outside ("precious") is byte for byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest

import _tiny_models as tm
from test_reliability_artifacts import (
    HANDLED, LOST, REFUSED, SILENT, STAGING, UNCLEAR, WEIGHTS, Bed, Case, edit_record, leftovers, tree_state,
)

from hf_calibrate import CalibratedModel
from hf_calibrate.serialization import ArtifactError
from hf_calibrate.serialization.files import STAGING_MARKER

JOURNAL = ".hf_calibrate-journal.json"  # the name an earlier version replayed at load
PRECIOUS = b"the user's own file, outside the model folder"


def _prepare(bed: Bed, name: str, kind: str = "vit") -> Tuple[Path, Path]:
    """A copy of a valid artifact and, beside it, a folder of the user's holding ``precious.txt``."""
    scratch = bed.scratch(f"hostile-{name}")
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_bytes(PRECIOUS)
    return bed.copy(kind, scratch / "model"), outside


def _journal(folder: Path, write: List[str], delete: List[str], staging: str = f"{STAGING}x") -> None:
    (folder / JOURNAL).write_text(json.dumps({"protocol": 1, "staging": staging, "write": write, "delete": delete}))


def _load_changes_nothing(bed: Bed, folder: Path, outside: Path, kind: str = "vit") -> Tuple[str, str]:
    """Load ``folder``: HANDLED when it loads the artifact exactly and nothing in or outside it changed."""
    inside_before, outside_before = tree_state(folder), tree_state(outside)
    try:
        model = bed.load(folder, kind)
    except ArtifactError as error:
        return UNCLEAR, f"refused a loadable folder: {str(error)[:200]}"
    if tree_state(outside) != outside_before:
        return LOST, "loading changed files outside the folder"
    if tree_state(folder) != inside_before:
        return SILENT, "loading changed the folder"
    if not tm.state_dicts_equal(model.calibrator, bed.reference(kind).calibrator):
        return SILENT, "loaded other values"
    return HANDLED, "loaded; nothing changed on disk"


def _save_keeps_outside(bed: Bed, folder: Path, outside: Path, kind: str = "vit-ts") -> Tuple[str, str]:
    """Save another calibration into ``folder``: HANDLED when nothing outside changed and the save loads back."""
    outside_before = tree_state(outside)
    bed.model(kind).save_pretrained(folder)
    if tree_state(outside) != outside_before:
        return LOST, "the save changed files outside the folder"
    if bed.load(folder, kind).method != bed.model(kind).method:
        return SILENT, "the saved folder does not load as the saved calibration"
    return HANDLED, "saved; nothing outside changed"


def _both(first: Tuple[str, str], then: Callable[[], Tuple[str, str]]) -> Tuple[str, str]:
    return then() if first[0] == HANDLED else first


def journal_deletes_through_a_link(bed: Bed) -> Tuple[str, str]:
    """The probe's case: ``lnk -> outside`` and a journal deleting ``lnk/precious.txt``."""
    folder, outside = _prepare(bed, "journal-delete")
    os.symlink(outside, folder / "lnk")
    (folder / f"{STAGING}x").mkdir()
    _journal(folder, write=[], delete=["lnk/precious.txt"])
    return _both(_load_changes_nothing(bed, folder, outside), lambda: _save_keeps_outside(bed, folder, outside))


def journal_writes_through_a_link(bed: Bed) -> Tuple[str, str]:
    """A journal whose ``write`` entry would replace ``lnk/precious.txt`` with the staged file's content."""
    folder, outside = _prepare(bed, "journal-write")
    os.symlink(outside, folder / "lnk")
    (folder / f"{STAGING}x" / "lnk").mkdir(parents=True)
    (folder / f"{STAGING}x" / "lnk" / "precious.txt").write_bytes(b"overwritten")
    _journal(folder, write=["lnk/precious.txt"], delete=[])
    return _both(_load_changes_nothing(bed, folder, outside), lambda: _save_keeps_outside(bed, folder, outside))


def staging_folder_is_a_link(bed: Bed) -> Tuple[str, str]:
    """A staging folder that is a link to the user's folder, and a journal moving its file into the model folder."""
    folder, outside = _prepare(bed, "staging-link")
    os.symlink(outside, folder / f"{STAGING}x")
    _journal(folder, write=["precious.txt"], delete=[])
    result = _both(_load_changes_nothing(bed, folder, outside), lambda: _save_keeps_outside(bed, folder, outside))
    if result[0] == HANDLED and not (folder / f"{STAGING}x").is_symlink():
        return LOST, "the save removed the link (the staging folder is not a real folder, so it is not the library's)"
    return result


def journal_deletes_the_users_files(bed: Bed) -> Tuple[str, str]:
    """A journal listing the user's NOTES.md and the artifact's own calibration.safetensors for deletion."""
    folder, outside = _prepare(bed, "journal-users")
    (folder / "NOTES.md").write_text("my notes")
    (folder / f"{STAGING}x").mkdir()
    _journal(folder, write=[], delete=["NOTES.md", WEIGHTS])
    return _load_changes_nothing(bed, folder, outside)


def _claim(folder: Path, name: str, digest: str) -> None:
    """Re-seal the record with ``name`` in its manifest and ``digest`` as its SHA-256 (a consistent, hostile record)."""
    def edit(record):
        record["files"]["manifest"].append(name)
        record["files"]["sha256"][name] = digest

    edit_record(folder, edit)


def sealed_record_claims_a_file_behind_a_link(bed: Bed) -> Tuple[str, str]:
    """A sealed record listing ``lnk/precious.txt`` with its true digest: a file behind a link is never proven."""
    folder, outside = _prepare(bed, "claim-link")
    os.symlink(outside, folder / "lnk")
    _claim(folder, "lnk/precious.txt", hashlib.sha256(PRECIOUS).hexdigest())
    return _save_keeps_outside(bed, folder, outside)


def sealed_record_claims_a_users_file(bed: Bed) -> Tuple[str, str]:
    """A sealed record listing the user's NOTES.md under a digest that is not its content's: the save keeps it."""
    folder, outside = _prepare(bed, "claim-notes")
    (folder / "NOTES.md").write_text("my notes")
    _claim(folder, "NOTES.md", "0" * 64)
    result = _save_keeps_outside(bed, folder, outside)
    if result[0] == HANDLED and (folder / "NOTES.md").read_text() != "my notes":
        return LOST, "the save deleted the user's NOTES.md"
    return result


def base_folder_is_a_link(bed: Bed) -> Tuple[str, str]:
    """``base`` is a link to the user's folder: a save of a transformers base would write through it, so it refuses."""
    folder, outside = _prepare(bed, "base-link", kind="vit-ts")
    shutil.rmtree(folder / "base")
    os.symlink(outside, folder / "base")
    before = tree_state(outside)
    try:
        bed.model("vit").save_pretrained(folder)
    except FileExistsError as error:
        kept = tree_state(outside) == before and not leftovers(folder)
        clear = "base" in str(error) and "Move it" in str(error)
        return ((REFUSED if clear else UNCLEAR) if kept else LOST), str(error)
    return (LOST if tree_state(outside) != before else SILENT), "saved through a linked base folder"


def staging_folder_holds_a_link_out(bed: Bed) -> Tuple[str, str]:
    """A dead save's staging folder (a real, marked folder) holding a link to the user's folder: removing it keeps the
    link's target."""
    folder, outside = _prepare(bed, "staging-inner-link")
    (folder / f"{STAGING}dead").mkdir()
    (folder / f"{STAGING}dead" / STAGING_MARKER).write_text(f"{STAGING}dead")
    os.symlink(outside, folder / f"{STAGING}dead" / "out")
    return _save_keeps_outside(bed, folder, outside)


def torn_folder_is_refused_unchanged(bed: Bed) -> Tuple[str, str]:
    """A folder whose calibration.safetensors is another save's (a save killed while installing): refused, and
    loading changes nothing."""
    folder, outside = _prepare(bed, "torn")
    shutil.copyfile(bed.folder("vit-ts") / WEIGHTS, folder / WEIGHTS)
    before = tree_state(folder)
    try:
        CalibratedModel.from_pretrained(folder)
    except ArtifactError as error:
        unchanged = tree_state(folder) == before
        clear = f"{WEIGHTS} is not the file that was saved" in str(error) and "re-save or re-download" in str(error)
        return ((REFUSED if clear else UNCLEAR) if unchanged else SILENT), str(error)
    return SILENT, "a torn folder loaded"


def sealed_record_claims_guessable_files(bed: Bed) -> Tuple[str, str]:
    """A sealed record listing files whose content anyone can guess, with their true digests: a git repository's
    ``.git/HEAD`` and an empty ``pkg/__init__.py``. A save deletes stale files only where it writes files, and never an
    empty one, so both stay (someone cloned a hub repo and saves into it)."""
    folder, outside = _prepare(bed, "claim-guessable")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "pkg").mkdir()
    (folder / "pkg" / "__init__.py").write_text("")
    for name in (".git/HEAD", "pkg/__init__.py"):
        _claim(folder, name, hashlib.sha256((folder / name).read_bytes()).hexdigest())
    result = _save_keeps_outside(bed, folder, outside)
    if result[0] == HANDLED and not ((folder / ".git" / "HEAD").is_file() and (folder / "pkg" / "__init__.py").is_file()):
        return LOST, "the save deleted files a hostile record claimed by their guessable digests"
    return result


def users_folder_named_like_a_staging_folder(bed: Bed) -> Tuple[str, str]:
    """A user's real folder that happens to carry the staging prefix, without a save's marker: it is not removed."""
    folder, outside = _prepare(bed, "reserved-name")
    (folder / f"{STAGING}mine").mkdir()
    (folder / f"{STAGING}mine" / "thesis.tex").write_text("my thesis")
    result = _save_keeps_outside(bed, folder, outside)
    if result[0] == HANDLED and not (folder / f"{STAGING}mine" / "thesis.tex").is_file():
        return LOST, "the save removed a user's folder by its name alone"
    return result


def card_is_a_folder_and_overwrite_card(bed: Bed) -> Tuple[str, str]:
    """``README.md`` is a folder and the save asks to overwrite the card: refused before anything is deleted (the old
    artifact still loads), not torn part-way through."""
    folder, outside = _prepare(bed, "card-folder", kind="bert")
    (folder / "README.md").unlink()
    (folder / "README.md").mkdir()
    before = tree_state(folder)
    try:
        bed.model("vit").save_pretrained(folder, overwrite_card=True)
    except FileExistsError as error:
        unchanged = tree_state(folder) == before and bed.load(folder, "bert").method == bed.model("bert").method
        return ((REFUSED if "README.md" in str(error) and "Move it" in str(error) else UNCLEAR) if unchanged else LOST), str(error)
    return SILENT, "saved over a folder named README.md"


def stray_tokenizer_file(bed: Bed) -> Tuple[str, str]:
    """A ``special_tokens_map.json`` that is not in the manifest, beside a BERT calibration: transformers would read it
    and re-map the tokens; the loaded tokenizer encodes as the saved one."""
    folder, outside = _prepare(bed, "stray-tokenizer", kind="bert")
    (folder / "special_tokens_map.json").write_text(json.dumps({"cls_token": "market", "sep_token": "the"}))
    expected = bed.reference("bert").preprocessor("the market")["input_ids"]
    result = _load_changes_nothing(bed, folder, outside, kind="bert")
    if result[0] == HANDLED and bed.load(folder, "bert").preprocessor("the market")["input_ids"] != expected:
        return SILENT, "a file outside the manifest changed the tokenizer"
    return result


HOSTILE_CASES: List[Case] = [
    Case("journal deletes lnk/precious.txt through a link", journal_deletes_through_a_link),
    Case("journal writes through a linked folder", journal_writes_through_a_link),
    Case("staging folder is a link out of the folder", staging_folder_is_a_link),
    Case("journal lists the user's NOTES.md and calibration.safetensors", journal_deletes_the_users_files),
    Case("sealed record claims a file behind a link", sealed_record_claims_a_file_behind_a_link),
    Case("sealed record claims the user's NOTES.md", sealed_record_claims_a_users_file),
    Case("base/ is a link to the user's folder", base_folder_is_a_link, REFUSED),
    Case("dead staging folder holds a link out", staging_folder_holds_a_link_out),
    Case("torn folder refused, loading changes nothing", torn_folder_is_refused_unchanged, REFUSED),
    Case("sealed record claims .git/HEAD and an empty file by their true digests", sealed_record_claims_guessable_files),
    Case("a user's folder named like a staging folder", users_folder_named_like_a_staging_folder),
    Case("README.md is a folder, overwrite_card=True", card_is_a_folder_and_overwrite_card, REFUSED),
    Case("a stray special_tokens_map.json beside a BERT calibration", stray_tokenizer_file),
]


@pytest.fixture(scope="module")
def bed(tmp_path_factory) -> Iterator[Bed]:
    with tm.torch_threads(1):
        yield Bed(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("case", HOSTILE_CASES, ids=[case.name for case in HOSTILE_CASES])
def test_hostile_folders_change_nothing_outside(bed, case):
    outcome, detail = case.run(bed)
    assert outcome == case.expected, detail
