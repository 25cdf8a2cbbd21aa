"""Evaluation results with their uncertainty (docs/design.md §2, "Intervals").

An evaluation of a calibrated model scores the same test samples twice, before and after
calibration, into two :class:`~hf_calibrate.metrics.CalibrationMetrics` that share their
Poisson-bootstrap weights (the same seed, and each sample's global index as its key). From
them come, per metric: each side's point and interval, the paired difference
calibrated − uncalibrated with its interval, and a verdict in plain words
(:func:`~hf_calibrate.metrics.verdict`: improved / made worse / no detectable change at this
test size / unchanged, when the two sides agree on every sample). The JSON form, which :meth:`CalibratedModel.evaluate` returns, the record keeps and
the card and the CLI show::

    {"uncalibrated": {metric: value, ..., "intervals": {metric: interval}},
     "calibrated":   {... the same ...},
     "difference":   {metric: interval of calibrated − uncalibrated},
     "verdicts":     {metric: "improved" | "made worse" | "no detectable change at this test size" | "unchanged"},
     "bootstrap":    {"replicates": R, "seed": s, "confidence": 0.95}}

where an interval is :meth:`Interval.to_dict` (``point``, ``low``, ``high``, ``confidence``,
``replicates``, ``seed``). With ``bootstrap=0`` only the points are computed, and the
``intervals``, ``difference``, ``verdicts`` and ``bootstrap`` keys are absent. An evaluation takes
0 or at least :data:`MIN_BOOTSTRAP` replicates; on fewer than ``MIN_INTERVAL_SAMPLES`` (30) test
samples no metric has an interval (``low`` and ``high`` None, and the ``reason``: never a
degenerate one) and every verdict is "no detectable change at this test size".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

from ..metrics import CalibrationMetrics, interval_report, verdict
from ..metrics._checks import check_n_bins
from ..metrics.interval_options import MIN_INTERVAL_REPLICATES, PER_SAMPLE_METRICS, check_bootstrap  # check_bootstrap: evaluate's check
from ..metrics.intervals import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES, HIGHER_IS_BETTER, check_seed

#: metrics given with intervals: the bootstrap's defaults. smECE's are on request (bootstrap_intervals(...,
#: metrics=["smooth_ece"])): one bandwidth search per replicate, 3-4 ms each at N = 10³-10⁴ on an idle core, so
#: 6-8 s for the two sides at R = 1,000 against 0.1-0.5 s for all the others (and 20-50x more when the CPU is
#: oversubscribed: its small FFTs suffer most)
INTERVAL_METRICS = ("accuracy", "ece", "ada_ece", "mce", "rms_ce", "nll", "brier")
#: replicates of an evaluation's bootstrap unless told otherwise
DEFAULT_BOOTSTRAP = DEFAULT_REPLICATES
#: fewest replicates an evaluation takes (0 aside): fewer cannot place its 2.5 % and 97.5 % quantiles
MIN_BOOTSTRAP = MIN_INTERVAL_REPLICATES


@dataclasses.dataclass(frozen=True)
class EvaluationKeywords:
    """``CalibratedModel.evaluate``'s own keywords (beside the engine options), checked when made: every evaluation of a
    calibrated model (``evaluate``, ``fit_and_evaluate``, ``compare``) hands them down as one.

    Attributes:
        n_bins: equal-width confidence bins of the ECE and the reliability diagram, from 1 to the metrics' maximum.
        dataset_name: how the results name the data (None: what a ``datasets.Dataset`` records).
        split: the split the results name (None: what the data record).
        in_sample: whether the data hold rows the calibration was fitted on (None: unknown, found out from the data).
        bootstrap: Poisson-bootstrap replicates behind the 95 % intervals: 0 (points only) or at least
            :data:`MIN_BOOTSTRAP`.
    """

    n_bins: int = 15
    dataset_name: Optional[str] = None
    split: Optional[str] = None
    in_sample: Optional[bool] = None
    bootstrap: int = DEFAULT_BOOTSTRAP

    def __post_init__(self) -> None:
        check_n_bins(self.n_bins)
        check_bootstrap(self.bootstrap)
        for name in ("dataset_name", "split"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string or None, got {value!r} ({type(value).__name__}).")
        if self.in_sample is not None and not isinstance(self.in_sample, bool):
            raise TypeError(f"in_sample must be True, False or None, got {self.in_sample!r}.")

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        """The keywords' names (``evaluate`` takes them beside the engine options)."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def taken_from(cls, settings: Dict[str, Any]) -> "EvaluationKeywords":
        """The keywords removed from ``settings`` (what is left are engine options), each absent one at its default."""
        return cls(**{name: settings.pop(name) for name in cls.names() if name in settings})


def accumulators(num_classes: int, n_bins: int, bootstrap: int, seed: int) -> Tuple[CalibrationMetrics, CalibrationMetrics]:
    """(uncalibrated, calibrated) accumulators whose replicates weigh each sample alike (seed ``seed``)."""
    seed = check_seed(seed)
    return (
        CalibrationMetrics(num_classes, n_bins, bootstrap=bootstrap, seed=seed),
        CalibrationMetrics(num_classes, n_bins, bootstrap=bootstrap, seed=seed),
    )


def _side(metrics: CalibrationMetrics, intervals: Dict[str, Any], sync: bool = True) -> Dict[str, Any]:
    """One side's JSON metrics: ``compute()``'s points, smECE's point, and every interval."""
    result = {key: value for key, value in metrics.compute(sync=sync).items() if key != "intervals"}
    if metrics.adaptive:
        result["smooth_ece"] = metrics.smooth_ece(sync=sync)
    if intervals:
        result["intervals"] = {name: interval.to_dict() for name, interval in intervals.items()}
    return result


def summarize(
    uncalibrated: CalibrationMetrics, calibrated: CalibrationMetrics, *, confidence: float = DEFAULT_CONFIDENCE
) -> Dict[str, Any]:
    """The JSON result of two accumulators of the same samples (module docstring); collective under several processes.

    Example:
        >>> import torch
        >>> before, after = accumulators(num_classes=2, n_bins=10, bootstrap=200, seed=0)
        >>> labels = torch.tensor([0, 1] * 100)
        >>> before.update(torch.tensor([[0.99, 0.01], [0.99, 0.01]] * 100), labels, sample_index=torch.arange(200))
        >>> after.update(torch.tensor([[0.6, 0.4], [0.6, 0.4]] * 100), labels, sample_index=torch.arange(200))
        >>> result = summarize(before, after)
        >>> result["verdicts"]["ece"], result["verdicts"]["accuracy"], result["bootstrap"]["replicates"]
        ('improved', 'no detectable change at this test size', 200)
    """
    if not uncalibrated.bootstrap:
        return {"uncalibrated": _side(uncalibrated, {}), "calibrated": _side(calibrated, {})}
    report = interval_report(calibrated, uncalibrated, metrics=_interval_metrics(calibrated), confidence=confidence)
    sides = {"uncalibrated": _side(uncalibrated, report.b), "calibrated": _side(calibrated, report.a)}
    return {
        **sides,
        "difference": {name: interval.to_dict() for name, interval in report.difference.items()},
        "verdicts": {name: verdict(interval, name not in HIGHER_IS_BETTER) for name, interval in report.difference.items()},
        "bootstrap": bootstrap_settings(calibrated, confidence),
    }


def bootstrap_settings(metrics: CalibrationMetrics, confidence: float = DEFAULT_CONFIDENCE) -> Dict[str, Any]:
    """How an evaluation's intervals were made: ``{"replicates": R, "seed": s, "confidence": level}``."""
    return {"replicates": metrics.bootstrap, "seed": metrics.seed, "confidence": confidence}


def summarize_one(
    metrics: CalibrationMetrics, *, names: Optional[Sequence[str]] = None, confidence: float = DEFAULT_CONFIDENCE,
    sync: bool = True,
) -> Dict[str, Any]:
    """One model's JSON metrics (a side of :func:`summarize`, with intervals of ``names`` — default every metric it
    can resample — when bootstrapped); ``sync``: as for :meth:`CalibrationMetrics.compute` (False when every process
    holds every sample)."""
    if not metrics.bootstrap:
        return _side(metrics, {}, sync)
    intervals = metrics.intervals(metrics=names or _interval_metrics(metrics), confidence=confidence, sync=sync)
    return _side(metrics, intervals, sync)


def _interval_metrics(metrics: CalibrationMetrics) -> Tuple[str, ...]:
    """:data:`INTERVAL_METRICS` that ``metrics`` can resample (the per-sample ones need ``adaptive``)."""
    return tuple(name for name in INTERVAL_METRICS if metrics.adaptive or name not in PER_SAMPLE_METRICS)
