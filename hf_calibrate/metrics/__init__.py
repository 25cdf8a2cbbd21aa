"""Calibration metrics (docs/design.md §2): exact, streaming and distributed.

Functional core in :mod:`.functional`, the accumulator in :mod:`.streaming`.
"""

from ._checks import EvaluateInputChecks, NonFiniteError
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
from .streaming import CalibrationMetrics, calibration_report

__all__ = [
    "CalibrationMetrics",
    "EvaluateInputChecks",
    "NonFiniteError",
    "ReliabilityBins",
    "accuracy",
    "adaptive_calibration_error",
    "brier_score",
    "calibration_report",
    "classwise_calibration_error",
    "expected_calibration_error",
    "maximum_calibration_error",
    "negative_log_likelihood",
    "reliability_bins",
]
