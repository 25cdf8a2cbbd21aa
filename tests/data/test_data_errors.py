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
    return torch.randn(60, 6, generator=generator), torch.randint(0, 4, (60,), generator=generator)


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
    with pytest.raises(ValueError, match=rf"the data \({type(data).__name__}\) hold no samples: at least one labelled sample"):
        CalibratedModel.fit(plain, data, **FIT)


@pytest.mark.parametrize("form", ["loader", "dataset", "list of batches"])
@pytest.mark.parametrize(("labels_of", "said"), [
    (lambda y: y[:, None], "each sample's label is a tensor of shape (1,) of dtype torch.int64; give one class index"),
    (lambda y: torch.nn.functional.one_hot(y, 4), "each sample's label is a tensor of shape (4,)"),
    (lambda y: y.float(), "each sample's label is a scalar of dtype torch.float32; cast them to integer class indices"),
], ids=["column", "one-hot", "float"])
def test_label_shape_errors_speak_of_each_samples_label(plain, rows, form, labels_of, said):
    """The probe read "(1,)" for a DataLoader(batch_size=50): the shape of a batch the fit made, not the user's. The
    message now says what each sample's label is, whatever batches the fit or the user made."""
    x, y = rows
    labels = labels_of(y)
    data = {"loader": DataLoader(TensorDataset(x, labels), batch_size=50), "dataset": TensorDataset(x, labels),
            "list of batches": [(x[:50], labels[:50])]}[form]
    with pytest.raises(ValueError) as error:
        CalibratedModel.fit(plain, data, **FIT)
    message = str(error.value)
    assert message.startswith("labels must be one integer class index per sample, but ") and said in message, message
    assert "(1, " not in message and "(50" not in message


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
