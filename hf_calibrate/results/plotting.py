"""Reliability diagrams: drawing only; the data come from :func:`hf_calibrate.metrics.reliability_bins`.

matplotlib is an optional dependency (``pip install 'hf-calibrate[plot]'``), imported when a
diagram is drawn. Figures are built as ``matplotlib.figure.Figure`` on an Agg canvas, never
through ``pyplot``, so drawing neither needs a display nor changes the user's backend.
"""

from __future__ import annotations

import io
import os
import re
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Tuple, Union

import numpy as np

from .._atomic import write_atomically
from ..metrics import ReliabilityBins, reliability_bins

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

ACCURACY_COLOR = "#4c72b0"
# (edge and hatch, face) of the gap between accuracy and mean confidence. The over-confident gap lies above the
# accuracy bar and has a face; the under-confident one lies on the bar's top part, so it is hatch only: the bar
# stays visible up to the accuracy.
OVERCONFIDENT_COLORS = ("#d55e00", "#eebf99")  # confidence above accuracy
UNDERCONFIDENT_COLORS = ("#7fffd4", "none")  # accuracy above confidence
ACCURACY_LABEL = "accuracy"
OVERCONFIDENT_LABEL = "over-confident: confidence above accuracy"
UNDERCONFIDENT_LABEL = "under-confident: accuracy above confidence"
#: what a diagram takes for one panel: bins, or their JSON form (``ReliabilityBins.to_dict()``)
Bins = Union[ReliabilityBins, Mapping[str, Any]]
PANEL_SIZE = (4.2, 5.4)  # inches per diagram (width, height)
DPI = 150
#: most diagrams side by side in one row of :func:`compare_reliability_diagrams`; more wrap onto further rows, so that
#: a figure of many stays a size whose text is readable where it is shown
MAX_COLUMNS = 4
#: where a title's line may break: at the space after ", ", "; ", ": " or ")", or before "(": between the phrases
#: results are worded in ("digits, validation split, 450 samples (in-sample: ...)"), never inside one
PHRASE_BREAK = re.compile(r"(?<=[,;:)]) (?=\S)|(?<=\S) (?=\()")
#: the part of its figure's (a panel title: its axes') width a title's line may take
TITLE_WIDTH = 0.95


def _new_figure(size: Tuple[float, float]) -> "Figure":
    """An empty Figure on an Agg canvas, independent of pyplot and of the active backend."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "drawing reliability diagrams needs matplotlib: pip install 'hf-calibrate[plot]'"
        ) from err
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def phrase_lines(title: str, fits: Callable[[str], bool]) -> List[str]:
    """The lines of ``title``: its own, each broken further only between phrases (:data:`PHRASE_BREAK`), as few times
    as lets ``fits`` (is a line narrow enough) hold of every line; a phrase that alone does not fit has a line of its own."""
    lines = []
    for line in title.split("\n"):
        current, *phrases = PHRASE_BREAK.split(line)
        for phrase in phrases:
            joined = f"{current} {phrase}"
            if fits(joined):
                current = joined
            else:
                lines.append(current)
                current = phrase
        lines.append(current)
    return lines


def _wrap_between_phrases(text: "Text", width: float) -> None:
    """Break the lines of ``text`` between phrases (:func:`phrase_lines`) so that each is at most ``width`` display
    pixels wide (matplotlib's own ``wrap=True`` breaks at any space: "validation\\nsplit")."""
    title = text.get_text()

    def fits(line: str) -> bool:
        text.set_text(line)
        return text.get_window_extent().width <= width

    text.set_text("\n".join(phrase_lines(title, fits)))


def _check_bins(bins: Any, name: str = "bins") -> ReliabilityBins:
    """``bins`` as checked ReliabilityBins; their JSON form (``ReliabilityBins.to_dict()``) is read back first."""
    if isinstance(bins, Mapping):
        try:
            bins = ReliabilityBins.from_dict(bins)
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"{name} is not the JSON form of ReliabilityBins ({type(error).__name__}: {error}).") from None
    if not isinstance(bins, ReliabilityBins):
        raise ValueError(
            f"{name} must be a ReliabilityBins (see hf_calibrate.metrics.reliability_bins) or its to_dict() form, "
            f"got {type(bins).__name__}."
        )
    n_bins = bins.counts.shape[0]
    shapes = [np.shape(bins.edges), np.shape(bins.mean_confidence), np.shape(bins.accuracy)]
    if n_bins < 1 or shapes != [(n_bins + 1,), (n_bins,), (n_bins,)]:
        raise ValueError(
            f"{name} is inconsistent: edges {shapes[0]}, counts {np.shape(bins.counts)}, mean_confidence "
            f"{shapes[1]} and accuracy {shapes[2]} must have shapes (B+1,), (B,), (B,) and (B,) with B >= 1."
        )
    if not (bins.counts > 0).any():
        raise ValueError(f"{name} holds no samples: every bin is empty.")
    return bins


def _draw(bins: ReliabilityBins, ax: "Axes", count_ax: "Axes | None", title: str | None, caption: str | None = None) -> None:
    """Draw ``bins`` into ``ax`` (accuracy per bin) and ``count_ax`` (samples per bin); the title's last line is
    ``caption``, by default the ECE."""
    filled = bins.counts > 0
    left = bins.edges[:-1][filled]
    width = np.diff(bins.edges)[filled]
    accuracy = bins.accuracy[filled]
    confidence = bins.mean_confidence[filled]

    ax.bar(left, accuracy, width=width, align="edge", color=ACCURACY_COLOR, edgecolor="white",
           linewidth=0.8, label=ACCURACY_LABEL)
    for label, mask, (edge, face), hatch in [
        (OVERCONFIDENT_LABEL, confidence > accuracy, OVERCONFIDENT_COLORS, "///"),
        (UNDERCONFIDENT_LABEL, accuracy > confidence, UNDERCONFIDENT_COLORS, "\\\\\\"),
    ]:
        if mask.any():
            low = np.minimum(accuracy, confidence)[mask]
            ax.bar(left[mask], np.abs(accuracy - confidence)[mask], bottom=low, width=width[mask], align="edge",
                   facecolor=face, edgecolor=edge, hatch=hatch, linewidth=0.8, label=label)
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.3", linewidth=1.0, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", xticks=np.linspace(0, 1, 6), yticks=np.linspace(0, 1, 6))
    ax.grid(True, linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    if caption is None:
        caption = f"ECE = {bins.ece:.4f}"  # a fraction to 4 decimals, as every table shows it
    _wrap_between_phrases(ax.set_title(f"{title}\n{caption}" if title else caption), TITLE_WIDTH * ax.bbox.width)
    if count_ax is None:
        ax.set_xlabel("confidence")
        return
    ax.tick_params(labelbottom=False)
    count_ax.bar(left, bins.counts[filled], width=width, align="edge", color="0.55", edgecolor="white",
                 linewidth=0.8, label="samples")
    count_ax.set(xlim=(0, 1), yscale="log", xlabel="confidence", ylabel="samples", xticks=np.linspace(0, 1, 6))
    count_ax.grid(True, axis="y", linewidth=0.4, alpha=0.5)
    count_ax.set_axisbelow(True)


def _figure_legend(figure: "Figure", axes: list["Axes"], columns: int) -> None:
    """One legend below the panels, with each label of ``axes`` once."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    figure.legend(entries.values(), entries.keys(), loc="outside lower center", ncols=columns, fontsize="medium",
                  frameon=False)


def grid_shape(panels: int, max_columns: int = MAX_COLUMNS) -> Tuple[int, int]:
    """(rows, columns) of ``panels`` diagrams: as few rows as ``max_columns`` allows, the panels spread evenly over
    them (5 in rows of 3 and 2, not of 4 and 1); ``panels`` ≥ 1.

    Example:
        >>> [grid_shape(n) for n in (1, 3, 4, 5, 7, 9)]
        [(1, 1), (1, 3), (1, 4), (2, 3), (2, 4), (3, 3)]
    """
    rows = -(-panels // max_columns)
    return rows, -(-panels // rows)


def _panel_axes(figure: "Figure", panels: int, columns: int = 1) -> list[Tuple["Axes", "Axes"]]:
    """``panels`` (reliability, count) pairs of axes, row by row in rows of ``columns``, each count panel a quarter as
    tall as its reliability panel, below it; the count panels share their y axis."""
    rows = -(-panels // columns)
    grid = figure.add_gridspec(2 * rows, columns, height_ratios=[4, 1] * rows)
    pairs: list[Tuple["Axes", "Axes"]] = []
    for index in range(panels):
        row, column = divmod(index, columns)
        ax = figure.add_subplot(grid[2 * row, column])
        count_ax = figure.add_subplot(grid[2 * row + 1, column], sharex=ax, sharey=pairs[0][1] if pairs else None)
        pairs.append((ax, count_ax))
    return pairs


def png_bytes(figure: "Figure") -> bytes:
    """``figure`` as the bytes of a PNG file (what ``path=`` writes)."""
    stream = io.BytesIO()
    figure.savefig(stream, format="png")
    return stream.getvalue()


def _save_atomically(figure: "Figure", path: str | os.PathLike) -> None:
    """Write ``figure`` as a PNG to ``path`` via a temporary file in the same folder and a rename."""
    write_atomically(path, lambda stream: stream.write(png_bytes(figure)))


def _check_captions(captions: Any, diagrams: Mapping[str, Any]) -> Mapping[str, str]:
    """``captions`` checked: a mapping of panel titles of ``diagrams`` to strings (empty for None)."""
    if captions is None:
        return {}
    if not isinstance(captions, Mapping) or not all(isinstance(text, str) for text in captions.values()):
        raise ValueError("captions must be a mapping of panel title -> str, e.g. {'temperature': 'NLL 0.3120'}.")
    unknown = [name for name in captions if name not in diagrams]
    if unknown:
        raise ValueError(f"captions name panels that diagrams do not hold: {unknown}; use the titles of diagrams "
                         f"({list(diagrams)}).")
    return captions


def _diagram_bins(bins: Bins | None, probs: Any, labels: Any, *, n_bins: int, from_logits: bool) -> ReliabilityBins:
    """Checked bins of :func:`reliability_diagram`: ``bins`` as given, or ``probs`` (N, C) and ``labels`` (N,) binned."""
    if (bins is None) == (probs is None):
        raise ValueError("pass either bins or probs and labels, not both and not neither.")
    if bins is None:
        if labels is None:
            raise ValueError("probs needs labels: pass labels=(N,) class indices.")
        bins = reliability_bins(probs, labels, n_bins=n_bins, from_logits=from_logits)
    elif labels is not None:
        raise ValueError("labels are only used with probs; bins already hold the data.")
    return _check_bins(bins)


def reliability_diagram(
    bins: Bins | None = None,
    *,
    probs: Any = None,
    labels: Any = None,
    n_bins: int = 15,
    from_logits: bool = False,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    ax: "Axes | None" = None,
    count_ax: "Axes | None" = None,
) -> "Figure":
    """Draw a reliability diagram: per-bin accuracy against confidence, and samples per bin.

    Pass either ``bins`` (from :func:`hf_calibrate.metrics.reliability_bins`, ``CalibrationMetrics.reliability()``,
    or their ``to_dict()`` form, as ``CalibratedModel.evaluate`` returns them) or ``probs`` (N, C) and ``labels``
    (N,), binned here into ``n_bins`` equal-width bins (``from_logits`` applies softmax first).

    Bars reach each non-empty bin's accuracy. The gap to its mean confidence is hatched: orange, with a face,
    above the bar where the model is over-confident (confidence above accuracy); green hatch only, over the
    bar's top, where it is under-confident (the bar stays visible up to the accuracy). The dashed diagonal is
    perfect calibration; a log-scale histogram of samples per bin sits below. The title carries the ECE.

    Args:
        title: text above the ECE in the title.
        path: also write the figure as a PNG there (atomically).
        ax: draw the reliability panel into this Axes instead of a new figure.
        count_ax: with ``ax``, the Axes for the sample histogram (none is drawn without it).

    Returns:
        The Figure drawn into (a new one unless ``ax`` was given).

    Example:
        >>> import torch
        >>> probs = torch.softmax(3 * torch.randn(500, 10, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> figure = reliability_diagram(probs=probs, labels=torch.zeros(500, dtype=torch.long), title="random")
        >>> figure.axes[0].get_title().startswith("random\\nECE = ")
        True
    """
    bins = _diagram_bins(bins, probs, labels, n_bins=n_bins, from_logits=from_logits)
    if count_ax is not None and ax is None:
        raise ValueError("count_ax is only used together with ax.")

    if ax is None:
        figure = _new_figure(PANEL_SIZE)
        ax, count_ax = _panel_axes(figure, 1)[0]
        _draw(bins, ax, count_ax, title)
        _figure_legend(figure, [ax], columns=1)
    else:
        figure = ax.figure
        _draw(bins, ax, count_ax, title)
        ax.legend(loc="best", fontsize="small")
    if path is not None:
        _save_atomically(figure, path)
    return figure


def compare_reliability_diagrams(
    diagrams: Mapping[str, Bins],
    *,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    captions: Mapping[str, str] | None = None,
) -> "Figure":
    """Draw several reliability diagrams side by side, one per entry, in one figure.

    Args:
        diagrams: panel title -> bins (or their ``to_dict()`` form), drawn in order left to right, in rows of at most
            :data:`MAX_COLUMNS` (:func:`grid_shape`), e.g. ``{"uncalibrated": bins_a, "temperature scaling": bins_b}``.
        title: overall title above the panels.
        path: also write the figure as a PNG there (atomically).
        captions: panel title -> the line under it in place of the panel's ECE (e.g. the metric the panels are
            ranked by, with its interval); a panel it does not name keeps its ECE.

    Returns:
        A new Figure with one (reliability, count) pair of axes per entry, :data:`PANEL_SIZE` each; count axes share y.

    Example:
        >>> import torch
        >>> from hf_calibrate.metrics import reliability_bins
        >>> logits = 3 * torch.randn(500, 10, generator=torch.Generator().manual_seed(0))
        >>> labels = logits.argmax(dim=1)
        >>> figure = compare_reliability_diagrams({
        ...     "raw": reliability_bins(logits, labels, from_logits=True),
        ...     "T = 3": reliability_bins(logits / 3, labels, from_logits=True),
        ... })
        >>> len(figure.axes)
        4
    """
    if not isinstance(diagrams, Mapping) or not diagrams:
        raise ValueError("diagrams must be a non-empty mapping of panel title -> ReliabilityBins.")
    checked = {name: _check_bins(bins, f"diagrams[{name!r}]") for name, bins in diagrams.items()}
    captions = _check_captions(captions, checked)
    rows, columns = grid_shape(len(checked))
    figure = _new_figure((PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows))
    panels = _panel_axes(figure, len(checked), columns)
    for (name, bins), (ax, count_ax) in zip(checked.items(), panels):
        _draw(bins, ax, count_ax, name, captions.get(name))
    _figure_legend(figure, [ax for ax, _ in panels], columns=2 if columns < 3 else 4)
    if title:
        _wrap_between_phrases(figure.suptitle(title), TITLE_WIDTH * figure.bbox.width)
    if path is not None:
        _save_atomically(figure, path)
    return figure
