"""Streamed calibration data, piece by piece (hf_calibrate.data.streams, hf_calibrate.fitting.runtime.scan), with tiny models.

The real-model comparisons of every form against the map-style data are in tests/data/test_data_forms.py;
here: the engine's block shuffle, the stream index, serving a plan, the re-read checks and every
documented error of a stream.
"""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.data import StreamIndex, prepare_data
from hf_calibrate.data.streams.index import trim_right_padding
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


def test_a_served_text_batch_loses_only_right_padding():
    inputs = {"input_ids": torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])}
    trimmed, _ = trim_right_padding((inputs, torch.tensor([1, 2])))
    assert trimmed["input_ids"].tolist() == [[5, 6], [7, 0]] and trimmed["attention_mask"].tolist() == [[1, 1], [1, 0]]
    left = {"input_ids": torch.tensor([[0, 0, 5, 6]]), "attention_mask": torch.tensor([[0, 0, 1, 1]])}
    assert trim_right_padding((left, torch.tensor([1])))[0]["input_ids"].tolist() == [[0, 0, 5, 6]]  # the model's business


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


def test_rows_past_spill_bytes_are_memory_mapped_bit_for_bit(tiny, tmp_path, monkeypatch):
    from hf_calibrate.fitting.runtime import collected_rows as rows
    from hf_calibrate.fitting.runtime.collected_rows import RowBuffer

    made = []
    mkstemp = rows.tempfile.mkstemp
    monkeypatch.setattr(rows.tempfile, "mkstemp", lambda **kwargs: made.append(kwargs["dir"]) or mkstemp(**kwargs))
    model, batches = tiny
    backbone = adapt(model)
    for data in (lambda: iter(batches), tm.image_data(model, 96)):
        want = _engine(batch_size=32).scan(prepare_data(data, backbone), backbone.logits)
        got = _engine(batch_size=32, spill_bytes=0).scan(prepare_data(data, backbone), backbone.logits, spill_dir=str(tmp_path))
        assert made.pop() == str(tmp_path)  # the rows went to a file there
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert list(tmp_path.iterdir()) == []  # mapped, then unlinked: nothing left in the folder
    buffer = RowBuffer(spill_bytes=40, directory=tmp_path)
    buffer.append(torch.ones(2, 3))
    buffer.append(torch.full((3, 3), 2.0))  # past 40 bytes: to the file
    assert len(list(tmp_path.iterdir())) == 1
    buffer.close()  # a failed pass removes its file
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- passes over a stream


def _counted(batches: List[Any], reads: List[int]):
    """A callable returning a new iterator of ``batches``; each iterator that is read from adds 1 to ``reads``."""
    def stream():
        reads.append(1)
        yield from batches

    return stream


def test_a_stream_larger_than_the_cache_is_read_once_per_pass(tiny):
    model, batches = tiny
    reads: List[int] = []
    stream = _counted(batches, reads)

    options = dict(method="neural_clamping", epochs=2, batch_size=32, holdout_fraction=0.25, eval_every=1, progress=False)
    kept = CalibratedModel.fit(model, stream, **options)
    assert len(reads) == 2  # the probe of the first batch and the first pass; later passes read the batches it kept
    reads.clear()
    CalibratedModel.fit(model, stream, cache_bytes=20_000, **options)  # 96 samples of 3 KB: read for every pass
    assert len(reads) == 2 + 2 * 2  # probe, first pass, then per epoch one training and one held-out pass
    again = CalibratedModel.fit(model, stream, cache_bytes=20_000, **options)
    assert torch.equal(again.calibrator.delta, CalibratedModel.fit(model, stream, cache_bytes=20_000, **options).calibrator.delta)
    assert kept.fit_summary["holdout_samples"] == 24


def test_a_stream_that_changes_between_passes_is_refused(tiny):
    model, batches = tiny
    reads: List[int] = []
    in_order = _counted(batches, reads)

    def reshuffled():  # a loader that shuffles on its own: another order after the probe and the first pass
        return in_order() if len(reads) < 2 else iter(batches[::-1])

    with pytest.raises(ValueError, match="other samples \\(or another order\\) on a later pass.*unshuffled"):
        CalibratedModel.fit(model, reshuffled, method="neural_clamping", epochs=1, cache_bytes=0, progress=False)
    reads.clear()

    def shrinking():  # ends early after the probe and the first pass
        return in_order() if len(reads) < 2 else iter(batches[:2])

    with pytest.raises(RuntimeError, match="fewer samples in this pass than in the first"):
        CalibratedModel.fit(model, shrinking, method="neural_clamping", epochs=1, holdout_fraction=0, cache_bytes=0, progress=False)


def test_bad_inputs_in_a_stream_are_named_by_their_place_in_the_data(tiny):
    model, batches = tiny
    broken = [(x.clone(), y) for x, y in batches]
    broken[2][0][3, 0, 0, 0] = float("nan")  # sample 2 * 20 + 3
    for data in (broken, lambda: iter(broken)):
        with pytest.raises(NonFiniteError, match=r"sample\(s\) 43 \(batch 2, row 3, counted from 0\) of the calibration data"):
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
    with pytest.raises(ValueError, match=r"the calibration data \(function\) hold no samples: at least one labelled sample"):
        CalibratedModel.fit(model, lambda: iter([]), **fit)
    with pytest.raises(ValueError, match="yielded nothing: they are empty, or a one-shot iterator"):
        CalibratedModel.fit(model, iter([]), **fit)
    with pytest.raises(TypeError, match="gave a int, not an iterator"):
        CalibratedModel.fit(model, lambda: 3, **fit)
    one_shot = (batch for batch in batches)
    CalibratedModel.fit(model, one_shot, **fit)  # one pass: fine
    with pytest.raises(ValueError, match="one-shot iterator that an earlier call already read"):
        CalibratedModel.fit(model, one_shot, **fit)
    with pytest.raises(ValueError, match="can be read only once"):
        CalibratedModel.fit(model, (batch for batch in batches), method="neural_clamping", progress=False)
    samples = CalibratedModel.fit(model, Samples(batches), **fit)  # a sample stream is batched by the engine
    assert samples.provenance["num_samples"] == 96


# ----------------------------------------------------------------------------- what users hold (review findings)


class SelfIterating(IterableDataset):
    """An IterableDataset that is its own iterator (as file, socket and queue readers often are): it can be read once."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.batches)


def test_sources_that_give_one_iterator_lose_no_sample_to_the_probe(tiny):
    model, batches = tiny
    fixed = iter(batches)
    for data in (SelfIterating(batches), DataLoader(SelfIterating(batches), batch_size=None), lambda: fixed):
        fitted = CalibratedModel.fit(model, data, method="temperature", progress=False)
        assert fitted.provenance["num_samples"] == 96, data
        with pytest.raises(ValueError, match="can be read only once"):
            CalibratedModel.fit(model, SelfIterating(batches), method="neural_clamping", progress=False)


def test_a_source_that_refills_one_buffer_gives_the_fit_of_its_copies(tiny):
    """A loader that copies each batch into the same preallocated tensors (pinned-memory style)."""
    model, batches = tiny
    inputs, labels = torch.empty(20, 3, 16, 16), torch.empty(20, dtype=torch.long)

    def refilled():
        for x, y in batches:
            inputs[: len(y)].copy_(x), labels[: len(y)].copy_(y)
            yield inputs[: len(y)], labels[: len(y)]

    for method, options in (("temperature", {}), ("neural_clamping", dict(epochs=2, batch_size=32, holdout_fraction=0.25))):
        for cache in ({}, {"cache_bytes": 0}):  # its batches kept, or read again for every pass
            want = CalibratedModel.fit(model, batches, method=method, progress=False, **options, **cache)
            got = CalibratedModel.fit(model, refilled, method=method, progress=False, **options, **cache)
            for key, value in want.calibrator.state_dict().items():
                assert torch.equal(got.calibrator.state_dict()[key], value), (method, cache, key)


def test_a_text_stream_that_changes_its_tokens_or_swaps_rows_is_caught_on_a_later_pass(tiny):
    model, data, tokenizer = tm.make_base("bert", n=48)
    rows = [data[i] for i in range(48)]
    batches = [{key: torch.stack([row[key] for row in rows[i : i + 12]]) for key in rows[0]} for i in range(0, 48, 12)]
    reads: List[int] = []
    in_order = _counted(batches, reads)

    def changed(change):
        return lambda: in_order() if len(reads) < 2 else iter([change(batch) if i == 1 else batch for i, batch in enumerate(batches)])

    swapped = lambda batch: {key: value[[1, 0, *range(2, 12)]] for key, value in batch.items()}  # noqa: E731
    other_token = lambda batch: {**batch, "input_ids": batch["input_ids"].clone().index_fill_(1, torch.tensor([1]), 2054)}  # noqa: E731
    for change in (other_token, swapped):
        reads.clear()
        with pytest.raises(ValueError, match="other samples \\(or another order\\)"):
            CalibratedModel.fit(model, changed(change), method="neural_clamping", epochs=1, batch_size=16, cache_bytes=0,
                                progress=False)


def test_batches_and_labels_as_users_hold_them(tiny):
    import datasets

    model, batches = tiny
    fit = dict(method="temperature", progress=False)
    want = CalibratedModel.fit(model, batches, **fit).calibrator.log_temperature
    targets = [{"pixel_values": x, "target": y} for x, y in batches]
    assert torch.equal(CalibratedModel.fit(model, targets, label_column="target", **fit).calibrator.log_temperature, want)
    x, y = (torch.cat(parts) for parts in zip(*batches))
    samples = DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=None)  # a loader that does not batch
    assert torch.equal(CalibratedModel.fit(model, samples, **fit).calibrator.log_temperature, want)
    with pytest.raises(ValueError, match=r"one integer class index per sample, but each sample's label is a tensor of shape \(1,\)"):
        CalibratedModel.fit(model, torch.utils.data.TensorDataset(x, y[:, None]), **fit)
    with pytest.raises(ValueError, match="holds 20 labels but 21 rows of 'pixel_values'"):
        CalibratedModel.fit(model, [(torch.cat([x[:21]]), y[:20])], **fit)
    resized = [batches[0], (torch.zeros(20, 3, 24, 24), batches[1][1])]
    with pytest.raises(ValueError, match="differ in size: \\(3, 16, 16\\) and \\(3, 24, 24\\)"):
        CalibratedModel.fit(model, resized, **fit)
    unnamed = datasets.Dataset.from_dict({"pixel_values": x.numpy(), "label": y.tolist()})
    with pytest.warns(UserWarning, match="records no features.*taken as the model's class indices"):
        CalibratedModel.fit(model, unnamed.to_iterable_dataset().map(lambda row: row), **fit)


def test_raw_text_batches_are_tokenized_with_the_models_tokenizer():
    model, data, tokenizer = tm.make_base("bert", n=48)
    texts, labels = tm.sentences(48), data.columns["labels"]
    rows = datasets_rows = [{"text": text, "label": int(label)} for text, label in zip(texts, labels)]
    batches = [{"text": texts[i : i + 16], "labels": labels[i : i + 16]} for i in range(0, 48, 16)]
    options = dict(method="temperature", preprocessor=tokenizer, max_length=tm.MAX_LENGTH, progress=False)
    want = CalibratedModel.fit(model, datasets_rows, **options)
    got = CalibratedModel.fit(model, batches, **options)
    assert torch.equal(got.calibrator.log_temperature, want.calibrator.log_temperature)
    assert len(rows) == got.provenance["num_samples"]


def test_one_shot_data_with_fit_and_evaluate_and_in_two_roles(tiny):
    from hf_calibrate.fit_evaluate import fit_and_evaluate

    model, batches = tiny
    calibrated, evaluation = fit_and_evaluate(model, (batch for batch in batches), method="temperature", progress=False)
    assert evaluation["uncalibrated"]["num_samples"] == 96 and evaluation["in_sample"]
    with pytest.raises(ValueError, match="evaluating a 'tst' calibration on them reads them a second time"):
        fit_and_evaluate(model, (batch for batch in batches), method="tst", progress=False)
    shared = (batch for batch in batches)
    with pytest.raises(ValueError, match="same one-shot iterator"):
        CalibratedModel.fit(model, batches, method="tst", validation_data=shared, temperature_data=shared, temperature=True,
                            progress=False)
    assert CalibratedModel.fit(model, batches, method="temperature", progress=False).evaluate(batches, progress=False)["in_sample"]
