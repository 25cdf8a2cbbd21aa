"""Real multi-process fits: 2 CPU processes (gloo) give the single-process fit.

``torchrun`` starts two fresh workers (see ``tests/_launch.py``); each loads the cached zoo CNN,
runs the same ``CalibratedModel.fit`` / ``evaluate`` and the main worker writes what it got to disk.
The engine splits every global batch across processes and sums gradients, so the δ and T
of Neural Clamping agree with one process up to float summation order; we allow 1e-4
relative (5 epochs of SGD with momentum amplify rounding only slightly).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_calibrate import CalibratedModel

NC_OPTIONS = dict(method="neural_clamping", epochs=5, holdout_fraction=0.0, batch_size=100, lr=0.05, progress=False)


def _fit_and_report(out_dir: str) -> None:
    """The worker: runs in each torchrun process."""
    from hf_calibrate.demo import digits_timm_cnn

    demo = digits_timm_cnn(progress=False)
    nc = CalibratedModel.fit(demo.model, demo.dataset["calibration"], **NC_OPTIONS)
    ts = CalibratedModel.fit(demo.model, demo.dataset["calibration"], method="temperature", progress=False)
    report = ts.evaluate(demo.dataset["test"], progress=False)
    if int(os.environ["RANK"]) == 0:
        save_file({"delta": nc.calibrator.delta.detach().cpu(), "log_t": nc.calibrator.log_temperature.detach().cpu().reshape(1),
                   "ts_log_t": ts.calibrator.log_temperature.detach().cpu().reshape(1)}, os.path.join(out_dir, "fit.safetensors"))
        metrics = {"world": nc.provenance["num_processes"], "calibrated": report["calibrated"], "uncalibrated": report["uncalibrated"]}
        Path(out_dir, "report.json").write_text(json.dumps(metrics))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_fit_like_one(tmp_path, digits_cnn):
    from _launch import torchrun

    single_nc = CalibratedModel.fit(digits_cnn.model, digits_cnn.dataset["calibration"], **NC_OPTIONS)
    single_ts = CalibratedModel.fit(digits_cnn.model, digits_cnn.dataset["calibration"], method="temperature", progress=False)
    single_report = single_ts.evaluate(digits_cnn.dataset["test"], progress=False)

    torchrun(Path(__file__), [str(tmp_path)])

    multi = load_file(str(tmp_path / "fit.safetensors"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world"] == 2
    assert single_nc.provenance["num_processes"] == 1
    assert single_nc.calibrator.delta.abs().max() > 0  # δ actually moved
    torch.testing.assert_close(multi["delta"], single_nc.calibrator.delta.detach().cpu(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(multi["log_t"][0], single_nc.calibrator.log_temperature.detach().cpu(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(multi["ts_log_t"][0], single_ts.calibrator.log_temperature.detach().cpu(), rtol=1e-5, atol=1e-7)
    for side in ("calibrated", "uncalibrated"):
        assert report[side]["num_samples"] == single_report[side]["num_samples"] == len(digits_cnn.dataset["test"])
        for name in ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier"):
            assert report[side][name] == pytest.approx(single_report[side][name], rel=1e-5, abs=1e-7), (side, name)


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _fit_and_report(sys.argv[1])
    shut_down()
