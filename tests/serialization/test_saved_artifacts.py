"""Artifacts saved by an earlier version of the library load bit-identically (docs/artifact.md, "Version policy").

``tests/serialization/artifacts/<name>/`` holds small calibrated models saved with ``save_pretrained`` by the
commit named in ``tests/serialization/artifacts/README.md``, each beside ``expected.safetensors``: a fixed
seeded input batch (``input/<key>``) and the calibrated logits that commit computed on it
(``logits``), on one torch thread. Loading them with today's code must give those logits exactly
(``torch.equal``), and re-saving the loaded model must give the same record (bar the version of
the library that wrote it, and the digests of files an older save did not digest) and the same tensor files.

The artifacts are regenerated only when the saved format changes on purpose (a new format
version), with ``python tests/serialization/test_saved_artifacts.py`` (see ``tests/serialization/artifacts/README.md``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import TensorDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel

ARTIFACTS = Path(__file__).parent / "artifacts"
EXPECTED = "expected.safetensors"
#: record keys that name the library version which wrote it (and the digest covering them): not the format
VERSIONED_KEYS = ("library_version", "record_sha256")
#: the tensor files whose bytes a re-save must reproduce
TENSOR_FILES = ("calibration.safetensors", "model.safetensors", "base/model.safetensors")


def _vit_neural_clamping() -> Tuple[CalibratedModel, Dict[str, torch.Tensor]]:
    """A tiny ViT with Neural Clamping (a visible δ) and an evaluation with intervals in its record."""
    base, data, processor = tm.make_base("vit", seed=0, n=48)
    calibrated = tm.fit(base, data, "neural_clamping", preprocessor=processor, seed=0)
    tm.enlarge_delta(calibrated, seed=1)
    calibrated.evaluate(tm.image_data(base, 40, seed=2), bootstrap=100, progress=False)
    return calibrated, tm.batch_of(tm.image_data(base, 8, seed=3))


def _vit_tst() -> Tuple[CalibratedModel, Dict[str, torch.Tensor]]:
    """A tiny ViT with a TST head (a head method: the base's classifier replaced)."""
    base, data, processor = tm.make_base("vit", seed=4, n=48)
    calibrated = tm.fit(base, data, "tst", preprocessor=processor, seed=0, latent_dim=8)
    return calibrated, tm.batch_of(tm.image_data(base, 8, seed=5))


def _plain_temperature() -> Tuple[CalibratedModel, Dict[str, torch.Tensor]]:
    """A plain ``nn.Module`` with temperature scaling: the base is not saved, the loader passes it."""
    base = tm.plain_module(seed=0)
    generator = torch.Generator().manual_seed(6)
    features = torch.randn(72, 6, generator=generator)
    with torch.no_grad():
        labels = torch.multinomial(torch.softmax(3 * base(features), dim=1), 1, generator=generator).squeeze(1)
    calibrated = tm.fit(base, TensorDataset(features[:64], labels[:64]), "temperature", seed=0)
    return calibrated, {"x": features[64:]}


def _softmax_module() -> nn.Module:
    """:func:`tm.plain_module` ending in a softmax: its outputs are probabilities."""
    return nn.Sequential(tm.plain_module(seed=0), nn.Softmax(dim=1)).eval()


def _softmax_vector() -> Tuple[CalibratedModel, Dict[str, torch.Tensor]]:
    """A plain module ending in a softmax with vector scaling (format 3: the calibration reads the log of its
    probabilities, ``input_contract.outputs``; vector's map is not invariant to that log's per-row constant)."""
    base = _softmax_module()
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(72, 6, generator=generator)
    with torch.no_grad():
        labels = torch.multinomial(base(features) ** 3, 1, generator=generator).squeeze(1)
    calibrated = tm.fit(base, TensorDataset(features[:64], labels[:64]), "vector", seed=0)
    return calibrated, {"x": features[64:]}


#: name -> (build the calibrated model and its input batch, the base to pass when loading or None)
CASES: Dict[str, Tuple[Callable[[], Tuple[CalibratedModel, Dict[str, torch.Tensor]]], Optional[Callable[[], nn.Module]]]] = {
    "vit_neural_clamping": (_vit_neural_clamping, None),
    "vit_tst": (_vit_tst, None),
    "plain_temperature": (_plain_temperature, lambda: tm.plain_module(seed=0)),
    "softmax_vector": (_softmax_vector, _softmax_module),
}


def _logits(model: nn.Module, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    """(N, C) calibrated logits of ``inputs`` (keywords; a plain module's single tensor under ``x``)."""
    with torch.no_grad():
        output = model(inputs["x"]) if set(inputs) == {"x"} else model(**inputs)
    return getattr(output, "logits", output).contiguous()


def _load(name: str) -> CalibratedModel:
    base = CASES[name][1]
    return CalibratedModel.from_pretrained(ARTIFACTS / name, base_model=base() if base is not None else None)


def _record(folder: Path) -> Dict[str, Any]:
    record = json.loads((folder / "calibration_config.json").read_text(encoding="utf-8"))
    return {key: value for key, value in record.items() if key not in VERSIONED_KEYS}


@pytest.mark.parametrize("name", list(CASES))
def test_saved_artifact_gives_the_stored_logits(name: str) -> None:
    expected = load_file(str(ARTIFACTS / name / EXPECTED))
    inputs = {key.split("/", 1)[1]: value for key, value in expected.items() if key.startswith("input/")}
    with tm.torch_threads(1):
        logits = _logits(_load(name), inputs)
    assert logits.dtype == expected["logits"].dtype
    # Float rounding differs between CPUs (the ViT's attention kernels pick other vector paths), so not bit for bit:
    # a changed δ, T or head moves these logits by orders of magnitude more than 1e-5.
    torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_saved_artifact_record_round_trips(name: str, tmp_path: Path) -> None:
    folder = ARTIFACTS / name
    model = _load(name)
    saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert model.config.calibration_method == saved["calibration_method"] == _record(folder)["method"]
    assert {str(k): v for k, v in model.config.id2label.items()} == saved["id2label"]
    assert model.last_evaluation is None or model.last_evaluation["reliability"] == _record(folder)["evaluation"]["reliability"]
    again = model.save_pretrained(tmp_path / name)
    new, old = _record(again), _record(folder)
    # a save records every file's SHA-256 (older saves recorded only the calibration weights'): the same for those, bar
    # what is drawn from the record — the card, whose usage snippet names the folder it was saved to (a plain module's
    # is loaded by path), and the diagram, whose bins are compared above and whose style may change between versions
    new_digests, old_digests = (record.pop("files")["sha256"] for record in (new, old))
    assert new_digests.keys() >= old_digests.keys()
    drawn = {"README.md", "reliability_diagram.png"}
    assert {name: digest for name, digest in new_digests.items() if name in old_digests and name not in drawn} == {
        name: digest for name, digest in old_digests.items() if name not in drawn}
    assert new == old
    for file in TENSOR_FILES:
        assert (folder / file).exists() == (again / file).exists(), file
        if (folder / file).exists():
            assert (folder / file).read_bytes() == (again / file).read_bytes(), file


def regenerate(names: Optional[list] = None) -> None:
    """Save every case (or ``names``) into ``tests/serialization/artifacts/<name>/`` with its expected logits, replacing what is there."""
    for name in names or list(CASES):
        with tm.torch_threads(1):
            model, inputs = CASES[name][0]()
            logits = _logits(model, inputs)
        folder = ARTIFACTS / name
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.chdir(ARTIFACTS):  # the card's usage snippet names the folder, not this machine's path
            model.save_pretrained(name)
        tensors = {f"input/{key}": value.contiguous() for key, value in inputs.items()}
        save_file({**tensors, "logits": logits}, str(folder / EXPECTED), metadata={"format": "pt"})


if __name__ == "__main__":
    regenerate(sys.argv[1:] or None)
