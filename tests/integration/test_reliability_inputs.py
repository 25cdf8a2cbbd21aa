"""Trust: no silent wrong confidence.

Every defect below once gave a silently wrong result or an unhelpful error; each now ends as
correct behaviour or as a ValueError that names the problem and the fix:

* non-finite inputs, logits or features (fit, evaluate, calibrators, metrics);
* option and label types at every public boundary (fit, evaluate, metrics, evaluate modules);
* MaC-Cal keeping a head at a retention rate it never validated;
* class names as labels in the Python API (matched to the model's labels, as the CLI does).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import CALIBRATORS, calibrator_class, fit_inverse_temperature
from hf_calibrate.fitting.auto.selection import default_logit_candidates
from hf_calibrate.metrics import CalibrationMetrics, calibration_report, expected_calibration_error, negative_log_likelihood
from hf_calibrate.serialization import weights_fingerprint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_models import LABELS, image_data, tiny_timm  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
LOGIT_METHODS = default_logit_candidates()  # every logit method, as auto chooses among them
ALL_METHODS = tuple(CALIBRATORS)
#: options that make every method's fit short (only reached where a check failed to stop it)
FAST = {"neural_clamping": dict(epochs=1, holdout_fraction=0.0), "tst": dict(epochs=1), "vtst": dict(epochs=1), "mac_cal": dict(epochs=1)}
BAD_SAMPLE = 57


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


@pytest.fixture(scope="module")
def cnn():
    return tiny_timm(0)


@pytest.fixture(scope="module")
def clean(cnn):
    """120 labelled 3×16×16 images for the tiny timm CNN."""
    return image_data(cnn, 120, seed=1)


def fit(model, data, method, **options):
    options = {"progress": False, "batch_size": 50, **FAST.get(method, {}), **options}
    return CalibratedModel.fit(model, data, method=method, **options)


def assert_names(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    for fragment in fragments:
        assert fragment in message, message


# ============================================================================ 1. non-finite values


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_nonfinite_input_is_refused_naming_the_sample_and_the_fix(cnn, clean, method, value):
    """One bad pixel in 120 images: every method refuses, naming sample 57; the model is untouched."""
    pixels, labels = clean.tensors
    pixels = pixels.clone()
    pixels[BAD_SAMPLE, 0, 3, 3] = value
    before, flags = weights_fingerprint(cnn), [p.requires_grad for p in cnn.parameters()]
    with pytest.raises(ValueError) as error:
        fit(cnn, TensorDataset(pixels, labels), method)
    assert_names(error, "input 'pixel_values'", f"sample(s) {BAD_SAMPLE} ", "positions in that data", "remove or impute these samples")
    assert "batch" not in str(error.value)  # the fit's own batches mean nothing to the user
    assert weights_fingerprint(cnn) == before and [p.requires_grad for p in cnn.parameters()] == flags


class Flaky(nn.Module):
    """Finite for most inputs; for a sample whose first value is 0 its features (so its logits) are ±inf/NaN."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(12, 8)
        self.classifier = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.body(x)) / x[:, :1]  # x[:, 0] == 0 → inf (or 0/0 = NaN)
        return self.classifier(hidden)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_model_emitting_nonfinite_logits_is_refused(method):
    """Finite inputs, but the model returns non-finite logits/features for samples 5 and 90."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(120, 12, generator=generator) + 0.5
    x[[5, 90], 0] = 0.0
    data = TensorDataset(x, torch.randint(0, 3, (120,), generator=generator))
    with pytest.raises(ValueError) as error:
        fit(Flaky(), data, method)
    message = str(error.value)
    assert re.search(r"returned NaN or infinite (logits|features)", message), message
    assert re.search(r"sample\(s\) (5|90)\b", message) and "inputs are finite" in message, message



@pytest.mark.parametrize("call", ["fit", "evaluate"])
def test_every_bad_sample_of_a_batch_is_named_across_micro_batches(call):
    """Samples 16 and 30 lie in batch 1 (16 samples), in different micro-batches of 4: both are named,
    once — not only the first micro-batch's, read ahead while batch 0 ended — by their positions in the data."""
    from _tiny_models import plain_data, plain_module

    module = plain_module()
    x, y = (tensor.clone() for tensor in plain_data(module).tensors)
    x[[16, 30], 0] = math.nan
    options = dict(batch_size=16, micro_batch_size=4, progress=False)
    with pytest.raises(ValueError) as error:
        if call == "fit":
            CalibratedModel.fit(module, TensorDataset(x, y), method="temperature", **options)
        else:
            fit(module, plain_data(module), "temperature").evaluate(TensorDataset(x, y), **options)
    assert_names(error, "sample(s) 16, 30 ", "(positions in that data")

@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_calibrators_refuse_nonfinite_logits_given_directly(method, value):
    """``fit_logits`` (and ``fit_inverse_temperature``) refuse NaN/inf logits instead of fitting T=0.001 or NaN."""
    generator = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(40, 3, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    logits[7, 1] = value
    cls = calibrator_class(method)
    calibrator = cls.create(3, cls.Options())
    with pytest.raises(ValueError) as error:
        calibrator.fit_logits(logits, labels, cls.Options())
    assert_names(error, "sample(s) 7 ", "NaN or infinite", "Remove these samples")
    with pytest.raises(ValueError, match=r"sample\(s\) 7 "):
        fit_inverse_temperature(logits, labels)


def test_evaluate_and_metrics_name_the_nonfinite_samples(cnn, clean):
    """``evaluate`` names the bad sample of the user's data; the metrics name the bad rows and the fix."""
    calibrated = fit(cnn, clean, "temperature")
    pixels, labels = clean.tensors
    pixels = pixels.clone()
    pixels[BAD_SAMPLE, 1, 0, 0] = math.inf
    with pytest.raises(ValueError) as error:
        calibrated.evaluate(TensorDataset(pixels, labels), progress=False, batch_size=50)
    assert_names(error, f"sample(s) {BAD_SAMPLE} ", "remove or impute")
    probs = torch.full((6, 3), 1 / 3)
    probs[4, 0] = math.nan
    with pytest.raises(ValueError) as error:
        expected_calibration_error(probs, torch.zeros(6, dtype=torch.long))
    assert_names(error, "NaN or infinite values (rows 4)", "Remove these samples")


# ============================================================================ 2. option and label types

#: (method, options, option named in the error): each once raised an operator error or was accepted
BAD_FIT_OPTIONS = [
    ("neural_clamping", {"lr": "0.1"}, "lr"),
    ("neural_clamping", {"lr": math.inf}, "lr"),
    ("neural_clamping", {"holdout_fraction": "0.2"}, "holdout_fraction"),
    ("neural_clamping", {"momentum": "0.9"}, "momentum"),
    ("neural_clamping", {"epochs": True}, "epochs"),
    ("neural_clamping", {"eval_every": True}, "eval_every"),
    ("neural_clamping", {"delta_init_scale": "small"}, "delta_init_scale"),
    ("neural_clamping", {"delta_init_scale": -1.0}, "delta_init_scale"),
    ("neural_clamping", {"n_bins": 0}, "n_bins"),
    ("temperature", {"max_iter": "5"}, "max_iter"),
    ("temperature", {"max_iter": 0}, "max_iter"),
    ("temperature", {"max_iter": True}, "max_iter"),
    ("temperature", {"seed": "x"}, "seed"),
    ("temperature", {"progress": "no"}, "progress"),
    ("temperature", {"num_workers": -1}, "num_workers"),
    ("temperature", {"max_length": 0}, "max_length"),
    ("temperature", {"mixed_precision": ["bf16"]}, "mixed_precision"),
    ("temperature", {"image_column": 3}, "image_column"),
    ("temperature", {"preprocess": "resize"}, "preprocess"),
    ("vector", {"max_iter": -1}, "max_iter"),
    ("matrix", {"l2": "1"}, "l2"),
    ("matrix", {"folds": "5"}, "folds"),
    ("vector", {"l2": -1.0}, "l2"),
    ("matrix", {"seed": True}, "seed"),
    ("histogram", {"n_bins": 2.5}, "n_bins"),
    ("histogram", {"n_bins": True}, "n_bins"),
    ("histogram", {"n_bins": 10**9}, "n_bins"),
    ("isotonic", {"prior": "1"}, "prior"),
    ("tst", {"lr": "1e-3"}, "lr"),
    ("tst", {"latent_dim": 0}, "latent_dim"),
    ("tst", {"patience": True}, "patience"),
    ("tst", {"weight_decay": -1.0}, "weight_decay"),
    ("tst", {"temperature": "yes"}, "temperature"),
    ("vtst", {"latent_dim": -2}, "latent_dim"),
    ("mac_cal", {"controller_gain": "1"}, "controller_gain"),
    ("mac_cal", {"initial_retention": "0.9"}, "initial_retention"),
    ("mac_cal", {"init_from_base": "no"}, "init_from_base"),
    ("neural_clamping", {"lr": 1e308}, "lr"),  # finite, yet it would overflow in torch: the range check must refuse it
    ("neural_clamping", {"gamma": [1.0, 1e300]}, "gamma"),
    ("neural_clamping", {"delta_init_scale": 1e300}, "delta_init_scale"),
    ("tst", {"lr": 1e308}, "lr"),
    ("matrix", {"l2": 1e300}, "l2"),
    ("mac_cal", {"controller_gain": -1e300}, "controller_gain"),
]


@pytest.mark.parametrize(("method", "options", "name"), BAD_FIT_OPTIONS, ids=[f"{m}-{n}" for m, _, n in BAD_FIT_OPTIONS])
def test_bad_fit_option_names_the_option_the_value_and_what_is_allowed(cnn, clean, method, options, name):
    with pytest.raises(ValueError) as error:
        fit(cnn, clean, method, **options)
    assert_names(error, f"option {name} must be ", f"got {options[name]!r}")


@pytest.mark.parametrize(("options", "name"), [({"lr": "0.1"}, "lr"), ({"epochs": True}, "epochs"), ({"n_bins": 0}, "n_bins")])
def test_neural_clamping_options_built_directly_are_checked_like_fit(options, name):
    from hf_calibrate.calibrators import NeuralClamping

    with pytest.raises(ValueError) as error:
        NeuralClamping.Options(**options)
    assert_names(error, f"option {name} must be ", f"got {options[name]!r}")


#: (keywords of ``evaluate``, exception, fragments of its message)
BAD_EVALUATE_OPTIONS = [
    ({"bogus": 1}, TypeError, ["unknown option(s) ['bogus'] for evaluate", "n_bins", "batch_size"]),
    ({"seed": "x"}, ValueError, ["option seed must be", "got 'x'"]),
    ({"batch_size": "64"}, ValueError, ["option batch_size must be", "Write batch_size=64"]),
    ({"dataset_name": 3}, TypeError, ["dataset_name must be a string or None"]),
]


@pytest.mark.parametrize(("options", "kind", "fragments"), BAD_EVALUATE_OPTIONS, ids=lambda v: str(v)[:30])
def test_bad_evaluate_option_is_named_like_fit(cnn, clean, options, kind, fragments):
    calibrated = fit(cnn, clean, "temperature")
    with pytest.raises(kind) as error:
        calibrated.evaluate(clean, progress=False, **options)
    assert_names(error, *fragments)


PROBS = np.array([[0.6, 0.4], [0.2, 0.8], [0.7, 0.3]])
#: (metric call on (PROBS, labels), fragment of the error): truthy strings, strings as labels, flags
BAD_METRIC_INPUTS = [
    (lambda: expected_calibration_error(PROBS, [0, 1, 1], from_logits="no"), "from_logits must be True or False, got 'no'"),
    (lambda: negative_log_likelihood(PROBS, [0, 1, 1], from_logits="False"), "from_logits must be True or False"),
    (lambda: calibration_report(PROBS, [0, 1, 1], from_logits=1), "from_logits must be True or False, got 1"),
    (lambda: expected_calibration_error(PROBS, ["cat", "dog", "dog"]), "label2id"),
    (lambda: CalibrationMetrics(2, adaptive="no"), "adaptive must be True or False"),
]


@pytest.mark.parametrize(("call", "fragment"), BAD_METRIC_INPUTS, ids=range(len(BAD_METRIC_INPUTS)))
def test_metric_flags_and_label_types_are_checked(call, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        call()


#: (references, compute keywords, fragment): each once truncated (0.9 → 0), cast or double-softmaxed
BAD_MODULE_INPUTS = [
    ([0.9, 0.0, 1.0], {}, "got floats (e.g. 0.9)"),
    ([True, False, True], {}, "got booleans"),
    (["cat", "dog", "dog"], {}, "label2id"),
    ([0, 1, 1], {"from_logits": "no"}, "from_logits must be True or False"),
]


def evaluate_module(name: str):
    """A fresh instance of the ``evaluate`` module class in ``evaluate_metrics/<name>/<name>.py``.

    The script is imported directly (``evaluate.load`` returns an instance of this same class),
    so this file leaves evaluate's dynamic-module package to ``test_evaluate_modules.py``.
    """
    evaluate = pytest.importorskip("evaluate")
    spec = importlib.util.spec_from_file_location(f"_reliability_{name}", REPO_ROOT / "evaluate_metrics" / name / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    metric_class = next(
        value for value in vars(script).values()
        if isinstance(value, type) and issubclass(value, evaluate.Metric) and value.__module__ == script.__name__
    )
    return metric_class(experiment_id=uuid.uuid4().hex)  # its own lock: a failed compute keeps it


@pytest.mark.parametrize("name", ["ece", "nll", "calibration"])
@pytest.mark.parametrize(("references", "kwargs", "fragment"), BAD_MODULE_INPUTS, ids=["float", "bool", "str", "flag"])
def test_evaluate_modules_refuse_what_they_would_cast(name, references, kwargs, fragment):
    module = evaluate_module(name)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        module.compute(predictions=PROBS.tolist(), references=references, **kwargs)


# ============================================================================ 3. MaC-Cal keeps the validated head


def test_mac_cal_keeps_the_head_it_validated():
    """The saved head has the selected epoch's retention rate, and reproduces that epoch's validation NLL."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    with torch.no_grad():
        model[2].weight.mul_(8.0)  # over-confident: the controller keeps lowering r
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(400, 6, generator=generator)
    y = torch.randint(0, 3, (400,), generator=generator)
    calibrated = CalibratedModel.fit(
        model, TensorDataset(x[:300], y[:300]), method="mac_cal", validation_data=TensorDataset(x[300:], y[300:]),
        epochs=6, controller_gain=0.2, min_retention=0.05, progress=False,  # r moves every epoch, never clipped
    )
    summary = calibrated.fit_summary
    selected = summary["history"][summary["best_epoch"] - 1]
    rates = [record["retention"] for record in summary["history"]]
    assert len(set(rates)) == len(rates)  # the controller moved r every epoch: a mix-up would show
    assert float(calibrated.calibrator.head_module.retention) == selected["retention"]
    with torch.no_grad():
        logits = calibrated(x[300:])
    assert calibration_report(logits, y[300:], from_logits=True)["nll"] == pytest.approx(selected["nll"], rel=1e-6)


# ============================================================================ 4. class names as labels


class NamedImages(Dataset):
    """``(pixels, class name)`` pairs or ``{"pixel_values", "labels": class name}`` dicts."""

    def __init__(self, pixels: torch.Tensor, names: list, as_dicts: bool) -> None:
        self.pixels, self.names, self.as_dicts = pixels, names, as_dicts

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int):
        if self.as_dicts:
            return {"pixel_values": self.pixels[index], "labels": self.names[index]}
        return self.pixels[index], self.names[index]


def _named(clean, form: str, names=LABELS):
    """The ``clean`` data with labels given as class names, in one of the accepted data forms."""
    pixels, labels = clean.tensors
    label_names = [names[int(label)] for label in labels]
    if form == "tuples":
        return NamedImages(pixels, label_names, as_dicts=False)
    if form == "dicts":
        return NamedImages(pixels, label_names, as_dicts=True)
    import datasets

    rows = {"pixel_values": pixels.numpy(), "label": label_names}
    if form == "datasets-strings":
        return datasets.Dataset.from_dict(rows).with_format("torch")
    # a ClassLabel whose names are the model's in another order: the indices must be remapped
    order = list(reversed(names))
    features = datasets.Features({
        "pixel_values": datasets.Array3D(shape=tuple(pixels.shape[1:]), dtype="float32"),
        "label": datasets.ClassLabel(names=order),
    })
    rows["label"] = [order.index(name) for name in label_names]
    return datasets.Dataset.from_dict(rows, features=features).with_format("torch")


@pytest.mark.parametrize("form", ["tuples", "dicts", "datasets-strings", "datasets-classlabel"])
def test_class_names_as_labels_are_matched_to_the_model(cnn, clean, form):
    """The same fit as with class indices, whatever form the named labels come in."""
    expected = fit(cnn, clean, "temperature").calibrator.temperature
    named = fit(cnn, _named(clean, form), "temperature")
    assert torch.equal(named.calibrator.temperature, expected)


@pytest.mark.parametrize("form", ["tuples", "datasets-strings"])
def test_unknown_class_names_list_the_models_labels(cnn, clean, form):
    names = ("cat", "dog", "cow", "bird")
    with pytest.raises(ValueError) as error:
        fit(cnn, _named(clean, form, names), "temperature")
    assert_names(error, "['cow']", "not labels of the model", str(list(LABELS)))


def test_classlabel_names_matched_ignoring_case_else_refused_naming_the_cast(cnn, clean):
    """SST-2's ``negative``/``positive`` against a model's ``NEGATIVE``/``POSITIVE`` is matched by
    name; names that do not match at all are refused with the two ways out (the indices may or
    may not mean the model's classes: guessing would be a silent wrong calibration)."""
    import datasets

    from hf_calibrate.backbones import adapt
    from hf_calibrate.data import align_labels, model_label_names

    backbone = adapt(cnn)
    names = model_label_names(backbone)
    labels = [i % len(names) for i in range(8)]
    shouted = datasets.Dataset.from_dict({"label": labels}, features=datasets.Features({"label": datasets.ClassLabel(names=[n.upper() for n in reversed(names)])}))
    matched = align_labels(shouted, "label", backbone)
    assert matched["label"] == [len(names) - 1 - label for label in labels]
    other = datasets.Dataset.from_dict({"label": labels}, features=datasets.Features({"label": datasets.ClassLabel(names=[f"other{i}" for i in range(len(names))])}))
    with pytest.raises(ValueError) as error:
        align_labels(other, "label", backbone)
    assert_names(error, "'other0'", "cast_column('label', datasets.Value('int64'))", "align_labels_with_mapping")


def test_models_with_generic_label_names(clean):
    """A model that only has transformers' default ``LABEL_i`` names: those exact names match; other
    names cannot, and say so; a dataset's ClassLabel indices are taken as they are (nothing to match)."""
    import datasets

    from hf_calibrate.backbones import adapt
    from hf_calibrate.data import align_labels

    generic = tiny_timm(0, label_names=[f"LABEL_{i}" for i in range(len(LABELS))])
    expected = fit(generic, clean, "temperature").calibrator.temperature
    named = fit(generic, _named(clean, "tuples", [f"LABEL_{i}" for i in range(len(LABELS))]), "temperature")
    assert torch.equal(named.calibrator.temperature, expected)
    with pytest.raises(ValueError) as error:
        fit(generic, _named(clean, "tuples"), "temperature")
    assert_names(error, "only generic", "LABEL_i", "Pass class indices")
    labels = [i % len(LABELS) for i in range(8)]
    rows = datasets.Dataset.from_dict({"label": labels}, features=datasets.Features({"label": datasets.ClassLabel(names=list(LABELS))}))
    assert align_labels(rows, "label", adapt(generic))["label"] == labels
