"""Safe defaults on small, nearly separable calibration data: cross-fitting, the priors of the
binning methods, the least data each method needs, and the bounds on a histogram's size.

Each test asserts a property of the fit that holds on any machine; held-out quality on real models is
measured in benchmarks/bench_safe_defaults.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from hf_calibrate.calibrators import HistogramBinning, calibrator_class, parse_options
from hf_calibrate.calibrators.binning import MAX_BINS, floor_of
from hf_calibrate.calibrators.holdout import cross_fitting_folds, select_by_cross_fitting
from hf_calibrate.calibrators.requirements import (
    DataRequirements,
    InsufficientDataError,
    check_calibration_data,
    outlier_warnings,
)
from hf_calibrate.fitting.auto.selection import default_logit_candidates

LOGIT_METHODS = default_logit_candidates()  # every logit method, as auto chooses among them


def nearly_separable(n: int = 450, classes: int = 10, errors: int = 3, seed: int = 0):
    """Confident logits (margins of several nats) whose labels are the argmax except on ``errors`` rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=generator) * 4
    labels = logits.argmax(1)
    labels[:errors] = (labels[:errors] + 1) % classes
    return logits, labels


def fitted(method: str, logits, labels, **options):
    cls = calibrator_class(method)
    parsed = parse_options(cls.Options, options, method)
    calibrator = cls.create(logits.shape[1], parsed)
    return calibrator, calibrator.fit_logits(logits, labels, parsed)


@pytest.mark.parametrize("count, classes, folds, seed", [(450, 10, 5, 0), (37, 3, 5, 1), (12, 7, 5, 2), (3, 2, 5, 0)])
def test_folds_are_seeded_even_sized_and_hold_every_sample_out_once(count, classes, folds, seed):
    labels = torch.arange(count) % classes
    split = cross_fitting_folds(labels, folds, seed)
    held = torch.cat([held for _, held in split])
    assert torch.equal(held.sort().values, torch.arange(count))  # every sample held out exactly once
    assert len(split) == min(folds, count)
    sizes = [len(held_out) for _, held_out in split]
    assert max(sizes) - min(sizes) <= 1
    for fit, held_out in split:
        assert torch.equal(torch.cat([fit, held_out]).sort().values, torch.arange(count))
    again, other = cross_fitting_folds(labels, folds, seed), cross_fitting_folds(labels, folds, seed + 1)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(split, again))
    assert count < 12 or not all(torch.equal(a[1], b[1]) for a, b in zip(split, other))
    with pytest.raises(ValueError, match="at least 2 calibration samples"):
        cross_fitting_folds(torch.tensor([0]), folds, seed)


def test_folds_deal_rows_at_random_not_by_class():
    """A fold's class counts vary as a new draw's would: stratified folds hand each fold's fit the held-out rows' exact
    class frequencies, which per-class biases learn (benchmarks/results/fold_leak.md)."""
    labels = torch.arange(450) % 10
    split = cross_fitting_folds(labels, 5, 0)
    per_fold = torch.stack([torch.bincount(labels[held], minlength=10) for _, held in split])  # (folds, classes)
    assert int((per_fold.amax(dim=0) - per_fold.amin(dim=0)).max()) > 1


@pytest.mark.parametrize("seed", range(10))
def test_a_rare_class_rows_go_to_different_folds(seed):
    """A class with fewer rows than folds keeps all but one of them in every fold's fitting rows: binary data with 2 rows
    of one class keep both classes in every fold's fit (dealt at random, a fifth of the seeds would lose it)."""
    labels = torch.zeros(60, dtype=torch.long)
    labels[torch.randperm(60, generator=torch.Generator().manual_seed(seed))[:2]] = 1
    split = cross_fitting_folds(labels, 5, seed)
    assert all(set(labels[fit].tolist()) == {0, 1} for fit, _ in split)
    assert sorted(int((labels[held] == 1).sum()) for _, held in split) == [0, 0, 0, 1, 1]


def test_selection_takes_the_lowest_cross_fitted_nll_and_stops_once_it_rises():
    """Candidates in order, each scored by the mean of its per-sample held-out NLLs over all folds; a tie keeps the
    stronger; the path stops after rising twice in a row, and a flat stretch does not stop it."""
    folds = cross_fitting_folds(torch.zeros(100, dtype=torch.long), 2, 0)
    noise = torch.randn(100, generator=torch.Generator().manual_seed(0))
    losses = {"strong": 1.0 + noise, "middle": 0.9 + noise, "tied": 0.9 + noise, "weak": 1.5 + noise, "weaker": 1.6 + noise,
              "never": 0.0 + noise}
    selection = select_by_cross_fitting(list(losses), folds, lambda name, k: losses[name][folds[k][1]])
    assert selection.chosen == "middle"
    assert list(selection.scores) == ["'strong'", "'middle'", "'tied'", "'weak'", "'weaker'"]
    assert selection.scores["'middle'"] == pytest.approx(float((0.9 + noise).double().mean()), rel=1e-6)  # float32 losses
    flat = {"ts": 1.0 + noise, "same": 1.0 + noise, "again": 1.0 + noise, "better": 0.5 + noise}
    assert select_by_cross_fitting(list(flat), folds, lambda name, k: flat[name][folds[k][1]]).chosen == "better"


@pytest.mark.parametrize("method", ["histogram", "isotonic"])
@pytest.mark.parametrize("mode", ["top_label", "one_vs_rest"])
def test_binning_never_says_zero_or_one(method, mode):
    """Nearly separable data: the top bins hold no error, yet no calibrated probability reaches 0 or 1 (the classic
    fit, prior=0, does)."""
    logits, labels = nearly_separable()
    test_logits, _ = nearly_separable(seed=1)
    calibrator, summary = fitted(method, logits, labels, mode=mode)
    classic, _ = fitted(method, logits, labels, mode=mode, prior=0.0)
    with torch.no_grad():
        probs = torch.softmax(calibrator(test_logits).double(), 1)
        classic_probs = torch.softmax(classic(test_logits).double(), 1)
    values = calibrator.bin_values if method == "histogram" else calibrator.knots_y
    assert float(values.max()) <= 1 - floor_of(len(labels)) + 1e-12 and float(values.min()) >= floor_of(len(labels)) - 1e-12
    assert float(probs.max()) < 1 - 1e-4
    assert float(classic_probs.max()) > 1 - 1e-9
    assert "prior_cv_nll" in summary


def test_isotonic_stays_monotone_after_its_prior():
    logits, labels = nearly_separable(n=300, errors=30)
    calibrator, _ = fitted("isotonic", logits, labels, prior=30.0)
    assert bool((calibrator.knots_x.diff(dim=1) >= 0).all()) and bool((calibrator.knots_y.diff(dim=1) >= 0).all())


def test_an_infinite_prior_is_temperature_scaling_averaged_per_bin():
    """prior=∞ is not an option (finite numbers only), but the cross-fitted path starts there: its bin values are the
    mean TS confidence of each bin's samples."""
    from hf_calibrate.calibrators.binning import histogram_values
    from hf_calibrate.calibrators.temperature import fit_inverse_temperature

    logits, labels = nearly_separable(errors=40)
    values, counts = histogram_values(logits, labels, 15, "top_label", math.inf)
    beta = fit_inverse_temperature(logits, labels)[0]
    confidence = torch.softmax(logits.double(), 1).max(1).values
    ts_confidence = torch.softmax(logits.double() * beta, 1).max(1).values
    top = confidence > 14 / 15
    assert values[0, 14].item() == pytest.approx(ts_confidence[top].mean().item(), rel=1e-9)


def test_histogram_size_is_bounded_before_anything_is_allocated():
    with pytest.raises(ValueError, match=f"option n_bins must be an integer from 1 to {MAX_BINS}"):
        parse_options(HistogramBinning.Options, {"n_bins": 10**9}, "histogram")
    logits, labels = nearly_separable(n=40, errors=5)
    with pytest.raises(ValueError, match="n_bins=100 is more than the 40 calibration samples.*pass n_bins <= 40"):
        fitted("histogram", logits, labels, n_bins=100)


@pytest.mark.parametrize("method", ["vector", "matrix", "dirichlet"])
def test_per_class_methods_refuse_a_single_class(method):
    logits, _ = nearly_separable(n=100)
    labels = torch.full((100,), 3)
    needs = calibrator_class(method).requirements
    with pytest.raises(InsufficientDataError, match=f"{method} needs at least 2 distinct classes.*which have 1"):
        check_calibration_data(logits, labels, method, needs)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_every_method_states_what_it_needs_and_refuses_one_row_or_no_error(method):
    """One row, or no misclassified row: only temperature scaling takes them, and keeps T = 1 there (saying so)."""
    needs = getattr(calibrator_class(method), "requirements", DataRequirements())
    logits, labels = nearly_separable(n=200, errors=0)
    if method == "temperature":
        assert needs.errors == 0 and needs.rows == 1
        calibrator, summary = fitted(method, logits, labels)
        assert "not fitted (T = 1 kept)" in summary["warnings"][0] and calibrator.temperature.item() == 1.0
        return
    for rows in (logits[:1], logits):
        with pytest.raises(InsufficientDataError, match=f"{method} needs at least .*Calibrate on more held-out rows"):
            check_calibration_data(rows, labels[: len(rows)], method, needs)


def test_few_rows_and_absent_classes_are_warned_about():
    logits, labels = nearly_separable(n=60, classes=10, errors=5)
    labels[labels == 9] = 8
    lines = check_calibration_data(logits, labels, "vector", calibrator_class("vector").requirements)
    assert any("60 calibration rows are fewer than the 100" in line for line in lines)
    assert any("of the 10 classes are absent" in line for line in lines)


def test_rows_with_huge_logits_are_named():
    logits, _ = nearly_separable(n=100)
    logits[17, 2] = 1e6
    (line,) = outlier_warnings(logits)
    assert line.startswith("calibration sample(s) 17 (row positions)")
    assert outlier_warnings(nearly_separable(n=100)[0]) == []


def test_vector_scaling_says_when_it_hits_a_bound_or_does_not_converge():
    logits, labels = nearly_separable(errors=1)
    _, summary = fitted("vector", logits, labels, l2=0.0, max_iter=3)
    assert any("without converging; pass a larger max_iter" in line for line in summary["warnings"])
    _, summary = fitted("vector", logits, labels)
    assert summary["warnings"] == []


def test_lbfgs_says_not_converged_only_while_the_objective_still_visibly_falls():
    """max_iter=3 on 30 classes stops a matrix fit far from its optimum: not converged; the default reaches it."""
    from hf_calibrate.calibrators.linear import RegularisedOptions, fit_matrix

    logits, labels = nearly_separable(n=300, classes=30, errors=60, seed=3)
    _, stopped = fit_matrix(logits, labels, RegularisedOptions(l2=0.01, max_iter=3))
    assert stopped["converged"] is False
    assert any("matrix: the fit stopped after max_iter=3 iterations without converging" in line for line in stopped["warnings"])
    _, default = fit_matrix(logits, labels, RegularisedOptions(l2=0.01))
    assert default["converged"] is True and default["warnings"] == []
