"""What the cross-fitted checks cost on large logits, as properties: the fold count's rule (5 folds, 2 from
``LARGE_LOGITS`` logit values on, a number given always wins) reaches every check; a fold layout hands each fold
exactly its rows; vector scaling's one-pass sums are the gradient and Hessian blocks autograd gives, at float32 as
at float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import holdout
from hf_calibrate.calibrators.holdout import FoldLayout, cross_fitting_folds, default_folds
from hf_calibrate.calibrators.linear import MatrixScaling, RegularisedOptions, fit_matrix, fit_vector
from hf_calibrate.calibrators.solvers.vector_newton import vector_scaling_pass


def test_the_fold_count_is_five_below_the_threshold_two_from_it_and_a_given_number_always():
    rows = holdout.LARGE_LOGITS // 1000
    assert default_folds(None, rows - 1, 1000) == holdout.DEFAULT_FOLDS == 5
    assert default_folds(None, rows, 1000) == holdout.LARGE_FOLDS == 2
    assert default_folds(7, rows, 1000) == 7 and default_folds(3, 10, 2) == 3


def _logits(rows: int, classes: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, classes, generator=generator)
    labels = torch.multinomial(torch.softmax(logits / 2 + torch.linspace(-1, 1, classes), 1), 1, generator=generator).squeeze(1)
    return logits, labels


def test_auto_cross_fits_two_folds_from_the_threshold_on_and_the_folds_it_is_given(monkeypatch):
    logits, labels = _logits(200, 4, 0)
    data = TensorDataset(logits, labels)

    def folds_of(**options) -> int:
        model = CalibratedModel.fit(nn.Identity(), data, method="auto", candidates=["vector"], progress=False, **options)
        return model.fit_summary["auto"]["folds"]

    assert folds_of() == 5
    monkeypatch.setattr(holdout, "LARGE_LOGITS", logits.numel())
    assert folds_of() == 2 and folds_of(folds=4) == 4


def test_a_checked_fit_cross_fits_two_folds_from_the_threshold_on(monkeypatch):
    """The same fit with the threshold at its logits' size is the fit with ``folds=2`` given."""
    logits, labels = _logits(300, 4, 1)
    expected = fit_vector(logits, labels, RegularisedOptions(folds=2))[1]["l2_cv_nll"]
    assert expected != fit_vector(logits, labels, RegularisedOptions())[1]["l2_cv_nll"]
    monkeypatch.setattr(holdout, "LARGE_LOGITS", logits.numel())
    assert fit_vector(logits, labels, RegularisedOptions())[1]["l2_cv_nll"] == expected
    assert MatrixScaling(4).cost_bound(logits.double(), labels, RegularisedOptions()).fits == 3


@pytest.mark.parametrize("folds", [2, 3, 5])
def test_a_fold_layout_hands_each_fold_exactly_its_rows(folds):
    labels = torch.randint(0, 3, (41,), generator=torch.Generator().manual_seed(folds))
    split = cross_fitting_folds(labels, folds, 0)
    layout = FoldLayout(split)
    arranged = layout.arrange(torch.arange(len(labels)))
    for fold, (fit_rows, held_rows) in enumerate(split):
        assert torch.equal(layout.fitting(arranged, fold).sort().values, fit_rows)
        assert torch.equal(layout.held(arranged, fold).sort().values, held_rows)
        if folds == 2:  # both fitting parts are one run: views, not copies
            assert layout.fitting(arranged, fold).untyped_storage().data_ptr() == arranged.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_the_vector_pass_gives_the_loss_gradient_and_hessian_blocks_of_autograd(dtype, tolerance):
    """Over more rows than one chunk (``chunk_rows``), the pass's (loss, Σ p z − Σ z_y, Σ p − counts) are the mean NLL
    and its gradient in (a, b), and its (Σ z² q, Σ z q, Σ q) the diagonal 2×2 Hessian blocks."""
    logits, labels = _logits(3000, 300, 2)
    scale = (0.4 + 0.2 * torch.rand(300, generator=torch.Generator().manual_seed(3))).double()
    bias = 0.3 * torch.randn(300, generator=torch.Generator().manual_seed(4)).double()
    loss, sums, _ = vector_scaling_pass(logits.to(dtype), labels, scale[None], bias[None])
    loss, sums = float(loss[0]), sums[:, 0]

    z = logits.double()
    a, b = scale.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    reference = nn.functional.cross_entropy(z * a + b, labels)
    grad_a, grad_b = torch.autograd.grad(reference, (a, b), create_graph=True)
    counts = torch.bincount(labels, minlength=300).double() / len(labels)
    true_sums = torch.zeros(300, dtype=torch.float64).index_add_(0, labels, z.gather(1, labels[:, None]).squeeze(1)) / len(labels)
    assert loss == pytest.approx(float(reference.detach()), rel=tolerance)
    torch.testing.assert_close(sums[0] - true_sums, grad_a.detach(), rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(sums[1] - counts, grad_b.detach(), rtol=tolerance, atol=tolerance)
    blocks = [torch.autograd.grad(grad[c], wrt, retain_graph=True)[0][c] for c in range(3)
              for grad, wrt in ((grad_a, a), (grad_a, b), (grad_b, b))]
    expected = torch.tensor(blocks, dtype=torch.float64).reshape(3, 3).T  # rows: aa, ab, bb; columns: classes 0–2
    torch.testing.assert_close(sums[2:, :3], expected, rtol=10 * tolerance, atol=10 * tolerance)


def test_the_vector_pass_coupling_completes_the_hessian_of_autograd():
    """With ``coupled=True`` the pass's Σ uᵀu, joined to its 2×2 blocks (``full_hessian``), is the whole (2C × 2C)
    Hessian of the mean NLL in (a, b) that autograd gives, over more rows than one chunk."""
    from hf_calibrate.calibrators.solvers.vector_newton import full_hessian

    logits, labels = _logits(3000, 7, 8)
    generator = torch.Generator().manual_seed(9)
    scale, bias = (0.4 + 0.5 * torch.rand(7, generator=generator)).double(), 0.3 * torch.randn(7, generator=generator).double()
    _, sums, coupling = vector_scaling_pass(logits.double(), labels, scale[None], bias[None], coupled=True)

    def nll(parameters: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.double() * parameters[:7] + parameters[7:], labels)

    expected = torch.autograd.functional.hessian(nll, torch.cat([scale, bias]))
    torch.testing.assert_close(full_hessian(sums[2:], coupling)[0], expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("classes", [2, 10, 24])
def test_full_newton_steps_reach_the_block_steps_optimum_in_fewer_iterations(classes, monkeypatch):
    """Up to ``FULL_NEWTON_MAX_CLASSES`` the steps use the whole Hessian: the same optimum as the block steps (to the
    fits' tolerance), in at most 6 iterations (quadratic convergence), fewer than the block steps."""
    from hf_calibrate.calibrators.solvers import vector_newton

    logits, labels = _logits(600, classes, 10)
    problems = 2
    beta = torch.full((problems,), 0.5, dtype=torch.float64)
    start = (beta[:, None].expand(problems, classes).clone(), torch.zeros(problems, classes, dtype=torch.float64))
    rows = torch.ones(problems, 600, dtype=torch.bool)
    rows[1, ::3] = False
    strength = torch.tensor([classes / 600, 0.0], dtype=torch.float64)  # a ridge, and none
    fits = {}
    for limit in (classes, 0):
        monkeypatch.setattr(vector_newton, "FULL_NEWTON_MAX_CLASSES", limit)
        fits[limit] = vector_newton.fit_vector_scaling(logits.double(), labels, beta, 100, strength, start, rows)
    (full_scale, full_bias, full), (block_scale, block_bias, block) = fits[classes], fits[0]
    assert full["iterations"] <= 6 and full["iterations"] < block["iterations"], (full, block)
    for ours, theirs in zip(full["loss"], block["loss"]):
        assert ours <= theirs + 1e-9
    torch.testing.assert_close(full_scale, block_scale, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(full_bias - full_bias.mean(1, keepdim=True), block_bias - block_bias.mean(1, keepdim=True),
                               rtol=1e-3, atol=1e-3)


def test_the_vector_pass_of_stacked_problems_is_each_problems_pass_on_its_rows():
    """P problems in one pass (``rows``: each problem's rows) give each problem's loss and sums on its rows alone."""
    logits, labels = _logits(700, 12, 5)
    generator = torch.Generator().manual_seed(6)
    rows = torch.rand(3, 700, generator=generator) < torch.tensor([[1.0], [0.8], [0.5]])
    scale = (0.3 + torch.rand(3, 12, generator=generator)).double()
    bias = 0.2 * torch.randn(3, 12, generator=generator).double()
    loss, sums, _ = vector_scaling_pass(logits.double(), labels, scale, bias, rows)
    for problem in range(3):
        own = rows[problem]
        alone, alone_sums, _ = vector_scaling_pass(logits.double()[own], labels[own], scale[problem:problem + 1], bias[problem:problem + 1])
        assert float(loss[problem]) == pytest.approx(float(alone[0]), rel=1e-12)
        torch.testing.assert_close(sums[:, problem], alone_sums[:, 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["vector", "matrix", "dirichlet"])
def test_a_check_fitted_jointly_scores_and_fits_as_one_fitted_fold_by_fold(method, monkeypatch):
    """On small data (``LinearMap.fits_jointly``) the folds' fits and the fit on all rows are one joint fit: its cross-fitted scores
    and its fitted map are those of the folds fitted one by one and the choice refitted, to the optimisers' tolerance
    (L-BFGS stops within ~1e-9 of each fold's objective either way; its flat directions move a held-out NLL by ~5e-6)."""
    from hf_calibrate.calibrators import calibrator_class
    from hf_calibrate.calibrators.solvers import linear_maps

    logits, labels = _logits(400, 6, 7)
    options = RegularisedOptions(l2_grid=(10.0, 1.0, 0.1))

    def fit():
        calibrator = calibrator_class(method)(6)
        summary = calibrator.fit_logits(logits, labels, options)
        return calibrator, summary

    joint, joint_summary = fit()
    monkeypatch.setattr(linear_maps.LinearMap, "fits_jointly", lambda *arguments: False)
    alone, alone_summary = fit()
    assert joint_summary["l2"] == alone_summary["l2"] is not None and len(joint_summary["l2_cv_nll"]) == 4
    for key, score in alone_summary["l2_cv_nll"].items():
        assert joint_summary["l2_cv_nll"][key] == pytest.approx(score, abs=2e-5)
    assert isinstance(joint_summary["converged"], bool) and joint_summary["converged"]
    with torch.no_grad():
        torch.testing.assert_close(joint(logits).softmax(1), alone(logits).softmax(1), atol=2e-4, rtol=0)


def test_a_joint_lbfgs_run_that_spends_its_budget_finishes_each_fit_alone():
    """Stacked C×C problems share L-BFGS's history: a run that spends ``JOINT_LBFGS_ITERATIONS`` (here patched to 2)
    goes on one problem at a time on its own rows, so each fit still gets ``max_iter`` iterations of its own and
    reports its own loss and convergence."""
    from unittest import mock

    from hf_calibrate.calibrators.solvers import linear_maps

    logits, labels = _logits(300, 4, 8)
    options = RegularisedOptions(l2_grid=(0.01,))
    with mock.patch.object(linear_maps, "JOINT_LBFGS_ITERATIONS", 2):
        cut = fit_matrix(logits, labels, options)[1]
    whole = fit_matrix(logits, labels, options)[1]
    with mock.patch.object(linear_maps.LinearMap, "fits_jointly", lambda *arguments: False):
        alone = fit_matrix(logits, labels, options)[1]
    assert cut["iterations"] > 2 and cut["converged"] and isinstance(cut["loss"], float)
    for summary in (cut, whole):
        assert summary["l2"] == alone["l2"]
        assert summary["loss"] == pytest.approx(alone["loss"], abs=1e-8)
        assert summary["l2_cv_nll"]["0.01"] == pytest.approx(alone["l2_cv_nll"]["0.01"], abs=2e-5)


@pytest.mark.parametrize("fit", ["fit_vector", "fit_matrix", "fit_dirichlet"])
def test_the_plain_fit_functions_take_labels_as_users_hold_them_and_refuse_bad_ones(fit):
    """int32 labels, a list or a numpy array fit as int64 ones; NaN logits and labels out of range are a ValueError
    naming the problem, as ``Calibrator.fit_logits`` gives (not torch's dtype error from inside the fit)."""
    import numpy as np

    from hf_calibrate import calibrators

    logits, labels = _logits(120, 3, 9)
    function = getattr(calibrators, fit)
    expected = function(logits, labels, RegularisedOptions(l2=1.0))[0]
    for held in (labels.int(), labels.tolist(), labels.numpy().astype(np.int16)):
        for key, value in function(logits, held, RegularisedOptions(l2=1.0))[0].items():
            torch.testing.assert_close(value, expected[key])
    with pytest.raises(ValueError, match="NaN or infinite"):
        function(torch.where(torch.arange(120)[:, None] == 4, float("nan"), logits), labels)
    with pytest.raises(ValueError, match=r"outside the valid range \[0, 2\] for 3 classes"):
        function(logits, labels + 3)
    with pytest.raises(ValueError, match=r"floating-point \(N, C\) tensor"):
        function(logits[0], labels)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_where_the_temperature_fit_starts_changes_its_passes_not_its_beta(dtype, tolerance):
    """The checks start each fold's TS fit from the β of all rows: any start in the bounds gives the same optimum."""
    from hf_calibrate.calibrators.temperature import fit_inverse_temperature

    logits, labels = _logits(900, 6, 11)
    reference, _ = fit_inverse_temperature(logits.to(dtype), labels)
    for start in (1e-3, 0.2, 0.5, 3.0, 1e3, 1e6):
        beta, _ = fit_inverse_temperature(logits.to(dtype), labels, start=start)
        assert beta == pytest.approx(reference, rel=tolerance), start
