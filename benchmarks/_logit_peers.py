"""Other libraries' temperature scaling, timed beside ours by ``bench_logit_fits.py`` (the ``bench`` extra).

Each peer is fitted on the same cached float32 logits the way its documentation shows, with its
default options; a peer that is not installed is reported with what to install
(``Peer.missing``). ``scaled`` is the calibration map every temperature fit returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

import torch
from torch.utils.data import DataLoader


def scaled(temperature: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The calibration map of a fitted temperature: ``z ↦ z / T``."""
    return lambda z: z / temperature



@contextlib.contextmanager
def counted_cross_entropy() -> Iterator[list[int]]:
    """Count ``nn.CrossEntropyLoss`` calls (the peers' objective evaluations) while the block runs: ``[count]``."""
    count = [0]

    def hook(module: torch.nn.Module, inputs: Any) -> None:
        if isinstance(module, torch.nn.CrossEntropyLoss):
            count[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


@contextlib.contextmanager
def warnings_logged_off() -> Iterator[None]:
    """Silence ``logging`` warnings (torch-uncertainty logs "model is None" on every fit from logits)."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def fit_torch_uncertainty(logits: torch.Tensor, labels: torch.Tensor):
    """torch-uncertainty ``TemperatureScaler()``: LBFGS (no line search, lr=0.1, max_iter=100) on 1/T from T = 1."""
    from torch_uncertainty.post_processing import TemperatureScaler

    scaler = TemperatureScaler()  # model=None: fits on the loader's (logits, labels) directly
    with counted_cross_entropy() as evaluations, warnings_logged_off():
        scaler.fit(DataLoader([(logits, labels)], batch_size=None), progress=False)
    temperature = 1.0 / float(scaler.inv_temp.detach())
    return scaled(temperature), {"temperature": temperature, "evaluations": evaluations[0]}


def fit_netcal(logits: torch.Tensor, labels: torch.Tensor):
    """netcal ``TemperatureScaling()``: scipy ``minimize`` (L-BFGS-B, finite-difference gradient) on w = 1/T from w = 1.

    netcal takes probabilities (it fits w on their logs); they are made here, inside the timed fit,
    in float64: from float32 probabilities its finite-difference step (~1e-8) is below float32
    resolution, the gradient is 0 and the fit returns T = 1 (the symptom reported as netcal issue #61).
    """
    from netcal.scaling import TemperatureScaling

    calibrator = TemperatureScaling()
    probabilities = torch.softmax(logits.double(), dim=1).numpy()
    with counted_cross_entropy() as evaluations:
        calibrator.fit(probabilities, labels.numpy())
    temperature = 1.0 / float(calibrator.weights[0])  # netcal's `temperature` property is this weight, 1/T
    return scaled(temperature), {"temperature": temperature, "evaluations": evaluations[0]}


def fit_probmetrics(logits: torch.Tensor, labels: torch.Tensor):
    """probmetrics ``get_calibrator("temp-scaling")``: bisection on the NLL's derivative in log(1/T), 30 steps."""
    from probmetrics.calibrators import get_calibrator
    from probmetrics.distributions import CategoricalLogits

    calibrator = get_calibrator("temp-scaling")
    calibrator.fit_torch(CategoricalLogits(logits), labels)
    temperature = 1.0 / float(calibrator.invtemp_)
    steps = calibrator.max_bisection_steps  # bisection_search takes exactly this many steps, one gradient pass each
    return scaled(temperature), {"temperature": temperature, "iterations": steps, "evaluations": steps}


@dataclasses.dataclass(frozen=True)
class Peer:
    """Another library's temperature scaling: its row, what to import and install, how it is fitted (and said so)."""

    label: str
    module: str  # importing it proves the peer usable
    distribution: str
    install: str
    fit: Callable[[torch.Tensor, torch.Tensor], tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]]
    how: str  # the call, for the notes

    def missing(self) -> str | None:
        """Why the peer cannot run here (the import error), or None."""
        try:
            importlib.import_module(self.module)
        except ImportError as error:
            return str(error)
        return None


PEERS = (
    Peer(
        "peer: torch-uncertainty TemperatureScaler", "torch_uncertainty.post_processing", "torch-uncertainty",
        "torch-uncertainty lightning", fit_torch_uncertainty,
        "`TemperatureScaler()` (no model: it fits on the loader's logits; LBFGS without line search, lr=0.1, "
        "max_iter=100, on 1/T from T = 1), `.fit(DataLoader([(logits, labels)], batch_size=None), progress=False)`, "
        "T = `1 / inv_temp` (its metadata leaves out lightning, which its `post_processing` package imports)",
    ),
    Peer(
        "peer: netcal TemperatureScaling (mle)", "netcal.scaling", "netcal", "netcal", fit_netcal,
        "`TemperatureScaling()` (`method=\"mle\"`: scipy `minimize`, L-BFGS-B with a finite-difference gradient, on "
        "w = 1/T applied to log-probabilities, from w = 1), `.fit(softmax(logits) as float64 numpy, labels)` with the "
        "softmax inside the timed fit, T = `1 / weights` (its `temperature` property returns w, i.e. 1/T). netcal "
        "takes probabilities, not logits; from float32 probabilities the finite-difference step is below float32 "
        "resolution, the gradient is 0 and the fit returns T = 1 unchanged (the symptom reported as netcal issue #61), hence float64",
    ),
    Peer(
        "peer: probmetrics temp-scaling (bisection)", "probmetrics.calibrators", "probmetrics", "probmetrics numba",
        fit_probmetrics,
        "`get_calibrator(\"temp-scaling\")` (`TemperatureScalingCalibrator`: 30 bisection steps on the NLL's "
        "derivative in log(1/T) ∈ [-16, 16]), `.fit_torch(CategoricalLogits(logits), labels)`, T = `1 / invtemp_` "
        "(its metadata leaves out numba, which `probmetrics.calibrators` imports)",
    ),
)


def peer_note(missing: dict[Peer, str | None]) -> str:
    """The notes' bullet on the peers: version and call of each that ran, the reason for each that did not."""
    parts = [
        f"{peer.distribution} {version(peer.distribution)}: {peer.how}" if reason is None
        else f"{peer.distribution}: **not run** ({reason}; `pip install {peer.install}`)"
        for peer, reason in missing.items()
    ]
    return (
        "- Peers, each with its default options on the same cached float32 logits, timed from the logits to a fitted "
        "T (`pip install -e \".[bench]\"` installs them): " + "; ".join(parts) + ". `evals` counts their "
        "`nn.CrossEntropyLoss` calls (torch-uncertainty, netcal) or bisection steps (probmetrics: one pass computing "
        "the NLL's derivative each); they are scored with `z / T` for the T they found."
    )
