"""Data the fit and the evaluation cannot use: each refused at the boundary naming the problem and the fix, in the
user's terms (their batch, their sample), never a bare IndexError or StopIteration."""

from __future__ import annotations

import datasets
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hf_calibrate import CalibratedModel

FIT = dict(method="temperature", progress=False)


@pytest.fixture(scope="module")
def plain() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(6, 4).eval()


@pytest.fixture(scope="module")
def rows():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(120, 6, generator=generator), torch.randint(0, 4, (120,), generator=generator)


@pytest.mark.parametrize("form", ["pair", "dict", "loader of pairs", "loader of dicts"])
def test_a_batch_with_more_inputs_than_labels_names_both_counts(plain, rows, form):
    """40 inputs with 30 labels in one batch (the probe's dict batch gave a bare IndexError)."""
    x, y = rows
    batch = (x[:40], y[:30]) if "pair" in form else {"input": x[:40], "labels": y[:30]}
    data = DataLoader([batch], batch_size=None) if form.startswith("loader") else [batch]
    with pytest.raises(ValueError) as error:
        CalibratedModel.fit(plain, data, **FIT)
    message = str(error.value)
    assert "40" in message and "30" in message and "one row per label" in message, message


def _empty_stream() -> datasets.IterableDataset:
    def nothing():
        yield from ()

    features = datasets.Features({"input": datasets.Sequence(datasets.Value("float32")), "labels": datasets.Value("int64")})
    return datasets.IterableDataset.from_generator(nothing, features=features)


@pytest.mark.parametrize("make", [_empty_stream, lambda: [], lambda: DataLoader([], batch_size=None)],
                         ids=["datasets.IterableDataset", "list of batches", "DataLoader of batches"])
def test_empty_streams_are_refused_naming_the_fix(plain, make):
    """An empty datasets.IterableDataset raised StopIteration with an empty message."""
    data = make()
    with pytest.raises(ValueError, match=rf"the calibration data \({type(data).__name__}\) hold no samples: at least one labelled"):
        CalibratedModel.fit(plain, data, **FIT)


@pytest.mark.parametrize("role", ["calibration", "validation", "evaluation"])
@pytest.mark.parametrize("fault", ["empty", "NaN"])
def test_errors_name_the_data_by_their_role(plain, rows, role, fault):
    """evaluate()'s errors called its data "calibration data"; the first fix named none ("the data"), which leaves a fit
    given calibration and validation data (both DataLoaders here) unclear about which one is empty or holds a NaN."""
    x, y = rows
    bad_x = x[:0] if fault == "empty" else x.clone().index_fill_(0, torch.tensor([7]), float("nan"))
    bad = DataLoader(TensorDataset(bad_x, y[: len(bad_x)]), batch_size=50)
    clean = DataLoader(TensorDataset(x, y), batch_size=50)
    options = dict(method="neural_clamping", max_iterations=1, progress=False)
    with pytest.raises(ValueError) as error:
        if role == "evaluation":
            CalibratedModel.fit(plain, clean, **FIT).evaluate(bad, progress=False)
        else:
            CalibratedModel.fit(plain, bad if role == "calibration" else clean,
                                validation_data=bad if role == "validation" else clean, **options)
    message = str(error.value)
    said = f"the {role} data (DataLoader) hold no samples" if fault == "empty" else f"sample(s) 7 (batch 0, row 7, counted from 0) of the {role} data, DataLoader("
    assert said in message, message
    assert all(other not in message for other in ("calibration data", "validation data", "evaluation data") if role not in other), message


@pytest.mark.parametrize("call", ["fit", "evaluate"])
@pytest.mark.parametrize("form", ["DataLoader(batch_size=50)", "list of batches", "TensorDataset"])
def test_a_bad_sample_is_named_by_its_place_in_the_users_data(plain, rows, call, form):
    """A NaN at sample 77 of a DataLoader(batch_size=50) was reported as "batch 0", counting the fit's own batches; the
    first fix dropped the batch. The sample is named by its position in the user's data, and by the user's batch (1) and
    its row there (27) when the user gave batches; data of single samples name no batch."""
    x, y = rows
    x = x.clone()
    x[77, 2] = float("nan")
    data = {"DataLoader(batch_size=50)": DataLoader(TensorDataset(x, y), batch_size=50), "TensorDataset": TensorDataset(x, y),
            "list of batches": [(x[start : start + 50], y[start : start + 50]) for start in range(0, 100, 50)]}[form]
    with pytest.raises(ValueError) as error:
        if call == "fit":
            CalibratedModel.fit(plain, data, batch_size=64, **FIT)
        else:
            CalibratedModel.fit(plain, TensorDataset(*rows), **FIT).evaluate(data, batch_size=64, progress=False)
    message = str(error.value)
    if form == "TensorDataset":
        assert "holds NaN or infinite values in sample(s) 77 of the " in message and "batch" not in message, message
    else:
        assert "holds NaN or infinite values in sample(s) 77 (batch 1, row 27, counted from 0) of the " in message, message
        assert "batch 0" not in message and "batch 2" not in message, message


@pytest.mark.parametrize("call", ["fit", "evaluate"])
@pytest.mark.parametrize("form", ["loader", "dataset", "list of batches"])
@pytest.mark.parametrize(("labels_of", "per_sample", "in_batch"), [
    (lambda y: y[:, None], "a tensor of shape (1,) of dtype torch.int64", "shape (50, 1) and dtype torch.int64"),
    (lambda y: torch.nn.functional.one_hot(y, 4), "a tensor of shape (4,) of dtype torch.int64", "shape (50, 4) and dtype torch.int64"),
    (lambda y: y.float(), "a scalar of dtype torch.float32", "shape (50,) and dtype torch.float32"),
], ids=["column", "one-hot", "float"])
def test_label_shape_errors_speak_of_the_users_batches(plain, rows, call, form, labels_of, per_sample, in_batch):
    """The probe read "(1,)" for a DataLoader(batch_size=50): the shape of a batch the fit made (of one sample, to probe
    the model), not the user's "(50,)". Data in batches (a DataLoader's, a list of batches) are now described by the
    user's batches; data of single samples (a Dataset) by each sample's label."""
    x, y = rows
    labels = labels_of(y)
    data = {"loader": DataLoader(TensorDataset(x, labels), batch_size=50), "dataset": TensorDataset(x, labels),
            "list of batches": [(x[:50], labels[:50]), (x[50:], labels[50:])]}[form]
    with pytest.raises(ValueError) as error:
        if call == "fit":
            CalibratedModel.fit(plain, data, **FIT)
        else:
            CalibratedModel.fit(plain, TensorDataset(x, y), **FIT).evaluate(data, progress=False)
    message = str(error.value)
    assert message.startswith("labels must be one integer class index per sample, but "), message
    if form == "dataset":
        assert f"each sample's label is {per_sample}" in message, message
    else:
        assert f"a batch of 50 samples of the data holds labels of {in_batch}" in message, message
        assert "one class index per sample is shape (50,)" in message, message
    assert "(1, " not in message, message  # never the shape of the fit's own batch of one


@pytest.fixture(scope="module")
def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        num_labels=3, pad_token_id=0)
    return BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("call", ["fit", "evaluate"])
@pytest.mark.parametrize("bad_id", [50, -3])
def test_token_ids_outside_the_vocabulary_name_the_samples_and_the_fix(tiny_bert, call, bad_id):
    """Out-of-vocabulary input_ids surfaced as the embedding's 'IndexError: index out of range in self'. They are found
    as the data are read (so that under several processes every process raises alike), naming the samples."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (24, 7), generator=generator)
    ids[[5, 6], 3] = bad_id  # one batch of 8: the error is raised once that batch has been read
    rows = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": torch.randint(0, 3, (24,), generator=generator).tolist()})
    with pytest.raises(ValueError) as error:
        if call == "fit":
            CalibratedModel.fit(tiny_bert, rows, method="temperature", batch_size=8, progress=False)
        else:
            clean = rows.map(lambda row: {"input_ids": [min(max(i, 1), 49) for i in row["input_ids"]]})
            CalibratedModel.fit(tiny_bert, clean, method="temperature", progress=False).evaluate(rows, batch_size=8, progress=False)
    message = str(error.value)
    assert "input 'input_ids' holds token ids in sample(s) 5, 6 of " in message, message
    assert "vocabulary of 50 tokens (ids 0 to 49)" in message and "model's own tokenizer" in message


@pytest.fixture(scope="module")
def one_token_type_bert() -> nn.Module:
    """A BERT with one token type, as RoBERTa models have (type_vocab_size=1)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        num_labels=3, pad_token_id=0, type_vocab_size=1)
    return BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("call", ["fit", "evaluate", "forward"])
def test_token_type_ids_outside_the_models_token_types_name_the_samples_and_the_fix(one_token_type_bert, call):
    """Sentence pairs tokenized for another model (token types 0 and 1) given to a model with one token type surfaced as
    the embedding's 'IndexError: index out of range in self', like out-of-vocabulary input_ids did."""
    generator = torch.Generator().manual_seed(0)
    ids, types = torch.randint(1, 50, (24, 7), generator=generator), torch.zeros(24, 7, dtype=torch.long)
    labels = torch.randint(0, 3, (24,), generator=generator)
    paired = types.clone()
    paired[9, 4:] = 1  # the second sentence of a pair
    batches = [{"input_ids": ids[:12], "token_type_ids": paired[:12], "labels": labels[:12]},
               {"input_ids": ids[12:], "token_type_ids": paired[12:], "labels": labels[12:]}]
    with pytest.raises(ValueError) as error:
        if call == "fit":
            CalibratedModel.fit(one_token_type_bert, batches, **FIT)
        else:
            calibrated = CalibratedModel.fit(one_token_type_bert, [{"input_ids": ids, "token_type_ids": types, "labels": labels}], **FIT)
            if call == "evaluate":
                calibrated.evaluate(batches, progress=False)
            else:
                calibrated(input_ids=ids[8:10], token_type_ids=paired[8:10])
    message = str(error.value)
    said = {"fit": "input 'token_type_ids' holds token ids in sample(s) 9 (batch 0, row 9, counted from 0) of the calibration data",
            "evaluate": "input 'token_type_ids' holds token ids in sample(s) 9 (batch 0, row 9, counted from 0) of the evaluation data",
            "forward": "token_type_ids holds token id 1, outside"}[call]
    assert said in message, message
    assert "this model's 1 token type(s) (ids 0 to 0)" in message and "drop token_type_ids" in message, message


def test_float_token_ids_are_refused_naming_the_fix(one_token_type_bert):
    """Float token_type_ids reached the embedding's bare 'Expected tensor ... Long, Int' RuntimeError."""
    ids = torch.randint(1, 50, (4, 7), generator=torch.Generator().manual_seed(0))
    calibrated = CalibratedModel.fit(one_token_type_bert, [{"input_ids": ids, "labels": torch.tensor([0, 1, 2, 0])}], **FIT)
    with pytest.raises(ValueError, match=r"token_type_ids must hold integer token ids, got dtype torch.float32: convert them"):
        calibrated(input_ids=ids, token_type_ids=torch.zeros(4, 7))
