"""In-sample honesty for ``datasets`` data: rows derived from the calibration data are recognised as its rows.

The probe: ``evaluate(cal.select(range(100)))``, ``evaluate(cal.shuffle(seed=3))`` and
``evaluate(cal.to_iterable_dataset())`` reported ``in_sample=False`` although every row was calibration data.
"""

from __future__ import annotations

import datasets
import pytest
import torch
from torch import nn

from hf_calibrate import CalibratedModel
from hf_calibrate.data.lineage import holds_rows_of

ROWS = 120


def _table(seed: int) -> datasets.Dataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(ROWS, 6, generator=generator)
    return datasets.Dataset.from_dict({"input": inputs.tolist(), "labels": torch.randint(0, 4, (ROWS,), generator=generator).tolist()})


@pytest.fixture(scope="module")
def calibration() -> datasets.Dataset:
    return _table(0)


DERIVED = {
    "select(range(100))": lambda cal: cal.select(range(100)),
    "select of the last rows": lambda cal: cal.select(range(ROWS - 30, ROWS)),
    "shuffle(seed=3)": lambda cal: cal.shuffle(seed=3),
    "filter": lambda cal: cal.filter(lambda row: row["labels"] == 1),
    "with_format('torch')": lambda cal: cal.with_format("torch"),
    "rename_column": lambda cal: cal.rename_column("input", "inputs"),
    "select of repeated rows": lambda cal: cal.select([7, 7, 7]),
    "to_iterable_dataset()": lambda cal: cal.to_iterable_dataset(),
    "to_iterable_dataset(num_shards=4).shuffle": lambda cal: cal.to_iterable_dataset(num_shards=4).shuffle(seed=1, buffer_size=8),
}


@pytest.mark.parametrize("derive", DERIVED.values(), ids=DERIVED.keys())
def test_data_derived_from_the_calibration_data_hold_its_rows(calibration, derive):
    assert holds_rows_of(derive(calibration), [calibration]) is True


def test_other_rows_are_not_taken_for_calibration_rows(calibration):
    """Disjoint parts of one table (train_test_split) and an equal table elsewhere in memory are not in-sample."""
    halves = calibration.train_test_split(test_size=0.25, seed=0)
    assert holds_rows_of(halves["test"], [halves["train"]]) is False
    assert holds_rows_of(halves["test"].shuffle(seed=1).to_iterable_dataset(), [halves["train"]]) is False
    assert holds_rows_of(halves["train"].select(range(5)), [halves["train"]]) is True
    assert holds_rows_of(_table(0), [calibration]) is False  # same values, other memory: another dataset
    assert holds_rows_of(calibration, [None]) is False  # the fit's data object is gone: nothing to compare


@pytest.mark.parametrize("derive", [lambda it: it.skip(10), lambda it: it.map(lambda row: row), lambda it: it.take(5)],
                         ids=["skip", "map", "take"])
def test_streams_whose_rows_cannot_be_traced_are_unknown_not_held_out(calibration, derive):
    assert holds_rows_of(derive(calibration.to_iterable_dataset()), [calibration]) is None


@pytest.fixture(scope="module")
def calibrated(calibration) -> CalibratedModel:
    torch.manual_seed(0)
    return CalibratedModel.fit(nn.Linear(6, 4).eval(), calibration, method="temperature", progress=False)


@pytest.mark.parametrize("derive", [DERIVED["select(range(100))"], DERIVED["shuffle(seed=3)"], DERIVED["to_iterable_dataset()"]],
                         ids=["select", "shuffle", "to_iterable_dataset"])
def test_evaluate_reports_derived_calibration_data_as_in_sample(calibrated, calibration, derive):
    """The probe's three cases, through evaluate: in_sample is True."""
    assert calibrated.evaluate(derive(calibration), bootstrap=0, progress=False)["in_sample"] is True


def test_evaluate_says_unknown_where_it_cannot_know(calibrated, calibration):
    """A stream whose rows cannot be traced: in_sample is None (unknown), and the CLI's label says so."""
    from hf_calibrate.reporting import evaluation_label

    result = calibrated.evaluate(calibration.to_iterable_dataset().skip(60), bootstrap=0, progress=False)
    assert result["in_sample"] is None
    assert evaluation_label(result).endswith("(whether these are data the calibration was fitted on is unknown)")
    held_out = calibrated.evaluate(_table(1), bootstrap=0, progress=False)
    assert held_out["in_sample"] is False
