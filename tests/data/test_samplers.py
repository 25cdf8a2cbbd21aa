"""A ``DataLoader`` is read as the samples one pass of it yields, whatever picks them.

Each case fits temperature scaling through a loader over 200 rows and compares it with the fit on exactly the rows one
pass of the loader yields (a ``Subset``): the same temperature, bit for bit, and the same count. Samplers that draw with
replacement, or yield a row twice, are refused naming the fix. Random samplers draw from their own generator here, which
the fit leaves as it found it, so one pass after the fit yields what the fit read.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, RandomSampler, SequentialSampler, Subset, SubsetRandomSampler,
                              TensorDataset, WeightedRandomSampler)

from hf_calibrate import CalibratedModel
from hf_calibrate._errors import UserError
from hf_calibrate.data.mapped import loader_dataset

ROWS = 200


def _rows() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(ROWS, 4, generator=generator)
    labels = torch.where(torch.rand(ROWS, generator=generator) < 0.7, logits.argmax(1), torch.randint(0, 4, (ROWS,), generator=generator))
    return TensorDataset(logits, labels)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(1)


#: case → the loader's keyword arguments over the dataset
READ: Dict[str, Callable[[Any], Dict[str, Any]]] = {
    "batch_sampler over the first 100 rows": lambda rows: dict(batch_sampler=BatchSampler(SequentialSampler(range(100)), 16, False)),
    "batch_sampler over every row, drop_last (not applied)": lambda rows: dict(batch_sampler=BatchSampler(SequentialSampler(rows), 16, True)),
    "batch_sampler over a shuffled subset": lambda rows: dict(batch_sampler=BatchSampler(SubsetRandomSampler(range(50, 150), _generator()), 8, False)),
    "SubsetRandomSampler": lambda rows: dict(batch_size=16, sampler=SubsetRandomSampler(range(0, ROWS, 3), _generator())),
    "RandomSampler of 60 rows without replacement": lambda rows: dict(batch_size=16, sampler=RandomSampler(rows, num_samples=60, generator=_generator())),
    "WeightedRandomSampler without replacement, every row": lambda rows: dict(batch_size=16, sampler=WeightedRandomSampler(torch.linspace(1, 3, ROWS), ROWS, replacement=False, generator=_generator())),
    "WeightedRandomSampler without replacement, 80 rows": lambda rows: dict(batch_size=16, sampler=WeightedRandomSampler(torch.linspace(1, 3, ROWS), 80, replacement=False, generator=_generator())),
    "a list of indices as sampler": lambda rows: dict(batch_size=16, sampler=[5, 3, 190, 7, 11, 60, 61, 62, 99, 100]),
}
#: case → (the loader's keyword arguments, what the refusal says)
REFUSED = {
    "WeightedRandomSampler with replacement": (lambda rows: dict(batch_size=16, sampler=WeightedRandomSampler(torch.ones(ROWS), ROWS)),
                                               "WeightedRandomSampler draws samples with replacement"),
    "RandomSampler with replacement": (lambda rows: dict(batch_size=16, sampler=RandomSampler(rows, replacement=True)),
                                       "RandomSampler draws samples with replacement"),
    "a batch_sampler repeating rows": (lambda rows: dict(batch_sampler=[[0, 1, 2], [2, 3, 4]]),
                                       r"yields some samples more than once \(6 draws of 5 samples\)"),
}


def _one_pass(loader: DataLoader) -> List[int]:
    """The rows one pass of ``loader`` yields, but for ``drop_last`` (documented: calibration uses every sample)."""
    batches = loader.batch_sampler
    drawn = batches.sampler if isinstance(batches, BatchSampler) else batches
    return [int(index) for item in drawn for index in (item if isinstance(item, list) else [item])]


def _fit(data: Any) -> CalibratedModel:
    return CalibratedModel.fit(nn.Identity(), data, method="temperature", progress=False)


@pytest.mark.parametrize("case", READ.keys())
def test_a_loader_is_read_as_the_rows_one_pass_yields(case):
    rows = _rows()
    loader = DataLoader(rows, **READ[case](rows))
    model = _fit(loader)
    yielded = _one_pass(loader)
    expected = _fit(Subset(rows, sorted(yielded)))
    assert model.fit_summary["fit_samples"] == len(set(yielded))
    assert torch.equal(model.calibrator.temperature, expected.calibrator.temperature)
    assert model.evaluate(loader, bootstrap=0, progress=False)["in_sample"] is True


@pytest.mark.parametrize("case", REFUSED.keys())
def test_a_loader_that_would_read_a_row_twice_is_refused(case):
    loader_options, said = REFUSED[case]
    rows = _rows()
    with pytest.raises(UserError, match=f"{said}.*calibration reads each sample once"):
        _fit(DataLoader(rows, **loader_options(rows)))


class PythonRandomSubset(torch.utils.data.Sampler):
    """A custom sampler drawing 60 of the rows from Python's ``random`` at each pass (no torch generator to restore)."""

    def __len__(self) -> int:
        return 60

    def __iter__(self):
        import random

        return iter(random.sample(range(ROWS), 60))


class Endless(torch.utils.data.Sampler):
    def __len__(self) -> int:
        return 10

    def __iter__(self):
        index = 0
        while True:
            yield index % ROWS
            index += 1


def test_a_custom_random_sampler_is_drawn_once_so_the_rows_read_are_the_rows_named():
    """A sampler drawing from Python's ``random``: the fit reads one draw, and the same loader evaluated afterwards is
    those very rows (all in-sample); the other rows are held out; the user's random states are as they were."""
    import random

    rows = _rows()
    loader = DataLoader(rows, batch_size=16, sampler=PythonRandomSubset())
    random.seed(3)
    python_state, torch_state = random.getstate(), torch.get_rng_state()
    model = _fit(loader)
    assert random.getstate() == python_state and torch.equal(torch.get_rng_state(), torch_state)
    read = sorted(int(index) for index in loader_dataset(loader).indices)
    assert model.fit_summary["fit_samples"] == len(read) == 60
    assert torch.equal(model.calibrator.temperature, _fit(Subset(rows, read)).calibrator.temperature)
    result = model.evaluate(loader, bootstrap=0, progress=False)
    assert (result["in_sample"], result["in_sample_rows"]) == (True, {"calibration": 60, "total": 60})
    others = Subset(rows, sorted(set(range(ROWS)) - set(read)))
    assert model.evaluate(others, bootstrap=0, progress=False)["in_sample"] is False


def test_a_shuffling_loader_leaves_its_generator_and_the_global_one_as_they_were():
    rows, generator = _rows(), torch.Generator().manual_seed(5)
    loader = DataLoader(rows, batch_size=16, shuffle=True, generator=generator)
    states = generator.get_state(), torch.get_rng_state()
    model = _fit(loader)
    model.evaluate(loader, bootstrap=0, progress=False)
    assert torch.equal(generator.get_state(), states[0]) and torch.equal(torch.get_rng_state(), states[1])


@pytest.mark.parametrize("batches", [[torch.tensor([0, 1, 2]), torch.tensor([7, 8])], [range(0, 5), range(10, 12)],
                                     [np.array([3, 4]), np.array([[5, 6]])]], ids=["tensors", "ranges", "arrays"])
def test_a_batch_sampler_may_yield_index_tensors_arrays_or_ranges(batches):
    rows = _rows()
    loader = DataLoader(rows, batch_sampler=batches)
    expected = sorted(int(index) for batch in batches for index in np.asarray(list(batch)).reshape(-1))
    assert model_rows(_fit(loader)) == len(expected)
    assert [int(index) for index in loader_dataset(loader).indices] == expected


def model_rows(model: CalibratedModel) -> int:
    return model.fit_summary["fit_samples"]


def test_a_sampler_yielding_more_than_its_len_is_refused_not_read_forever():
    with pytest.raises(UserError, match=r"Endless yields more than the 10 items its len\(\) says: it may never end"):
        _fit(DataLoader(_rows(), batch_size=4, sampler=Endless()))
