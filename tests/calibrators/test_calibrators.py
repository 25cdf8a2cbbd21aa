"""Calibrators on cached logits: against definitions, peers (scipy, sklearn) and properties."""

from __future__ import annotations

import math
import sys
import warnings
from typing import Dict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from sklearn.isotonic import IsotonicRegression

import hf_calibrate.calibrators as calibrators
from hf_calibrate.calibrators import (
    CALIBRATORS,
    Calibrator,
    DirichletCalibration,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    NeuralClamping,
    TemperatureScaling,
    VectorScaling,
    calibrator_class,
    fit_inverse_temperature,
    focal_loss,
    parse_options,
)
from hf_calibrate.calibrators.binning import _top_label_vector
from hf_calibrate.calibrators.isotonic import _interpolate
from hf_calibrate.metrics import expected_calibration_error


def miscalibrated(n: int = 4000, classes: int = 6, sharpness: float = 3.0, seed: int = 0):
    """Logits whose labels follow softmax(logits / sharpness): over-confident by that factor."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=generator) * 3
    labels = torch.multinomial(torch.softmax(logits / sharpness, dim=1), 1, generator=generator).squeeze(1)
    return logits, labels


def fitted(cls, logits, labels, **options):
    calibrator = cls.create(logits.shape[1], parse_options(cls.Options, options, cls.method))
    summary = calibrator.fit_logits(logits, labels, calibrator.Options(**options))
    return calibrator, summary


def test_temperature_matches_a_scalar_minimiser():
    logits, labels = miscalibrated()
    calibrator, summary = fitted(TemperatureScaling, logits, labels)
    reference = minimize_scalar(
        lambda log_t: F.cross_entropy(logits.double() / math.exp(log_t), labels).item(), bounds=(-3, 3), method="bounded",
        options={"xatol": 1e-9},
    )
    assert calibrator.temperature.item() == pytest.approx(math.exp(reference.x), rel=1e-5)
    assert 2.5 < calibrator.temperature.item() < 3.5  # labels were drawn at temperature 3
    assert summary["iterations"] < 20
    with torch.no_grad():
        assert torch.equal(calibrator(logits).argmax(1), logits.argmax(1))



@settings(max_examples=12, deadline=None)
@given(classes=st.integers(2, 40), count=st.integers(60, 600), sharpness=st.floats(0.3, 4.0), seed=st.integers(0, 2**16))
def test_vector_scaling_reaches_the_optimum_of_scipys_lbfgs(classes, count, sharpness, seed):
    """Block-Newton (per-class 2×2 Hessian blocks + line search) against scipy's L-BFGS-B in float64
    on the same convex objective with the same bounds on a = exp(log_scale) (those a saved artifact
    allows): never a worse NLL, and a projected gradient near zero (every class occurs, so the
    optimum is finite; a scale the optimum would make negative ends at the lower bound)."""
    from scipy.optimize import minimize

    from hf_calibrate.calibrators.solvers.vector_newton import SCALE_BOUNDS

    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(count, classes, generator=generator, dtype=torch.float64) * 3
    labels = torch.cat([torch.arange(classes), torch.multinomial(torch.softmax(logits[classes:] / sharpness, 1), 1, generator=generator).squeeze(1)])
    calibrator, summary = fitted(VectorScaling, logits, labels, l2=0.0)  # the unregularised fit

    def nll_and_grad(flat):
        parameters = torch.tensor(flat, dtype=torch.float64, requires_grad=True)
        loss = F.cross_entropy(logits * parameters[:classes] + parameters[classes:], labels)
        loss.backward()
        return loss.item(), parameters.grad.numpy().copy()

    start = np.concatenate([np.full(classes, 1.0 / fitted(TemperatureScaling, logits, labels)[0].temperature.item()), np.zeros(classes)])
    bounds = [SCALE_BOUNDS] * classes + [(None, None)] * classes
    reference = minimize(nll_and_grad, start, jac=True, method="L-BFGS-B", bounds=bounds,
                         options={"maxiter": 5000, "gtol": 1e-12, "ftol": 1e-15})
    ours = np.concatenate([calibrator.log_scale.detach().exp().double().numpy(), calibrator.bias.detach().double().numpy()])
    loss, gradient = nll_and_grad(ours)
    at_bound = np.concatenate([ours[:classes] <= SCALE_BOUNDS[0] * (1 + 1e-5), np.zeros(classes, dtype=bool)])  # stored in float32
    projected = np.where(at_bound, np.minimum(gradient, 0.0), gradient)
    assert loss <= reference.fun + 1e-8, (loss, reference.fun, summary)  # nats: far below any visible change
    assert np.abs(projected).max() <= 1e-4, (np.abs(projected).max(), summary)

def test_temperature_below_one_for_an_under_confident_model():
    logits, labels = miscalibrated(sharpness=0.4)
    calibrator, _ = fitted(TemperatureScaling, logits, labels)
    assert 0.3 < calibrator.temperature.item() < 0.5


SEPARABLE = r"has no minimum: all \d+ rows are classified correctly"
BELOW_CHANCE = "has no minimum: the true classes' logits are on average no higher than the mean logit"


def wide_margins(rows: int = 50, margin: float = 20.0):
    """``rows`` 3-class logits whose true class leads the others by ``margin``: separable, far from any tie."""
    labels = torch.arange(rows) % 3
    return F.one_hot(labels, 3).float() * margin, labels


SEPARABLE_REFUSED = "not fitted (T = 1 kept)"


@pytest.mark.parametrize("case, message, temperature", [
    ("argmax of 4000 rows", SEPARABLE_REFUSED, 1.0),
    ("wide margins", SEPARABLE_REFUSED, 1.0),  # f'(β) underflows to 0 long before the bound
    ("one row", SEPARABLE_REFUSED, 1.0),
    ("tied top, label not argmax's pick", SEPARABLE_REFUSED, 1.0),
    ("argmin labels", BELOW_CHANCE, 1e3),
    ("wide margins, float16", SEPARABLE_REFUSED, 1.0),
])
def test_a_temperature_without_a_minimum_says_so(case, message, temperature):
    """Separable logits (the true class always on top, ties included): the NLL falls towards T → 0, a hard argmax,
    so T = 1 is kept and one line says why; logits below chance: the bound the NLL falls towards, and the cause.
    fit_inverse_temperature itself returns the bound in both cases."""
    logits, labels = miscalibrated()
    logits, labels = {
        "argmax of 4000 rows": (logits, logits.argmax(1)),
        "wide margins": wide_margins(),
        "one row": wide_margins(rows=1, margin=2.0),
        "tied top, label not argmax's pick": (torch.tensor([[2.0, 2.0, 0.0]]), torch.tensor([1])),
        "argmin labels": (logits, logits.argmin(1)),
        "wide margins, float16": (wide_margins()[0].half(), wide_margins()[1]),
    }[case]
    calibrator, summary = fitted(TemperatureScaling, logits, labels)
    assert len(summary["warnings"]) == 1 and message in summary["warnings"][0]
    assert calibrator.temperature.item() == pytest.approx(temperature, rel=1e-6)
    bound = 1e-3 if message == SEPARABLE_REFUSED else 1e3
    assert 1.0 / fit_inverse_temperature(logits, labels)[0] == pytest.approx(bound, rel=1e-6)


@pytest.mark.parametrize("case, said", [
    ("a quarter of the rows tie", "in 50 of them the true class only ties with other classes for the highest logit"),
    ("every logit zero", "all 200 calibration rows have every logit equal, so every T gives the same uniform"),
])
def test_ties_are_not_called_correct_classifications(case, said):
    """Rows whose true class only ties for the top logit (and rows whose logits are all equal) leave the NLL without a
    minimum as correct rows do, but the line says what they are, never "classified correctly"."""
    logits, labels = wide_margins(rows=200)
    if case == "every logit zero":
        logits = torch.zeros_like(logits)
    else:
        rows = torch.arange(0, 200, 4)
        logits[rows, (labels[rows] + 1) % 3] = logits[rows, labels[rows]]  # another class ties the true one, on top
    calibrator, summary = fitted(TemperatureScaling, logits, labels)
    assert calibrator.temperature.item() == 1.0
    assert len(summary["warnings"]) == 1 and said in summary["warnings"][0]
    assert "classified correctly" not in summary["warnings"][0]


def test_a_temperature_with_a_minimum_does_not_warn():
    """One misclassified row among wide margins is enough for a minimum: T is finite, and nothing is said."""
    logits, labels = wide_margins()
    labels[0] = 1
    assert fitted(TemperatureScaling, *miscalibrated())[1]["warnings"] == []
    calibrator, summary = fitted(TemperatureScaling, logits, labels)
    assert summary["warnings"] == []
    assert 1e-3 < calibrator.temperature.item() < 1e3


def test_a_temperature_at_its_bound_says_so():
    """One wrong row with logits a million times the others' (a corrupted input) drives T to its bound: said in one line."""
    logits, labels = miscalibrated(n=200)
    logits[0] = torch.tensor([0.0, 1e6, 0.0, 0.0, 0.0, 0.0])
    labels[0] = 0
    calibrator, summary = fitted(TemperatureScaling, logits, labels)
    assert calibrator.temperature.item() > 100
    assert len(summary["warnings"]) == 1 and "T = 1000" in summary["warnings"][0]


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_linear_maps_start_at_ts_and_only_improve(cls):
    logits, labels = miscalibrated()
    ts, _ = fitted(TemperatureScaling, logits, labels)
    calibrator, summary = fitted(cls, logits, labels)
    with torch.no_grad():
        ts_nll = F.cross_entropy(ts(logits).double(), labels).item()
        nll = F.cross_entropy(calibrator(logits).double(), labels).item()
    assert summary.get("loss", ts_nll) <= ts_nll + 1e-9  # the objective starts at TS (penalty 0 there); no loss: TS chosen
    assert nll <= ts_nll + 1e-6


def test_vector_scaling_recovers_per_class_scales():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(20000, 3, generator=generator) * 2
    scales, bias = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([0.3, 0.0, -0.3])
    labels = torch.multinomial(torch.softmax(logits * scales + bias, 1), 1, generator=generator).squeeze(1)
    calibrator, _ = fitted(VectorScaling, logits, labels, l2=0.0)
    # softmax is invariant to a common shift of the bias: compare centred biases
    assert torch.allclose(calibrator.log_scale.exp().detach(), scales, atol=0.08)
    fitted_bias = calibrator.bias.detach()
    assert torch.allclose(fitted_bias - fitted_bias.mean(), bias - bias.mean(), atol=0.08)


def test_dirichlet_with_scaled_identity_is_temperature_scaling():
    logits, _ = miscalibrated(n=50)
    dirichlet = DirichletCalibration(6)
    with torch.no_grad():
        dirichlet.weight.copy_(torch.eye(6) * 0.4)
        assert torch.allclose(torch.softmax(dirichlet(logits), 1), torch.softmax(logits * 0.4, 1), atol=1e-6)


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_a_stronger_pull_stays_closer_to_temperature_scaling(cls):
    """The ridge towards TS: the calibrated log-probabilities of a larger λ are closer to TS's, and λ = 0 is the furthest."""
    logits, labels = miscalibrated(n=600, classes=5, seed=4)
    ts, _ = fitted(TemperatureScaling, logits, labels)
    distances = []
    for strength in (0.0, 0.1, 10.0):
        calibrator, _ = fitted(cls, logits, labels, l2=strength)
        with torch.no_grad():
            change = F.log_softmax(calibrator(logits).double(), 1) - F.log_softmax(ts(logits).double(), 1)
            distances.append(change.square().mean().item())
    assert distances[0] > distances[1] > distances[2]


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_the_strength_is_selected_by_cross_fitted_nll(cls):
    """TS (λ = ∞) first, then the grid strongest first; the choice has the lowest cross-fitted NLL of those tried;
    and it generalises better than the unregularised fit (300 rows, 30 classes)."""
    logits, labels = miscalibrated(n=300, classes=30, seed=1)
    fresh_logits, fresh_labels = miscalibrated(n=4000, classes=30, seed=2)
    selected, summary = fitted(cls, logits, labels, l2=None, l2_grid=(1e-4, 1.0, 1e2))
    loose, _ = fitted(cls, logits, labels, l2=0.0)
    scores = summary["l2_cv_nll"]
    assert list(scores) == ["inf", "100.0", "1.0", "0.0001"][: len(scores)]
    chosen = "inf" if summary["l2"] is None else repr(summary["l2"])
    assert scores[chosen] == min(scores.values())
    with torch.no_grad():
        nll = lambda c: F.cross_entropy(c(fresh_logits), fresh_labels).item()  # noqa: E731
        assert nll(selected) < nll(loose)


@pytest.mark.parametrize("classes", [2, 3, 10])
def test_the_variables_lbfgs_moves_make_the_ridge_the_same_in_every_direction(classes):
    """Δ = S ⊙ U (``isotropic_scale``): the ridge of (U, b) is ρ_d (‖U‖² + ‖b‖²) whatever λ and N, and the objective is
    the one of Δ."""
    from hf_calibrate.calibrators.solvers.linear_maps import isotropic_scale, matrix_objective, ridge_strengths

    generator = torch.Generator().manual_seed(classes)
    scaled, labels = torch.randn(50, classes, generator=generator, dtype=torch.float64), torch.arange(50) % classes
    free, bias = torch.randn(classes, classes, generator=generator, dtype=torch.float64), torch.randn(classes, generator=generator, dtype=torch.float64)
    scale, no_map = isotropic_scale(classes, torch.float64, torch.device("cpu")), torch.zeros(classes, classes, dtype=torch.float64)
    for l2, rows in ((1.0, 50), (0.3, 7)):
        ridge = ridge_strengths(l2, rows, classes)
        data_term = torch.nn.functional.cross_entropy(torch.addmm(bias, scaled, (free * scale).t()) + scaled, labels)
        penalty = matrix_objective(scaled, labels, free, bias, ridge, scale)() - data_term
        assert float(penalty) == pytest.approx(ridge[0] * float(free.square().sum() + bias.square().sum()), rel=1e-12)
        assert float(matrix_objective(scaled, labels, free, bias, ridge, scale)()) == float(matrix_objective(scaled, labels, free * scale, bias, ridge)())
    assert float(matrix_objective(scaled, labels, no_map, bias * 0, (1.0, 1.0), scale)()) == pytest.approx(float(torch.nn.functional.cross_entropy(scaled, labels)))


@pytest.mark.parametrize("cls", [MatrixScaling, DirichletCalibration])
def test_a_fixed_strength_reaches_the_optimum_of_scipys_lbfgs(cls):
    """A fixed λ: our L-BFGS (float64 here) against scipy's L-BFGS-B run to a tight tolerance on the same objective."""
    from scipy.optimize import minimize

    from hf_calibrate.calibrators.solvers.linear_maps import matrix_objective, ridge_strengths

    logits, labels = miscalibrated(n=600, classes=4, seed=3)
    calibrator, summary = fitted(cls, logits, labels, l2=0.5)
    beta = 1.0 / summary["temperature"]
    scaled = beta * cls.linear_map.features(logits.double())

    def objective(flat):
        offset, bias = torch.tensor(flat[:16].reshape(4, 4), requires_grad=True), torch.tensor(flat[16:], requires_grad=True)
        loss = matrix_objective(scaled, labels, offset, bias, ridge_strengths(0.5, 600, 4))()
        loss.backward()
        return loss.item(), np.concatenate([offset.grad.numpy().ravel(), bias.grad.numpy()])

    reference = minimize(objective, np.zeros(20), jac=True, method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10000})
    assert summary["loss"] <= reference.fun + 1e-7  # nats: far below any visible change
    weight = beta * (np.eye(4) + reference.x[:16].reshape(4, 4))  # W = β (I + Δ)
    ours = np.concatenate([calibrator.weight.detach().double().numpy().ravel(), calibrator.bias.detach().double().numpy()])
    np.testing.assert_allclose(ours, np.concatenate([weight.ravel(), reference.x[16:]]), atol=2e-3)


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_the_pull_bounds_the_change_from_temperature_scaling(cls):
    """At λ > 0 the fit's objective is at most TS's (where the ridge is 0), so the ridge λ (C/N) (Σ Δ_cc² + ‖b‖²) +
    λ (C(C − 1)/N) Σ_{c≠j} Δ_cj² ≤ NLL_TS, with W = β (I + Δ) (a = β (1 + v) for vector scaling): every parameter
    stays within √(NLL_TS N / (λ C)) of TS's, however separable the data (one error here)."""
    logits, _ = miscalibrated(n=450, classes=10, seed=5)
    labels = logits.argmax(1)
    labels[0] = (labels[0] + 1) % 10
    calibrator, summary = fitted(cls, logits, labels, l2=0.01)
    beta, (rows, classes) = 1.0 / summary["temperature"], logits.shape
    with torch.no_grad():
        weight = torch.diag(calibrator.log_scale.double().exp()) if cls is VectorScaling else calibrator.weight.double()
        offset = weight / beta - torch.eye(classes, dtype=torch.float64)
        diagonal = offset.diagonal().square().sum() + calibrator.bias.double().square().sum()
        ridge = 0.01 / rows * (classes * diagonal + classes * (classes - 1) * (offset.square().sum() - offset.diagonal().square().sum()))
        ts_nll = F.cross_entropy(logits.double() * beta, labels).item()
    assert float(ridge) <= ts_nll + 1e-6
    assert all(torch.isfinite(parameter).all() for parameter in calibrator.parameters())


def _interrupted_at(evaluation: int, monkeypatch):
    """Make matrix scaling's objective raise KeyboardInterrupt (as Ctrl-C) at its ``evaluation``-th call with gradients."""
    from hf_calibrate.calibrators.solvers import linear_maps

    calls, make_objective = [0], linear_maps.matrix_objective

    def interrupted(*arguments):
        objective = make_objective(*arguments)

        def counted():
            calls[0] += 1
            if calls[0] == evaluation:
                raise KeyboardInterrupt
            return objective()

        return counted

    monkeypatch.setattr(linear_maps, "matrix_objective", interrupted)


@pytest.mark.parametrize("l2", [None, 1.0])
def test_ctrl_c_keeps_the_best_state_only_where_allowed(l2, monkeypatch):
    from hf_calibrate.calibrators.base import FitContext

    logits, labels = miscalibrated(n=500, classes=5)
    options = MatrixScaling.Options(l2=l2)
    with monkeypatch.context() as patch:
        _interrupted_at(6, patch)
        with pytest.raises(KeyboardInterrupt):
            MatrixScaling(5).fit_logits(logits, labels, options)
    calibrator = MatrixScaling(5)
    with monkeypatch.context() as patch:
        _interrupted_at(6, patch)
        with pytest.warns(UserWarning, match="interrupted \\(Ctrl-C\\)"):
            summary = calibrator.fit_logits(logits, labels, options, FitContext(interruptible=True))
    assert summary["interrupted"].startswith("during the l2 selection" if l2 is None else "during the fit")
    ts, _ = fitted(TemperatureScaling, logits, labels)
    with torch.no_grad():
        assert torch.isfinite(calibrator.weight).all()
        assert F.cross_entropy(calibrator(logits), labels) <= F.cross_entropy(ts(logits), labels) + 1e-6


@pytest.mark.parametrize("joint", [True, False])
def test_lbfgs_fits_show_progress_per_fit(joint, monkeypatch):
    """A bar per fit: on small data one per λ for the folds and all rows fitted jointly, with nothing refitted; above
    ``LinearMap.fits_jointly``'s limit one per fold and λ, then the refit."""
    from tqdm.auto import tqdm

    from hf_calibrate.calibrators.solvers import lbfgs
    from hf_calibrate.calibrators.solvers import linear_maps
    from hf_calibrate.calibrators.base import FitContext

    bars = []

    def progress(total, description):
        bars.append((total, description))
        return tqdm(total=total, desc=description, disable=True)

    if not joint:
        monkeypatch.setattr(linear_maps.LinearMap, "fits_jointly", lambda *arguments: False)
    logits, labels = miscalibrated(n=300, classes=4)
    options = DirichletCalibration.Options(l2=None, l2_grid=(0.1, 10.0), folds=2)
    summary = DirichletCalibration(4).fit_logits(logits, labels, options, FitContext(progress=progress))
    refit = [(1250, "dirichlet fit")] if summary["l2"] is not None else []
    if joint:
        joint_budget = lbfgs.max_evaluations(linear_maps.JOINT_LBFGS_ITERATIONS)
        assert bars == [(joint_budget, f"dirichlet: l2 = {strength}, 2 folds and all rows") for strength in ("10", "0.1")]
        return
    expected = [(1250, f"dirichlet: l2 = {strength}, fold {fold} of 2") for strength in ("10", "0.1") for fold in (1, 2)]
    assert bars == [*expected, *refit]


def test_a_long_fit_is_announced_with_its_bound(monkeypatch):
    from hf_calibrate.calibrators.solvers import lbfgs
    from hf_calibrate.calibrators.base import FitContext

    logits, labels = miscalibrated(n=300, classes=4)
    monkeypatch.setattr(lbfgs, "WARN_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(lbfgs, "TIME_FROM_WORK", 0.0)
    with pytest.warns(UserWarning, match=r"matrix on 300 x 4 logits: one evaluation .* up to 6 L-BFGS fit\(s\) of at most 1250"):
        fitted(MatrixScaling, logits, labels)  # the default: l2 = 1 on 5 folds against TS, then the refit
    with pytest.warns(UserWarning, match=r"matrix on 300 x 4 logits: one evaluation .* up to 1 L-BFGS fit\(s\) of at most 1250"):
        fitted(MatrixScaling, logits, labels, l2=1.0)  # a given l2: one fit
    with warnings.catch_warnings():  # not on the other processes of a distributed fit
        warnings.simplefilter("error")
        options = MatrixScaling.Options()
        MatrixScaling(4).fit_logits(logits, labels, options, FitContext(announce=False))
    monkeypatch.setattr(lbfgs, "WARN_AFTER_SECONDS", 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted(MatrixScaling, logits, labels)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(l2=-1.0), r"l2 must be a non-negative number in \[0, 10000\], got -1.0"),
        (dict(l2_grid=()), "l2_grid must be a non-empty"),
        (dict(l2_grid=(0.0, 1.0)), r"l2_grid must be a positive number in \(0, 10000\] \(each value of the list\)"),
        (dict(folds=1), "folds must be an integer >= 2"),
    ],
)
def test_regularised_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        parse_options(MatrixScaling.Options, options, "matrix")


@pytest.mark.parametrize("mode", ["top_label", "one_vs_rest"])
def test_histogram_bins_hold_empirical_frequencies(mode):
    logits, labels = miscalibrated()
    calibrator, _ = fitted(HistogramBinning, logits, labels, n_bins=10, mode=mode, prior=0.0)  # the classic frequencies
    probs = torch.softmax(logits.double(), 1)
    scores = probs.max(1).values if mode == "top_label" else probs[:, 2]
    targets = (probs.argmax(1) == labels) if mode == "top_label" else (labels == 2)
    row = 0 if mode == "top_label" else 2
    for b in range(10):
        in_bin = (scores > b / 10) & (scores <= (b + 1) / 10)
        if in_bin.any():
            assert calibrator.bin_values[row, b].item() == pytest.approx(targets[in_bin].double().mean().item())
    with torch.no_grad():
        calibrated = torch.softmax(calibrator(logits).double(), 1)
    assert torch.allclose(calibrated.sum(1), torch.ones(len(logits), dtype=torch.float64))
    if mode == "top_label":  # the top probability is the bin frequency
        expected = calibrator.bin_values[0, ((scores * 10).ceil().long() - 1).clamp(0, 9)]
        assert torch.allclose(calibrated.max(1).values, expected, atol=1e-6)


def test_isotonic_top_label_matches_sklearn():
    logits, labels = miscalibrated()
    calibrator, _ = fitted(IsotonicCalibration, logits, labels, prior=0.0)  # the classic fit
    probs = torch.softmax(logits.double(), 1)
    confidence = probs.max(1).values.numpy()
    correct = (probs.argmax(1) == labels).double().numpy()
    reference = IsotonicRegression(out_of_bounds="clip").fit(confidence, correct)
    queries = np.concatenate([confidence[:500], np.random.default_rng(0).uniform(0.0, 1.0, 500)])
    ours = _interpolate(torch.from_numpy(queries)[None], calibrator.knots_x, calibrator.knots_y)[0].numpy()
    np.testing.assert_allclose(ours, reference.predict(queries), atol=1e-9)


def test_isotonic_one_vs_rest_rows_are_distributions():
    logits, labels = miscalibrated()
    calibrator, summary = fitted(IsotonicCalibration, logits, labels, mode="one_vs_rest")
    assert calibrator.knots_x.shape == (6, summary["num_knots"])
    with torch.no_grad():
        probs = torch.softmax(calibrator(logits).double(), 1)
    assert torch.allclose(probs.sum(1), torch.ones(len(logits), dtype=torch.float64))


# The method-parametrised tests below take every registered logit method (a new one too, with no edit here); the
# tables hold only what differs per method, and a method they do not name gets the default.
#: the logit methods: fitted on cached logits alone (Calibrator.fitted_on_logits)
LOGIT_METHODS = [name for name, cls in CALIBRATORS.items() if cls.fitted_on_logits()]
#: options each method is fitted with besides its defaults ({}): one more fit per mode of the binning methods
MORE_OPTIONS = {"histogram": [{"mode": "one_vs_rest"}], "isotonic": [{"mode": "one_vs_rest"}]}
LOGIT_FITS = [(method, options) for method in LOGIT_METHODS for options in [{}, *MORE_OPTIONS.get(method, [])]]
#: the fits' test ids: ``histogram``, ``histogram-mode=one_vs_rest``
LOGIT_FIT_IDS = ["-".join([method, *(f"{key}={value}" for key, value in options.items())]) for method, options in LOGIT_FITS]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method, options", LOGIT_FITS, ids=LOGIT_FIT_IDS)
def test_logit_fits_agree_on_cpu_and_gpu(method, options):
    """The same code path on a GPU tensor: equal calibrated probabilities up to summation order."""
    logits, labels = miscalibrated(n=3000, classes=8)
    cls = CALIBRATORS[method]
    on_cpu, _ = fitted(cls, logits, labels, **options)
    on_gpu = cls.create(8, parse_options(cls.Options, options, method)).cuda()
    on_gpu.fit_logits(logits.cuda(), labels.cuda(), cls.Options(**options))
    with torch.no_grad():
        expected = torch.softmax(on_cpu(logits).double(), 1)
        found = torch.softmax(on_gpu(logits.cuda()).double(), 1).cpu()
    torch.testing.assert_close(found, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method, options", LOGIT_FITS, ids=LOGIT_FIT_IDS)
def test_labels_as_users_hold_them(method, options):
    """uint8 tensors, numpy arrays and lists of labels fit like int64 tensors."""
    logits, labels = miscalibrated(n=400, classes=5)
    cls = CALIBRATORS[method]
    reference, _ = fitted(cls, logits, labels, **options)
    for held in (labels.to(torch.uint8), labels.numpy(), labels.tolist()):
        calibrator = cls.create(5, parse_options(cls.Options, options, method))
        calibrator.fit_logits(logits, held, cls.Options(**options))
        with torch.no_grad():
            torch.testing.assert_close(calibrator(logits), reference(logits))


def _one_vs_rest_case(seed: int, samples: int, classes: int, repeats: int, absent: int):
    """Logits as users hold them, with exact ties: duplicated rows, rows shifted by an integer
    (softmax-identical; a grid of 1/256 keeps shifts exact), rows with their classes permuted, and
    scaled rows whose probabilities underflow to exactly 0; ``absent`` classes have no sample
    labelled with them."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(-1500, 1500, size=(samples, classes)) / 256
    copies = rng.integers(0, samples, size=repeats)
    shifted = logits[copies] + rng.integers(-2, 3, size=(repeats, 1))
    permuted = logits[copies][:, rng.permutation(classes)]  # the same probabilities, other classes
    logits = np.concatenate([logits, shifted, permuted, logits[copies] * 400])  # × 400: probabilities underflow to 0
    labels = rng.integers(0, classes - absent, size=len(logits))
    return torch.from_numpy(logits).float(), torch.from_numpy(labels)


@settings()  # examples, seed and deadline: the profile in conftest.py
@given(
    seed=st.integers(0, 2**32 - 1), samples=st.integers(1, 60), classes=st.integers(2, 6),
    repeats=st.integers(0, 40), absent=st.integers(0, 1),
)
def test_isotonic_one_vs_rest_matches_a_full_sort_per_class(seed, samples, classes, repeats, absent):
    """Against the definition: per class, sort all N scores, merge exact ties, fit (scipy), interpolate.
    (scikit-learn's IsotonicRegression is not the reference here: it merges scores within 1e-15 of
    each other, e.g. 1e-200 with an exact 0.)"""
    from scipy.optimize import isotonic_regression

    logits, labels = _one_vs_rest_case(seed, samples, classes, repeats, absent)
    calibrator, _ = fitted(IsotonicCalibration, logits, labels, mode="one_vs_rest", prior=0.0)
    probs = torch.softmax(logits.double(), 1).numpy()
    queries = np.concatenate([probs, np.random.default_rng(seed).uniform(0, 1, (50, classes))]).T
    ours = _interpolate(torch.from_numpy(queries.copy()), calibrator.knots_x, calibrator.knots_y).numpy()
    for k in range(classes):
        scores, inverse = np.unique(probs[:, k], return_inverse=True)
        weights = np.bincount(inverse).astype(np.float64)
        means = np.bincount(inverse, weights=(labels.numpy() == k).astype(np.float64)) / weights
        fitted_values = isotonic_regression(means, weights=weights, increasing=True).x
        np.testing.assert_allclose(ours[k], np.interp(queries[k], scores, fitted_values), atol=1e-9, err_msg=f"class {k}")
    assert bool((calibrator.knots_x.diff(dim=1) >= 0).all()) and bool((calibrator.knots_y.diff(dim=1) >= 0).all())


@settings()  # examples, seed and deadline: the profile in conftest.py
@given(
    st.integers(2, 8).flatmap(
        lambda c: st.tuples(
            st.lists(st.floats(0.0, 1.0), min_size=c, max_size=c).filter(lambda v: sum(v) > 1e-3),
            st.floats(0.0, 1.0),
        )
    )
)
@example(([0.0, 1.0, 1e-10], 0.5))  # rest mass 1e-10: once lost 4e-8 of the row's mass to cancellation
def test_top_label_vector_keeps_argmax_and_order(case):
    weights, top = case
    probs = torch.tensor(weights, dtype=torch.float64)[None]
    probs = probs / probs.sum()
    calibrated = _top_label_vector(probs, torch.tensor([top], dtype=torch.float64))[0]
    classes = probs.shape[1]
    predicted = int(probs.argmax())
    assert calibrated.sum().item() == pytest.approx(1.0, abs=1e-9)
    assert calibrated[predicted].item() == pytest.approx(top, abs=1e-12)
    assert bool((calibrated >= -1e-15).all())
    if top >= 1 / classes + 1e-6:
        assert int(calibrated.argmax()) == predicted
    others = [k for k in range(classes) if k != predicted]
    for i in others:  # the other classes keep their order
        for j in others:
            if probs[0, i] > probs[0, j] + 1e-12:
                assert calibrated[i] >= calibrated[j] - 1e-12


# Synthetic data over-confident by a factor 3 (4,000 rows each way): over 5 (fit, test) seed pairs
# the calibrated/uncalibrated ECE ratio was at most 0.08 (TS, vector, matrix, Dirichlet), 0.11
# (histogram, isotonic, structured matrix) and 0.09 (structured vector), against the bound 0.5.
#: the bound of that ratio for the methods that undo over-confidence
ECE_RATIO_BOUND = {method: 0.5 for method in ("temperature", "vector", "matrix", "dirichlet", "structured_vector",
                                               "structured_matrix", "histogram", "isotonic")}
#: a method not in ECE_RATIO_BOUND must not make the ECE worse (a per-class bias leaves it at 1.0)
DEFAULT_ECE_RATIO_BOUND = 1.1


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_every_logit_method_lowers_ece_on_fresh_data(method):
    logits, labels = miscalibrated(seed=0)
    test_logits, test_labels = miscalibrated(seed=1)
    cls = calibrator_class(method)
    calibrator, _ = fitted(cls, logits, labels)
    with torch.no_grad():
        after = expected_calibration_error(calibrator(test_logits), test_labels, from_logits=True)
    before = expected_calibration_error(test_logits, test_labels, from_logits=True)
    assert after < ECE_RATIO_BOUND.get(method, DEFAULT_ECE_RATIO_BOUND) * before


def test_focal_loss_definition():
    logits, labels = miscalibrated(n=64)
    assert torch.allclose(focal_loss(logits, labels, 0.0), F.cross_entropy(logits, labels), atol=1e-6)
    p = torch.softmax(logits, 1).gather(1, labels[:, None]).squeeze(1)
    manual = (-(1 - p) ** 2 * p.log()).mean()
    assert torch.allclose(focal_loss(logits, labels, 2.0), manual, atol=1e-6)
    assert torch.allclose(focal_loss(logits, labels, 1.0, reduction="sum"), focal_loss(logits, labels, 1.0) * 64, atol=1e-4)


def test_unknown_methods_and_options_are_named():
    with pytest.raises(ValueError, match="unknown method 'platt'.*neural_clamping"):
        calibrator_class("platt")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['n_bin'\].*n_bins"):
        parse_options(HistogramBinning.Options, {"n_bin": 5}, "histogram")
    with pytest.raises(ValueError, match="mode must be one of"):
        HistogramBinning(3, mode="per_class")


def _defined_methods() -> Dict[str, type]:
    """{method: class} of every class that a loaded module of the calibrators package defines and that names its own
    ``method``."""
    found, classes = {}, [Calibrator]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        module = sys.modules.get(cls.__module__) if cls.__module__.startswith(f"{calibrators.__name__}.") else None
        if "method" in cls.__dict__ and getattr(module, cls.__name__, None) is cls:
            found[cls.method] = cls
    return found


def test_the_registry_holds_exactly_the_methods_defined_in_the_package():
    """Every class of the package that names its own ``method`` is registered under it, and nothing else of the package
    is (a base class such as HeadCalibrator names none)."""
    defined = _defined_methods()
    assert {name: cls for name, cls in CALIBRATORS.items() if cls.__module__.startswith(f"{calibrators.__name__}.")} == defined
    assert all(cls.method == name for name, cls in CALIBRATORS.items())
    assert {"temperature", "neural_clamping", "tst"} <= set(defined)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"epochs": 0}, "option epochs must be a positive integer"),
        ({"lr": -1.0}, "option lr must be a positive number"),
        ({"gamma": []}, "option gamma must be a number or a non-empty list of them"),
        ({"gamma": [1.0, float("nan")]}, "option gamma must be a finite number"),
        ({"delta_weight": -0.1}, "option delta_weight must be"),
        ({"delta_init": "ones"}, "option delta_init must be one of"),
        ({"holdout_fraction": 1.0}, r"option holdout_fraction must be a non-negative number in \[0, 1\), got 1.0"),
        ({"select_metric": "accuracy"}, "option select_metric must be one of"),
        ({"augment": "yes"}, "augment must be True or False or a callable"),
        ({"temperature_init": 0}, r"option temperature_init must be a number in \[0.001, 1000\], got 0"),
        ({"temperature_init": "one"}, r"option temperature_init must be \"ts\" or a number in \[0.001, 1000\]"),
        ({"temperature_init": float("inf")}, "option temperature_init must be"),
    ],
)
def test_neural_clamping_options_are_validated(options, message):
    """Each names the option, what was given and what is allowed (``InvalidOptionError``, a ValueError)."""
    with pytest.raises(ValueError, match=message):
        NeuralClamping.Options(**options)


def test_neural_clamping_grids_and_defaults():
    options = NeuralClamping.Options(gamma=[0, 1, 2], delta_weight=0.05)
    assert options.gamma == (0.0, 1.0, 2.0) and options.delta_weight == (0.05,)
    defaults = NeuralClamping.Options()
    assert (defaults.optimizer, defaults.lr, defaults.momentum, defaults.gamma, defaults.delta_weight) == ("lbfgs", None, None, (1.0,), (0.01,))
    assert (defaults.max_iterations, defaults.patience, defaults.ridge, defaults.refit, defaults.require_significant_gain) == (
        12, 12, (0.1,), "average", False)
    sgd = NeuralClamping.Options(optimizer="sgd")
    assert (sgd.lr, sgd.momentum, sgd.max_iterations, sgd.patience, sgd.ridge, sgd.refit) == (0.01, 0.9, None, None, None, None)


def test_neural_clamping_starts_at_the_given_temperature_and_falls_back_to_the_temperature_fit():
    """``temperature_init`` sets T's start (the authors' code starts at 1). A start so far off that NC
    cannot beat TS on the held-out NLL (T = 1000, one tiny step: uniform predictions) falls back to
    δ = 0 and to exactly the temperature method's T on the same data — fitted on all of it, not only
    on the fitting part. (On held-out ECE the uniform predictions would win: ECE ≈ 0 when the
    accuracy is about 1/C, which is why NLL is the default selection criterion.)"""
    import _tiny_models as tm

    from hf_calibrate import CalibratedModel

    base = tm.tiny_timm(0)
    data = tm.image_data(base, 96, sharpness=8.0)  # informative labels: TS beats uniform predictions held out
    started = tm.fit(base, data, "neural_clamping", temperature_init=2.5, lr=1e-12, epochs=1)
    assert started.fit_summary["history"][0]["temperature"] == pytest.approx(2.5, rel=1e-6)
    fallback = tm.fit(base, data, "neural_clamping", temperature_init=1000.0, lr=1e-12, epochs=1, holdout_fraction=0.25,
                      select_metric="nll")
    summary = fallback.fit_summary
    assert summary["fell_back_to_temperature_scaling"] and torch.count_nonzero(fallback.calibrator.delta) == 0
    temperature = CalibratedModel.fit(base, data, method="temperature", progress=False, batch_size=32)
    assert float(fallback.calibrator.temperature) == pytest.approx(float(temperature.calibrator.temperature), rel=1e-5)
    assert summary["temperature_scaling"]["fallback_temperature"] == pytest.approx(float(temperature.calibrator.temperature), rel=1e-5)
    assert summary["temperature_scaling"]["temperature"] != pytest.approx(summary["temperature_scaling"]["fallback_temperature"], rel=1e-4)


def test_neural_clamping_warns_when_its_fitting_part_is_separable():
    """Labels that are the base's own predictions: TS on the fitting part has no minimum, and NC's start says so."""
    import _tiny_models as tm

    base = tm.tiny_timm(0)
    pixels = tm.image_data(base, 64).tensors[0]
    with torch.no_grad():
        predicted = base(pixels).argmax(1)
    with pytest.warns(UserWarning, match="fitting part of the calibration data.*" + SEPARABLE):
        tm.fit(base, torch.utils.data.TensorDataset(pixels, predicted), "neural_clamping", epochs=1, holdout_fraction=0.25)
