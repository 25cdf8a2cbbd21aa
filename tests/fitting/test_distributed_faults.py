"""Bad data held by one process stops every process with the same clear error.

Under ``torchrun`` each process reads only its strided share of a batch: with 16 samples in
one batch, rank 1 holds the odd positions. Before the fault ledger, a NaN in sample 3 raised
``NonFiniteError`` on rank 1 only, and rank 0 died in its next collective with gloo's
"Connection closed by peer". Now every process must raise the same error naming the sample.

Each scenario runs in both workers (2 fresh CPU processes, gloo; see ``tests/_launch.py``);
each worker writes ``{scenario: [error type, message]}`` and the test compares the two.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_models import NUM_CLASSES, image_data, tiny_timm  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
OPTIONS = dict(batch_size=16, progress=False)
ON_RANK_1 = 3  # odd position: held by rank 1 only
ON_RANK_0 = 6  # even position: held by rank 0 only


def _with(data: TensorDataset, *, pixel: Tuple[int, float] = None, label: Tuple[int, int] = None) -> TensorDataset:
    pixels, labels = (tensor.clone() for tensor in data.tensors)
    if pixel is not None:
        pixels[pixel[0], 0, 0, 0] = pixel[1]
    if label is not None:
        labels[label[0]] = label[1]
    return TensorDataset(pixels, labels)


def _token_rows(bad_at: int) -> object:
    """16 rows of token ids for a 50-token BERT, the id 50 (outside its vocabulary) in row ``bad_at``."""
    import datasets

    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 50, (16, 6), generator=generator)
    ids[bad_at, 2] = 50
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": torch.randint(0, 3, (16,), generator=generator).tolist()})


def _tiny_bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        num_labels=3, pad_token_id=0)
    return BertForSequenceClassification(config).eval()


def _scenarios() -> Dict[str, Callable[[], object]]:
    model = tiny_timm(0)
    clean = image_data(model, 16, seed=1)
    calibrated = CalibratedModel.fit(model, clean, method="temperature", **OPTIONS)
    return {
        "fit_nan_on_rank_1": lambda: CalibratedModel.fit(model, _with(clean, pixel=(ON_RANK_1, float("nan"))), method="temperature", **OPTIONS),
        "fit_nc_inf_on_rank_0": lambda: CalibratedModel.fit(
            model, _with(clean, pixel=(ON_RANK_0, float("inf"))), method="neural_clamping", epochs=1, holdout_fraction=0.0, **OPTIONS),
        "evaluate_nan_on_rank_1": lambda: calibrated.evaluate(_with(clean, pixel=(ON_RANK_1, float("nan"))), **OPTIONS),
        "evaluate_label_on_rank_1": lambda: calibrated.evaluate(_with(clean, label=(ON_RANK_1, NUM_CLASSES + 5)), **OPTIONS),
        "fit_token_id_on_rank_1": lambda: CalibratedModel.fit(_tiny_bert(), _token_rows(ON_RANK_1), method="temperature", **OPTIONS),
    }


def _worker(out_dir: str) -> None:
    torch.set_num_threads(1)
    outcomes = {}
    for name, run in _scenarios().items():
        try:
            run()
            outcomes[name] = ["none", ""]
        except Exception as error:  # noqa: BLE001 - recorded and compared by the test
            outcomes[name] = [type(error).__name__, str(error)]
    Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps(outcomes))


def test_every_process_raises_the_same_error_for_data_only_one_holds(tmp_path):
    from _launch import torchrun

    torchrun(Path(__file__), [str(tmp_path)], timeout=300)  # a process left waiting would hang until gloo's 30 min
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]
    outcomes = ranks[0]
    for name, sample in (("fit_nan_on_rank_1", ON_RANK_1), ("fit_nc_inf_on_rank_0", ON_RANK_0), ("evaluate_nan_on_rank_1", ON_RANK_1)):
        kind, message = outcomes[name]
        assert kind == "NonFiniteError", (name, outcomes[name])
        assert f"sample(s) {sample} " in message and "remove or impute" in message, (name, message)
    kind, message = outcomes["evaluate_label_on_rank_1"]
    assert kind == "ValueError" and "labels do not match the model" in message, message
    kind, message = outcomes["fit_token_id_on_rank_1"]  # refused on every rank, not an IndexError on rank 1 leaving rank 0 waiting
    assert kind == "ValueError" and f"holds token ids in sample(s) {ON_RANK_1} " in message and "vocabulary of 50" in message, message


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _worker(sys.argv[1])
    shut_down()
