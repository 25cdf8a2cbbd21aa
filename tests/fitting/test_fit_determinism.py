"""Fits are seeded: the same data and ``seed`` give bit-identical calibrators, whatever state
torch's global random generator is in, and a fit leaves that state untouched.

(What reproduces across thread counts, processes and machines is in ``docs/determinism.md``.)
Once, head methods initialised their new head from the global generator, so two identical TST
fits differed; this test fails on that.
"""

from __future__ import annotations

import pytest
import torch

from _tiny_models import fit, make_base

METHODS = ("temperature", "vector", "matrix", "dirichlet", "histogram", "isotonic", "neural_clamping", "tst", "vtst", "mac_cal")


@pytest.fixture(scope="module")
def base():
    return make_base("timm", n=64)


def _state(calibrated):
    return {name: tensor.detach().clone() for name, tensor in calibrated.calibrator.state_dict().items()}


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_calibrator_whatever_the_global_rng(base, method):
    model, data, _ = base
    torch.manual_seed(1)
    first = _state(fit(model, data, method, seed=7))
    torch.manual_seed(2)
    rng_before = torch.random.get_rng_state()
    second = _state(fit(model, data, method, seed=7))
    assert torch.equal(torch.random.get_rng_state(), rng_before), "a fit must not consume the user's random numbers"
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), (method, name)
