"""Calibration metrics (docs/design.md §2): exact, streaming and distributed.

Functional core in :mod:`.functional`, the accumulator in :mod:`.streaming`; every metric's key,
titles, model-index type and direction in one table, :mod:`.catalog`.
"""

from ._checks import EvaluateInputChecks, NonFiniteError
from .catalog import METRIC_CATALOG, MetricInfo
from .debiased import debiased_calibration_error
from .functional import (
    ReliabilityBins,
    accuracy,
    adaptive_calibration_error,
    brier_score,
    classwise_calibration_error,
    expected_calibration_error,
    maximum_calibration_error,
    negative_log_likelihood,
    reliability_bins,
)
from .intervals import Interval, bootstrap_intervals, interval_columns, paired_bootstrap_intervals, verdict
from .smooth import smooth_calibration_error, smooth_ece_from_confidences
from .streaming import CalibrationMetrics, IntervalReport, calibration_report, interval_report, paired_intervals

__all__ = [
    "CalibrationMetrics",
    "EvaluateInputChecks",
    "Interval",
    "IntervalReport",
    "METRIC_CATALOG",
    "MetricInfo",
    "NonFiniteError",
    "ReliabilityBins",
    "accuracy",
    "adaptive_calibration_error",
    "bootstrap_intervals",
    "brier_score",
    "calibration_report",
    "classwise_calibration_error",
    "debiased_calibration_error",
    "expected_calibration_error",
    "interval_columns",
    "interval_report",
    "maximum_calibration_error",
    "negative_log_likelihood",
    "paired_bootstrap_intervals",
    "paired_intervals",
    "reliability_bins",
    "smooth_calibration_error",
    "smooth_ece_from_confidences",
    "verdict",
]
