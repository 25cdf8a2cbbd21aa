"""Structured vector scaling: the map is its formula, the fit is the convex objective's minimum, and it stays bounded.

Properties, not scores (its quality against temperature scaling and probmetrics' ``svs`` is in
``benchmarks/results/safe_defaults.md``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import StructuredVectorScaling
from hf_calibrate.calibrators.temperature import temperature_method_beta


def _data(seed: int, rows: int = 200, classes: int = 4, sharpness: float = 3.0):
    """Logits and labels drawn from softmax(sharpness · logits'): a model with some errors, miscalibrated per class."""
    generator = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(rows, classes, generator=generator, dtype=torch.float64)
    shifted = sharpness * logits + torch.linspace(-1, 1, classes, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(shifted, 1), 1, generator=generator).squeeze(1)
    return logits, labels


def _fit(logits, labels, **options) -> StructuredVectorScaling:
    calibrator = StructuredVectorScaling(logits.shape[1]).double()
    summary = calibrator.fit_logits(logits, labels, StructuredVectorScaling.Options(**options))
    calibrator.summary = summary
    return calibrator


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), l2=st.sampled_from([0.1, 1.0, 10.0]), smoothing=st.sampled_from([0.0, 1.0]))
def test_the_fit_is_the_minimum_of_its_objective_and_the_map_is_its_formula(seed, l2, smoothing):
    logits, labels = _data(seed)
    calibrator = _fit(logits, labels, l2=l2, smoothing=smoothing)
    rows, classes = logits.shape
    beta, epsilon = temperature_method_beta(logits, labels), smoothing / (rows + 1)
    assert float(calibrator.epsilon) == pytest.approx(epsilon) and float(calibrator.inverse_temperature) == pytest.approx(beta)
    x = torch.log((1 - epsilon) * torch.softmax(beta * logits, 1) + epsilon / classes)  # the formula, probabilities formed
    offset = calibrator.scale_offset.detach().clone().requires_grad_(True)
    bias = calibrator.bias.detach().clone().requires_grad_(True)
    strength = l2 * classes / rows
    objective = F.cross_entropy(x * (1 + offset) + bias, labels) + strength * (offset.square().sum() + bias.square().sum())
    objective.backward()
    assert float(torch.cat([offset.grad, bias.grad]).abs().max()) < 1e-4  # convex: a zero gradient is the minimum (L-BFGS stops within ~1e-10 nats)
    with torch.no_grad():
        assert torch.allclose(calibrator(logits), x * (1 + offset) + bias, atol=1e-9)


def test_a_strong_ridge_is_smoothed_temperature_scaling_and_without_smoothing_is_temperature_scaling():
    logits, labels = _data(1)
    strong = _fit(logits, labels, l2=1e6, smoothing=0.0)
    temperature = CalibratedModel.fit(nn.Identity(), TensorDataset(logits.float(), labels), method="temperature", progress=False)
    with torch.no_grad():
        expected = torch.softmax(temperature(logits.float()).double(), 1)
        assert torch.allclose(torch.softmax(strong(logits), 1), expected, atol=1e-4)
    smoothed = _fit(logits, labels, l2=1e6)
    with torch.no_grad():
        probabilities = torch.softmax(smoothed(logits), 1)
    assert float(probabilities.min()) >= float(smoothed.epsilon) / logits.shape[1] * 0.99  # the mixture's floor


def test_separable_data_stay_bounded_and_say_so():
    """Every row right: temperature scaling is not fitted (T = 1, said), and the ridge keeps v and b finite and small."""
    logits = 5 * torch.eye(4, dtype=torch.float64).repeat(25, 1)
    labels = torch.arange(4).repeat(25)
    calibrator = _fit(logits, labels)
    assert float(calibrator.inverse_temperature) == 1.0
    assert any("not fitted (T = 1 kept)" in line for line in calibrator.summary["warnings"])
    assert calibrator.summary["converged"] and calibrator.summary["largest_scale_offset"] < 10


def test_a_fit_through_the_model_saves_and_loads_to_the_same_outputs(tmp_path):
    logits, labels = _data(2)
    calibrated = CalibratedModel.fit(nn.Identity(), TensorDataset(logits.float(), labels), method="structured_vector", progress=False)
    assert calibrated.fit_summary["epsilon"] == pytest.approx(1 / (len(labels) + 1))
    calibrated.save_pretrained(tmp_path / "svs")
    loaded = CalibratedModel.from_pretrained(tmp_path / "svs", base_model=nn.Identity())
    with torch.no_grad():
        assert torch.equal(loaded(logits.float()), calibrated(logits.float()))


def test_options_are_checked():
    from hf_calibrate.calibrators import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="l2"):
        StructuredVectorScaling.Options(l2=-1.0)
    with pytest.raises(InvalidOptionError, match="smoothing"):
        StructuredVectorScaling.Options(smoothing=2.0)
