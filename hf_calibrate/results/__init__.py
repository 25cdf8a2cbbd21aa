"""What results are: an evaluation's JSON result with its intervals, how results name what they were computed on, the
model card, reliability diagrams, the ranking of several calibrations, and the ``evaluate`` library's evaluator.

Modules: :mod:`.evaluation` (the before/after accumulators' summary: intervals, paired differences, verdicts),
:mod:`.reporting` (data names, splits, in-sample labels and counts, the metrics' titles), :mod:`.cards` (the model
card), :mod:`.plotting` (reliability diagrams), :mod:`.comparison` (several calibrations ranked with paired intervals),
:mod:`.html_report` (a comparison as one offline HTML page; its figures in :mod:`.report_figures`, its per-class and
per-bin data in :mod:`.report_data`), :mod:`.evaluation_report` (one evaluation's before/after as that page) and
:mod:`.evaluator` (the ecosystem's evaluator fed class probabilities; it imports ``evaluate``).

This layer sits below fitting, scoring, the saved artifact and the model (docs/design.md §1): it imports none of them.
Importing this package imports none of its modules (each is imported when first used).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
    """A module of this package, imported when first used (``import hf_calibrate`` then
    ``hf_calibrate.results.comparison.compare``)."""
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["cards", "comparison", "evaluation", "evaluation_report", "evaluator", "html_report", "plotting", "report_data",
           "report_figures", "reporting"]
