"""One calibrated model's evaluation as the page of :mod:`.html_report`: ``hf-calibrate evaluate --report PATH``.

An evaluation (:meth:`hf_calibrate.CalibratedModel.evaluate`'s result, with intervals) holds both sides' metrics and
intervals, both sides' reliability bins, and the paired differences calibrated − uncalibrated with their verdicts. The
page shows them as a comparison of two rows, the calibration and the uncalibrated base, ranked by NLL: the same
reliability diagrams with their intervals and hover, the paired differences and verdicts, and the ranking table
(:func:`evaluation_as_comparison`). Per-class calibration is compare's alone: an evaluation keeps only the classwise ECE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from .._atomic import write_text_atomically
from .._output_files import refuse_unproven
from .html_report import comparison_report, is_our_report, missing_dependency

#: the metrics held against the uncalibrated model, as :mod:`.comparison` holds them
GUARDS = ("nll", "brier")
UNCALIBRATED = "uncalibrated"


def _negated(interval: Mapping[str, Any]) -> Dict[str, Any]:
    """The interval of −d from that of d (a paired difference read the other way round)."""
    return {**interval, "point": -interval["point"], "low": -interval["high"], "high": -interval["low"]}


def _holds_zero(interval: Mapping[str, Any]) -> bool:
    return interval["low"] <= 0.0 <= interval["high"]


def _check_evaluation(evaluation: Any, name: Any) -> Mapping[str, Any]:
    """``evaluation`` when it is a calibrated model's evaluation with intervals; else a ValueError naming the fix."""
    if not isinstance(name, str) or not name or name == UNCALIBRATED:
        raise ValueError(f"name must be the calibration's method name (a non-empty string other than {UNCALIBRATED!r}); "
                         f"got {name!r}.")
    if not isinstance(evaluation, Mapping) or not {"calibrated", "uncalibrated", "reliability"} <= set(evaluation):
        raise ValueError("evaluation must be a calibrated model's evaluation (CalibratedModel.evaluate's result, with its "
                         "'calibrated' and 'uncalibrated' sides); a plain model's has no before/after to show.")
    if not all(key in (evaluation.get("difference") or {}) for key in GUARDS):
        raise ValueError("the evaluation has no paired intervals (it was computed with bootstrap=0): evaluate with "
                         "bootstrap > 0 (the CLI's default, --bootstrap 1000) for the report.")
    return evaluation


def _row(evaluation: Mapping[str, Any], side: str, name: str, versus_best: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One side as a ranking row of :func:`.comparison.compare`'s result."""
    metrics = evaluation[side]
    row: Dict[str, Any] = {
        "name": name, "metrics": {key: value for key, value in metrics.items() if key != "intervals"},
        "interval": metrics["intervals"]["nll"], "versus_best": versus_best,
        "tied_with_best": versus_best is None or _holds_zero(versus_best), "fit_seconds": None,
        "versus_uncalibrated": {}, "made_worse": [], "improved": [], "verdict": None,
    }
    if side == "calibrated":
        verdicts = evaluation.get("verdicts") or {}
        row["versus_uncalibrated"] = {key: evaluation["difference"][key] for key in GUARDS}
        row["made_worse"] = [key for key in GUARDS if verdicts.get(key) == "made worse"]
        row["improved"] = [key for key in GUARDS if verdicts.get(key) == "improved"]
        row["verdict"] = "made worse" if row["made_worse"] else "improved" if row["improved"] else "no detectable difference"
    return row


def evaluation_as_comparison(evaluation: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """The evaluation of the calibration ``name`` (e.g. ``"temperature"``) as a comparison result of two rows, the
    calibration and the uncalibrated base, best NLL first (what :func:`.html_report.comparison_report` draws)."""
    evaluation = _check_evaluation(evaluation, name)
    difference = evaluation["difference"]["nll"]  # calibrated − uncalibrated
    if evaluation["calibrated"]["nll"] <= evaluation["uncalibrated"]["nll"]:
        rows: List[Dict[str, Any]] = [_row(evaluation, "calibrated", name, None),
                                      _row(evaluation, "uncalibrated", UNCALIBRATED, _negated(difference))]
    else:
        rows = [_row(evaluation, "uncalibrated", UNCALIBRATED, None), _row(evaluation, "calibrated", name, difference)]
    reliability = evaluation["reliability"]
    return {
        "metric": "nll", "dataset": evaluation.get("dataset"), "split": evaluation.get("split"),
        "bootstrap": evaluation["bootstrap"], "rows": rows,
        "reliability": {name: reliability["calibrated"], UNCALIBRATED: reliability["uncalibrated"]},
        "in_sample": [name] if evaluation.get("in_sample") is True else [],
    }


def write_evaluation_report(evaluation: Mapping[str, Any], path: Path, name: str) -> Optional[str]:
    """Write the page of :func:`evaluation_as_comparison` to ``path`` (atomically) and return None; or, when plotly is
    missing, write nothing and return why (naming ``pip install "hf-calibrate[report]"``).

    Refuses (FileExistsError) to replace a file at ``path`` it cannot prove a report wrote
    (:func:`.html_report.is_our_report`), or a link; a ValueError when ``evaluation`` cannot be shown (no intervals,
    a plain model's).
    """
    path = Path(path)
    result = evaluation_as_comparison(evaluation, name)
    refuse_unproven({path: is_our_report}, instead="write the report to another path")
    missing = missing_dependency()
    if missing is not None:
        return f"{path.name} not written: {missing}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, comparison_report(result))
    return None
