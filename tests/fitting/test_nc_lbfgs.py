"""Neural Clamping's default optimiser: the step-wise L-BFGS, the folds, and the cross-fitted fit's promises.

Properties, not scores: L-BFGS lowers its objective every iteration and finds a known minimum;
the ridge penalty is its formula and holds a fit nearer its start; folds are balanced per class
and seeded; the fit's choice is consistent with its own record (a fall-back is exactly the
``temperature`` method, a kept δ beat TS on the pooled held-out data and is the fold runs' mean
there, a refit on all the data takes the chosen number of iterations); SGD options select SGD,
and asking for both is an error naming the fix.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators.options import InvalidOptionError
from hf_calibrate.calibrators.holdout import fold_assignment
from hf_calibrate.calibrators.neural_clamping import NeuralClamping
from hf_calibrate.fitting.clamping import stepwise_lbfgs
from hf_calibrate.fitting.clamping.lbfgs import Penalty, resolved_folds


def _quadratic(matrix: torch.Tensor, target: torch.Tensor):
    def evaluate(theta: torch.Tensor):
        residual = theta - target
        return float(0.5 * residual @ matrix @ residual), matrix @ residual
    return evaluate


def test_lbfgs_descends_every_iteration_and_finds_the_minimum_of_a_quadratic():
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(12, 12, generator=generator, dtype=torch.float64))[0]
    matrix = basis @ torch.diag(torch.logspace(-1, 1, 12, dtype=torch.float64)) @ basis.T  # condition number 100
    target = torch.randn(12, generator=generator, dtype=torch.float64)
    evaluate = _quadratic(matrix, target)
    state = stepwise_lbfgs.start(torch.zeros(12, dtype=torch.float64), evaluate)
    values = [state.value]
    for _ in range(200):
        if not stepwise_lbfgs.iterate(state, evaluate):
            break
        values.append(state.value)
    assert all(later < earlier for earlier, later in zip(values, values[1:]))
    assert torch.allclose(state.theta, target, atol=1e-3)


def test_lbfgs_first_step_is_cautious_and_a_minimum_is_converged():
    evaluate = _quadratic(torch.eye(3, dtype=torch.float64), torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64))
    state = stepwise_lbfgs.start(torch.zeros(3, dtype=torch.float64), evaluate)
    first = stepwise_lbfgs.direction(state)
    assert float(first.abs().sum()) == pytest.approx(1.0)  # −∇f / ‖∇f‖₁ when ‖∇f‖₁ > 1
    at_minimum = stepwise_lbfgs.start(torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64), evaluate)
    assert not stepwise_lbfgs.iterate(at_minimum, evaluate) and at_minimum.converged


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=10, max_size=200), st.integers(2, 7), st.integers(0, 2**31 - 1))
def test_folds_are_even_sized_seeded_and_spread_a_rare_class(labels, folds, seed):
    labels = torch.tensor(labels)
    assignment = fold_assignment(labels, folds, seed)
    assert torch.equal(assignment, fold_assignment(labels, folds, seed))
    sizes = torch.bincount(assignment, minlength=folds)
    assert len(sizes) == folds and int(sizes.max() - sizes.min()) <= 1
    for label in labels.unique():
        if int((labels == label).sum()) < folds:  # a rare class: its rows in different folds
            assert int(torch.bincount(assignment[labels == label]).max()) == 1


def test_automatic_folds_and_too_many_folds():
    options = NeuralClamping.Options(optimizer="lbfgs")
    assert resolved_folds(options, 49, False) == 1 and resolved_folds(options, 50, False) == 2
    assert resolved_folds(options, 10_001, False) == 1 and resolved_folds(options, 500, True) == 1
    assert resolved_folds(NeuralClamping.Options(optimizer="lbfgs", holdout_fraction=0.0), 500, False) == 1  # nothing held out
    assert resolved_folds(NeuralClamping.Options(optimizer="lbfgs", holdout_fraction=0.3), 500, False) == 1  # that one part
    assert resolved_folds(NeuralClamping.Options(optimizer="lbfgs", holdout_fraction=0.2), 500, False) == 2  # the default share
    with pytest.raises(ValueError, match="folds=8 over 6 calibration samples leaves 0 per fold, fewer than the 1 processes"):
        resolved_folds(NeuralClamping.Options(folds=8), 6, False)
    with pytest.raises(ValueError, match="folds=3 over 10 calibration samples leaves 3 per fold, fewer than the 4 processes"):
        resolved_folds(NeuralClamping.Options(folds=3), 10, False, world=4)
    with pytest.raises(ValueError, match="folds=3 and validation_data both choose"):
        resolved_folds(NeuralClamping.Options(folds=3), 100, True)


def test_sgd_options_select_sgd_and_asking_for_lbfgs_with_them_is_an_error():
    assert NeuralClamping.Options().optimizer == "lbfgs"  # the default
    assert NeuralClamping.Options(folds=3).optimizer == "lbfgs" and NeuralClamping.Options(folds=3).max_iterations == 12
    with pytest.raises(InvalidOptionError, match=r"\['folds'\] belong to optimizer='lbfgs'"):
        NeuralClamping.Options(optimizer="sgd", folds=3)
    sgd = NeuralClamping.Options(epochs=3)
    assert sgd.optimizer == "sgd" and sgd.lr == 0.01 and sgd.momentum == 0.9
    assert NeuralClamping.Options(momentum=0.0).optimizer == "sgd"  # a zero is an option given
    with pytest.raises(InvalidOptionError, match=r"\['epochs', 'lr'\].*optimizer='sgd'"):
        NeuralClamping.Options(optimizer="lbfgs", epochs=3, lr=0.1)
    with pytest.raises(InvalidOptionError, match="option optimizer must be one of"):
        NeuralClamping.Options(optimizer="adam")
    assert NeuralClamping.Options(ridge=0.5).optimizer == "lbfgs" and NeuralClamping.Options(ridge=[0, 1]).ridge == (0.0, 1.0)
    assert NeuralClamping.Options(optimizer="lbfgs").ridge == (0.1,)
    with pytest.raises(InvalidOptionError, match="option ridge must be a non-negative number"):
        NeuralClamping.Options(ridge=-1.0)
    with pytest.raises(InvalidOptionError, match=r"\['epochs'\] belong to optimizer='sgd' and \['ridge'\] to optimizer='lbfgs'"):
        NeuralClamping.Options(epochs=3, ridge=0.1)
    with pytest.raises(InvalidOptionError, match=r"\['ridge', 'refit'\] belong to optimizer='lbfgs'"):
        NeuralClamping.Options(optimizer="sgd", ridge=0.1, refit="all")
    with pytest.raises(InvalidOptionError, match="option refit must be one of"):
        NeuralClamping.Options(refit="mean")
    with pytest.raises(InvalidOptionError, match="require_significant_gain=True is an L-BFGS option, but the SGD recipe"):
        NeuralClamping.Options(epochs=3, require_significant_gain=True)


@settings(max_examples=25, deadline=None)
@given(weight=st.floats(0, 1), ridge=st.floats(0, 10), start=st.floats(-2, 2), seed=st.integers(0, 2**16))
def test_the_penalty_is_its_formula_with_its_gradient(weight, ridge, start, seed):
    """λ‖δ‖₂ + (ρ/2)(‖δ‖₂² + (log T − log T₀)²), against its definition and its hand-written gradient."""
    generator = torch.Generator().manual_seed(seed)
    delta = torch.randn(3, 4, generator=generator, dtype=torch.float64).requires_grad_(True)
    log_t = torch.randn((), generator=generator, dtype=torch.float64).requires_grad_(True)
    value = Penalty(weight, ridge, start)(delta, log_t)
    value.backward()
    norm = math.sqrt(float(delta.detach().square().sum()))
    assert float(value) == pytest.approx(weight * norm + ridge / 2 * (norm ** 2 + (float(log_t) - start) ** 2), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(delta.grad, weight * delta.detach() / norm + ridge * delta.detach())
    assert float(log_t.grad) == pytest.approx(ridge * (float(log_t) - start), abs=1e-12)


def test_a_stronger_ridge_keeps_delta_and_the_temperature_nearer_their_start():
    """The ridge's promise on a real fit, nothing held out: ρ = 10 ends nearer (δ = 0, TS's T) than ρ = 0."""
    base = tm.tiny_timm(0)
    data = tm.image_data(base, 80, sharpness=8.0)
    with tm.torch_threads(1):
        temperature = CalibratedModel.fit(base, data, method="temperature", progress=False)
        fits = {ridge: CalibratedModel.fit(base, data, method="neural_clamping", progress=False, folds=1, holdout_fraction=0.0,
                                           max_iterations=8, ridge=ridge) for ridge in (0.0, 10.0)}
    start = float(temperature.calibrator.log_temperature)
    distance = {ridge: math.hypot(float(fit.calibrator.delta.norm()), float(fit.calibrator.log_temperature) - start) for ridge, fit in fits.items()}
    assert distance[10.0] < distance[0.0]
    assert fits[10.0].fit_summary["selected"]["ridge"] == 10.0


def _objective(model, data, calibrated, gamma=1.0, weight=0.01) -> float:
    from hf_calibrate.calibrators.neural_clamping import focal_loss

    pixels, labels = data.tensors
    with torch.no_grad():
        logits = model(pixels + calibrated.calibrator.delta) / calibrated.calibrator.temperature
        return float(focal_loss(logits, labels, gamma)) + weight * float(calibrated.calibrator.delta.norm())


def _shifted_data(base, count: int, shift_scale: float = 8.0, sharpness: float = 8.0):
    """Images whose labels follow softmax(sharpness · f(x + δ*)) for a fixed random δ*: a miscalibration that
    Neural Clamping's own model (δ = δ*, T = 1/sharpness) describes exactly, so a δ helps."""
    pixels = tm.image_tensors(count, seed=0)
    shift = shift_scale * torch.randn(pixels.shape[1:], generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        probabilities = torch.softmax(sharpness * base(pixels + shift).double(), dim=1)
    labels = torch.multinomial(probabilities, 1, generator=torch.Generator().manual_seed(3)).squeeze(1)
    return torch.utils.data.TensorDataset(pixels, labels)


@pytest.mark.parametrize("refit", ["average", "all"])
def test_the_cross_fitted_fit_keeps_its_promises(refit):
    """Where a δ helps, the kept δ beat TS on the pooled held-out data at the iteration of the best pooled score, and
    is the mean of the fold runs' (δ, log T) there, or (``refit="all"``) a refit on all the data for that many
    iterations that lowered the objective below TS's start."""
    base = tm.tiny_timm(0)
    data = _shifted_data(base, 120)
    with tm.torch_threads(1):
        calibrated = CalibratedModel.fit(base, data, method="neural_clamping", optimizer="lbfgs", progress=False, batch_size=40,
                                         refit=refit)
        temperature = CalibratedModel.fit(base, data, method="temperature", progress=False)
    summary = calibrated.fit_summary
    assert summary["optimizer"] == "lbfgs" and summary["folds"] == 2 and summary["holdout_samples"] == 120
    iterations = [record["iteration"] for record in summary["history"]]
    assert iterations[0] == 0 and iterations == list(range(len(iterations))) and len(iterations) <= 13
    baseline = summary["temperature_scaling"]["holdout_nll"]
    assert summary["history"][0]["holdout_nll"] == baseline  # iteration 0 is TS, cross-fitted: exactly the baseline
    assert not summary["fell_back_to_temperature_scaling"] and summary["refit"] == refit
    chosen = summary["selected"]
    assert chosen["holdout_nll"] < baseline and summary["selection"]["nll_difference"]["high"] < 0
    assert chosen["holdout_nll"] == min(record["holdout_nll"] for record in summary["history"])
    if refit == "average":
        assert _is_the_fold_runs_mean(calibrated, chosen) and summary["iterations"] == chosen["iteration"]
    else:
        assert summary["iterations"] == chosen["refit_iterations"] <= chosen["iteration"]  # fewer only if the refit converged
        assert _objective(base, data, calibrated) < _objective(base, data, _temperature_start(base, data, temperature))
    assert summary["evaluations"] >= 2 * (len(iterations) - 1) + (summary["iterations"] if refit == "all" else 0)


def _is_the_fold_runs_mean(calibrated, chosen) -> bool:
    """log T is the mean of the runs' log T, and ‖mean δ‖ ≤ the mean of their ‖δ‖ (the triangle inequality)."""
    log_temperatures = [math.log(value) for value in chosen["run_temperatures"]]
    mean_log_t = sum(log_temperatures) / len(log_temperatures)
    return (float(calibrated.calibrator.log_temperature) == pytest.approx(mean_log_t, abs=1e-6)
            and float(calibrated.calibrator.delta.norm()) <= sum(chosen["run_delta_norms"]) / len(log_temperatures) + 1e-6)


def _temperature_start(base, data, temperature):
    """A Neural Clamping model at the L-BFGS start: δ = 0, T = the temperature method's."""
    start = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, max_iterations=1, folds=1, holdout_fraction=0.0)
    start.calibrator.delta.data.zero_()
    start.calibrator.log_temperature.data.copy_(temperature.calibrator.log_temperature)
    return start


def test_a_fit_where_delta_cannot_help_falls_back_to_the_temperature_method():
    """Labels drawn independently of the images: no δ beats TS held out beyond its interval, so the fit is exactly the
    temperature method's (``require_significant_gain=True``, so that a chance point gain does not keep a δ)."""
    base = tm.tiny_timm(0)
    pixels = tm.image_tensors(100, seed=1)
    labels = torch.randint(0, tm.NUM_CLASSES, (100,), generator=torch.Generator().manual_seed(2))
    data = torch.utils.data.TensorDataset(pixels, labels)
    with tm.torch_threads(1):
        calibrated = CalibratedModel.fit(base, data, method="neural_clamping", optimizer="lbfgs", progress=False,
                                         require_significant_gain=True)
        temperature = CalibratedModel.fit(base, data, method="temperature", progress=False)
    summary = calibrated.fit_summary
    assert summary["fell_back_to_temperature_scaling"] and summary["refit"] == "none"
    assert torch.count_nonzero(calibrated.calibrator.delta) == 0 and summary["iterations"] == 0
    assert float(calibrated.calibrator.temperature) == pytest.approx(float(temperature.calibrator.temperature), rel=1e-5)


def test_one_held_out_part_keeps_the_runs_own_state_and_nothing_held_out_keeps_the_last():
    base = tm.tiny_timm(0)
    data = tm.image_data(base, 80, sharpness=8.0)
    with tm.torch_threads(1):
        single = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, folds=1, holdout_fraction=0.25)
        none = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, folds=1, holdout_fraction=0.0, max_iterations=3)
    assert single.fit_summary["folds"] == 1 and single.fit_summary["holdout_samples"] == 20 and single.fit_summary["fit_samples"] == 60
    assert single.fit_summary["refit"] == "none"  # nothing to average: the run's own state
    assert none.fit_summary["holdout_samples"] == 0 and none.fit_summary["iterations"] <= 3
    assert not none.fit_summary["fell_back_to_temperature_scaling"]
    assert math.isfinite(float(none.calibrator.temperature))


def test_the_fallback_advice_names_the_fits_own_schedule_options():
    from hf_calibrate.results.reporting import fallback_advice

    lbfgs, sgd = fallback_advice({"optimizer": "lbfgs"}), fallback_advice({"optimizer": "sgd", "epochs": 5})
    assert "max_iterations" in lbfgs and "ridge" in lbfgs and "epochs" not in lbfgs
    assert "epochs" in sgd and "max_iterations" not in sgd
    assert "--option max_iterations=N" in fallback_advice({"optimizer": "lbfgs"}, cli=True)
    assert "--option epochs=N" in fallback_advice({}, cli=True)  # records from before the optimiser was recorded: SGD


def test_the_card_says_the_schedule_in_iterations_passes_and_how_the_folds_became_the_model(tmp_path):
    """The card's selection text states what the fit did: L-BFGS iterations kept, evaluations, the fold mean; SGD epochs × steps."""
    base = tm.tiny_timm(0)
    data = _shifted_data(base, 120)
    with tm.torch_threads(1):
        lbfgs = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, batch_size=40)
        sgd = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, batch_size=40, epochs=2)
    summary = lbfgs.fit_summary
    lbfgs.save_pretrained(tmp_path / "lbfgs")
    sgd.save_pretrained(tmp_path / "sgd")
    card = (tmp_path / "lbfgs" / "README.md").read_text(encoding="utf-8")
    assert (f"Full-batch L-BFGS, stopped early by 2-fold cross-fitting: {summary['iterations']} iteration(s) kept (the mean of "
            f"the fold runs' δ and log T there), {summary['evaluations']} objective evaluations in all") in card
    assert "ρ = 0.1" in card and "pooled held-out nll of the fold runs" in card
    assert "SGD: 2 epoch(s) × 3 step(s) over 96 samples." in (tmp_path / "sgd" / "README.md").read_text(encoding="utf-8")


def test_a_ridge_grid_keeps_the_point_and_iteration_of_the_best_pooled_score():
    base = tm.tiny_timm(0)
    data = _shifted_data(base, 120)
    with tm.torch_threads(1):
        calibrated = CalibratedModel.fit(base, data, method="neural_clamping", progress=False, batch_size=40, ridge=[0.0, 0.1, 10.0])
    summary = calibrated.fit_summary
    assert {record["ridge"] for record in summary["history"]} == {0.0, 0.1, 10.0}
    best = min(summary["history"], key=lambda record: record["holdout_nll"])
    assert (summary["selected"]["ridge"], summary["selected"]["iteration"]) == (best["ridge"], best["iteration"])


def test_cards_of_records_from_before_the_ridge_and_refit_keep_their_meaning():
    """An L-BFGS summary written before ``refit`` existed was refitted on all the data; one without ``ridge`` shows no ρ."""
    from hf_calibrate.results.cards import _selection, schedule_text

    summary = {"optimizer": "lbfgs", "folds": 2, "iterations": 3, "evaluations": 10, "holdout_samples": 100,
               "fell_back_to_temperature_scaling": False, "temperature_scaling": {"holdout_nll": 0.5},
               "selected": {"gamma": 1.0, "delta_weight": 0.01, "iteration": 3, "holdout_nll": 0.4, "temperature": 1.2,
                            "delta_norm": 0.3}}
    assert "3 iteration(s) kept (refitted on all the data)" in schedule_text(summary)
    text = _selection({"method": "neural_clamping", "options": {}, "fit": {"num_samples": 100, "summary": summary}})["text"]
    assert "γ = 1.0, λ = 0.01, iteration 3" in text and "ρ" not in text
