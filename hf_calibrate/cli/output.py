"""What the commands print and write: the console, tables, the reliability diagram, early checks of output paths
(the console, plain tables and the path check are :mod:`hf_calibrate._console`'s, shared with the demo command)."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List

from .._console import Console, check_writable, format_table, messages_dropped
from .._output_files import is_signed_png, refuse_unproven, write_signed_png
from .metric_keys import TABLE_METRICS

__all__ = [
    "TORCHVISION_FALLBACK", "Console", "check_diagram_target", "check_writable", "draw_diagram", "fit_warning_lines",
    "fit_warnings_reported_here", "format_table", "library_noise_dropped", "metric_table", "warnings_as_lines",
]

#: (logger, part of the message) of transformers' note that it falls back from the torchvision backend when the image
#: processor it loads has only a PIL variant (a timm model's): the commands never ask for a backend, so it says nothing to act on
TORCHVISION_FALLBACK = ("transformers.models.auto.image_processing_auto", "backend is not available. Falling back to")


def metric_table(evaluation: Dict[str, Any]) -> str:
    """Before/after table of an evaluation, each value with its interval [low, high] when it has one, the paired
    change and its verdict (only one column for a plain model), and a line saying how the intervals were made."""
    from ..results.reporting import METRIC_NAMES, bootstrap_note, change_text, shown_metrics, value_text

    sides = [side for side in ("uncalibrated", "calibrated") if side in evaluation]
    both, verdicts = len(sides) == 2, evaluation.get("verdicts") or {}
    header = ["metric", *sides] + (["change"] if both else []) + (["verdict"] if both and verdicts else [])
    rows = []
    for key in shown_metrics(evaluation, TABLE_METRICS):
        row = [METRIC_NAMES[key], *(value_text(evaluation, side, key) for side in sides)]
        row += ([change_text(evaluation, key)] if both else []) + ([verdicts.get(key, "")] if both and verdicts else [])
        rows.append(row)
    note = bootstrap_note(evaluation)
    return format_table(header, rows) + (f"\n{note}" if note else "")


def draw_diagram(evaluation: Dict[str, Any], path: Path, title: str) -> None:
    """The reliability diagram(s) of an evaluation as a PNG at ``path``, uncalibrated first, signed as ours
    (:func:`hf_calibrate._output_files.signed_png`); refuses, as :func:`check_diagram_target`, to replace any other file."""
    from ..results.plotting import compare_reliability_diagrams, png_bytes, reliability_diagram

    reliability = evaluation["reliability"]
    panels = {side: reliability[side] for side in ("uncalibrated", "calibrated") if side in reliability}
    if len(panels) == 1:
        figure = reliability_diagram(next(iter(panels.values())), title=title)
    else:
        figure = compare_reliability_diagrams(panels, title=title)
    check_diagram_target(path)  # again: the evaluation took a while
    write_signed_png(path, png_bytes(figure))


def check_diagram_target(path: Path) -> None:
    """Raise FileExistsError when ``path`` holds anything but a diagram :func:`draw_diagram` wrote, unchanged since
    (a user's image, a link, a folder): replacing our own earlier diagram is what a rerun should do, anything else not."""
    refuse_unproven({path: is_signed_png}, instead="write the diagram to another --diagram path")


@contextlib.contextmanager
def fit_warnings_reported_here() -> Iterator[None]:
    """Silence ``TemperatureScalingFallbackWarning`` and ``CalibrationFitWarning`` inside: the commands print their
    own plain line about each (:func:`fit_warning_lines`), not a Python warning."""
    from ..fitting.calibrate import CalibrationFitWarning
    from ..modeling import TemperatureScalingFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TemperatureScalingFallbackWarning)
        warnings.simplefilter("ignore", CalibrationFitWarning)
        yield


@contextlib.contextmanager
def library_noise_dropped() -> Iterator[None]:
    """Inside, other libraries' log messages that tell a command's user nothing (:data:`TORCHVISION_FALLBACK`) are not
    shown; the loggers are as they were after."""
    with messages_dropped(*TORCHVISION_FALLBACK):
        yield


@contextlib.contextmanager
def warnings_as_lines(console: Console) -> Iterator[None]:
    """Every warning shown inside as one plain ``warning: ...`` line (:meth:`Console.warn`), not Python's
    ``file:line: Category: message`` followed by a source line; which warnings are shown is left as it was."""
    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        console.warn(" ".join(str(message).split()))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def fit_warning_lines(calibrated: Any) -> List[str]:
    """The lines of a fit's ``fit_summary["warnings"]``: a bound hit, separable data, no convergence, data near the least."""
    return list(calibrated.fit_summary.get("warnings") or [])
