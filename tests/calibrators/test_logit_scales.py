"""Logits on a scale far from a model's: probabilities given as logits (a model ending in a softmax), log-probabilities
(one ending in log_softmax), and logits multiplied by 1e-6 or 1e30, whose temperature ends at its bound."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate._errors import UserError
from hf_calibrate._probabilities import as_logits
from hf_calibrate.calibrators import calibrator_class, parse_options
from hf_calibrate.fitting.calibrate import CalibrationFitWarning

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

#: the methods that start from temperature scaling (their fit is pulled towards it, or centred on it)
STARTING_FROM_TS = ("vector", "matrix", "dirichlet", "structured_vector", "histogram", "isotonic")


def five_classes(rows: int = 200, seed: int = 0):
    """(rows, 5) logits of a model right about 40 % of the time, and their labels."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (rows,), generator=generator)
    logits = torch.randn(rows, 5, generator=generator) * 2.0
    logits[torch.arange(rows), labels] += 1.5
    return logits, labels


def fitted(method: str, logits: torch.Tensor, labels: torch.Tensor, **given):
    """(calibrator, fit summary) of ``method`` with its defaults (but for ``given``) on (N, C) logits."""
    cls = calibrator_class(method)
    options = parse_options(cls.Options, given, method)
    calibrator = cls.create(logits.shape[1], options)
    summary = calibrator.fit_logits(logits, labels, options)
    calibrator.is_fitted = True
    return calibrator, summary


def ending_in(last: nn.Module) -> nn.Module:
    """A fixed 6-feature, 4-class classifier whose forward ends in ``last``."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4), last).eval()


def fit_warnings(model: nn.Module, data: TensorDataset, method: str):
    """(calibrated model, the texts of the CalibrationFitWarnings its fit said)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrated = CalibratedModel.fit(model, data, method=method, progress=False)
    return calibrated, [str(w.message) for w in caught if issubclass(w.category, CalibrationFitWarning)]


def labelled_inputs(rows: int = 120) -> TensorDataset:
    """(rows, 6) inputs and labels drawn from ``ending_in(nn.Identity())``'s softmax at temperature 2 (over-confident)."""
    x = torch.randn(rows, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        probabilities = torch.softmax(ending_in(nn.Identity())(x) / 2, 1)
    return TensorDataset(x, torch.multinomial(probabilities, 1, generator=torch.Generator().manual_seed(2)).squeeze(1))


@pytest.mark.parametrize("method", ["temperature", "vector", "neural_clamping"])
def test_a_model_ending_in_a_softmax_is_calibrated_on_the_log_of_its_probabilities(method, tmp_path):
    """A model ending in a softmax hands the fit probabilities p (every method calibrated softmax(p), a flattened copy,
    and on a ViT's probabilities came out worse than the model). The fit reads log p, the logits up to a per-row
    constant, says so once (in the summary too), and gives what the same method gives on the model without its softmax;
    the calibrated model returns logits, and keeps reading log p once saved and loaded (format 3). Vector scaling is not
    invariant to the per-row constant (its per-class scales multiply it): there, the fit beats the model's own NLL."""
    data = labelled_inputs()
    calibrated, said = fit_warnings(ending_in(nn.Softmax(dim=1)), data, method)
    (line,) = [text for text in said if "outputs are probabilities" in text]
    assert "reads their log" in line and line in calibrated.fit_summary["warnings"]
    assert calibrated.backbone.outputs == "probabilities"
    reference, said = fit_warnings(ending_in(nn.Identity()), data, method)
    assert reference.backbone.outputs == "logits" and not any("probabilities" in text for text in said)
    x = data.tensors[0]
    with torch.no_grad():
        if method == "vector":
            nll = lambda probabilities: float(-probabilities[torch.arange(len(x)), data.tensors[1]].log().mean())  # noqa: E731
            assert nll(torch.softmax(calibrated(x), 1)) < nll(ending_in(nn.Softmax(dim=1))(x))
        else:
            torch.testing.assert_close(torch.softmax(calibrated(x), 1), torch.softmax(reference(x), 1), atol=2e-3, rtol=0)
        calibrated.save_pretrained(tmp_path / "saved")
        loaded = CalibratedModel.from_pretrained(tmp_path / "saved", base_model=ending_in(nn.Softmax(dim=1)))
        torch.testing.assert_close(loaded(x), calibrated(x))
    record = json.loads((tmp_path / "saved" / "calibration_config.json").read_text())
    assert record["format_version"] == 3 and record["input_contract"]["outputs"] == "probabilities"
    assert "ends in a softmax" in (tmp_path / "saved" / "README.md").read_text()


def test_a_calibration_of_probabilities_refuses_outputs_that_are_not():
    """The calibration reads log p; outputs that are not probabilities (another model, a changed one) are refused,
    naming the rows and the fix, not read as logits."""
    model = ending_in(nn.Softmax(dim=1))
    calibrated, _ = fit_warnings(model, labelled_inputs(), "temperature")
    model[3] = nn.Identity()
    with pytest.raises(UserError, match=r"calibrated as probabilities .* row\(s\) 0, 1, 2, 3, 4 of this batch .* fit it again"):
        calibrated(torch.randn(5, 6))


def test_log_probabilities_and_logits_are_read_as_they_are():
    """A model ending in log_softmax hands the fit its logits up to a per-row constant, which softmax ignores: nothing
    is said, and temperature scaling fits the same T as on the logits."""
    data = labelled_inputs()
    calibrated, said = fit_warnings(ending_in(nn.LogSoftmax(dim=1)), data, "temperature")
    assert not any("probabilities" in text for text in said) and calibrated.backbone.outputs == "logits"
    reference, _ = fit_warnings(ending_in(nn.Identity()), data, "temperature")
    assert calibrated.calibrator.temperature.item() == pytest.approx(reference.calibrator.temperature.item(), rel=1e-4)


def test_sigmoid_outputs_are_named_with_the_fix():
    """A model ending in a sigmoid: every value in [0, 1], rows not summing to 1; said, naming the fix (the log-odds)."""
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 4, (120,), generator=torch.Generator().manual_seed(2))
    calibrated, said = fit_warnings(ending_in(nn.Sigmoid()), TensorDataset(x, labels), "temperature")
    (line,) = [text for text in said if "per-class probabilities" in text]
    assert "without its final sigmoid" in line and "log-odds" in line
    _, said = fit_warnings(ending_in(nn.Identity()), TensorDataset(x, labels), "temperature")
    assert not any("probabilities" in text for text in said)


@pytest.mark.parametrize("scale, bound", [(1e30, "T = 1000 is at its bound"), (1e-6, "T = 0.001 is at its bound")])
def test_temperature_at_its_bound_on_rescaled_logits_names_the_scale(scale, bound):
    """Logits × 1e30 (or × 1e-6) put T at its bound with the median row still spanning far more (less) than a model's
    calibrated logits: the line names the scale, not a few dominating rows; one huge row among normal ones still does."""
    logits, labels = five_classes()
    _, summary = fitted("temperature", logits * scale, labels)
    (line,) = summary["warnings"]
    assert bound in line and "the logits' scale is far from a model's" in line
    logits[0] = torch.tensor([0.0, 1e3, 0.0, 0.0, 0.0])  # one wrong row: its logit of 1000 alone drives T to 1000
    labels[0] = 0
    (line,) = fitted("temperature", logits, labels)[1]["warnings"]
    assert "T = 1000 is at its bound" in line and "a few rows dominate the fit" in line


@pytest.mark.parametrize("method", STARTING_FROM_TS)
def test_a_fit_starting_from_a_temperature_at_its_bound_says_so(method):
    """Logits × 1e30: temperature scaling ends at T = 1000 (vector's test NLL was 1.3e27, with no warning). Every method
    that starts from it passes the line on, once, named as its own."""
    logits, labels = five_classes()
    _, summary = fitted(method, logits * 1e30, labels)
    lines = [line for line in summary["warnings"] if "T = 1000 is at its bound" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{method}: it starts from temperature scaling, and T = 1000")


def test_vector_scales_at_their_bound_on_tiny_logits_are_put_down_to_the_temperature():
    """Logits × 1e-6, fitted without a ridge (l2=0; the default ridge keeps the scales within it): vector's per-class
    scales end at their bound because the logits are tiny, not because the data separate the classes (what the line
    said): it points at the temperature's line, which names the scale."""
    logits, labels = five_classes(rows=300)
    lines = fitted("vector", logits * 1e-6, labels, l2=0.0)[1]["warnings"]
    (scales,) = [line for line in lines if "per-class scale(s) ended at a bound" in line]
    assert "the temperature it starts from is at its bound too" in scales and "separate" not in scales
    assert any("the logits' scale is far from a model's" in line for line in lines)


@pytest.mark.parametrize("method", ["matrix", "dirichlet"])
def test_maps_on_tiny_logits_keep_their_accuracy_or_say_why_not(method):
    """Logits × 1e-6: temperature scaling ends at T = 0.001, its logits still nearly uniform, and matrix / Dirichlet fit
    little more than biases, the class frequencies, which then decide every argmax (accuracy .41 → .20). Either the
    accuracy is kept or the fit says that the temperature it starts from is at its bound because of the logits' scale."""
    logits, labels = five_classes(rows=300)
    calibrator, summary = fitted(method, logits * 1e-6, labels)
    with torch.no_grad():
        accuracy = float((calibrator(logits * 1e-6).argmax(1) == labels).double().mean())
    base = float((logits.argmax(1) == labels).double().mean())
    said = any("T = 0.001 is at its bound" in line and "scale is far from" in line for line in summary["warnings"])
    assert accuracy >= base - 0.05 or said


def test_base_outputs_overrides_the_guess_and_a_wrong_guess_names_it():
    """A model whose first rows only look like probabilities: the fit stops at the first batch that is not, naming
    ``base_outputs='logits'``, which then reads the outputs as they are; ``base_outputs`` is checked by name."""

    class FirstRowsLikeProbabilities(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            logits = torch.stack([x[:, 0], 2 * x[:, 1], -x[:, 0]], dim=1)
            return torch.where((x[:, 2] > 100)[:, None], torch.tensor([0.2, 0.3, 0.5]), logits)

    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    x[:16, 2] = 1000.0  # the first 16 rows give [0.2, 0.3, 0.5]
    data = TensorDataset(x, torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(1)))
    with pytest.raises(UserError, match=r"only looked like probabilities\), fit with base_outputs='logits'"):
        CalibratedModel.fit(FirstRowsLikeProbabilities(), data, method="temperature", progress=False)
    calibrated, said = fit_warnings_with(FirstRowsLikeProbabilities(), data, base_outputs="logits")
    assert calibrated.backbone.outputs == "logits" and not any("probabilities" in text for text in said)
    with pytest.raises(UserError, match="calibrated as probabilities"):  # log-probabilities are not probabilities
        fit_warnings_with(ending_in(nn.LogSoftmax(dim=1)), labelled_inputs(), base_outputs="probabilities")
    with pytest.raises(ValueError, match="base_outputs"):
        CalibratedModel.fit(ending_in(nn.Identity()), labelled_inputs(), method="temperature", base_outputs="softmax")


def fit_warnings_with(model: nn.Module, data: TensorDataset, **options):
    """(temperature-scaled model, the texts of the CalibrationFitWarnings its fit said) with ``options``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrated = CalibratedModel.fit(model, data, method="temperature", progress=False, **options)
    return calibrated, [str(w.message) for w in caught if issubclass(w.category, CalibrationFitWarning)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_probabilities_are_read_exactly_and_heads_accept_their_layer(dtype):
    """A float16 / bfloat16 softmax: log p is taken in float32, so values below float16's smallest normal number are
    not rounded up (the uncalibrated side is the model's own probabilities), and a head's classifier layer is checked
    against the softmax within its rounding (it was refused as 'transformed further')."""
    tiny = torch.tensor([[1.0, 1e-6]], dtype=dtype)  # float16: a subnormal; was read as 6.1e-5, 60 times more
    assert as_logits(tiny).dtype == torch.float32 and as_logits(tiny).exp()[0, 1] == pytest.approx(float(tiny[0, 1]), rel=1e-6)
    model = nn.Sequential(ending_in(nn.Identity()), LowPrecision(dtype), nn.Softmax(dim=1))
    x, labels = labelled_inputs().tensors
    with torch.no_grad():
        model[0][2].weight.mul_(12.0)  # a sure model
        assert bool((model(x) < 6.1e-5).any())  # below float16's smallest normal number: was rounded up to it
    calibrated = CalibratedModel.fit(model, TensorDataset(x, labels), method="tst", epochs=2, progress=False)
    with torch.no_grad():
        own = model(x).double()
    evaluated = calibrated.evaluate(TensorDataset(x, labels), bootstrap=0, progress=False)
    # softmax(log p) renormalises p, whose rows sum to 1 within 2⁻⁸ in bfloat16: so up to that, exactly the model's
    assert evaluated["uncalibrated"]["nll"] == pytest.approx(float(-own[torch.arange(len(x)), labels].log().mean()), abs=2.0 ** -8)


class LowPrecision(nn.Module):
    """Casts its input to ``dtype``: a model computing its softmax in float16 or bfloat16."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def test_rows_of_an_underflowed_softmax_are_not_taken_for_copies():
    """A model sure of its rows gives many of them the same one-hot probabilities (log p: 0 and the floor): distinct
    inputs, not copies of one; exact copies of other rows still are."""

    class SureOfSome(nn.Module):
        """softmax(logits × the input's first feature): rows with a large one are one-hot."""

        def __init__(self) -> None:
            super().__init__()
            self.body = ending_in(nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.body(x) * x[:, :1], dim=1)

    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(3))
    x[:, 0] = 1.0
    x[:80, 0] = 1e4  # one-hot rows, all alike
    x[100:] = x[80:100]  # 20 copies of rows that are not
    model = SureOfSome().eval()
    with torch.no_grad():
        assert int((model(x[:80]).max(dim=1).values == 1.0).sum()) > 40 and bool((model(x[80:]) > 0).all())
    calibrated, _ = fit_warnings_with(model, TensorDataset(x, torch.randint(0, 4, (120,), generator=torch.Generator().manual_seed(4))))
    assert calibrated.backbone.outputs == "probabilities" and calibrated.fit_summary["duplicate_rows"] == 20
