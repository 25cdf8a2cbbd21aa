"""Verified loading: hand-broken artifacts fail with an ``ArtifactError`` naming the file and the fix.

Each test copies a valid saved calibration into its own folder, breaks one thing, and checks
that ``CalibratedModel.from_pretrained`` refuses it (never a silent load) with a message that
says which file is wrong and what to do. The last tests check that loading valid artifacts
never unpickles anything.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import _tiny_models as tm
from _files import format_one_artifact
import hf_calibrate.serialization as serialization
from hf_calibrate import CalibratedModel
from hf_calibrate.serialization import ArtifactError

CONFIG = "calibration_config.json"
WEIGHTS = "calibration.safetensors"


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Dict[str, Any]:
    """Valid artifacts: kind → folder, plus the bases (``"<kind>-base"``) and sample inputs."""
    root = tmp_path_factory.mktemp("valid")
    out: Dict[str, Any] = {}
    for kind in tm.KINDS:
        base, data, preprocessor = tm.make_base(kind)
        calibrated = tm.fit(base, data, "neural_clamping", preprocessor=preprocessor)
        tm.enlarge_delta(calibrated)
        calibrated.save_pretrained(root / kind)
        out[kind], out[f"{kind}-base"], out[f"{kind}-inputs"] = root / kind, base, tm.batch_of(data, 4)
    plain = tm.plain_module()
    tm.fit(plain, tm.plain_data(plain), "temperature").save_pretrained(root / "plain")
    out["plain"], out["plain-base"] = root / "plain", plain
    return out


@pytest.fixture
def copy_of(saved, tmp_path) -> Callable[[str], Path]:
    """A private copy of a valid artifact, to break."""

    def make(kind: str) -> Path:
        return Path(shutil.copytree(saved[kind], tmp_path / kind))

    return make


def _edit_record(folder: Path, edit: Callable[[dict], None], *, reseal: bool = True) -> None:
    """Edit the record; ``reseal`` re-computes its digests (of the weights file and of itself), as a
    consistent but wrong artifact would have them, so that the check under test is the one that fires."""
    record = json.loads((folder / CONFIG).read_text())
    edit(record)
    if reseal:
        digests = record["files"]["sha256"]
        digests.update({name: serialization.file_sha256(folder / name) for name in digests if (folder / name).is_file()})
        record = serialization.seal_record(record)
    (folder / CONFIG).write_text(json.dumps(record))


def _refused(folder: Any, **kwargs: Any) -> str:
    """The ArtifactError message from loading ``folder``; fails the test if it loads."""
    with pytest.raises(ArtifactError) as caught:
        CalibratedModel.from_pretrained(folder, **kwargs)
    return str(caught.value)


# ----------------------------------------------------------------------------- the calibration tensors


@pytest.mark.parametrize("kind", tm.KINDS)
def test_valid_artifacts_load(saved, kind):
    """The baseline the broken copies differ from."""
    model = CalibratedModel.from_pretrained(saved[kind])
    assert model.method == "neural_clamping"


def test_truncated_weights(copy_of):
    folder = copy_of("timm")
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    message = _refused(folder)
    assert str(folder / WEIGHTS) in message
    assert "truncated" in message and "re-download" in message


def test_missing_weights_file(copy_of):
    folder = copy_of("vit")
    (folder / WEIGHTS).unlink()
    message = _refused(folder)
    assert str(folder / WEIGHTS) in message and "missing" in message and "re-save or re-download" in message


@pytest.mark.parametrize("kind, wrong_shape", [("timm", (3, 8, 8)), ("vit", (3, 12, 12)), ("bert", (8,))])
def test_delta_shape_against_the_base_input_contract(copy_of, kind, wrong_shape):
    """δ and its recorded shape agree with each other but not with the base model's input, nor (images)
    with the recorded calibration input size (δ may differ from the base's declared size only where
    the record says it was calibrated at another one)."""
    folder = copy_of(kind)
    tensors = load_file(str(folder / WEIGHTS))
    right_shape = tuple(tensors["delta"].shape)
    tensors["delta"] = torch.zeros(wrong_shape)
    save_file(tensors, str(folder / WEIGHTS))

    def edit(record: dict) -> None:
        record["calibrator"]["delta_shape"] = list(wrong_shape)
        record["input_contract"]["shape"] = list(wrong_shape)
        record["fit"]["summary"]["selected"]["delta_norm"] = 0.0  # δ is zero now: the record states what it holds

    _edit_record(folder, edit)
    message = _refused(folder)
    if kind == "bert":
        assert WEIGHTS in message and str(wrong_shape) in message and str(right_shape) in message
        assert "another base" in message
    else:
        assert "'input_contract.input_size'" in message and str(list(wrong_shape)) in message and "delta_shape" in message


def test_delta_shape_against_the_record(copy_of):
    folder = copy_of("timm")
    tensors = load_file(str(folder / WEIGHTS))
    tensors["delta"] = torch.zeros(3, 8, 8)
    save_file(tensors, str(folder / WEIGHTS))
    _edit_record(folder, lambda record: None)  # digests of the new file: the shape check is what must catch it
    message = _refused(folder)
    assert str(folder / WEIGHTS) in message and "'delta'" in message and "(3, 8, 8)" in message
    assert "re-save" in message


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_extra_or_missing_tensor(copy_of, change):
    folder = copy_of("bert")
    tensors = load_file(str(folder / WEIGHTS))
    if change == "extra":
        tensors["head.weight"] = torch.zeros(2, 2)
    else:
        del tensors["log_temperature"]
    save_file(tensors, str(folder / WEIGHTS))
    _edit_record(folder, lambda record: None)
    message = _refused(folder)
    assert str(folder / WEIGHTS) in message
    assert ("unexpected tensors ['head.weight']" if change == "extra" else "missing tensors ['log_temperature']") in message
    assert "re-save them together" in message


def test_unknown_method(copy_of):
    folder = copy_of("timm")
    _edit_record(folder, lambda record: record.update(method="no_such_method"))
    message = _refused(folder)
    assert CONFIG in message and "no_such_method" in message and "Upgrade hf-calibrate" in message


# ----------------------------------------------------------------------------- the record


@pytest.mark.parametrize("kind", tm.KINDS)
def test_mismatched_labels(copy_of, kind):
    folder = copy_of(kind)
    _edit_record(folder, lambda record: record["base_model"]["id2label"].update({"0": "zebra"}))
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "'zebra'" in message and "'cat'" in message
    assert "with the base it was fitted on" in message


def test_newer_format_version(copy_of):
    folder = copy_of("vit")
    _edit_record(folder, lambda record: record.update(format_version=99))
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "format version 99" in message and "pip install -U" in message


def test_hand_edited_record_is_refused(copy_of):
    """A record must match its own digest: an edit that passes every other check is still refused."""
    folder = copy_of("vit")
    _edit_record(folder, lambda record: record["fit"].update(seed=123), reseal=False)
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "'record_sha256'" in message and "re-save or re-download" in message


def test_changed_tensor_values_are_refused(copy_of):
    """Finite, in-range, right-shaped but different δ values: only the recorded SHA-256 can tell."""
    folder = copy_of("vit")
    tensors = load_file(str(folder / WEIGHTS))
    tensors["delta"] = tensors["delta"] + 0.01
    save_file(tensors, str(folder / WEIGHTS))
    message = _refused(folder)
    assert str(folder / WEIGHTS) in message and "'files.sha256'" in message and "re-download" in message


def _set_temperature(folder: Path, temperature: float) -> None:
    tensors = load_file(str(folder / WEIGHTS))
    tensors["log_temperature"] = torch.full_like(tensors["log_temperature"], float(np.log(temperature)))
    save_file(tensors, str(folder / WEIGHTS))


def _downgraded(folder: Path) -> None:
    """The hostile probe: a sealed record edited (label 0 renamed, T = 0.001), its digests dropped, claiming format 1."""
    _set_temperature(folder, 0.001)
    record = json.loads((folder / CONFIG).read_text())
    record["base_model"]["id2label"]["0"] = "zebra"
    (folder / CONFIG).write_text(json.dumps(record))
    format_one_artifact(folder)


@pytest.mark.parametrize("make", [format_one_artifact, _downgraded], ids=["format 1", "edited and downgraded"])
def test_a_format_one_record_is_refused_naming_the_fix(copy_of, make):
    """Format 1 (no manifest, no digests) predates the first release: nothing can prove such a record unedited, so it
    is refused before anything is read or built, naming the format and the fix; the folder is left as it was."""
    folder = copy_of("timm")
    make(folder)
    before = tm.file_hashes(folder)
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "format_version 1" in message and "reads (2 to 3" in message
    assert "fit the calibration again and save it with this version" in message
    assert tm.file_hashes(folder) == before


def test_not_json(copy_of):
    folder = copy_of("timm")
    (folder / CONFIG).write_text("{'method': 'temperature',")
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "not valid JSON" in message and "re-save or re-download" in message


def test_record_missing_an_entry(copy_of):
    folder = copy_of("timm")
    _edit_record(folder, lambda record: record.pop("calibrator"))
    message = _refused(folder)
    assert str(folder / CONFIG) in message and "'calibrator'" in message and "re-save" in message


@pytest.mark.parametrize("name", ["../../x.safetensors", "ABSOLUTE"])
def test_weights_path_outside_the_folder(copy_of, tmp_path, name):
    folder = copy_of("timm")
    if name == "ABSOLUTE":
        name = str(tmp_path / "elsewhere.safetensors")
    target = Path(os.path.normpath(folder / name))
    shutil.copy(folder / WEIGHTS, target)  # a perfectly valid file: only the path is wrong
    _edit_record(folder, lambda record: record["files"].update(weights=name))
    message = _refused(folder)
    assert CONFIG in message and repr(name) in message and "not a plain relative path" in message


def test_base_folder_outside_the_folder(copy_of, saved, tmp_path):
    folder = copy_of("vit")
    shutil.copytree(saved["vit"] / "base", tmp_path / "other_base")  # valid, but outside
    _edit_record(folder, lambda record: record["files"].update(base="../other_base"))
    message = _refused(folder)
    assert CONFIG in message and "'../other_base'" in message


# ----------------------------------------------------------------------------- the base model


@pytest.mark.parametrize("kind, weights", [("timm", "model.safetensors"), ("vit", "base/model.safetensors"),
                                           ("bert", "base/model.safetensors")])
def test_swapped_base_weights(copy_of, tmp_path, kind, weights):
    """Same architecture, other weights (another seed): the fingerprint check must catch it."""
    folder = copy_of(kind)
    other, data, preprocessor = tm.make_base(kind, seed=1)
    tm.fit(other, data, "temperature").save_pretrained(tmp_path / "other")
    assert (tmp_path / "other" / weights).read_bytes() != (folder / weights).read_bytes()
    shutil.copy(tmp_path / "other" / weights, folder / weights)
    _edit_record(folder, lambda record: None)  # a consistent record: the fingerprint, not the file digest, must catch it
    message = _refused(folder)
    assert str(folder / weights) in message
    assert "not those the calibration" in message and "Restore the original base weights" in message


def test_missing_transformers_base_folder(copy_of):
    folder = copy_of("bert")
    shutil.rmtree(folder / "base")
    message = _refused(folder)
    assert str(folder / "base") in message and "re-save or re-download" in message


def test_plain_module_needs_base_model(saved):
    message = _refused(saved["plain"])
    assert "plain PyTorch module" in message and "base_model=" in message
    other = tm.plain_module(seed=5)
    message = _refused(saved["plain"], base_model=other)
    assert "not those the calibration" in message and "the base_model= you passed" in message
    reloaded = CalibratedModel.from_pretrained(saved["plain"], base_model=saved["plain-base"])
    assert reloaded.method == "temperature"


def test_base_model_override_of_a_saved_base_is_verified(saved):
    other, _, _ = tm.make_base("timm", seed=3)
    message = _refused(saved["timm"], base_model=other)
    assert "not those the calibration" in message and "base_model=" in message


# ----------------------------------------------------------------------------- what is not a calibration


def test_empty_folder(tmp_path):
    message = _refused(tmp_path)
    assert f"{tmp_path} has no {CONFIG}" in message and "not an hf_calibrate calibration" in message


def test_plain_transformers_model_folder(tmp_path):
    tm.tiny_vit().save_pretrained(tmp_path / "vit")
    message = _refused(tmp_path / "vit")
    assert CONFIG in message and "not an hf_calibrate calibration" in message and "save_pretrained" in message


def test_unknown_repo_id(hub_online):
    message = _refused(f"{hub_online.user}/no-such-calibration")
    assert "no-such-calibration" in message and "could not find" in message and "token=" in message


def test_unknown_revision(hub_online, saved):
    repo_id = hub_online.unique_repo_id("revision-error")
    CalibratedModel.from_pretrained(saved["timm"]).push_to_hub(repo_id)
    message = _refused(repo_id, revision="0" * 40)
    assert repo_id in message and "0" * 40 in message and "revision" in message


def test_neither_folder_nor_repo_id(tmp_path):
    message = _refused(str(tmp_path / "does" / "not" / "exist"))
    assert "neither an existing local folder nor a valid hub repo id" in message


def test_offline_and_not_cached(hub_server):
    with hub_server.configure_client(offline=True):
        message = _refused(f"{hub_server.user}/never-downloaded")
    assert "never-downloaded" in message and "HF_HUB_OFFLINE" in message


# ----------------------------------------------------------------------------- no pickle, ever


@pytest.fixture
def no_pickle(monkeypatch) -> None:
    """Make every unpickling entry point raise for the duration of the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("loading a calibration unpickled something")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


@pytest.mark.parametrize("kind", [*tm.KINDS, "plain"])
def test_loading_never_unpickles(saved, no_pickle, kind):
    base_model = saved["plain-base"] if kind == "plain" else None
    model = CalibratedModel.from_pretrained(saved[kind], base_model=base_model)
    assert tm.state_dicts_equal(model.base_model, saved[f"{kind}-base"])
    if kind != "plain":
        assert model(**saved[f"{kind}-inputs"]) is not None
    with pytest.raises(AssertionError, match="unpickled"):  # the trap is armed
        torch.load("anything")
