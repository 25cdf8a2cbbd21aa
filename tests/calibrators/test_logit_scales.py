"""Logits on a scale far from a model's: probabilities given as logits (a model ending in a softmax), log-probabilities
(one ending in log_softmax), and logits multiplied by 1e-6 or 1e30, whose temperature ends at its bound (issue 40)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import calibrator_class, parse_options
from hf_calibrate.fitting.calibrate import CalibrationFitWarning

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

#: the methods that start from temperature scaling (their fit is pulled towards it, or centred on it)
STARTING_FROM_TS = ("vector", "matrix", "dirichlet", "structured_vector", "histogram", "isotonic")
PROBABILITIES_FIX = "Calibrate the model without its final softmax"


def five_classes(rows: int = 200, seed: int = 0):
    """(rows, 5) logits of a model right about 40 % of the time, and their labels."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (rows,), generator=generator)
    logits = torch.randn(rows, 5, generator=generator) * 2.0
    logits[torch.arange(rows), labels] += 1.5
    return logits, labels


def fitted(method: str, logits: torch.Tensor, labels: torch.Tensor):
    """(calibrator, fit summary) of ``method`` with its defaults on (N, C) logits."""
    cls = calibrator_class(method)
    options = parse_options(cls.Options, {}, method)
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


@pytest.mark.parametrize("method", ["temperature", "vector"])
def test_probabilities_given_as_logits_are_named_with_the_fix_and_log_probabilities_are_not(method):
    """A model ending in a softmax hands the fit probabilities: said, naming the fix, and kept in the summary. One ending
    in log_softmax hands it the logits up to a per-row constant, which softmax ignores: nothing is said, and temperature
    scaling fits the same T as on the logits (the documented decision: log-probabilities are fine)."""
    logits_model = ending_in(nn.Identity())
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        labels = torch.multinomial(torch.softmax(logits_model(x) / 2, 1), 1, generator=torch.Generator().manual_seed(2)).squeeze(1)
    data = TensorDataset(x, labels)
    calibrated, said = fit_warnings(ending_in(nn.Softmax(dim=1)), data, method)
    (line,) = [text for text in said if "look like probabilities" in text]
    assert PROBABILITIES_FIX in line and "log_softmax" in line and line in calibrated.fit_summary["warnings"]
    calibrated, said = fit_warnings(ending_in(nn.LogSoftmax(dim=1)), data, method)
    assert not any("probabilities" in text for text in said)
    if method == "temperature":
        reference, _ = fit_warnings(logits_model, data, method)
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
