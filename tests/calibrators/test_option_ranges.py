"""Every number option has a finite range the fit can use, checked where options are checked.

A value outside it is refused by ``CalibratedModel.fit`` before any data are read, naming the option, the value, the
range and the fix; a value at either end of it fits. Sizes (bins, latent widths, Monte-Carlo samples) are bounded the
same way, before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import _tiny_models as tm
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import CALIBRATORS, InvalidOptionError
from hf_calibrate.calibrators.neural_clamping import SGD_OPTIONS

pytestmark = pytest.mark.usefixtures("single_thread")

#: options that make a fit short (and, for Neural Clamping, choose the optimiser that reads the option)
QUICK = {"neural_clamping": {"max_iterations": 2}, "tst": {"epochs": 2}, "vtst": {"epochs": 2}, "mac_cal": {"epochs": 2}}


def _mentions_float(hint: typing.Any) -> bool:
    return hint is float or any(_mentions_float(arg) for arg in typing.get_args(hint))


def _float_options():
    """(method, option, its Range) of every option typed float (alone, in a Union or a list) of every method."""
    for method, calibrator in CALIBRATORS.items():
        hints = typing.get_type_hints(calibrator.Options)
        for field in dataclasses.fields(calibrator.Options):
            if _mentions_float(hints[field.name]):
                yield method, field.name, field.metadata.get("range")  # declared with calibrators.options.ranged


FLOAT_OPTIONS = list(_float_options())
#: a share of the data: which shares leave rows to fit and to select on depends on the data, and the split says so
#: (calibrators.holdout), so its ends are not fitted here
SHARES = ("holdout_fraction",)
FITTED = [option for option in FLOAT_OPTIONS if option[1] not in SHARES]


@pytest.fixture(scope="module")
def plain() -> nn.Module:
    return tm.plain_module()


@pytest.fixture(scope="module")
def rows(plain) -> TensorDataset:
    return tm.plain_data(plain)


def _fit(model: nn.Module, data: TensorDataset, method: str, **options: typing.Any):
    extra = dict(QUICK.get(method, {}))
    if method == "neural_clamping" and set(options) & set(SGD_OPTIONS):
        extra = {"epochs": 2}
    if "delta_init_scale" in options:
        extra["delta_init"] = "random"
    return CalibratedModel.fit(model, data, method=method, progress=False, **extra, **options)


@pytest.mark.parametrize(("method", "name", "allowed"), FLOAT_OPTIONS, ids=[f"{m}.{n}" for m, n, _ in FLOAT_OPTIONS])
def test_every_float_option_declares_a_finite_range(method, name, allowed):
    from hf_calibrate.calibrators.options import Range

    assert isinstance(allowed, Range), f"{method} option {name} declares no range (ranged(default, Range(...)))"
    assert math.isfinite(allowed.low) and math.isfinite(allowed.high) and allowed.low < allowed.high


def _ends(allowed: typing.Any):
    """The two ends of a range, or the nearest floats inside an open end."""
    low = float(np.nextafter(allowed.low, allowed.high)) if allowed.low_open else allowed.low
    high = float(np.nextafter(allowed.high, allowed.low)) if allowed.high_open else allowed.high
    return low, high


@pytest.mark.parametrize("end", ["low", "high"])
@pytest.mark.parametrize(("method", "name", "allowed"), FITTED, ids=[f"{m}.{n}" for m, n, _ in FITTED])
def test_a_float_option_at_either_end_of_its_range_fits(plain, rows, method, name, allowed, end):
    """The range is one the fit can use: at its ends the fit runs and the calibrated logits are finite."""
    value = _ends(allowed)[end == "high"]
    options = {name: [value] if name.endswith("_grid") else value}
    if name.endswith("_retention"):
        options.update(initial_retention=value, min_retention=value)  # initial_retention may not be below min_retention
    calibrated = _fit(plain, rows, method, **options)
    with torch.no_grad():
        logits = calibrated(rows.tensors[0][:20])
    assert torch.isfinite(getattr(logits, "logits", logits)).all()


@pytest.mark.parametrize(("method", "options", "name", "said"), [
    ("neural_clamping", {"lr": 1e308}, "lr", "a positive number in (0, 1]"),  # torch's overflow RuntimeError
    ("neural_clamping", {"lr": 1e6}, "lr", "a positive number in (0, 1]"),  # fitted T = inf, silently
    ("neural_clamping", {"temperature_init": 1e-300}, "temperature_init", "a number in [0.001, 1000]"),  # NaN probabilities
    ("neural_clamping", {"gamma": [1.0, 1e300]}, "gamma", "a non-negative number in [0, 100] (each value of the list)"),
    ("mac_cal", {"min_retention": 1e-300, "initial_retention": 1e-300}, "min_retention", "a number in [0.01, 1]"),  # NaN loss
    ("tst", {"weight_decay": 1e6}, "weight_decay", "a non-negative number in [0, 10]"),
    ("matrix", {"l2": 1e300}, "l2", "a non-negative number in [0, 10000]"),
    ("histogram", {"prior_grid": [1e300]}, "prior_grid", "a positive number in (0, 1e+06] (each value of the list)"),
])
def test_a_float_option_beyond_its_range_is_refused_naming_the_range_and_the_fix(plain, rows, method, options, name, said):
    """Values the old magnitude check (|x| <= 1e6) let through broke the fit (T = inf, NaN probabilities, a NaN loss);
    now every one is refused where options are checked, before the data are read."""
    with pytest.raises(InvalidOptionError) as error:
        _fit(plain, rows, method, **options)
    message = str(error.value)
    assert message.startswith(f"option {name} must be {said}, got {options[name]!r}"), message
    assert f"Pass a value in that range, or leave {name} out" in message, message


@pytest.mark.parametrize(("method", "options", "said"), [
    ("histogram", {"n_bins": 10**9}, "option n_bins must be an integer from 1 to 10000, got 1000000000"),
    ("neural_clamping", {"n_bins": 10**9}, "option n_bins must be an integer from 1 to 10000, got 1000000000"),
    ("tst", {"latent_dim": 10**9}, "option latent_dim must be an integer from 1 to 4096, got 1000000000"),
    ("vtst", {"samples": 10**9}, "option samples must be an integer from 1 to 100, got 1000000000"),
    ("mac_cal", {"samples": 10**9}, "option samples must be an integer from 1 to 100, got 1000000000"),
])
def test_sizes_are_bounded_before_anything_is_allocated(plain, rows, method, options, said):
    """Neural Clamping's n_bins=10**9 asked the allocator for 24 GB (uncapped, the process was killed without a
    traceback), TST's latent_dim=10**9 for 72 GB, V-TST's samples=10**9 for 512 GB: each raised a raw allocator error."""
    with pytest.raises(InvalidOptionError, match=f"^{said}: a fit cannot use values beyond that"):
        _fit(plain, rows, method, **options)
