"""Streams under 2 processes (torchrun, gloo on CPU) against one process, with the zoo's digits CNN.

Each process reads only its own units of a stream (its shards of a ``datasets.IterableDataset``,
every other batch of a list, every other chunk of a sample stream), yet after the first pass every
sample has the dataset index one process gives it, and a process's share of a global batch is the
samples of its own units. So the global batches, the hold-out split and the shuffles are one
process's, and only float summation order differs — what ``tests/fitting/test_distributed_fit.py``
documents: one-pass results to 1e-5, Neural Clamping's first SGD step to 1e-5 relative L2, after
several epochs δ by relative L2 ≤ 1e-2 and the final loss and log T to 1e-5. The last form reads
the stream again for every pass (``cache_bytes`` below the stream's size), shuffled within blocks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import IterableDataset

from hf_calibrate import CalibratedModel

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

FIRST_STEP = dict(method="neural_clamping", epochs=1, batch_size=4096, holdout_fraction=0.0, lr=0.05)
# 359 fitting samples in batches of 179: the last batch has 1 sample, so one of two processes has none of it
EPOCHS = dict(method="neural_clamping", epochs=3, batch_size=179, holdout_fraction=0.2, lr=0.05)
FIRST_STEP_REL_L2, FINAL_DELTA_REL_L2, FINAL_LOSS_AND_LOG_T_ABS = 1e-5, 1e-2, 1e-5
BATCH = 50


class Samples(IterableDataset):
    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor) -> None:
        self.pixels, self.labels = pixels, labels

    def __iter__(self):
        return zip(self.pixels, self.labels)


class ReadLog(list):
    """A list of batches that notes which of its batches were read."""

    def __init__(self, batches: list) -> None:
        super().__init__(batches)
        self.read: set = set()

    def __getitem__(self, index):
        self.read.add(index)
        return super().__getitem__(index)


def forms(demo: Any) -> Dict[str, Callable[[], Any]]:
    """The streams compared, built from the zoo CNN's calibration split."""
    import timm.data

    calibration = demo.dataset["calibration"]
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=demo.model))
    pixels = torch.stack([transform(image.convert("RGB")) for image in calibration["image"]])
    labels = torch.tensor(calibration["label"])
    batches = [(pixels[i : i + BATCH], labels[i : i + BATCH]) for i in range(0, len(labels), BATCH)]
    return {
        "sharded": lambda: calibration.to_iterable_dataset(num_shards=4),  # each process reads 2 shards
        "one_shard": lambda: calibration.to_iterable_dataset(),  # each process keeps every other chunk of rows
        # take/shuffle do not act shard by shard: every process reads the whole stream and keeps its chunks
        "taken": lambda: calibration.to_iterable_dataset(num_shards=4).take(300),
        "shuffled": lambda: calibration.to_iterable_dataset(num_shards=4).shuffle(seed=0, buffer_size=64),
        "batches": lambda: batches,  # each process loads every other batch
        "samples": lambda: Samples(pixels, labels),
    }


def _fits(demo: Any) -> Dict[str, torch.Tensor]:
    """Every compared number of every form, flat, for one process or the main one of several."""
    results: Dict[str, torch.Tensor] = {}
    for name, make in forms(demo).items():
        spill = {"spill_bytes": 0} if name == "one_shard" else {}  # its logits memory-mapped, exchanged in chunks
        ts = CalibratedModel.fit(demo.model, make(), method="temperature", progress=False, **spill)
        results[f"{name}.ts_log_t"] = ts.calibrator.log_temperature.detach().reshape(1)
        first = CalibratedModel.fit(demo.model, make(), progress=False, **FIRST_STEP)
        results[f"{name}.first_delta"] = first.calibrator.delta.detach().clone()
        results[f"{name}.world"] = torch.tensor([first.provenance["num_processes"]])
    make = forms(demo)["batches"]
    for name, extra in (("epochs", {}), ("reread", {"cache_bytes": 100_000})):  # the stream is ~3.6 MB: read 8 times
        nc = CalibratedModel.fit(demo.model, make(), progress=False, **EPOCHS, **extra)
        results[f"{name}.delta"] = nc.calibrator.delta.detach().clone()
        results[f"{name}.log_t"] = nc.calibrator.log_temperature.detach().reshape(1)
        results[f"{name}.loss"] = torch.tensor([record["loss"] for record in nc.fit_summary["history"]], dtype=torch.float64)
    tst = CalibratedModel.fit(demo.model, forms(demo)["sharded"](), method="tst", epochs=2, progress=False)
    results.update({f"tst.{key}": value.detach().clone() for key, value in tst.calibrator.state_dict().items() if value.is_floating_point()})
    return results


def _evaluation(demo: Any, calibrated: CalibratedModel) -> Dict[str, Any]:
    report = calibrated.evaluate(demo.dataset["test"].to_iterable_dataset(num_shards=2), progress=False, bootstrap=200)
    return {key: report[key] for key in ("uncalibrated", "calibrated", "difference")}


def _worker(out_dir: str) -> None:
    from hf_calibrate.demo import digits_timm_cnn

    demo = digits_timm_cnn(progress=False)
    results = _fits(demo)
    evaluation = _evaluation(demo, CalibratedModel.fit(demo.model, forms(demo)["one_shard"](), method="temperature", progress=False))
    batches = ReadLog(forms(demo)["batches"]())
    CalibratedModel.fit(demo.model, batches, method="temperature", progress=False)
    Path(out_dir, f"read-{os.environ['RANK']}.json").write_text(json.dumps(sorted(batches.read)))
    own_half = list(batches)[int(os.environ["RANK"]) :: 2]  # data already split per process: refused, not halved
    try:
        CalibratedModel.fit(demo.model, own_half, method="temperature", progress=False)
    except ValueError as error:
        Path(out_dir, f"split-{os.environ['RANK']}.txt").write_text(str(error))
    if int(os.environ["RANK"]) == 0:
        save_file({key: value.contiguous() for key, value in results.items()}, os.path.join(out_dir, "fits.safetensors"))
        Path(out_dir, "evaluation.json").write_text(json.dumps(evaluation))


def _relative_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖ / ‖want‖ (the plain distance when want is 0, e.g. an unused temperature)."""
    distance, scale = float((got.double() - want.double()).norm()), float(want.double().norm())
    return distance / scale if scale > 0 else distance


def test_two_processes_reading_their_own_units_fit_like_one(tmp_path, digits_cnn):
    from _launch import torchrun
    from _results import flat

    single = _fits(digits_cnn)
    single_evaluation = _evaluation(digits_cnn, CalibratedModel.fit(digits_cnn.model, forms(digits_cnn)["one_shard"](),
                                                                    method="temperature", progress=False))
    torchrun(Path(__file__), [str(tmp_path)])
    multi = load_file(str(tmp_path / "fits.safetensors"))
    for name in forms(digits_cnn):
        assert int(multi[f"{name}.world"]) == 2 and int(single[f"{name}.world"]) == 1
        torch.testing.assert_close(multi[f"{name}.ts_log_t"], single[f"{name}.ts_log_t"], rtol=1e-5, atol=1e-7)
        assert single[f"{name}.first_delta"].abs().max() > 0
        assert _relative_l2(multi[f"{name}.first_delta"], single[f"{name}.first_delta"]) <= FIRST_STEP_REL_L2, name
    for name in ("epochs", "reread"):
        assert _relative_l2(multi[f"{name}.delta"], single[f"{name}.delta"]) <= FINAL_DELTA_REL_L2, name
        assert abs(float(multi[f"{name}.log_t"][0] - single[f"{name}.log_t"][0])) <= FINAL_LOSS_AND_LOG_T_ABS, name
        torch.testing.assert_close(multi[f"{name}.loss"], single[f"{name}.loss"], rtol=0, atol=FINAL_LOSS_AND_LOG_T_ABS)
    for key in (key for key in single if key.startswith("tst.")):
        assert _relative_l2(multi[key], single[key]) <= FINAL_DELTA_REL_L2, key
    batches = len(forms(digits_cnn)["batches"]())  # 9: each process loaded the first (to probe the model) and its own
    assert json.loads((tmp_path / "read-0.json").read_text()) == list(range(0, batches, 2))
    assert json.loads((tmp_path / "read-1.json").read_text()) == [0, *range(1, batches, 2)]
    for rank in (0, 1):
        assert "the processes hold different data" in (tmp_path / f"split-{rank}.txt").read_text()
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    for key in ("uncalibrated", "calibrated", "difference"):
        assert flat(evaluation[key]) == pytest.approx(flat(single_evaluation[key]), rel=1e-5, abs=1e-7), key


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _worker(sys.argv[1])
    shut_down()
