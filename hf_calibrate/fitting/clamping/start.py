"""What both Neural Clamping optimisers share: δ's starting point, the held-out scores, the re-read check."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ... import _distributed
from ...backbones import Backbone
from ...calibrators.neural_clamping import SELECT_METRICS, NeuralClamping
from ...data import CalibrationData, StreamedData
from ...metrics import calibration_report, smooth_calibration_error
from ..runtime.engine import Engine


def holdout_scores(logits: torch.Tensor, labels: torch.Tensor, n_bins: int) -> Dict[str, float]:
    """Every selection criterion (``SELECT_METRICS``) of calibrated ``logits``, keyed ``holdout_<metric>``.

    All of them are kept in the history (a few ms per check), so that a fit shows how the
    criteria it did not select on moved too.
    """
    report = calibration_report(logits, labels, n_bins=n_bins, from_logits=True)
    scores = {metric: report[metric] for metric in SELECT_METRICS if metric != "smooth_ece"}
    scores["smooth_ece"] = smooth_calibration_error(logits, labels, from_logits=True)
    return {f"holdout_{metric}": scores[metric] for metric in SELECT_METRICS}


def require_rereadable(*sources: Optional[CalibrationData]) -> None:
    """Refuse a one-shot stream: Neural Clamping reads its data once per epoch and once per held-out check."""
    for source in sources:
        if isinstance(source, StreamedData) and not source.reiterable:
            raise ValueError(
                f"Neural Clamping reads its data once per epoch, but these data ({source.description}) can be read only "
                "once: a generator or other iterator. Pass a callable that returns a new iterator each time it is called (e.g. "
                "lambda: make_batches()), or a re-iterable: a list of batches, a DataLoader, an IterableDataset."
            )


def initial_delta(
    backbone: Backbone,
    data: CalibrationData,
    fit_indices: torch.Tensor,
    calibrator: NeuralClamping,
    options: NeuralClamping.Options,
    engine: Engine,
    log_t: torch.Tensor,
) -> torch.Tensor:
    """δ's starting point: zeros, N(0, scale²), or the mean gradient of Σ_k f_k(x + δ)/T at δ = 0."""
    shape = calibrator.delta.shape
    if options.delta_init == "zero":
        return torch.zeros(shape, device=engine.device)
    if options.delta_init == "random":
        return (torch.randn(shape, generator=engine.generator(0x5EED)) * options.delta_init_scale).to(engine.device)
    delta = torch.zeros(shape, device=engine.device, requires_grad=True)
    global_batches = engine.global_batches(fit_indices, shuffle=False)
    for _, micro_batches in engine.batches(data, global_batches):
        for _, inputs, _ in micro_batches:
            with engine.autocast():
                logits = backbone.logits(inputs, delta)
            (logits.float().sum() * torch.exp(-log_t) / len(fit_indices)).backward()
        engine.sync_faults()
    grad = delta.grad if delta.grad is not None else torch.zeros_like(delta)
    return _distributed.all_reduce_sum_(grad.detach().clone())
