"""Temperature scaling (Guo et al., 2017): calibrated logits = z / T, one scalar T > 0.

T is stored as log T. The fit minimises the NLL exactly: as a function of β = 1/T the NLL
``f(β) = mean_i [logsumexp(β z_i) − β z_{i,y_i}]`` is convex, with
``f'(β) = mean_i (E_p[z_i] − z_{i,y_i})`` and ``f''(β) = mean_i Var_p[z_i] ≥ 0``, so a
safeguarded Newton iteration on β converges in a handful of passes over the logits — fewer
than a generic L-BFGS on log T, which matters for 50,000 × 1,000 logits. Each pass computes
f' and f'' together, chunk by cache-sized chunk, so it costs about one ``logsumexp`` pass.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .._warnings import warn_user
from .base import Calibrator, check_finite_logits, chunk_rows
from .options import check_fields, require
from .memory import Footprint

# T is kept within [1e-3, 1e3]: beyond this the model is constant or a hard argmax anyway.
BETA_BOUNDS = (1e-3, 1e3)
#: what to change when the calibration data is separable (see :func:`warn_if_without_minimum`)
CALIBRATION_DATA_FIX = (
    "Calibrate on held-out data the model was not trained on, and enough of it that the model gets some rows wrong."
)
#: above this many rows, Newton first runs on a strided subsample of this many rows
WARM_START_ROWS = 2048
#: Guo et al. (2017), the paper of temperature, vector and matrix scaling
GUO_2017_CITATION = (
    "@inproceedings{guo2017calibration, title={On Calibration of Modern Neural Networks}, "
    "author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.}, booktitle={ICML}, year={2017}}"
)


def _nll_derivatives(logits: torch.Tensor, labels: torch.Tensor, beta: float) -> Tuple[float, float]:
    """f'(β) and f''(β) of the mean NLL of softmax(β·z), in one pass over the logits.

    For each cache-sized chunk of rows: w = exp(β(z − max z)), then E_p[z] = Σw·z / Σw and
    E_p[z²]; f' = mean(E_p[z] − z_y), f'' = mean(E_p[z²] − E_p[z]²). Chunks are computed at the
    logits' precision (float32 for float32 and narrower inputs), the per-row results summed in
    float64 on the logits' device (no synchronisation until the end).
    """
    rows = chunk_rows(logits)
    true_logits = logits.gather(1, labels[:, None]).squeeze(1)
    slope = torch.zeros((), dtype=torch.float64, device=logits.device)
    curvature = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        z = logits[start : start + rows]
        if z.dtype not in (torch.float32, torch.float64):
            z = z.float()
        weights = (z - z.amax(dim=1, keepdim=True)).mul_(beta).exp_()  # one (rows, C) temporary
        total = weights.sum(dim=1)
        mean_z = torch.linalg.vecdot(weights, z) / total
        mean_z2 = torch.linalg.vecdot(weights.mul_(z), z) / total
        slope += (mean_z - true_logits[start : start + rows]).sum(dtype=torch.float64)
        curvature += (mean_z2 - mean_z.square()).clamp_min(0).sum(dtype=torch.float64)
    n = logits.shape[0]
    return float(slope) / n, float(curvature) / n


def _newton(logits, labels, beta, low, high, tolerance, step_tolerance, max_iter):
    """Safeguarded Newton on β; returns (β, passes over ``logits``).

    Stops when f'(β) ≈ 0, the bracket is closed, the step is below ``step_tolerance``·β, or the
    *next* step would be: Newton's error squares each step (e' ≈ K·e²), so after steps s₁ then
    s₂ the next is about s₂³/s₁²; when 10× that is below tolerance, β + s₂ is returned without
    the confirming pass (it differs from the optimum by about that predicted step).
    """
    previous = None  # the last Newton step's size, None after a bisection
    for iteration in range(1, max_iter + 1):
        slope, curvature = _nll_derivatives(logits, labels, beta)
        if slope > 0:
            high = beta
        else:
            low = beta
        if abs(slope) <= tolerance or high / low - 1.0 <= tolerance:
            return beta, iteration
        step = beta - slope / curvature if curvature > 0 else math.nan
        newton = low < step < high
        new_beta = step if newton else math.sqrt(low * high)
        change = abs(new_beta - beta)
        if change <= step_tolerance * beta:
            return new_beta, iteration
        if newton and previous is not None and change < 0.1 * previous and 10 * change**3 / previous**2 <= step_tolerance * new_beta:
            return new_beta, iteration
        previous = change if newton else None
        beta = new_beta
    return beta, max_iter


def fit_inverse_temperature(
    logits: torch.Tensor, labels: torch.Tensor, *, tolerance: float = 1e-10, max_iter: int = 100, start: float = 1.0
) -> Tuple[float, int]:
    """β = 1/T minimising the NLL of softmax(β·logits); returns (β, Newton passes over all the logits).

    Safeguarded Newton: a bracket [lo, hi] with f'(lo) < 0 < f'(hi) is kept, and a Newton
    step that leaves it is replaced by a geometric bisection. Stops when f'(β) ≈ 0 or the step
    is, or by Newton's quadratic convergence will next be, below the precision of the logits
    (relative 1e-6 in float32, 1e-12 in float64). Large inputs start from the optimum of a
    strided subsample of :data:`WARM_START_ROWS` rows (within sampling error, ~1/√2048 ≈ 2%),
    so two passes over all the logits usually suffice; each pass costs about one
    ``torch.logsumexp`` over them (benchmarks/results/logit_fits.md). Smaller ones start from ``start``
    (in the bounds; e.g. the β of rows these are a part of): where it starts changes the passes, not the β
    returned, which is the optimum to the precision above.
    Logits holding NaN or ±inf are refused (:class:`~hf_calibrate.metrics.NonFiniteError`).
    Where the NLL has no minimum (separable rows, or logits below chance: see
    :func:`warn_if_without_minimum`) the bound it falls towards is returned, after one pass.
    """
    check_finite_logits(logits)
    low, high = BETA_BOUNDS
    reason = _without_minimum(logits, labels)
    if reason is not None:
        return (high if reason == "separable" else low), 1
    step_tolerance = 1e-12 if logits.dtype == torch.float64 else 1e-6
    beta = min(max(start, low), high)
    if logits.shape[0] > 4 * WARM_START_ROWS:
        stride = logits.shape[0] // WARM_START_ROWS
        beta, _ = _newton(logits[::stride], labels[::stride], beta, low, high, tolerance, 1e-3, max_iter)
    return _newton(logits, labels, beta, low, high, tolerance, step_tolerance, max_iter)


def _without_minimum(logits: torch.Tensor, labels: torch.Tensor) -> Optional[str]:
    """Why the NLL of softmax(β·z) has no minimum over β > 0 — ``"separable"`` or ``"below chance"`` — or None.

    f'(β) = mean_i (E_p[z_i] − z_{i,y_i}) is increasing (f is convex). When every row's true
    logit is the largest (ties included), E_p[z_i] ≤ z_{i,y_i} for every β, so f' < 0 and the
    NLL falls as T → 0. When f'(0) = mean_i (mean_k z_ik − z_{i,y_i}) ≥ 0, the true logits are on
    average no higher than the mean logit and the minimum lies at β ≤ 0. One chunked pass, at
    the logits' precision with a float64 sum: ~0.13 of a Newton pass (50,000 × 1,000 on a CPU).
    """
    true_logits = logits.gather(1, labels[:, None]).squeeze(1)
    rows = chunk_rows(logits)
    separable = True
    slope_at_zero = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        z, true_z = logits[start : start + rows], true_logits[start : start + rows]
        separable = separable and bool((true_z >= z.amax(dim=1)).all())
        slope_at_zero += (z.mean(dim=1) - true_z).sum(dtype=torch.float64)
    if separable:
        return "separable"
    return "below chance" if float(slope_at_zero) >= 0 else None


def without_minimum_message(beta: float, logits: torch.Tensor, labels: torch.Tensor, data: str, fix: str) -> Optional[str]:
    """The sentence saying that ``beta``, fitted by :func:`fit_inverse_temperature` on ``logits`` over ``data`` (rows
    named for the message), is a bound because the NLL has no minimum, or None; ``fix`` says what to change for
    separable data.

    The fit returns exactly a bound of :data:`BETA_BOUNDS` then (Newton's iterates stay strictly
    inside them), so other fits cost nothing here.
    """
    if beta not in BETA_BOUNDS:
        return None
    reason = _without_minimum(logits, labels)
    if reason == "separable" and _all_logits_equal(logits):
        return (f"the temperature fitted on {data} is a bound: every row has all its logits equal, so every T gives "
                "the same uniform probabilities. Check that the model returns its logits.")
    if reason == "separable":
        return (f"the temperature fitted on {data} has no minimum: {_no_class_above_true(logits, labels)}, so the "
                f"NLL keeps falling as T → 0 and the fit stops at its bound T = {1 / BETA_BOUNDS[1]:g}, a hard argmax with "
                f"confidence ≈ 1. {fix}")
    if reason == "below chance":
        return (f"the temperature fitted on {data} has no minimum: the true classes' logits are on average no higher than "
                f"the mean logit, so the fit stops at its bound T = {1 / BETA_BOUNDS[0]:g} (nearly uniform probabilities). "
                "Check that the labels use the model's class indices (its id2label order).")
    return None


def warn_if_without_minimum(beta: float, logits: torch.Tensor, labels: torch.Tensor, data: str, fix: str) -> None:
    """Warn (at the user's line) with :func:`without_minimum_message` when there is one."""
    message = without_minimum_message(beta, logits, labels, data, fix)
    if message is not None:
        warn_user(message)


#: a temperature within this factor of a bound of :data:`BETA_BOUNDS` is reported as at its bound
NEAR_BOUND = 1.5
#: about what the median row of a model's calibrated logits spans (max − min, logits): a temperature at its bound that
#: leaves it beyond these, on the side the fit pushes away from, says the logits' scale is wrong, not a few rows
CALIBRATED_SPANS = (1.0, 100.0)


def temperature_warnings(
    beta: float, logits: torch.Tensor, labels: torch.Tensor, data: str = "the calibration data", method: str = "temperature",
    start: bool = False,
) -> List[str]:
    """One line per problem of a temperature fitted by ``method`` on (N, C) ``logits`` and (N,) ``labels`` over ``data``:
    no minimum (separable, below chance), or T at (or within :data:`NEAR_BOUND` of) a bound (:func:`bound_message`).
    ``start``: the temperature is the temperature scaling ``method`` starts from (and is pulled towards), as the line says."""
    head = f"{method}: " + ("it starts from temperature scaling, and " if start else "")
    message = without_minimum_message(beta, logits, labels, data, CALIBRATION_DATA_FIX)
    if message is not None:
        return [head + message]
    return [head + bound_message(beta, logits)] if near_bound(beta) else []


def near_bound(beta: float) -> bool:
    """Whether 1/T = ``beta`` is at, or within :data:`NEAR_BOUND` of, a bound of :data:`BETA_BOUNDS`."""
    low, high = BETA_BOUNDS
    return beta < low * NEAR_BOUND or beta > high / NEAR_BOUND


def bound_message(beta: float, logits: torch.Tensor) -> str:
    """Why 1/T = ``beta`` ended at a bound of :data:`BETA_BOUNDS` on (N, C) ``logits``: their scale, when even at the bound
    the median row's calibrated span (max − min) stays beyond :data:`CALIBRATED_SPANS` on the side the fit pushes away
    from (too small at T = 0.001, too large at T = 1000), else a few dominating rows."""
    low, high = BETA_BOUNDS
    head = f"T = {1 / beta:.4g} is at its bound ({1 / high:g} to {1 / low:g})"
    span = float((logits.amax(dim=1) - logits.amin(dim=1)).double().median())
    calibrated = span * beta
    if (calibrated < CALIBRATED_SPANS[0] and beta > 1) or (calibrated > CALIBRATED_SPANS[1] and beta < 1):
        return (f"{head} and still leaves the median row's logits spanning {calibrated:.3g} (max − min; {span:.3g} as given), "
                f"where a model's calibrated logits span about {CALIBRATED_SPANS[0]:g} to {CALIBRATED_SPANS[1]:g}: the "
                "logits' scale is far from a model's: check that the model's forward returns its logits, not a rescaled copy.")
    return (f"{head}: a few rows dominate the fit. Check the calibration data for rows with extreme logits (a corrupted "
            "input) and for labels outside the model's class order.")


def starting_temperature_warnings(logits: torch.Tensor, labels: torch.Tensor, method: str) -> List[str]:
    """:func:`temperature_warnings` of the temperature scaling that ``method`` starts from, fitted here on (N, C)
    ``logits`` and (N,) ``labels`` (for fits that do not keep its 1/T)."""
    return temperature_warnings(fit_inverse_temperature(logits.detach(), labels)[0], logits, labels, method=method, start=True)


class TemperatureScaling(Calibrator):
    """``z / T``: one scalar, predictions unchanged.

    Example:
        >>> import torch
        >>> logits = torch.tensor([[4.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
        >>> ts = TemperatureScaling(num_classes=2)
        >>> _ = ts.fit_logits(logits, torch.tensor([0, 1, 1, 0]), ts.Options())
        >>> round(ts.temperature.item(), 3)  # 3 of 4 right: softmax(4/T) → 0.75
        3.641
    """

    method = "temperature"
    preserves_argmax = True
    title = "temperature scaling"
    description = ("The logits are divided by one scalar temperature T fitted to minimise the negative log-likelihood on "
                   "the calibration data. Predictions are unchanged.")
    citation = GUO_2017_CITATION
    #: the logits' float64 working copy and its chunked passes'
    footprint = Footprint(rows=2)

    @dataclasses.dataclass
    class Options:
        """Fit options of temperature scaling.

        Attributes:
            max_iter: Newton iterations at most (default 100; 5–10 are typical).
        """

        max_iter: int = 100

        def __post_init__(self) -> None:
            check_fields(self)
            require(self.max_iter >= 1, "max_iter", self.max_iter, "an integer >= 1")

    def __init__(self, num_classes: int) -> None:
        super().__init__(num_classes)
        self.log_temperature = nn.Parameter(torch.zeros(()))

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * torch.exp(-self.log_temperature).to(logits.dtype)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "TemperatureScaling.Options") -> Dict[str, Any]:
        """The NLL's minimiser T; on separable data, where T → 0 would give a hard argmax, T = 1 is kept (and said)."""
        beta, iterations = fit_inverse_temperature(logits.detach(), labels, max_iter=options.max_iter)
        separable = is_separable_fit(beta, logits, labels)
        lines = [separable_message(logits, labels)] if separable else temperature_warnings(beta, logits, labels)
        beta = 1.0 if separable else beta
        with torch.no_grad():
            self.log_temperature.fill_(-math.log(beta))
        return {"temperature": 1.0 / beta, "iterations": iterations, "warnings": lines, **({"refused": True} if separable else {})}


def is_separable_fit(beta: float, logits: torch.Tensor, labels: torch.Tensor) -> bool:
    """Whether ``beta`` (from :func:`fit_inverse_temperature`) is the upper bound because every row is classified correctly."""
    return beta == BETA_BOUNDS[1] and _without_minimum(logits, labels) == "separable"


def temperature_method_beta(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """1/T exactly as the ``temperature`` method fits it: the NLL's minimiser, or 1 on separable rows."""
    beta, _ = fit_inverse_temperature(logits.detach(), labels)
    return 1.0 if is_separable_fit(beta, logits, labels) else beta


def separable_message(logits: torch.Tensor, labels: torch.Tensor) -> str:
    """The line saying temperature scaling was not fitted on the separable calibration rows of (N, C) ``logits``."""
    if _all_logits_equal(logits):
        return (f"temperature: not fitted (T = 1 kept): all {len(labels)} calibration rows have every logit equal, so "
                "every T gives the same uniform probabilities. Check that the model returns its logits (it ranks no "
                "class above another on these data).")
    return (f"temperature: not fitted (T = 1 kept) on the calibration rows: {_no_class_above_true(logits, labels)}, so the "
            f"NLL keeps falling as T → 0 and its minimiser would be a hard argmax with confidence ≈ 1. {CALIBRATION_DATA_FIX}")


def _all_logits_equal(logits: torch.Tensor) -> bool:
    """Whether every row of (N, C) ``logits`` has all its C logits equal."""
    rows = chunk_rows(logits)
    return all(bool((chunk.amax(dim=1) == chunk.amin(dim=1)).all()) for chunk in logits.split(rows))


def _no_class_above_true(logits: torch.Tensor, labels: torch.Tensor) -> str:
    """What rows in which no class's logit is above the true class's are (:func:`_without_minimum`'s separable rows):
    classified correctly only where the true logit is the only highest one; a tie is not a correct classification."""
    rows = chunk_rows(logits)
    tied = sum(int(((chunk == chunk.amax(dim=1, keepdim=True)).sum(dim=1) > 1).sum()) for chunk in logits.split(rows))
    if tied:
        return (f"no class's logit is above the true class's in any of the {len(labels)} rows, but in {tied} of them the "
                "true class only ties with other classes for the highest logit (a tie, not a correct classification, "
                "whose confidence falls towards 1/k for k tied classes)")
    return f"all {len(labels)} rows are classified correctly"
