"""Structured vector and matrix scaling: the map is its formula, the fit is the convex objective's minimum, it stays
bounded; and a C×C fit too large for the memory free is refused before it starts.

Properties, not scores (their quality and cost against temperature scaling and probmetrics' ``svs`` and ``sms`` are
in ``benchmarks/results/safe_defaults.md`` and ``benchmarks/results/fit_cost.md``).
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
from hf_calibrate.calibrators import StructuredMatrixScaling, StructuredVectorScaling
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


@pytest.mark.parametrize("method", ["structured_vector", "structured_matrix"])
def test_a_fit_through_the_model_saves_and_loads_to_the_same_outputs(method, tmp_path):
    logits, labels = _data(2)
    calibrated = CalibratedModel.fit(nn.Identity(), TensorDataset(logits.float(), labels), method=method, progress=False)
    assert calibrated.fit_summary["epsilon"] == pytest.approx(1 / (len(labels) + 1))
    calibrated.save_pretrained(tmp_path / method)
    loaded = CalibratedModel.from_pretrained(tmp_path / method, base_model=nn.Identity())
    with torch.no_grad():
        assert torch.equal(loaded(logits.float()), calibrated(logits.float()))


def test_options_are_checked():
    from hf_calibrate.calibrators import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="l2"):
        StructuredVectorScaling.Options(l2=-1.0)
    with pytest.raises(InvalidOptionError, match="smoothing"):
        StructuredVectorScaling.Options(smoothing=2.0)


# ----------------------------------------------------------------------------- structured matrix scaling


def _fit_matrix(logits, labels, **options) -> StructuredMatrixScaling:
    calibrator = StructuredMatrixScaling(logits.shape[1]).double()
    calibrator.summary = calibrator.fit_logits(logits, labels, StructuredMatrixScaling.Options(**options))
    return calibrator


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), l2=st.sampled_from([0.1, 1.0, 10.0]))
def test_structured_matrix_is_the_minimum_of_its_objective_and_the_map_is_its_formula(seed, l2):
    """(I + Δ) x + b on x = log((1 − ε) softmax(β z) + ε/C), ridge λ (C/N) on Δ's diagonal and b, λ C(C − 1)/N off it."""
    logits, labels = _data(seed)
    calibrator = _fit_matrix(logits, labels, l2=l2)
    rows, classes = logits.shape
    beta, epsilon = temperature_method_beta(logits, labels), 1 / (rows + 1)
    x = torch.log((1 - epsilon) * torch.softmax(beta * logits, 1) + epsilon / classes)
    offset = calibrator.offset.detach().clone().requires_grad_(True)
    bias = calibrator.bias.detach().clone().requires_grad_(True)
    off_diagonal = offset.square().sum() - offset.diagonal().square().sum()
    ridge = l2 * classes / rows * (offset.diagonal().square().sum() + bias.square().sum()) + l2 * classes * (classes - 1) / rows * off_diagonal
    (F.cross_entropy(x + x @ offset.T + bias, labels) + ridge).backward()
    assert float(torch.cat([offset.grad.flatten(), bias.grad]).abs().max()) < 1e-4  # convex: a zero gradient is the minimum
    with torch.no_grad():
        assert torch.allclose(calibrator(logits), x + x @ offset.T + bias, atol=1e-9)


def test_structured_matrix_with_a_diagonal_offset_is_structured_vector():
    """Its map restricted to a diagonal Δ = diag(v) is structured vector scaling's (1 + v) ⊙ x + b."""
    logits, _ = _data(3)
    matrix, vector = StructuredMatrixScaling(4).double(), StructuredVectorScaling(4).double()
    v, b = torch.tensor([0.5, -0.2, 0.1, 0.0]), torch.tensor([0.3, 0.0, -0.1, 0.2])
    with torch.no_grad():
        for calibrator in (matrix, vector):
            calibrator.bias.copy_(b)
            calibrator.epsilon.fill_(0.01)
            calibrator.inverse_temperature.fill_(0.7)
        matrix.offset.copy_(torch.diag(v))
        vector.scale_offset.copy_(v)
        assert torch.allclose(matrix(logits), vector(logits), atol=1e-12)


# ----------------------------------------------------------------------------- memory known before it is spent


@pytest.mark.parametrize("method", ["matrix", "dirichlet", "structured_matrix"])
def test_a_map_too_large_for_the_memory_free_is_refused_before_it_allocates(method, monkeypatch):
    """The C×C fits estimate their peak from (rows, classes) and refuse, naming the estimate, what is free and the way
    out; at 50 × 10,000 the estimate is tens of GB (a matrix fit there reached 20.9 GB before it was killed)."""
    from hf_calibrate.calibrators import calibrator_class, memory, parse_options

    cls = calibrator_class(method)
    assert cls.footprint.bytes(50, 10_000) > 20e9
    monkeypatch.setattr(memory, "free_bytes", lambda device: 500_000)  # 0.5 MB free: enough for TS, not for a 40 × 40 map
    options = parse_options(cls.Options, {}, method)
    logits, labels = _data(5, rows=100, classes=40)
    needed = f"{cls.footprint.bytes(100, 40) / 1e6:.1f}"
    with pytest.raises(memory.FitTooLargeError, match=rf"needs about {needed} MB of memory at its peak, and cpu has 0\.5 MB free\. Use structured_vector"):
        cls.create(40, options).fit_logits(logits.float(), labels, options)
    temperature = calibrator_class("temperature")
    temperature.create(40, temperature.Options()).fit_logits(logits.float(), labels, temperature.Options())
    monkeypatch.setattr(memory, "free_bytes", lambda device: None)  # unknown: not refused
    cls.create(40, options).fit_logits(logits.float(), labels, options)


def test_auto_leaves_out_a_map_too_large_for_memory_naming_its_estimate(monkeypatch):
    """In auto the refusal leaves the C×C candidates out before they start, with the estimate as the reason; the others
    are fitted as usual."""
    from hf_calibrate.calibrators import memory
    from hf_calibrate.calibrators.holdout import content_groups, cross_fitting_folds
    from hf_calibrate.fitting.auto.scoring import score_candidates
    from hf_calibrate.fitting.runtime.engine import Engine, EngineOptions

    monkeypatch.setattr(memory, "free_bytes", lambda device: 1_100_000)  # enough for TS and structured vector only
    logits, labels = _data(6, rows=400, classes=20, sharpness=0.5)  # every class present
    logits, groups = logits.float(), content_groups(logits)
    folds = cross_fitting_folds(labels, 5, 0, groups)
    bar = type("Bar", (), {"update": lambda self, count: None})()
    scored = {entry.method: entry for entry in score_candidates(
        ["temperature", "structured_vector", "matrix", "structured_matrix"], logits, labels, folds, Engine(EngineOptions()), bar, groups)}
    for method in ("matrix", "structured_matrix"):
        assert scored[method].nll is None and f"{method} on 400 x 20 logits needs about" in scored[method].reason
    assert scored["structured_vector"].nll is not None
