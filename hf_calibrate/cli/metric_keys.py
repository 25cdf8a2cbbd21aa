"""The metric keys of the command line's tables, in one place (titles: :data:`hf_calibrate.reporting.METRIC_NAMES`)."""

#: the metrics of ``fit`` and ``evaluate``'s before/after table
TABLE_METRICS = ("accuracy", "ece", "ada_ece", "smooth_ece", "classwise_ece", "nll", "brier")
#: the demo's first table: uncalibrated → calibrated
DEMO_METRICS = ("accuracy", "ece", "ada_ece", "nll", "brier")
#: the demo's second table: the paired change of these, with its interval and verdict
DEMO_CHANGES = ("ece", "nll", "brier")
#: ranking metrics of ``compare``: :data:`hf_calibrate.evaluation.INTERVAL_METRICS` (those with intervals), spelled out here
#: so that building the parser imports no torch (tests/cli/test_startup.py checks the two agree)
COMPARE_METRICS = ("accuracy", "ece", "ada_ece", "mce", "rms_ce", "nll", "brier")
