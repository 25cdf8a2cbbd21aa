"""The comparison as one HTML page a person can explore: ``comparison.html``, written beside comparison.md by
``hf-calibrate compare`` (and one evaluation's before/after, by ``hf-calibrate evaluate --report``: :mod:`.evaluation_report`).

The page works offline: plotly.js is embedded in it (no CDN, no network). It holds the ranking table with its
intervals and verdicts, the reliability diagrams of every method overlaid (switched with a menu or the legend; each
bin's count, accuracy with its 95 % interval, and confidence on hover), the paired differences with their intervals,
each class's calibration per method, and ``method="auto"``'s decision table when auto was compared.

plotly is optional (``pip install "hf-calibrate[report]"``): without it :func:`write_comparison_report` writes nothing
and says how to install it, and compare's other files are written as always. The page proves itself ours with a last
line holding the SHA-256 of everything before it (:func:`is_our_report`), so a later write replaces it, and only it.
"""

from __future__ import annotations

import hashlib
import html
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence

from . import reporting
from .._atomic import write_text_atomically
from .._output_files import refuse_unproven
from .report_figures import (MAX_CLASSES_SHOWN, differences_figure, per_class_figure, plotly_modules, row_verdict,
                             reliability_figure)

#: the report's file name in compare's output folder
REPORT_FILE = "comparison.html"
#: the report's last line: this, the SHA-256 (hex) of everything before the line, and :data:`PROOF_END`
PROOF_START = "<!-- hf_calibrate sha256 "
PROOF_END = " -->\n"
#: the keys of a comparison result the report reads (:mod:`.comparison`'s docstring)
RESULT_KEYS = ("metric", "dataset", "split", "bootstrap", "rows", "reliability")
#: the keys each of its rows must have (the verdicts are compare's, read as given)
ROW_KEYS = ("name", "metrics", "interval", "versus_best", "tied_with_best", "versus_uncalibrated", "made_worse", "improved")
#: the ranking table's columns beside the ranked metric and the differences
OTHER_METRICS = ("accuracy", "ece", "nll", "brier", "classwise_ece")

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; }}
th {{ background: #f3f3f3; }}
.worse {{ color: #b24a00; font-weight: bold; }}
.warning {{ background: #fff3cd; padding: 0.5em; border-left: 4px solid #d39e00; }}
.note {{ color: #555; font-size: 0.9em; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head>
<body>
{body}
</body>
</html>
"""


def _check_result(result: Any) -> Mapping[str, Any]:
    """``result`` when it is a comparison result; a ValueError naming what it lacks otherwise."""
    missing = [key for key in RESULT_KEYS if key not in result] if isinstance(result, Mapping) else list(RESULT_KEYS)
    if not missing and result["rows"]:
        missing = sorted({key for row in result["rows"] for key in ROW_KEYS if key not in row})
    if missing or not result["rows"]:
        raise ValueError(f"result must be a comparison result (what hf_calibrate.results.comparison.compare returns, or the "
                         f"content of comparison.json) with at least one row; it lacks {missing or ['rows']}.")
    return result


def missing_dependency() -> Optional[str]:
    """Why the report cannot be drawn here (plotly is missing; the message names the extra to install), or None."""
    try:
        plotly_modules()
    except ImportError as error:
        return str(error)
    return None


def comparison_report(result: Mapping[str, Any], *, class_names: Optional[Sequence[str]] = None) -> str:
    """The whole HTML page of a comparison ``result`` (:func:`hf_calibrate.results.comparison.compare`'s, or
    comparison.json's content), signed on its last line (:func:`is_our_report`).

    Args:
        result: the comparison; its optional ``classes`` ({method: per-class calibration}) and ``auto`` ({method:
            auto's decision}) add the per-class heatmap and auto's decision tables.
        class_names: the C class names in index order, for the per-class heatmap (default ``class k``).

    Raises:
        ImportError: plotly is missing (the message names ``pip install "hf-calibrate[report]"``).
        ValueError: ``result`` is not a comparison result, or ``class_names`` does not name each of its classes.
    """
    result = _check_result(result)
    if class_names is not None and (isinstance(class_names, str) or not isinstance(class_names, Sequence)
                                    or not all(isinstance(name, str) for name in class_names)):
        raise ValueError(f"class_names must be a list of strings, one per class in index order, or None; got "
                         f"{type(class_names).__name__} {str(class_names)[:80]!r}.")
    plotly = plotly_modules()
    figures = [("Reliability diagrams", RELIABILITY_NOTE, "reliability", reliability_figure(result["reliability"])),
               ("Paired differences", DIFFERENCES_NOTE, "differences", differences_figure(result["rows"], result["metric"]))]
    classes = {name: data for name, data in (result.get("classes") or {}).items() if data.get("ece")}
    if classes:
        figures.append(("Per-class calibration", PER_CLASS_NOTE, "per-class", per_class_figure(classes, class_names)))
    sections = [_header(result), _ranking_section(result)]
    sections += [_section(title, note, _figure_html(plotly, figure, div_id)) for title, note, div_id, figure in figures]
    sections += [_auto_section(name, decision) for name, decision in (result.get("auto") or {}).items()]
    title = f"Calibration comparison on {reporting.data_label(result['dataset'], result['split'])}"
    return _signed(PAGE.format(title=html.escape(title), plotlyjs=plotly.get_plotlyjs(), body="\n".join(sections)))


RELIABILITY_NOTE = ("Each point is one confidence bin: its accuracy against its mean confidence, with the 95 % Wilson "
                    "interval of the accuracy (binomial, from the bin's count); markers grow with the count. Points below "
                    "the diagonal are over-confident, above it under-confident. Below: samples per bin. Click a legend "
                    "entry to hide or show a method, or pick one in the menu; hover a point for its count, accuracy, "
                    "interval and confidence.")
DIFFERENCES_NOTE = ("Paired bootstrap differences with their 95 % intervals: the ranking metric minus the best method's "
                    "(below 0 for a metric where higher is better, such as accuracy), and NLL and Brier minus the "
                    "uncalibrated model's (lower is better). Green: improved (the interval lies below 0); orange: made "
                    "worse (above 0), or worse than the best; grey: the interval holds 0 "
                    "(tied, no detectable difference): this test set cannot tell the two apart. Hover a point for its "
                    "interval and verdict.")
PER_CLASS_NOTE = ("Each class's term of the classwise ECE, Σ over bins of |Σ [y = k] − Σ p_k| / N (their mean over the "
                  "classes is the table's classwise ECE): where a method's probabilities for a class are off, and by how "
                  f"much. At most the {MAX_CLASSES_SHOWN} classes worst calibrated under any method are shown, worst on "
                  "top; hover a cell for the class's samples and its predicted against its labelled share.")


def _figure_html(plotly: Any, figure: Any, div_id: str) -> str:
    """``figure`` as a ``<div id=div_id>`` and the script drawing it with the page's one copy of plotly.js."""
    config = {"displaylogo": False, "responsive": True}
    return plotly.to_html(figure, include_plotlyjs=False, full_html=False, div_id=div_id, config=config)


def _section(title: str, note: str, content: str) -> str:
    return f"<section>\n<h2>{html.escape(title)}</h2>\n<p class=\"note\">{html.escape(note)}</p>\n{content}\n</section>"


def _header(result: Mapping[str, Any]) -> str:
    """The page's title, what the comparison was computed on, and the in-sample warning when there is one."""
    samples = result["rows"][0]["metrics"].get("num_samples")
    bootstrap = result["bootstrap"]
    lines = [f"<h1>Calibration comparison on {html.escape(reporting.data_label(result['dataset'], result['split'], samples))}</h1>",
             f"<p>Ranked by {html.escape(reporting.METRIC_NAMES[result['metric']])}; {bootstrap['confidence']:.0%} Poisson-bootstrap "
             f"intervals ({bootstrap['replicates']} replicates, seed {bootstrap['seed']}), paired across methods.</p>"]
    in_sample = result.get("in_sample") or []
    if in_sample:
        lines.append(f"<p class=\"warning\"><strong>In-sample for {html.escape(', '.join(in_sample))}</strong>: these data are "
                     "data they were fitted on, so their rows are optimistic and the ranking favours them.</p>")
    return "\n".join(lines)


def _ranking_section(result: Mapping[str, Any]) -> str:
    """The ranking table: each method's metric with its interval, its difference to the best, whether it is tied with
    the best, the verdicts of its NLL and Brier against the uncalibrated model, and its other metrics."""
    metric = result["metric"]
    name = reporting.METRIC_NAMES[metric]
    others = [key for key in OTHER_METRICS if key != metric]
    header = ["method", f"{name} [95% CI]", f"{name} − best [95% CI]", "tied with best", "NLL − uncalibrated",
              "Brier − uncalibrated", *(reporting.METRIC_NAMES[key] for key in others)]
    rows = [_ranking_cells(row, metric, others) for row in result["rows"]]
    if any(row.get("fit_seconds") is not None for row in result["rows"]):
        header.append("fit time")
        for cells, row in zip(rows, result["rows"]):
            cells.append(html.escape(reporting.fit_time_text(row.get("fit_seconds"))))
    return _section("Ranking", "Best first. 'made worse' marks a difference to the uncalibrated model whose interval lies "
                    "above 0: the method left the model worse calibrated than no calibration.", _table(header, rows))


def _ranking_cells(row: Mapping[str, Any], metric: str, others: List[str]) -> List[str]:
    """One ranking row's cells as HTML (escaped text; a guard metric made worse in the ``worse`` style)."""
    versus = row["versus_best"]
    best = "best" if versus is None else f"{versus['point']:+.4f} {reporting.interval_text(versus, signed=True)}"
    guards = []
    for key in ("nll", "brier"):
        interval = row["versus_uncalibrated"].get(key)
        if interval is None:
            guards.append("–")
            continue
        shown = f"{interval['point']:+.4f} {reporting.interval_text(interval, signed=True)}"
        text = html.escape(f"{shown}: {row_verdict(row, key)}")
        guards.append(f"<span class=\"worse\">{text}</span>" if key in row.get("made_worse", []) else text)
    metrics = row["metrics"]
    values = [html.escape(f"{metrics[key]:.4f}") if metrics.get(key) is not None else "–" for key in others]
    point = f"{metrics[metric]:.4f} {reporting.interval_text(row['interval'])}"
    return [html.escape(row["name"]), html.escape(point), html.escape(best), "yes" if row["tied_with_best"] else "no",
            *guards, *values]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table of ``header`` (plain text) and ``rows`` (cells already HTML)."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "\n".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}\n</table>"


def _auto_section(name: str, decision: Mapping[str, Any]) -> str:
    """``method="auto"``'s decision for the compared method ``name``: the sentence saying what it chose and why, and
    its candidates' table (:func:`.reporting.auto_note`, :func:`.reporting.auto_table`)."""
    summary = {"auto": decision}
    note = reporting.auto_note(summary) or ""
    lines = (reporting.auto_table(summary) or "").splitlines()
    cells = [[part.strip() for part in line.strip().strip("|").split("|")] for line in lines]
    rows = [[_bold(html.escape(cell)) for cell in row] for row in cells[2:]]  # after the header and its --- line
    return _section(f"auto's decision ({name})", note, _table(cells[0], rows) if cells else "")


def _bold(text: str) -> str:
    """Markdown's ``**x**`` (auto's table marks the chosen candidate so) as HTML's bold."""
    parts = text.split("**")
    return "".join(f"<strong>{part}</strong>" if index % 2 else part for index, part in enumerate(parts))


def _signed(page: str) -> str:
    """``page`` with its proof appended: a last line holding the SHA-256 of the page's UTF-8 bytes."""
    return f"{page}{PROOF_START}{hashlib.sha256(page.encode('utf-8')).hexdigest()}{PROOF_END}"


def is_our_report(path: Path) -> bool:
    """Whether the file at ``path`` is a report :func:`comparison_report` made, unchanged since: its last line holds
    the SHA-256 of everything before it."""
    data = path.read_bytes()
    start, end = PROOF_START.encode(), PROOF_END.encode()
    cut = data.rfind(start)
    if cut < 0 or not data.endswith(end):
        return False
    digest = data[cut + len(start): len(data) - len(end)]
    return digest == hashlib.sha256(data[:cut]).hexdigest().encode()


def write_comparison_report(
    result: Mapping[str, Any], folder: Path, *, class_names: Optional[Sequence[str]] = None
) -> Optional[str]:
    """Write :func:`comparison_report` to ``folder``/comparison.html (atomically) and return None; or, when plotly is
    missing, write nothing and return why (naming ``pip install "hf-calibrate[report]"``), removing a report an
    earlier write left there, which would describe another comparison.

    Refuses (FileExistsError) to replace a comparison.html it cannot prove it wrote (:func:`is_our_report`) or a link.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"folder {folder} is a file, not a folder: pass the folder the report should be written into.")
    path = folder / REPORT_FILE
    refuse_unproven({path: is_our_report}, instead="write the comparison to another folder")
    missing = missing_dependency()
    if missing is not None:
        stale = path.exists()
        path.unlink(missing_ok=True)
        return f"{REPORT_FILE} not written{' (the earlier one removed)' if stale else ''}: {missing}"
    page = comparison_report(result, class_names=class_names)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, page)
    return None

