"""No pass twice: ``fit_and_evaluate`` (and ``hf-calibrate fit`` without ``--eval-split``) reuse the fit's base logits.

The fit has run the base model over the calibration data; an evaluation on that same data
takes the base logits from there. What is asserted, on the zoo's timm CNN and real digits:

* the results are those of ``CalibratedModel.fit`` followed by ``evaluate``: bit for bit for the
  logit-space methods and for Neural Clamping with separate validation data (the fit's pass
  is the evaluation's: same batches, same order of sums); to 1e-6 relative for Neural Clamping
  and a head method holding out part of the calibration data (their fit computed the base
  logits in the batches of its two parts; on this CPU those are bit-identical too);
* the base model's forward (counted by a forward hook on it) runs no further time for a
  logit-space method and once per evaluation batch — the calibrated pass — for Neural
  Clamping and the head methods (``evaluate`` runs it twice);
* nothing stale: other data, other engine options fall back to a full evaluation; ``n_bins``
  is honoured; the kept logits are not copied and do not outlive the call;
* under two processes (``torchrun``), the same as the two calls in those processes.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import weakref
from pathlib import Path

import pytest
import torch
from _results import flat

from hf_calibrate import CalibratedModel
from hf_calibrate.data import PreparedData
from hf_calibrate.fitting.runtime.kept_logits import KeptLogits
from hf_calibrate.fit_evaluate import fit_and_evaluate

BATCH = 150  # 449 calibration samples: 3 batches per pass
EVALUATION = {"progress": False, "batch_size": BATCH}
# method → (fit options, base forwards of the evaluation per batch: by evaluate, by fit_and_evaluate)
METHODS = {
    "temperature": ({}, 1, 0),
    "histogram": ({}, 1, 0),
    "neural_clamping": ({"epochs": 1}, 2, 1),
    "tst": ({"epochs": 2}, 2, 1),
}


class ForwardCounter:
    """Counts the calls of a module's forward with a forward hook."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.calls += 1

    def take(self) -> int:
        calls, self.calls = self.calls, 0
        return calls


@pytest.fixture
def counter(digits_cnn):
    counting = ForwardCounter(digits_cnn.model)
    yield counting
    counting.handle.remove()


def _passes(data) -> int:
    return math.ceil(len(data) / BATCH)



@pytest.mark.parametrize("method", list(METHODS))
def test_same_results_as_fit_then_evaluate_with_fewer_base_passes(method, digits_cnn, counter):
    options, evaluate_per_batch, reuse_per_batch = METHODS[method]
    data = digits_cnn.dataset["calibration"]
    fitted = CalibratedModel.fit(digits_cnn.model, data, method=method, **options, **EVALUATION)
    fit_calls = counter.take()
    expected = fitted.evaluate(data, **EVALUATION)
    assert counter.take() == evaluate_per_batch * _passes(data)

    calibrated, evaluation = fit_and_evaluate(digits_cnn.model, data, method=method, evaluation_options=EVALUATION,
                                              **options, **EVALUATION)
    assert counter.take() - fit_calls == reuse_per_batch * _passes(data)
    assert calibrated.last_evaluation is evaluation
    assert all(torch.equal(a, b) for a, b in zip(calibrated.calibrator.state_dict().values(), fitted.calibrator.state_dict().values()))
    if method in ("temperature", "histogram"):
        assert evaluation == expected
    else:  # base logits of a held-out part come from other batches: equal up to float rounding
        assert evaluation["calibrated"] == expected["calibrated"]
        assert flat(evaluation["uncalibrated"]) == pytest.approx(flat(expected["uncalibrated"]), rel=1e-6, abs=1e-9)


def test_neural_clamping_with_validation_data_is_bit_identical(digits_cnn, counter):
    data, validation = digits_cnn.dataset["calibration"], digits_cnn.dataset["test"]
    options = dict(method="neural_clamping", validation_data=validation, epochs=1, **EVALUATION)
    expected = CalibratedModel.fit(digits_cnn.model, data, **options).evaluate(data, **EVALUATION)
    counter.take()
    _, evaluation = fit_and_evaluate(digits_cnn.model, data, evaluation_options=EVALUATION, **options)
    assert evaluation == expected


def test_other_data_or_options_are_evaluated_afresh_and_n_bins_is_honoured(digits_cnn, counter):
    data = digits_cnn.dataset["calibration"].select(range(200))
    fitted = CalibratedModel.fit(digits_cnn.model, data, method="temperature", **EVALUATION)
    fit_calls = counter.take()
    cases = {
        "equal rows, another object": (data.select(range(len(data))), EVALUATION, 1),
        "another batch size": (None, dict(EVALUATION, batch_size=100), 1),
        "another label column given": (None, dict(EVALUATION, label_column="label"), 1),
        "only n_bins differs": (None, dict(EVALUATION, n_bins=7), 0),
    }
    for name, (evaluation_data, evaluation_options, passes) in cases.items():
        _, evaluation = fit_and_evaluate(digits_cnn.model, data, evaluation_data, method="temperature",
                                         evaluation_options=evaluation_options, **EVALUATION)
        assert counter.take() - fit_calls == passes * math.ceil(len(data) / evaluation_options["batch_size"]), name
        expected = fitted.evaluate(data if evaluation_data is None else evaluation_data, **evaluation_options)
        counter.take()
        assert evaluation == expected, name
    assert evaluation["n_bins"] == 7 and len(evaluation["reliability"]["calibrated"]["counts"]) == 7


def test_kept_logits_are_not_copied_and_do_not_outlive_the_call(digits_cnn, monkeypatch):
    added, taken = [], []
    add, take = KeptLogits.add, KeptLogits.take

    def recording_add(self, data, indices, logits, labels):
        added.append(logits.data_ptr())
        return add(self, data, indices, logits, labels)

    def recording_take(self):
        result = take(self)
        taken.append((result[0].data_ptr(), weakref.ref(result[0])))
        return result

    monkeypatch.setattr(KeptLogits, "add", recording_add)
    monkeypatch.setattr(KeptLogits, "take", recording_take)
    calibrated, _ = fit_and_evaluate(digits_cnn.model, digits_cnn.dataset["calibration"], method="temperature",
                                     evaluation_options=EVALUATION, **EVALUATION)
    gc.collect()
    assert added == [taken[0][0]]  # the tensor the logit pass made is the one the evaluation read
    assert taken[0][1]() is None and calibrated.last_evaluation  # the returned model holds no reference to it


def _prepared(count: int) -> PreparedData:
    return PreparedData(dataset=list(range(count)), collate=lambda items: items, description=f"{count} samples")


def test_kept_logits_assembles_its_data_in_dataset_order_and_ignores_other_data():
    data, other = _prepared(5), _prepared(5)
    logits = torch.arange(10.0).reshape(5, 2)
    labels = torch.tensor([0, 1, 0, 1, 1])
    kept = KeptLogits(data)
    fit_part, held_out = torch.tensor([0, 2, 3]), torch.tensor([1, 4])
    kept.add(data, fit_part, logits[fit_part], labels[fit_part])
    kept.add(other, held_out, torch.zeros(2, 2), torch.zeros(2, dtype=torch.long))
    assert kept.take() is None  # samples 1 and 4 of `data` were never received
    kept.add(data, fit_part, logits[fit_part], labels[fit_part])
    kept.add(data, held_out, logits[held_out], labels[held_out])
    got_logits, got_labels = kept.take()
    assert torch.equal(got_logits, logits) and torch.equal(got_labels, labels)
    assert kept.take() is None  # handed over once


def test_cli_fit_runs_the_base_once_and_reports_what_evaluate_reports(digits_cnn, tmp_path, capsys):
    from _files import write_image_folder

    from hf_calibrate.cli import main
    from hf_calibrate.fitting.runtime.probing import OUTPUT_PROBE_ROWS

    data = digits_cnn.dataset["calibration"]
    folder = write_image_folder(tmp_path / "digits", {"calibration": data})
    output = tmp_path / "ts"
    calls = []  # the rows of each forward pass of the base
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, inputs, out: calls.append(len(inputs[0])) if type(module).__name__ == "ResNet" else None
    )
    try:
        assert main(["fit", "--model", str(digits_cnn.path), "--dataset", str(folder), "--method", "temperature",
                     "--batch-size", "200", "--output", str(output), "--no-progress"]) == 0
    finally:
        hook.remove()
    # one pass over the calibration split (was two), after a look at its first rows (fitting.probing.base_outputs)
    assert calls == [OUTPUT_PROBE_ROWS] + [200, 200, len(data) - 400]
    capsys.readouterr()
    assert main(["evaluate", "--model", str(output), "--dataset", str(folder), "--split", "calibration", "--batch-size", "200",
                 "--json", "--no-progress"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    recorded = json.loads((output / "calibration_config.json").read_text())["evaluation"]
    for side in ("uncalibrated", "calibrated"):
        assert recorded[side] == {key: evaluated[side][key] for key in recorded[side]}, side


def _two_process_worker(out_dir: str) -> None:
    """Runs in each torchrun process: both paths on a tiny CNN, micro-batched; rank 0 writes the results."""
    import _tiny_models as tm

    model = tm.tiny_timm()
    data = tm.image_data(model, n=90)
    options = {"progress": False, "batch_size": 40, "micro_batch_size": 7}
    results = {}
    for method, extra in (("temperature", {}), ("neural_clamping", {"epochs": 1})):
        expected = CalibratedModel.fit(model, data, method=method, **extra, **options).evaluate(data, **options)
        _, got = fit_and_evaluate(model, data, method=method, evaluation_options=options, **extra, **options)
        results[method] = {"expected": expected, "got": got, "world": int(os.environ["WORLD_SIZE"])}
    if int(os.environ["RANK"]) == 0:
        Path(out_dir, "results.json").write_text(json.dumps(results))


@pytest.mark.multiprocess
def test_two_processes_reuse_gives_what_evaluate_gives(tmp_path):
    from _launch import torchrun

    torchrun(Path(__file__), [str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["temperature"]["world"] == 2
    assert results["temperature"]["got"] == results["temperature"]["expected"]
    nc = results["neural_clamping"]
    assert nc["got"]["calibrated"] == nc["expected"]["calibrated"]
    assert flat(nc["got"]["uncalibrated"]) == pytest.approx(flat(nc["expected"]["uncalibrated"]), rel=1e-6, abs=1e-9)


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _two_process_worker(sys.argv[1])
    shut_down()
