"""Real multi-process fits: 2 CPU processes (gloo) against one process.

``torchrun`` starts two fresh workers (see ``tests/_launch.py``); each loads the cached zoo CNN,
runs the same ``CalibratedModel.fit`` / ``evaluate`` and the main worker writes what it got to
disk. The engine splits every global batch across processes and sums gradients, so two
processes change only the order in which float32 sums are taken. What that guarantees:

* one-pass computations (logits, the temperature-scaling solve, metrics) equal one process to
  float tolerance (the binned metrics too: the test confidences nearest an inner bin edge are
  4e-5 away from it, before and after TS, far beyond float32 differences in the logits);
* Neural Clamping's first SGD step equals one process's to float tolerance: with δ₀ = 0 and one
  global batch, δ₁ = −lr·∇δ (the momentum buffer starts at the gradient), a sum over the same
  449 samples in another order. Measured: relative L2 1e-7 between two summation orders of one
  process; asserted ≤ 1e-5.
* after several epochs δ is *not* near-equal element by element: SGD amplifies rounding
  (ReLU boundaries, momentum), and two summation orders within one process (micro-batches of 16
  vs 7 vs none, 5 epochs) already give δ a relative L2 distance of 4e-4 (largest element
  3.8e-5) while their final loss and T agree to 1e-7. So the test compares what is stable: the
  final training loss and log T to 1e-5 (100× the measured spread), and δ by relative L2 ≤ 1e-2
  (25× the measured spread; a lost all-reduce, or a process missing part of a batch, moves δ by
  tens of percent).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from _results import flat
from safetensors.torch import load_file, save_file

from hf_calibrate import CalibratedModel

NC_OPTIONS = dict(method="neural_clamping", epochs=5, holdout_fraction=0.0, batch_size=100, lr=0.05, progress=False)
FIRST_STEP = dict(NC_OPTIONS, epochs=1, batch_size=4096)  # one global batch: a single SGD step
FIRST_STEP_REL_L2 = 1e-5
FINAL_DELTA_REL_L2 = 1e-2
FINAL_LOSS_AND_LOG_T_ABS = 1e-5


def _fits(model, calibration):
    """{name: (δ, log T, last epoch's training loss)} for the first-step and the 5-epoch fit, and the TS model."""
    fits = {}
    for name, options in (("first_step", FIRST_STEP), ("epochs", NC_OPTIONS)):
        nc = CalibratedModel.fit(model, calibration, **options)
        fits[name] = (nc.calibrator.delta.detach().cpu(), nc.calibrator.log_temperature.detach().cpu().reshape(1),
                      torch.tensor([nc.fit_summary["history"][-1]["loss"]], dtype=torch.float64))
    ts = CalibratedModel.fit(model, calibration, method="temperature", progress=False)
    return fits, ts, nc.provenance["num_processes"]


def _relative_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def _fit_and_report(out_dir: str) -> None:
    """The worker: runs in each torchrun process."""
    from hf_calibrate.demo import digits_timm_cnn

    demo = digits_timm_cnn(progress=False)
    fits, ts, world = _fits(demo.model, demo.dataset["calibration"])
    report = ts.evaluate(demo.dataset["test"], progress=False)
    if int(os.environ["RANK"]) == 0:
        tensors = {f"{name}.{part}": value for name, fit in fits.items() for part, value in zip(("delta", "log_t", "loss"), fit)}
        tensors["ts_log_t"] = ts.calibrator.log_temperature.detach().cpu().reshape(1)
        save_file(tensors, os.path.join(out_dir, "fit.safetensors"))
        metrics = {"world": world, **{key: report[key] for key in ("calibrated", "uncalibrated", "difference", "verdicts")}}
        Path(out_dir, "report.json").write_text(json.dumps(metrics))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_fit_like_one(tmp_path, digits_cnn):
    from _launch import torchrun

    single, single_ts, single_world = _fits(digits_cnn.model, digits_cnn.dataset["calibration"])
    single_report = single_ts.evaluate(digits_cnn.dataset["test"], progress=False)

    torchrun(Path(__file__), [str(tmp_path)])

    multi = load_file(str(tmp_path / "fit.safetensors"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["world"] == 2 and single_world == 1
    # One pass: the TS solve and the metrics.
    torch.testing.assert_close(multi["ts_log_t"][0], single_ts.calibrator.log_temperature.detach().cpu(), rtol=1e-5, atol=1e-7)
    for side in ("calibrated", "uncalibrated"):
        assert report[side]["num_samples"] == single_report[side]["num_samples"] == len(digits_cnn.dataset["test"])
        for name in ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier"):
            assert report[side][name] == pytest.approx(single_report[side][name], rel=1e-5, abs=1e-7), (side, name)
    # The bootstrap weights are keyed on each sample's dataset index: the same intervals, paired ones too.
    for key in ("calibrated", "uncalibrated", "difference"):
        single_values = flat(single_report[key]["intervals"] if key != "difference" else single_report[key])
        multi_values = flat(report[key]["intervals"] if key != "difference" else report[key])
        assert multi_values == pytest.approx(single_values, rel=1e-5, abs=1e-7), key
    assert report["verdicts"] == single_report["verdicts"]
    # Neural Clamping: the first step to float tolerance, then what SGD keeps stable.
    delta, log_t, _ = single["first_step"]
    assert delta.abs().max() > 0  # δ actually moved
    distance = _relative_l2(multi["first_step.delta"], delta)
    assert distance <= FIRST_STEP_REL_L2, f"first-step δ: relative L2 {distance:.2e}"
    torch.testing.assert_close(multi["first_step.log_t"], log_t, rtol=1e-6, atol=1e-7)
    delta, log_t, loss = single["epochs"]
    distance = _relative_l2(multi["epochs.delta"], delta)
    assert distance <= FINAL_DELTA_REL_L2, f"final δ: relative L2 {distance:.2e}"
    assert abs(float(multi["epochs.log_t"][0] - log_t[0])) <= FINAL_LOSS_AND_LOG_T_ABS
    assert abs(float(multi["epochs.loss"][0] - loss[0])) <= FINAL_LOSS_AND_LOG_T_ABS


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _fit_and_report(sys.argv[1])
    shut_down()
