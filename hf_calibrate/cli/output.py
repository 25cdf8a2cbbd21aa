"""What the commands print and write: the console, tables, the reliability diagram, early checks of output paths."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .._errors import UserError
from .metric_keys import TABLE_METRICS


class Console:
    """Output of the main process only: results on stdout, notes on stderr when stdout holds JSON."""

    def __init__(self, is_main: bool, json_output: bool = False) -> None:
        self.is_main = is_main
        self.json_output = json_output

    def result(self, text: str) -> None:
        """A line of the command's result (stdout)."""
        if self.is_main:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """A line about the run (stdout; stderr when stdout holds JSON)."""
        if self.is_main:
            print(text, file=sys.stderr if self.json_output else sys.stdout, flush=True)

    def warn(self, text: Optional[str]) -> None:
        """A ``warning: ...`` line on stderr, something the user should act on (nothing when ``text`` is None)."""
        if self.is_main and text is not None:
            print(f"warning: {text}", file=sys.stderr, flush=True)


def check_writable(path: Path, flag: str, *, folder: bool) -> None:
    """Fail early, before any compute, when ``path`` (a folder or a file) cannot be written."""
    if path.exists() and path.is_dir() != folder:
        raise UserError(f"{flag} {path} exists and is {'not ' if folder else ''}a folder.")
    parent = path.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=parent).cleanup()  # saving writes a sibling, then renames it
    except OSError as error:
        raise UserError(f"cannot write {flag} {path}: {error.strerror or error} (in {parent}).") from error


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def metric_table(evaluation: Dict[str, Any]) -> str:
    """Before/after table of an evaluation, each value with its interval [low, high] when it has one, the paired
    change and its verdict (only one column for a plain model), and a line saying how the intervals were made."""
    from ..reporting import METRIC_NAMES, bootstrap_note, change_text, shown_metrics, value_text

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
    """The reliability diagram(s) of an evaluation as a PNG at ``path``, uncalibrated first."""
    from ..plotting import compare_reliability_diagrams, reliability_diagram

    reliability = evaluation["reliability"]
    panels = {side: reliability[side] for side in ("uncalibrated", "calibrated") if side in reliability}
    if len(panels) == 1:
        reliability_diagram(next(iter(panels.values())), title=title, path=path)
    else:
        compare_reliability_diagrams(panels, title=title, path=path)


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
