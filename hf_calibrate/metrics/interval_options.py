"""Defaults and validation of the bootstrap intervals' options (docs/design.md §2, "Intervals").

Shared by the one-shot functions of :mod:`.intervals` and the accumulator
:class:`~hf_calibrate.metrics.accumulator.CalibrationMetrics`; every error names the value and the fix.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ._checks import as_tensor

#: Replicates by default: R = 1,000 puts the Monte Carlo error of a 95 % endpoint near 2 % of the
#: interval's width; the streaming state is R·(3B + 2) float64 values (376 kB for B = 15).
DEFAULT_REPLICATES = 1000
DEFAULT_CONFIDENCE = 0.95
#: Metrics with intervals by default, and those computed only on request (smooth_ece costs one
#: full smECE bandwidth search per replicate).
DEFAULT_METRICS = ("accuracy", "ece", "mce", "rms_ce", "ada_ece", "nll", "brier")
ON_REQUEST_METRICS = ("smooth_ece",)
#: Metrics that need each sample's confidence (equal-mass bins, kernel smoothing).
PER_SAMPLE_METRICS = ("ada_ece", "smooth_ece")
#: Calibration errors, biased upwards by resampling: their intervals are shifted by the bootstrap bias.
BIAS_SHIFTED_METRICS = ("ece", "mce", "rms_ce", "ada_ece", "smooth_ece")
#: Fewest samples behind an interval: a bootstrap of fewer resamples the same few rows, and its interval
#: understates the spread (one sample gives an interval of zero width).
MIN_INTERVAL_SAMPLES = 30
#: Fewest replicates behind an interval: fewer cannot place the 2.5 % and 97.5 % quantiles of a 95 % interval
#: (one replicate gives low = high).
MIN_INTERVAL_REPLICATES = 100
#: Why fewer replicates are refused where a user asks for intervals (evaluate, the evaluate modules, the evaluator).
TOO_FEW_REPLICATES = "fewer cannot place the 2.5 % and 97.5 % quantiles of a 95 % interval"


def no_interval_reason(samples: Optional[int], replicates: int) -> Optional[str]:
    """Why ``replicates`` bootstrap replicates of ``samples`` samples (None: not known) give no interval, or None.

    Example:
        >>> no_interval_reason(1000, 1000) is None, no_interval_reason(1, 1000)
        (True, 'no interval: 1 sample, fewer than the 30 an interval needs')
    """
    if samples is not None and samples < MIN_INTERVAL_SAMPLES:
        noun = "sample" if samples == 1 else "samples"
        return f"no interval: {samples} {noun}, fewer than the {MIN_INTERVAL_SAMPLES} an interval needs"
    if replicates < MIN_INTERVAL_REPLICATES:
        return f"no interval: {replicates} bootstrap replicates, fewer than the {MIN_INTERVAL_REPLICATES} an interval needs"
    return None


#: the most bootstrap replicates taken: their weights are drawn per replicate and sample
MAX_REPLICATES = 100_000


def check_replicates(value: Any, name: str = "replicates", *, allow_zero: bool = False) -> int:
    """A positive integer (``allow_zero``: non-negative) up to :data:`MAX_REPLICATES`; bools refused.

    Example:
        >>> check_replicates(1000), check_replicates(0, "bootstrap", allow_zero=True)
        (1000, 0)
    """
    low = 0 if allow_zero else 1
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        what = "a non-negative integer (0 turns intervals off)" if allow_zero else "a positive integer"
        raise ValueError(f"{name} must be {what}, got {value!r}.")
    if value > MAX_REPLICATES:
        raise ValueError(f"{name} must be at most {MAX_REPLICATES:,}, got {value!r}: 1,000 (the default) give "
                         "interval ends to about ±0.01 of their coverage; pass e.g. 1000 or 10000.")
    return int(value)


def check_bootstrap(value: Any, name: str = "bootstrap") -> int:
    """Replicates where a user asks for intervals: 0 (points only) or at least :data:`MIN_INTERVAL_REPLICATES`.

    Example:
        >>> check_bootstrap(0), check_bootstrap(1000)
        (0, 1000)
    """
    replicates = check_replicates(value, name, allow_zero=True)
    if 0 < replicates < MIN_INTERVAL_REPLICATES:
        raise ValueError(
            f"{name} must be 0 (points only) or at least {MIN_INTERVAL_REPLICATES} replicates, got {replicates}: "
            f"{TOO_FEW_REPLICATES}. Pass {name}=1000 (the default of evaluate) or 0."
        )
    return replicates


def check_confidence(value: Any) -> float:
    """A real number strictly between 0 and 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"confidence must be a number strictly between 0 and 1 (e.g. 0.95 for 95 %), got {value!r}.")
    return float(value)


def check_seed(value: Any) -> int:
    """An integer (any sign: the weights use it modulo 2⁶⁴); bools refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"seed must be an integer, got {value!r}.")
    return int(value)


def check_sample_index(values: Any, num_samples: int) -> torch.Tensor:
    """Global sample indices of a batch: 1-D, integer, one per sample, non-negative; as int64."""
    index = as_tensor(values, "sample_index")
    if index.ndim != 1 or index.shape[0] != num_samples:
        raise ValueError(
            f"sample_index must be one-dimensional with one index per sample of the batch ({num_samples},), "
            f"got shape {tuple(index.shape)}."
        )
    if index.dtype == torch.bool or index.is_floating_point() or index.is_complex():
        raise ValueError(f"sample_index must hold integer sample indices, got dtype {index.dtype}.")
    if index.numel() and int(index.min()) < 0:
        raise ValueError(f"sample_index must be non-negative, got {int(index.min())}.")
    return index.long()


def check_metrics(metrics: Any, unavailable: Dict[str, str]) -> Tuple[str, ...]:
    """Names of the metrics to bootstrap, without repeats: ``None`` → the defaults not ``unavailable``.

    ``unavailable`` maps a metric that cannot be computed here to the reason and the fix.
    """
    if metrics is None:
        return tuple(name for name in DEFAULT_METRICS if name not in unavailable)
    if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
        raise ValueError(f"metrics must be a non-empty list of metric names such as ['ece', 'nll'], got {metrics!r}.")
    known = DEFAULT_METRICS + ON_REQUEST_METRICS
    for name in metrics:
        if name not in known:
            raise ValueError(f"metrics must be names among {', '.join(map(repr, known))}; got {name!r}.")
        if name in unavailable:
            raise ValueError(f"metrics asks for {name!r}, but {unavailable[name]}")
    return tuple(dict.fromkeys(metrics))
