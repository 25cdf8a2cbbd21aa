"""The metric keys of the command line's tables, in one place (titles: :data:`hf_calibrate.results.reporting.METRIC_NAMES`;
the demo's tables, :data:`DEMO_METRICS` and :data:`DEMO_CHANGES`, are its command's: :mod:`hf_calibrate.demo.command`)."""

from ..demo.command import DEMO_CHANGES, DEMO_METRICS

#: the metrics of ``fit`` and ``evaluate``'s before/after table
TABLE_METRICS = ("accuracy", "ece", "ada_ece", "smooth_ece", "classwise_ece", "nll", "brier")
#: ranking metrics of ``compare``: :data:`hf_calibrate.results.evaluation.INTERVAL_METRICS` (those with intervals), spelled out here
#: so that building the parser imports no torch (tests/cli/test_startup.py checks the two agree)
COMPARE_METRICS = ("accuracy", "ece", "ada_ece", "mce", "rms_ce", "nll", "brier")

__all__ = ["COMPARE_METRICS", "DEMO_CHANGES", "DEMO_METRICS", "TABLE_METRICS"]
