"""Every method on real models trained here on real data (the zoo of ``hf_calibrate.demo``).

For the timm CNN and the transformers ViT on sklearn digits and the pretrained MiniLM on BBC
News, every method fits through ``CalibratedModel.fit``. The tests assert what holds by
construction, on any machine, and not how a method happens to score on one noisy test split
(that comparison, with seeds and intervals, is ``benchmarks/bench_quality.py``):

* each method lowers its own objective on the data it was fitted on — temperature scaling
  reaches the NLL optimum (its derivative vanishes); vector, matrix and Dirichlet scaling start
  from that optimum and minimise NLL (+ a penalty that is zero there), so their in-sample NLL is
  at most temperature scaling's; histogram binning and isotonic regression replace confidences
  by in-sample frequencies, so their in-sample ECE falls to a small fraction of the base's;
* Neural Clamping is never worse than TS on its own selection split (it falls back);
* the base weights stay bit-identical and no base parameter ever gets a gradient;
* the calibrated model is called like its base, and evaluates on the full test split.
"""

from __future__ import annotations

import pytest
import torch

from hf_calibrate import CalibratedModel
from hf_calibrate.data import prepare_data
from hf_calibrate.fitting.auto.selection import default_logit_candidates
from hf_calibrate.metrics import expected_calibration_error, negative_log_likelihood
from hf_calibrate.serialization import weights_fingerprint

LOGIT_METHODS = default_logit_candidates()  # every logit method, as auto chooses among them
# Small budgets keep the suite fast on 2 CPU cores; the benchmarks run the full defaults.
# The binning methods are fitted without their prior towards TS (prior=0), the classic maps whose in-sample
# property test_binning_methods_flatten_their_in_sample_ece checks; their defaults are measured in benchmarks/.
CLASSIC_BINNING = {"prior": 0.0}
NC_OPTIONS = {
    "digits_cnn": dict(epochs=30, batch_size=128),
    "digits_vit": dict(epochs=30, batch_size=128),
    "bbc_minilm": dict(epochs=4, batch_size=64, eval_every=1),
}
#: the MiniLM is fitted on a stratified share of its 556 calibration articles: nine fits through a transformer
#: (every logit method and Neural Clamping) cost most of this module's time, and the properties hold on fewer rows
CALIBRATION_ROWS = {"bbc_minilm": 256}


def _fit_options(name, demo):
    options = dict(progress=False)
    if demo.library == "transformers":
        options["preprocessor"] = demo.preprocessor
    if name == "bbc_minilm":
        options["max_length"] = demo.recipe["hparams"]["max_length"]
    return options


@torch.no_grad()
def _base_logits(model, data, options):
    """The base's float32 logits and the labels of ``data``, computed once."""
    prepared = prepare_data(data, model.backbone, **{k: v for k, v in options.items() if k != "progress"})
    logits, labels = [], []
    for start in range(0, len(prepared), 64):
        inputs, batch_labels = prepared.collate([prepared.dataset[i] for i in range(start, min(start + 64, len(prepared)))])
        logits.append(model.backbone.logits(inputs).float())
        labels.append(batch_labels)
    return torch.cat(logits), torch.cat(labels)


@pytest.fixture(scope="module", params=["digits_cnn", "digits_vit", "bbc_minilm"])
def fitted(request):
    """All methods fitted on one zoo model, its calibration logits, and the base's state before and after."""
    name = request.param
    demo = request.getfixturevalue(name)
    options = _fit_options(name, demo)
    before = weights_fingerprint(demo.model)
    flags = [p.requires_grad for p in demo.model.parameters()]
    models, calibration = {}, demo.dataset["calibration"]
    if name in CALIBRATION_ROWS:
        calibration = calibration.train_test_split(train_size=CALIBRATION_ROWS[name], stratify_by_column="label", seed=0)["train"]
    for method in LOGIT_METHODS + ("neural_clamping",):
        extra = NC_OPTIONS[name] if method == "neural_clamping" else CLASSIC_BINNING if method in ("histogram", "isotonic") else {}
        models[method] = CalibratedModel.fit(demo.model, calibration, method=method, **options, **extra)
    logits, labels = _base_logits(models["temperature"], calibration, options)
    results = {method: models[method].evaluate(demo.dataset["test"], **options) for method in ("temperature", "neural_clamping")}
    grads = [p.grad for p in demo.model.parameters()]
    return {
        "name": name, "demo": demo, "results": results, "models": models, "before": before,
        "after": weights_fingerprint(demo.model), "grads": grads, "flags_before": flags,
        "calibration_logits": logits, "calibration_labels": labels,
    }


def _in_sample(fitted, method):
    """(probabilities before, probabilities after) of ``method`` on its own calibration data."""
    logits = fitted["calibration_logits"]
    with torch.no_grad():
        calibrated = fitted["models"][method].calibrator(logits)
    return torch.softmax(logits.double(), 1), torch.softmax(calibrated.double(), 1)


def test_base_weights_untouched_and_never_get_gradients(fitted):
    assert fitted["after"] == fitted["before"]
    assert all(grad is None for grad in fitted["grads"])
    assert not any(p.requires_grad for p in fitted["demo"].model.parameters())


def test_temperature_scaling_reaches_the_nll_optimum(fitted):
    """f'(β) = mean_i(E_p[z_i] − z_{i,y_i}) vanishes at β = 1/T: what is left is below the
    Newton solver's stopping step (relative 1e-6 in β for float32 logits), with 10× margin."""
    z = fitted["calibration_logits"].double()
    labels = fitted["calibration_labels"]
    beta = float(torch.exp(-fitted["models"]["temperature"].calibrator.log_temperature.double()))
    p = torch.softmax(beta * z, 1)
    mean_z = (p * z).sum(1)
    slope = float((mean_z - z.gather(1, labels[:, None]).squeeze(1)).mean())
    curvature = float(((p * z * z).sum(1) - mean_z**2).mean())
    assert abs(slope) <= 1e-5 * beta * curvature, (fitted["name"], slope, curvature, beta)


def test_temperature_scaling_lowers_its_in_sample_nll(fitted):
    labels = fitted["calibration_labels"]
    before, after = _in_sample(fitted, "temperature")
    assert negative_log_likelihood(after, labels) < negative_log_likelihood(before, labels)


@pytest.mark.parametrize("method", ("vector", "matrix", "dirichlet"))
def test_linear_scalings_reach_at_most_the_temperature_nll_in_sample(fitted, method):
    """They start at the TS optimum, where their penalty is 0, and descend on NLL + penalty."""
    labels = fitted["calibration_labels"]
    _, after = _in_sample(fitted, method)
    _, ts = _in_sample(fitted, "temperature")
    assert negative_log_likelihood(after, labels) <= negative_log_likelihood(ts, labels) + 1e-6, (fitted["name"], method)


@pytest.mark.parametrize("method", ("histogram", "isotonic"))
def test_binning_methods_flatten_their_in_sample_ece(fitted, method):
    """The classic maps (prior=0). In sample, each group of rows the map sends to one value (a fit bin, an isotonic block) has that value
    as its accuracy, so a group inside one ECE bin adds no gap. Two kinds of rows escape that, and bound the
    ECE from the definition (not from one machine's model):

    - rows whose argmax the map changes (g(c) < 1/C): each moves a gap by at most 1 where it was and where
      it lands, 2 / N each;
    - rows of a group whose value is an ECE bin edge (a block of 15 with 14 correct is 14/15): the
      probabilities read back from the calibrated logits round to either side of the edge row by row, so
      the group splits between two bins; its two parts' gaps cancel, so it adds at most its size / N.
    """
    labels = fitted["calibration_labels"]
    before, after = _in_sample(fitted, method)
    changed = int((after.argmax(1) != before.argmax(1)).sum())
    confidence = after.max(1).values
    edges = torch.arange(1, 15, dtype=torch.float64) / 15
    on_an_edge = int(((confidence[:, None] - edges).abs() < 1e-6).any(1).sum())
    bound = (2 * changed + on_an_edge) / len(labels) + 1e-6
    assert expected_calibration_error(after, labels, n_bins=15) <= bound, (fitted["name"], method, changed, on_an_edge)


def test_neural_clamping_never_worse_than_ts_on_selection_split(fitted):
    model = fitted["models"]["neural_clamping"]
    summary, key = model.fit_summary, f"holdout_{model.provenance['options']['select_metric']}"
    baseline = summary["temperature_scaling"][key]
    if summary["fell_back_to_temperature_scaling"]:
        assert summary["selected"] == {"fallback": "temperature_scaling"}
        assert torch.count_nonzero(model.calibrator.delta) == 0
    else:
        assert summary["selected"][key] < baseline
    evaluated = [r[key] for r in summary["history"] if key in r]
    assert evaluated, "the held-out split was never evaluated"


@pytest.mark.parametrize("method", ("temperature", "neural_clamping"))
def test_evaluation_covers_the_whole_test_split(fitted, method):
    result = fitted["results"][method]
    for side in ("uncalibrated", "calibrated"):
        assert result[side]["num_samples"] == len(fitted["demo"].dataset["test"])


def test_temperature_keeps_predictions(fitted):
    result = fitted["results"]["temperature"]
    assert result["calibrated"]["accuracy"] == result["uncalibrated"]["accuracy"]
    before, after = _in_sample(fitted, "temperature")
    assert torch.equal(before.argmax(1), after.argmax(1))


def test_calibrated_model_is_called_like_its_base(fitted):
    demo, model = fitted["demo"], fitted["models"]["neural_clamping"]
    options = {k: v for k, v in _fit_options(fitted["name"], demo).items() if k != "progress"}
    prepared = prepare_data(demo.dataset["test"], model.backbone, **options)
    inputs, _ = prepared.collate([prepared.dataset[i] for i in range(4)])
    with torch.no_grad():
        if demo.library == "timm":
            out = model(inputs["pixel_values"])
            assert isinstance(out, torch.Tensor) and out.shape == (4, 10)
        else:
            out = model(**inputs)
            assert out.logits.shape[0] == 4
            base = demo.model(**inputs)
            assert type(out) is type(base)
