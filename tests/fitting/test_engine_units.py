"""The engine's index plans, unit by unit (hf_calibrate/fitting/runtime/engine.py, hf_calibrate/data/streams/index.py).

Everything a fit reads is planned as dataset indices before any sample is loaded
(docs/design.md §3.0): the seeded hold-out split (``Engine.split_indices``), the global batches
of an epoch (``Engine.global_batches``, seeded shuffle, optionally within blocks), each
process's micro-batches of a global batch (``Engine.local_micro_batches``, through the data's
``local_share``: every W-th index for map-style data, the samples of its own units for a
stream) and the serving of a planned sequence of micro-batches from a stream's units
(``_Plan``). These tests check the properties those plans promise, in one process: several
processes are simulated by setting an engine's ``rank`` and ``world`` (the plans read nothing
else of the process group); real multi-process runs are tests/fitting/test_distributed_fit.py and
tests/data/test_data_forms_distributed.py.
"""

from __future__ import annotations

import copy
import functools
from typing import Dict, List, Sequence, Tuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from hf_calibrate.data import PreparedData, StreamedData, StreamIndex
from hf_calibrate.data.streams.index import _Plan
from hf_calibrate.fitting.runtime.engine import Engine, EngineOptions, steps_per_epoch

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: small tensors, one torch thread


@functools.lru_cache(maxsize=None)
def _cached_engine(batch_size: int, micro_batch_size: int | None, seed: int) -> Engine:
    return Engine(EngineOptions(batch_size=batch_size, micro_batch_size=micro_batch_size, seed=seed, progress=False))


def engine(batch_size: int = 1000, micro_batch_size: int | None = None, seed: int = 0, *, rank: int = 0, world: int = 1) -> Engine:
    """An engine of one process that plans as process ``rank`` of ``world`` would (a shallow copy: the cache stays clean)."""
    simulated = copy.copy(_cached_engine(batch_size, micro_batch_size, seed))
    simulated.rank, simulated.world = rank, world
    return simulated


def map_style(count: int) -> PreparedData:
    """``count`` samples whose input and label are their own dataset index."""
    indices = torch.arange(count)
    return PreparedData(TensorDataset(indices.float(), indices), collate=lambda items: items, description="indices")


def stream_of(unit_sizes: Sequence[int], owners: Sequence[int]) -> StreamedData:
    """An indexed stream of units of ``unit_sizes`` samples, unit u read by process ``owners[u]`` (nothing is read)."""
    data = StreamedData(source=None, to_batch=None, description="a stream")
    sizes = torch.tensor(list(unit_sizes), dtype=torch.int64)
    data.index = StreamIndex(keys=torch.arange(len(sizes)), starts=torch.cumsum(sizes, 0) - sizes, sizes=sizes,
                             owners=torch.tensor(list(owners), dtype=torch.int64), count=int(sizes.sum()))
    return data


def concatenated(batches: Sequence[torch.Tensor]) -> List[int]:
    return torch.cat(list(batches)).tolist() if batches else []


fractions = st.floats(min_value=0.01, max_value=0.99, allow_nan=False)


# ----------------------------------------------------------------------------- the hold-out split


@given(count=st.integers(2, 3000), fraction=fractions, seed=st.integers(0, 2**31))
def test_the_split_is_a_sorted_partition_of_the_configured_size(count: int, fraction: float, seed: int) -> None:
    holdout_size = round(fraction * count)  # Python's round: halves go to the even neighbour
    if not 1 <= holdout_size < count:
        with pytest.raises(ValueError, match=f"holdout_fraction={fraction} leaves"):
            engine(seed=seed).split_indices(count, fraction)
        return
    fit, holdout = engine(seed=seed).split_indices(count, fraction)
    assert fit.dtype == holdout.dtype == torch.int64
    assert len(holdout) == holdout_size and len(fit) == count - holdout_size
    assert sorted(fit.tolist() + holdout.tolist()) == list(range(count))  # disjoint, and covers every index
    assert fit.tolist() == sorted(fit.tolist()) and holdout.tolist() == sorted(holdout.tolist())


@pytest.mark.parametrize(("count", "fraction", "expected"), [(10, 0.25, 2), (5, 0.5, 2), (7, 0.5, 4), (10, 0.2, 2), (1000, 0.2, 200)])
def test_the_hold_out_size_rounds_half_to_even(count: int, fraction: float, expected: int) -> None:
    assert len(engine().split_indices(count, fraction)[1]) == expected


@given(count=st.integers(1, 500))
def test_fraction_zero_holds_nothing_out(count: int) -> None:
    fit, holdout = engine().split_indices(count, 0.0)
    assert fit.tolist() == list(range(count)) and holdout.numel() == 0


@given(count=st.integers(200, 3000), fraction=st.floats(0.1, 0.9), seed=st.integers(0, 2**31))
def test_the_split_depends_only_on_the_seed_not_on_the_process(count: int, fraction: float, seed: int) -> None:
    first = engine(seed=seed).split_indices(count, fraction)
    again = engine(batch_size=7, micro_batch_size=3, seed=seed, rank=2, world=3).split_indices(count, fraction)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = engine(seed=seed + 1).split_indices(count, fraction)
    assert not torch.equal(first[1], other[1])  # ≥ C(200, 20) possible hold-outs: two seeds that agree are a bug


def test_a_fraction_leaving_no_sample_on_either_side_is_refused() -> None:
    with pytest.raises(ValueError, match=r"holdout_fraction=0.01 leaves 10 of 10 samples to fit and 0 to select on"):
        engine().split_indices(10, 0.01)
    with pytest.raises(ValueError, match=r"leaves 0 of 10 samples to fit and 10 to select on"):
        engine().split_indices(10, 0.99)


# ----------------------------------------------------------------------------- global batches


@given(count=st.integers(1, 2000), batch_size=st.integers(1, 300), shuffle=st.booleans(), epoch=st.integers(0, 50),
       offset=st.integers(0, 100))
def test_an_epoch_is_every_index_once_in_full_batches_but_the_last(count: int, batch_size: int, shuffle: bool, epoch: int,
                                                                  offset: int) -> None:
    indices = torch.arange(offset, offset + count)
    batches = engine(batch_size).global_batches(indices, shuffle=shuffle, epoch=epoch)
    assert len(batches) == steps_per_epoch(count, batch_size)
    assert all(len(batch) == batch_size for batch in batches[:-1]) and 1 <= len(batches[-1]) <= batch_size
    order = concatenated(batches)
    assert sorted(order) == indices.tolist()  # each index exactly once
    if not shuffle:
        assert order == indices.tolist()


@given(count=st.integers(3, 2000), batch_size=st.integers(1, 300), world=st.integers(1, 8), epoch=st.integers(0, 50),
       seed=st.integers(0, 2**31))
def test_global_batches_are_the_same_for_any_number_of_processes(count: int, batch_size: int, world: int, epoch: int,
                                                               seed: int) -> None:
    if count < world:
        return
    indices = torch.arange(count)
    single = engine(batch_size, seed=seed).global_batches(indices, shuffle=True, epoch=epoch)
    for rank in {0, world - 1}:
        several = engine(batch_size, seed=seed, rank=rank, world=world).global_batches(indices, shuffle=True, epoch=epoch)
        assert [batch.tolist() for batch in several] == [batch.tolist() for batch in single]


def test_the_shuffle_is_seeded_per_epoch() -> None:
    indices = torch.arange(500)

    def order(seed: int, epoch: int) -> List[int]:
        return concatenated(engine(64, seed=seed).global_batches(indices, shuffle=True, epoch=epoch))

    assert order(3, 1) == order(3, 1)
    assert len({tuple(order(seed, epoch)) for seed in (3, 4) for epoch in (0, 1, 2)}) == 6


def test_fewer_samples_than_processes_are_refused() -> None:
    with pytest.raises(ValueError, match="3 samples cannot be shared by 4 processes"):
        engine(rank=1, world=4).global_batches(torch.arange(3), shuffle=False)


@given(count=st.integers(1, 600), block=st.integers(1, 700), epoch=st.integers(0, 10))
def test_a_block_shuffle_permutes_each_block_within_itself(count: int, block: int, epoch: int) -> None:
    indices = torch.arange(count)
    order = concatenated(engine(37).global_batches(indices, shuffle=True, epoch=epoch, block=block))
    for start in range(0, count, block):
        assert sorted(order[start : start + block]) == list(range(start, min(start + block, count)))
    if count <= block:  # the indices fit in one block: the map-style shuffle
        assert order == concatenated(engine(37).global_batches(indices, shuffle=True, epoch=epoch))


# ----------------------------------------------------------------------------- micro-batches


def _micro_batches_per_rank(data: PreparedData | StreamedData, batch: torch.Tensor, batch_size: int, micro: int | None, world: int) -> Dict[int, List[torch.Tensor]]:
    return {rank: engine(batch_size, micro, rank=rank, world=world).local_micro_batches(data, batch) for rank in range(world)}


def _check_partition(per_rank: Dict[int, List[torch.Tensor]], batch: torch.Tensor, micro: int | None) -> None:
    """The micro-batches of all processes partition the global batch; each respects the micro-batch size."""
    assert sorted(index for parts in per_rank.values() for index in concatenated(parts)) == sorted(batch.tolist())
    for parts in per_rank.values():
        assert all(part.dtype == torch.int64 and part.ndim == 1 and len(part) >= 1 for part in parts)
        if micro is None:
            assert len(parts) <= 1  # the whole per-process share in one forward pass
        else:
            assert all(len(part) == micro for part in parts[:-1]) and all(len(part) <= micro for part in parts)


@given(count=st.integers(1, 400), batch_size=st.integers(1, 120), micro=st.none() | st.integers(1, 50),
       world=st.integers(1, 6), epoch=st.integers(0, 5))
def test_map_style_micro_batches_partition_each_global_batch_strided(count: int, batch_size: int, micro: int | None,
                                                                    world: int, epoch: int) -> None:
    if count < world:
        return
    data = map_style(count)
    for batch in engine(batch_size, world=world).global_batches(torch.arange(count), shuffle=True, epoch=epoch):
        per_rank = _micro_batches_per_rank(data, batch, batch_size, micro, world)
        _check_partition(per_rank, batch, micro)
        for rank, parts in per_rank.items():  # map-style data: every world-th index of the batch, from the rank
            assert concatenated(parts) == batch[rank::world].tolist()


@st.composite
def streams(draw: st.DrawFn) -> Tuple[List[int], List[int], int]:
    world = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=12))
    owners = draw(st.lists(st.integers(0, world - 1), min_size=len(sizes), max_size=len(sizes)))
    return sizes, owners, world


@given(stream=streams(), batch_size=st.integers(1, 60), micro=st.none() | st.integers(1, 20), epoch=st.integers(0, 5))
def test_stream_micro_batches_are_each_process_s_own_units_samples(stream: Tuple[List[int], List[int], int], batch_size: int,
                                                                 micro: int | None, epoch: int) -> None:
    sizes, owners, world = stream
    data = stream_of(sizes, owners)
    count = sum(sizes)
    owner_of_index = torch.repeat_interleave(torch.tensor(owners), torch.tensor(sizes))
    assert torch.equal(data.index.owner_of(torch.arange(count)), owner_of_index)
    if count < world:
        return
    for batch in engine(batch_size, world=world).global_batches(torch.arange(count), shuffle=True, epoch=epoch):
        per_rank = _micro_batches_per_rank(data, batch, batch_size, micro, world)
        _check_partition(per_rank, batch, micro)
        for rank, parts in per_rank.items():  # in the global batch's order, only the indices this process reads
            assert concatenated(parts) == [index for index in batch.tolist() if owner_of_index[index] == rank]


def test_a_process_with_no_share_of_a_batch_gets_no_micro_batch() -> None:
    data = stream_of([5, 5], owners=[0, 0])
    assert engine(10, 2, rank=1, world=2).local_micro_batches(data, torch.arange(10)) == []
    assert engine(4, rank=3, world=4).local_micro_batches(map_style(10), torch.tensor([8, 9])) == []


# ----------------------------------------------------------------------------- serving a plan from a stream's units


@st.composite
def plans(draw: st.DrawFn) -> Tuple[List[int], List[List[int]]]:
    """Unit sizes, and micro-batches of distinct dataset indices (a shuffled subset, cut at random)."""
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=10))
    chosen = draw(st.permutations(range(sum(sizes))))
    chosen = chosen[: draw(st.integers(0, len(chosen)))]
    cuts = sorted(draw(st.sets(st.integers(1, max(len(chosen) - 1, 1)), max_size=6))) if len(chosen) > 1 else []
    bounds = [0, *cuts, len(chosen)] if chosen else []
    return sizes, [list(chosen[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]


@given(plan=plans())
def test_a_plan_serves_each_micro_batch_in_its_order_from_units_read_in_order(plan: Tuple[List[int], List[List[int]]]) -> None:
    sizes, micro_batches = plan
    served = _Plan(micro_batches, pad_id=0)
    out: List[List[int]] = []
    start = 0
    for size in sizes:  # the units arrive in dataset order; inputs and labels are the dataset indices
        unit = torch.arange(start, start + size)
        served.take(start, ({"x": unit.float()[:, None]}, unit))
        for inputs, labels in served.complete():
            assert inputs["x"][:, 0].long().tolist() == labels.tolist()
            out.append(labels.tolist())
        start += size
    assert served.done()
    assert out == micro_batches
    assert not served.units  # every held unit was released once its rows were handed over
