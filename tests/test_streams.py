"""Streamed calibration data, piece by piece (hf_calibrate.data.sources / stream, fitting.scan), with tiny models.

The real-model comparisons of every form against the map-style data are in tests/test_data_forms.py;
here: the engine's block shuffle, the stream index, serving a plan, the re-read checks and every
documented error of a stream.
"""

from __future__ import annotations

import itertools
from typing import Any, List

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.data import StreamIndex, prepare_data
from hf_calibrate.data.stream import _row
from hf_calibrate.fitting import Engine, EngineOptions
from hf_calibrate.metrics import NonFiniteError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tiny():
    """(timm model, its 96 samples as a list of batches of 20: the last one has 16)."""
    model, data, _ = tm.make_base("timm", n=96)
    x, y = data.tensors
    return model, [(x[i : i + 20], y[i : i + 20]) for i in range(0, 96, 20)]


def _engine(**options: Any) -> Engine:
    return Engine(EngineOptions(progress=False, **options))


# ----------------------------------------------------------------------------- the engine's shuffle and the index


def test_a_block_shuffle_is_the_full_shuffle_when_the_indices_fit_in_one_block():
    engine, indices = _engine(batch_size=7), torch.arange(3, 50)
    full = engine.global_batches(indices, shuffle=True, epoch=2)
    assert all(torch.equal(a, b) for a, b in zip(full, engine.global_batches(indices, shuffle=True, epoch=2, block=47)))
    blocked = torch.cat(engine.global_batches(indices, shuffle=True, epoch=2, block=10))
    assert sorted(blocked.tolist()) == indices.tolist()  # a permutation
    for start in range(0, 47, 10):  # each block permuted within itself, in block order
        assert sorted(blocked[start : start + 10].tolist()) == indices[start : start + 10].tolist()
    assert not torch.equal(blocked, torch.cat(full))


def test_the_index_places_units_by_key_whoever_read_them():
    index = StreamIndex.gather(keys=[(1 << 40) | 0, 0, 2, 1], sizes=[5, 3, 4, 2])  # shard 1 after shard 0's chunks
    assert index.count == 14
    assert [index.start_of(key) for key in (0, 1, 2, (1 << 40) | 0)] == [0, 3, 5, 9]
    assert index.owner_of(torch.tensor([0, 13])).tolist() == [0, 0]
    with pytest.raises(RuntimeError, match="same unit"):
        StreamIndex.gather(keys=[4, 4], sizes=[1, 1])


def test_a_row_loses_only_right_padding():
    inputs = {"input_ids": torch.tensor([[5, 6, 0, 0], [0, 0, 7, 8]]), "attention_mask": torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1]])}
    right, left = _row((inputs, torch.tensor([1, 2])), 0), _row((inputs, torch.tensor([1, 2])), 1)
    assert right["input_ids"].tolist() == [5, 6] and right["attention_mask"].tolist() == [1, 1] and int(right["labels"]) == 1
    assert left["input_ids"].tolist() == [0, 0, 7, 8]  # left padding is the model's business: kept as it was


def test_serving_a_plan_hands_over_each_micro_batch_in_plan_order(tiny):
    model, batches = tiny
    engine = _engine(batch_size=32)
    data = prepare_data(lambda: iter(batches), adapt(model))
    logits, labels = engine.scan(data, adapt(model).logits, keep_inputs=False)
    plan = [[40, 2, 95], [60, 41], [0]]
    served = list(data.serve(plan, 0, 1))
    for indices, (inputs, served_labels) in zip(plan, served):
        assert served_labels.tolist() == labels[indices].tolist()
        torch.testing.assert_close(adapt(model).logits(inputs), logits[indices], rtol=1e-5, atol=1e-6)  # other batch: float rounding


# ----------------------------------------------------------------------------- passes over a stream


def test_a_stream_larger_than_the_cache_is_read_once_per_pass(tiny):
    model, batches = tiny
    reads: List[int] = []

    def stream():
        reads.append(1)
        return iter(batches)

    options = dict(method="neural_clamping", epochs=2, batch_size=32, holdout_fraction=0.25, eval_every=1, progress=False)
    kept = CalibratedModel.fit(model, stream, **options)
    assert len(reads) == 2  # the probe of its first batch, the first pass; later passes read the kept batches
    reads.clear()
    CalibratedModel.fit(model, stream, cache_bytes=20_000, **options)  # 96 samples of 3 KB: read for every pass
    assert len(reads) == 1 + 1 + 2 * 2  # probe, first pass, per epoch one training and one held-out pass
    again = CalibratedModel.fit(model, stream, cache_bytes=20_000, **options)
    assert torch.equal(again.calibrator.delta, CalibratedModel.fit(model, stream, cache_bytes=20_000, **options).calibrator.delta)
    assert kept.fit_summary["holdout_samples"] == 24


def test_a_stream_that_changes_between_passes_is_refused(tiny):
    model, batches = tiny
    orders = itertools.count()

    def reshuffled():  # a loader that shuffles on its own
        return iter(batches if next(orders) < 2 else batches[::-1])

    with pytest.raises(ValueError, match="other samples \\(or another order\\) on a later pass.*unshuffled"):
        CalibratedModel.fit(model, reshuffled, method="neural_clamping", epochs=1, cache_bytes=0, progress=False)
    shrinking = iter([batches, batches, batches[:2]])
    with pytest.raises(RuntimeError, match="fewer samples in this pass than in the first"):
        CalibratedModel.fit(model, lambda: iter(next(shrinking)), method="neural_clamping", epochs=1, holdout_fraction=0,
                            cache_bytes=0, progress=False)


def test_bad_inputs_in_a_stream_are_named_by_their_place_in_the_data(tiny):
    model, batches = tiny
    broken = [(x.clone(), y) for x, y in batches]
    broken[2][0][3, 0, 0, 0] = float("nan")  # sample 2 * 20 + 3
    for data in (broken, lambda: iter(broken)):
        with pytest.raises(NonFiniteError, match=r"sample\(s\) 43 of"):
            CalibratedModel.fit(model, data, method="temperature", progress=False)


def test_class_names_and_reordered_class_labels_in_streams_are_the_models_classes(tiny):
    import datasets

    model, batches = tiny
    named = [{"pixel_values": x, "labels": [tm.LABELS[int(k)] for k in y]} for x, y in batches]
    want = CalibratedModel.fit(model, batches, method="temperature", progress=False).calibrator.log_temperature
    assert torch.equal(CalibratedModel.fit(model, named, method="temperature", progress=False).calibrator.log_temperature, want)
    reversed_names = list(reversed(tm.LABELS))
    rows = datasets.Dataset.from_dict(
        {"pixel_values": [x.numpy() for x, _ in batches for x in x], "label": [len(tm.LABELS) - 1 - int(k) for _, y in batches for k in y]},
        features=datasets.Features({"pixel_values": datasets.Array3D((3, 16, 16), "float32"),
                                    "label": datasets.ClassLabel(names=reversed_names)}),
    ).with_format("torch")
    streamed = CalibratedModel.fit(model, rows.to_iterable_dataset(), method="temperature", progress=False)
    torch.testing.assert_close(streamed.calibrator.log_temperature, want, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- errors with their fix


class Samples(IterableDataset):
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return ((x, y) for xs, ys in self.batches for x, y in zip(xs, ys))


def test_documented_stream_errors(tiny):
    model, batches = tiny
    fit = dict(method="temperature", progress=False)
    with pytest.raises(ValueError, match="shuffle=True.*shuffle=False"):
        CalibratedModel.fit(model, DataLoader(batches, batch_size=None, shuffle=True), **fit)
    with pytest.raises(ValueError, match="preprocess=.* whole batches.*collate_fn"):
        CalibratedModel.fit(model, batches, preprocess=lambda row: row, **fit)
    with pytest.raises(ValueError, match="yielded nothing"):
        CalibratedModel.fit(model, lambda: iter([]), **fit)
    with pytest.raises(ValueError, match="yielded nothing: it is empty, or a one-shot iterator"):
        CalibratedModel.fit(model, iter([]), **fit)
    with pytest.raises(TypeError, match="did not give an iterator"):
        CalibratedModel.fit(model, lambda: 3, **fit)
    one_shot = (batch for batch in batches)
    CalibratedModel.fit(model, one_shot, **fit)  # one pass: fine
    with pytest.raises(ValueError, match="one-shot iterator that an earlier call already read"):
        CalibratedModel.fit(model, one_shot, **fit)
    with pytest.raises(ValueError, match="can be read only once"):
        CalibratedModel.fit(model, (batch for batch in batches), method="neural_clamping", progress=False)
    samples = CalibratedModel.fit(model, Samples(batches), **fit)  # a sample stream is batched by the engine
    assert samples.provenance["num_samples"] == 96
