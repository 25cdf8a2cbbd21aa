"""In-sample honesty for ``datasets`` data: rows derived from the calibration data are recognised as its rows.

The probe: ``evaluate(cal.select(range(100)))``, ``evaluate(cal.shuffle(seed=3))`` and
``evaluate(cal.to_iterable_dataset())`` hold nothing but calibration rows, so each must report ``in_sample=True``
rather than pass for held-out data; so must rows copied by ``map``. Rows that cannot be compared are unknown (None),
never a confident False, and data holding some calibration rows say how many.
"""

from __future__ import annotations

from typing import Any, Tuple

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

from hf_calibrate import CalibratedModel
from hf_calibrate.data.calibration_rows import CalibrationRows
from hf_calibrate.data.lineage import holds_rows_of, row_digests, shared_rows
from hf_calibrate.results.reporting import evaluation_label

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
    "map adding a column": lambda cal: cal.map(lambda row: {"weight": 1.0}),
    "map(identity)": lambda cal: cal.map(lambda row: row),
    "the same rows built again": lambda cal: datasets.Dataset.from_pandas(cal.to_pandas()),
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
    assert holds_rows_of(calibration, [None]) is None  # the fit's data object is gone: nothing to compare, so unknown


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
    from hf_calibrate.results.reporting import evaluation_label

    result = calibrated.evaluate(calibration.to_iterable_dataset().skip(60), bootstrap=0, progress=False)
    assert result["in_sample"] is None
    assert evaluation_label(result).endswith("(in-sample not checked: whether these are data the calibration was fitted on is unknown)")
    held_out = calibrated.evaluate(_table(1), bootstrap=0, progress=False)
    assert held_out["in_sample"] is False


def _rows(data) -> int:
    return ROWS if isinstance(data, datasets.IterableDataset) else len(data)


USERS_DERIVE = {name: DERIVED[name] for name in ("select(range(100))", "shuffle(seed=3)", "to_iterable_dataset()", "filter",
                                                  "map adding a column", "map(identity)", "the same rows built again")}


@pytest.mark.parametrize("derive", USERS_DERIVE.values(), ids=USERS_DERIVE.keys())
def test_evaluate_counts_every_row_of_data_derived_from_the_calibration_data(calibrated, calibration, derive):
    """Every row is a calibration row, however the user derived the data (``map`` copies the rows: compared by
    content): in_sample is True and in_sample_rows counts them all."""
    data = derive(calibration)
    result = calibrated.evaluate(data, bootstrap=0, progress=False)
    assert result["in_sample"] is True
    assert result["in_sample_rows"] == {"calibration": _rows(data), "total": _rows(data)} == {
        "calibration": result["calibrated"]["num_samples"], "total": result["calibrated"]["num_samples"]}


def test_evaluate_says_how_many_rows_of_partly_in_sample_data_are_calibration_rows(calibrated, calibration):
    """30 calibration rows among 150: in-sample, with the count, and the label says 'partly'."""
    mixed = datasets.concatenate_datasets([_table(1), calibration.select(range(90, 120))]).shuffle(seed=0)
    result = calibrated.evaluate(mixed, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (True, {"calibration": 30, "total": ROWS + 30})
    assert evaluation_label(result).endswith(f"(partly in-sample: 30 of {ROWS + 30} rows are data the calibration was "
                                             "fitted on, so optimistic)")


def test_a_genuinely_different_test_set_is_held_out(calibration):
    """The held-out part of a train_test_split, and other rows of the same shape, say False (with no count)."""
    halves = calibration.train_test_split(test_size=0.25, seed=0)
    torch.manual_seed(0)
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), halves["train"], method="temperature", progress=False)
    for held_out in (halves["test"], halves["test"].map(lambda row: {"weight": 1.0}), _table(1)):
        result = model.evaluate(held_out, bootstrap=0, progress=False)
        assert (result["in_sample"], result["in_sample_rows"]) == (False, None)
    assert model.evaluate(halves["train"].select(range(10)), bootstrap=0, progress=False)["in_sample_rows"] == {
        "calibration": 10, "total": 10}


def test_a_copy_whose_inputs_changed_type_is_unknown_not_held_out(calibrated, calibration):
    """A copy whose inputs changed type (float64 → float32) shares no memory and no column of comparable content
    with the calibration data: whether its rows are calibration rows is unknown (None), not False."""
    cast = calibration.cast_column("input", datasets.Sequence(datasets.Value("float32")))
    result = calibrated.evaluate(cast, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (None, None)


# ----------------------------------------------------------------------------- content digests


def _layouts() -> datasets.Dataset:
    """Rows in every Arrow layout ``datasets`` writes: nested lists, fixed-size arrays, strings, bytes, images
    (structs of bytes and path), booleans, class labels and nulls."""
    features = datasets.Features({
        "nested": datasets.Sequence(datasets.Sequence(datasets.Value("float32"))),
        "grid": datasets.Array2D((2, 2), "int32"), "text": datasets.Value("string"), "blob": datasets.Value("binary"),
        "image": datasets.Image(), "flag": datasets.Value("bool"), "label": datasets.ClassLabel(names=["a", "b"]),
        "maybe": datasets.Value("int64"),
    })
    rows = [{"nested": [[float(i), 0.5]] * (i % 3), "grid": [[i, 1], [2, i]], "text": "x" * i, "blob": bytes([i]) * i,
             "image": {"bytes": bytes([i, 7]), "path": None}, "flag": i % 2 == 0, "label": i % 2,
             "maybe": None if i % 4 == 0 else i} for i in range(12)]
    return datasets.Dataset.from_list(rows, features=features)


def test_row_digests_are_the_same_for_the_same_rows_in_any_layout_and_differ_otherwise():
    """A row's digest depends on its content only: the same for the row selected, shuffled, copied by map or sliced
    out of another chunk; distinct rows have distinct digests, and changing one value changes that row's only."""
    data = _layouts()
    columns = tuple(sorted(data.column_names))
    digests = row_digests(data, columns)
    assert digests.shape == (12,) and len(set(digests.tolist())) == 12
    order = [5, 0, 11, 5]
    assert row_digests(data.select(order), columns).tolist() == digests[order].tolist()
    assert row_digests(data.map(lambda row: row), columns).tolist() == digests.tolist()
    chunked = datasets.Dataset(pa.concat_tables([data.data.table.slice(0, 5), data.data.table.slice(5)]), info=data.info)
    assert row_digests(chunked, columns).tolist() == digests.tolist()
    changed = row_digests(data.map(lambda row, i: {"text": "changed" if i == 3 else row["text"]}, with_indices=True), columns)
    assert np.flatnonzero(changed != digests).tolist() == [3]


def test_shared_rows_count_rows_by_memory_and_by_content(calibration):
    """A renamed column shares memory (no content comparison: the columns differ); a copy shares content; a stream
    that cannot be traced cannot be counted."""
    assert shared_rows(calibration.rename_column("input", "inputs").select(range(7)), [calibration]) == (7, 7)
    assert shared_rows(calibration.map(lambda row: row).select(range(40, 50)), [calibration]) == (10, 10)
    assert shared_rows(_table(1), [calibration]) == (0, ROWS)
    assert shared_rows(calibration.to_iterable_dataset().skip(3), [calibration]) is None


def test_rows_of_calibration_data_passed_inline_are_known_after_the_object_is_gone():
    """``fit(model, full.select(range(80)))``: the selected dataset is gone after the fit, but its rows' digests were
    kept, so data holding them still count as in-sample (and other rows of the same table do not)."""
    import gc

    full = _table(2)
    torch.manual_seed(0)
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), full.select(range(80)), method="temperature", progress=False)
    gc.collect()
    assert all(reference() is None for reference in model.calibration_rows.objects)
    result = model.evaluate(full, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (True, {"calibration": 80, "total": ROWS})
    assert model.evaluate(full.select(range(80, ROWS)), bootstrap=0, progress=False)["in_sample"] is False


def test_a_loaders_sampler_decides_which_rows_are_read_and_counted():
    """A DataLoader with a SubsetRandomSampler reads only that part (fit and evaluate), and its rows are counted as
    calibration rows by what the sampler reads; a sampler drawing with replacement is refused with the fix."""
    from torch.utils.data import DataLoader, SubsetRandomSampler, WeightedRandomSampler

    from hf_calibrate._errors import UserError

    full = _table(3).with_format("torch")
    torch.manual_seed(0)
    part = DataLoader(full, batch_size=16, sampler=SubsetRandomSampler(range(0, 60)))
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), part, method="temperature", progress=False)
    assert model.provenance["num_samples"] == 60
    other = model.evaluate(DataLoader(full, batch_size=16, sampler=SubsetRandomSampler(range(40, 100))), bootstrap=0, progress=False)
    assert other["calibrated"]["num_samples"] == 60
    assert (other["in_sample"], other["in_sample_rows"]) == (True, {"calibration": 20, "total": 60})
    with pytest.raises(UserError, match="WeightedRandomSampler draws samples with replacement"):
        model.evaluate(DataLoader(full, batch_size=16, sampler=WeightedRandomSampler([1.0] * ROWS, ROWS)), bootstrap=0)


def _tensor_loader_model(**loader_options: Any) -> Tuple[CalibratedModel, Any]:
    """(a TS fit on ``DataLoader(TensorDataset of 200 rows, **loader_options)``, that loader)."""
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    rows = TensorDataset(torch.randn(200, 6, generator=generator), torch.randint(0, 4, (200,), generator=generator))
    loader = DataLoader(rows, **loader_options)
    torch.manual_seed(0)
    return CalibratedModel.fit(nn.Linear(6, 4).eval(), loader, method="temperature", progress=False), loader


def test_a_batch_sampler_over_part_of_the_rows_is_read_as_that_part():
    """A ``batch_sampler`` over the first 100 of 200 rows: the fit and the evaluation read those 100 rows, not all 200
    (the other rows may be the user's test rows)."""
    from torch.utils.data import BatchSampler, SequentialSampler

    model, loader = _tensor_loader_model(batch_sampler=BatchSampler(SequentialSampler(range(100)), 10, False))
    assert sum(len(labels) for _, labels in loader) == 100
    assert model.fit_summary["fit_samples"] == 100
    assert model.evaluate(loader, bootstrap=0, progress=False)["calibrated"]["num_samples"] == 100


def test_the_very_loader_given_to_fit_is_in_sample():
    """A loader whose sampler reads part of its dataset, evaluated after the fit: in-sample, all its rows (the Subset it
    stands for is a new object at each read, so the loader itself is what the fit remembers)."""
    from torch.utils.data import SubsetRandomSampler

    model, loader = _tensor_loader_model(sampler=SubsetRandomSampler(range(100)))
    result = model.evaluate(loader, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (True, {"calibration": 100, "total": 100})


def test_rows_that_cannot_be_compared_are_unknown_not_held_out():
    """Torch data other than tensors have no row digests, and a model whose calibration rows are not kept (loaded from
    a record without them) has none to compare with: whether they are calibration rows is unknown (None), never a
    confident False. Tensor rows are compared by content."""
    from torch.utils.data import DataLoader, SubsetRandomSampler

    model, loader = _tensor_loader_model(sampler=SubsetRandomSampler(range(100)))
    other = DataLoader(loader.dataset, sampler=SubsetRandomSampler(range(100, 200)))
    assert model.evaluate(other, bootstrap=0, progress=False)["in_sample"] is False  # tensor rows: by content
    samples = [(features, label) for features, label in loader.dataset]  # a list of samples: no digests
    assert model.evaluate(samples, bootstrap=0, progress=False)["in_sample"] is None
    table = _table(5)
    fitted = CalibratedModel.fit(nn.Linear(6, 4).eval(), table.select(range(60)), method="temperature", progress=False)
    assert fitted.fitted_on(table.select(range(60, ROWS))) is False
    fitted.calibration_rows = CalibrationRows()  # what a model loaded from a record without row digests holds
    assert fitted.fitted_on(table.select(range(60, ROWS))) is None


@pytest.mark.parametrize("draws", [200, 40])
def test_a_weighted_sampler_without_replacement_is_read_as_one_draw(draws):
    """``WeightedRandomSampler(replacement=False)`` yields each row once: accepted, as the rows of one draw, which
    leaves the random state as it was (the user's next epoch draws the same rows)."""
    from torch.utils.data import WeightedRandomSampler

    sampler = WeightedRandomSampler(torch.linspace(1, 2, 200), draws, replacement=False)
    model, loader = _tensor_loader_model(sampler=sampler, batch_size=16)
    assert model.fit_summary["fit_samples"] == draws
    state = torch.get_rng_state()
    result = model.evaluate(loader, bootstrap=0, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert (result["calibrated"]["num_samples"], result["in_sample"]) == (draws, True)


def test_a_sampler_yielding_a_row_twice_is_refused():
    from hf_calibrate._errors import UserError

    with pytest.raises(UserError, match=r"yields some samples more than once \(4 draws of 2 samples\).*yields each sample once"):
        _tensor_loader_model(sampler=[0, 1, 0, 1])


def test_tensor_rows_are_compared_by_content():
    """A TensorDataset's rows: the same values in a new tensor are calibration rows, a changed row is not, another
    dtype cannot be compared (unknown); in-place changes to the fitted tensors are seen."""
    from torch.utils.data import Subset, TensorDataset

    generator = torch.Generator().manual_seed(4)
    inputs, labels = torch.randn(120, 6, generator=generator), torch.randint(0, 4, (120,), generator=generator)
    fitted = TensorDataset(inputs, labels)
    copy = TensorDataset(inputs.clone(), labels.clone())
    copy.tensors[0][:10] += 1.0
    assert shared_rows(copy, [fitted]) == (110, 120)
    assert shared_rows(Subset(copy, range(30)), [fitted]) == (20, 30)
    assert shared_rows(TensorDataset(inputs.double(), labels), [fitted]) is None
    inputs[:60] = 0.0  # the fitted rows changed in place
    assert shared_rows(copy, [fitted]) == (60, 120)  # rows 60-119 only (stale digests would say 110)


def test_rows_split_twice_are_known_and_a_users_own_subset_class_is_no_torch_subset():
    """``random_split`` of a ``random_split`` of a TensorDataset: its rows are counted through both index maps; a user
    class that happens to be named ``Subset`` is data like any other (it used to break the digests)."""
    from torch.utils.data import Dataset, TensorDataset, random_split

    generator = torch.Generator().manual_seed(2)
    rows = TensorDataset(torch.randn(200, 6, generator=generator), torch.randint(0, 4, (200,), generator=generator))
    outer, _ = random_split(rows, [150, 50], generator=generator)
    calibration, held_out = random_split(outer, [100, 50], generator=generator)
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), calibration, method="temperature", progress=False)
    assert model.evaluate(rows, bootstrap=0, progress=False)["in_sample_rows"] == {"calibration": 100, "total": 200}
    assert model.evaluate(held_out, bootstrap=0, progress=False)["in_sample"] is False

    class Subset(Dataset):  # noqa: D401 - a user's class with torch's name
        def __len__(self) -> int:
            return 40

        def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
            return rows[index]

    assert model.evaluate(Subset(), bootstrap=0, progress=False)["in_sample"] is None


def test_a_gone_fitted_object_without_digests_leaves_its_rows_unknown_not_held_out():
    """Validation data without row digests (a list of samples), gone after the fit: data holding its rows are not
    claimed to be held out (None), before and after a save; the calibration rows are still known."""
    import gc

    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(6)
    inputs, labels = torch.randn(160, 6, generator=generator), torch.randint(0, 4, (160,), generator=generator)
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), TensorDataset(inputs[:100], labels[:100]), method="neural_clamping",
                                validation_data=[(inputs[index], labels[index]) for index in range(100, 160)],
                                epochs=1, progress=False)
    gc.collect()
    assert model.evaluate(TensorDataset(inputs[100:], labels[100:]), bootstrap=0, progress=False)["in_sample"] is None
    assert model.evaluate(TensorDataset(inputs[:10], labels[:10]), bootstrap=0, progress=False)["in_sample"] is True
    assert model.calibration_rows.kept()[1] is None  # nothing to save: a partial set of digests would say False for those rows


def test_in_sample_false_over_calibration_rows_is_kept_but_warned_about():
    """``in_sample=False`` overrides, as documented, but not silently when the rows show otherwise."""
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(8)
    rows = TensorDataset(torch.randn(80, 6, generator=generator), torch.randint(0, 4, (80,), generator=generator))
    model = CalibratedModel.fit(nn.Linear(6, 4).eval(), rows, method="temperature", progress=False)
    with pytest.warns(UserWarning, match=r"in_sample=False was given, but these data hold rows the calibration was "
                                         r"fitted on \(80 of 80\)"):
        result = model.evaluate(rows, in_sample=False, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (False, None)
