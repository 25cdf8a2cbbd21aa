"""A loaded model knows its calibration rows: the record keeps a 16-byte digest of each row of
``datasets`` or tensor calibration data (``fit.calibration_rows``), and ``evaluate`` of the loaded model counts the evaluated rows
among them as the fitted model does. What cannot be compared is unknown (None), never a confident False; a save with
``row_digests=False`` keeps none; a malformed entry is refused on load like any broken record.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Dict, Optional

import datasets
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import hf_calibrate.serialization as serialization
from hf_calibrate import CalibratedModel
from hf_calibrate.serialization import ArtifactError
from hf_calibrate.serialization.row_digests import MAX_SAVED_ROWS

ROWS, FITTED = 300, 200
CONFIG = "calibration_config.json"


def _table() -> datasets.Dataset:
    generator = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(ROWS, 6, generator=generator), torch.randint(0, 4, (ROWS,), generator=generator)
    return datasets.Dataset.from_dict({"input": inputs.tolist(), "labels": labels.tolist()})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Dict[str, Any]:
    """A TS fit on the first 200 rows of a 300-row table, saved with and without its row digests."""
    table, base = _table(), nn.Linear(6, 4).eval()
    model = CalibratedModel.fit(base, table.select(range(FITTED)), method="temperature", progress=False)
    root = tmp_path_factory.mktemp("saved")
    model.save_pretrained(root / "with")
    model.save_pretrained(root / "without", row_digests=False)
    return {"table": table, "base": base, "with": root / "with", "without": root / "without"}


#: evaluated data, from the full table → (in_sample, in_sample_rows) the loaded model says
CASES: Dict[str, tuple] = {
    "the calibration rows": (lambda table: table.select(range(FITTED)), (True, {"calibration": FITTED, "total": FITTED})),
    "partly calibration rows": (lambda table: table.select(range(180, ROWS)), (True, {"calibration": 20, "total": 120})),
    "other rows of the table": (lambda table: table.select(range(FITTED, ROWS)), (False, None)),
    "the calibration rows rebuilt": (lambda table: datasets.Dataset.from_pandas(table.select(range(50)).to_pandas()),
                                     (True, {"calibration": 50, "total": 50})),
    "a column added by map": (lambda table: table.map(lambda row: {"weight": 1.0}), (True, {"calibration": FITTED, "total": ROWS})),
    "a column cast to another type": (lambda table: table.cast_column("labels", datasets.Value("int32")), (None, None)),
    "torch tensors of the same rows": (lambda table: TensorDataset(torch.tensor(table["input"]), torch.tensor(table["labels"])),
                                       (None, None)),
}


@pytest.mark.parametrize("case", CASES.keys())
def test_a_loaded_model_knows_its_calibration_rows(saved, case):
    derive, expected = CASES[case]
    loaded = CalibratedModel.from_pretrained(saved["with"], base_model=saved["base"])
    result = loaded.evaluate(derive(saved["table"]), bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == expected


def test_a_save_without_row_digests_leaves_whether_in_sample_unknown(saved):
    record = json.loads((saved["without"] / CONFIG).read_text())
    assert "calibration_rows" not in record["fit"]
    loaded = CalibratedModel.from_pretrained(saved["without"], base_model=saved["base"])
    assert loaded.evaluate(saved["table"].select(range(FITTED, ROWS)), bootstrap=0, progress=False)["in_sample"] is None


def test_a_loaded_model_saved_again_keeps_its_row_digests(saved, tmp_path):
    loaded = CalibratedModel.from_pretrained(saved["with"], base_model=saved["base"])
    loaded.save_pretrained(tmp_path / "again")
    kept = lambda folder: json.loads((folder / CONFIG).read_text())["fit"]["calibration_rows"]  # noqa: E731
    assert kept(tmp_path / "again") == kept(saved["with"])
    assert "calibration_rows" not in loaded.provenance


def _digests(rows: int) -> str:
    return base64.b64encode(bytes(16 * rows)).decode("ascii")


BROKEN: Dict[str, Callable[[list], Optional[list]]] = {
    "not base64": lambda rows: [{**rows[0], "digests": "not base64!"}],
    "digests not a multiple of 16 bytes": lambda rows: [{**rows[0], "digests": base64.b64encode(bytes(17)).decode()}],
    "more rows than a record holds": lambda rows: [{**rows[0], "digests": _digests(MAX_SAVED_ROWS + 1)}],
    "an unknown key": lambda rows: [{**rows[0], "rows": 3}],
    "columns not pairs of strings": lambda rows: [{**rows[0], "columns": [["input", 3]]}],
    "not a list": lambda rows: rows[0],
}


@pytest.mark.parametrize("case", BROKEN.keys())
def test_malformed_row_digests_are_refused_naming_the_key(saved, tmp_path, case):
    folder = tmp_path / "broken"
    CalibratedModel.from_pretrained(saved["with"], base_model=saved["base"]).save_pretrained(folder)
    record = json.loads((folder / CONFIG).read_text())
    record["fit"]["calibration_rows"] = BROKEN[case](record["fit"]["calibration_rows"])
    (folder / CONFIG).write_text(json.dumps(serialization.seal_record(record)))
    with pytest.raises(ArtifactError, match=r"fit\.calibration_rows.*must be a list of at most 8 objects"):
        CalibratedModel.from_pretrained(folder, base_model=saved["base"])


def test_a_loaded_model_fitted_on_tensors_knows_its_tensor_rows(tmp_path):
    """Calibration rows of a TensorDataset are kept by content too: the loaded model counts them in other tensors."""
    generator = torch.Generator().manual_seed(1)
    inputs, labels = torch.randn(ROWS, 6, generator=generator), torch.randint(0, 4, (ROWS,), generator=generator)
    base = nn.Linear(6, 4).eval()
    CalibratedModel.fit(base, TensorDataset(inputs[:FITTED], labels[:FITTED]), method="temperature",
                        progress=False).save_pretrained(tmp_path / "model")
    loaded = CalibratedModel.from_pretrained(tmp_path / "model", base_model=base)
    result = loaded.evaluate(TensorDataset(inputs[150:].clone(), labels[150:].clone()), bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (True, {"calibration": 50, "total": 150})
    held_out = loaded.evaluate(TensorDataset(inputs[FITTED:], labels[FITTED:]), bootstrap=0, progress=False)
    assert held_out["in_sample"] is False
