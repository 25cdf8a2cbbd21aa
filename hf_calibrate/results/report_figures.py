"""The interactive figures of the comparison's HTML report (:mod:`.html_report`), drawn with plotly.

plotly is an optional dependency (``pip install "hf-calibrate[report]"``): :func:`plotly_modules` imports it when a
figure is drawn and says how to install it when it is missing. Each function takes the comparison result's JSON
parts it draws (:mod:`.comparison`'s docstring) and returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

import html
import math
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import reporting
from .report_data import bin_accuracy_intervals

#: how a user gets the report's dependency
INSTALL_HINT = 'pip install "hf-calibrate[report]"'
#: the most classes the per-class heatmap shows (those worst calibrated), so that each row stays readable
MAX_CLASSES_SHOWN = 40
#: the colour of a paired difference by its verdict (lower is better); any other verdict is UNDETECTED_COLOR
VERDICT_COLORS = {"improved": "#2a9d4b", "made worse": "#d55e00", "worse than the best": "#d55e00"}
UNDETECTED_COLOR = "#6b6b6b"
TEMPLATE = "plotly_white"
#: one colour per method, the same for its bins and its count bars (plotly's qualitative palette, cycled)
METHOD_COLORS = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")


def plain(text: Any) -> str:
    """``text`` as plotly shows it literally: plotly draws labels, names and legends as a subset of HTML (a name such
    as ``<a href=...>`` would become a link), and decodes ``&lt;``, ``&gt;`` and ``&amp;`` back to the characters."""
    return html.escape(str(text), quote=False)


def plotly_modules() -> SimpleNamespace:
    """``go`` (plotly.graph_objects), ``make_subplots``, ``to_html`` and ``get_plotlyjs``; an ImportError naming the extra
    to install when plotly is missing."""
    try:
        import plotly.graph_objects as go
        from plotly.io import to_html
        from plotly.offline import get_plotlyjs
        from plotly.subplots import make_subplots
    except ImportError as error:
        raise ImportError(f"the HTML report needs plotly, which is not installed: {INSTALL_HINT}") from error
    return SimpleNamespace(go=go, make_subplots=make_subplots, to_html=to_html, get_plotlyjs=get_plotlyjs)


def _bin_points(bins: Mapping[str, Sequence[Any]]) -> Dict[str, List[Any]]:
    """The non-empty bins of ``bins`` (``ReliabilityBins.to_dict()``) as plot columns: mean confidence, accuracy, the
    lower and upper error-bar lengths of its 95 % Wilson interval, and per bin [left edge, right edge, count, interval
    low, interval high, confidence − accuracy] for the hover."""
    count = len(bins["counts"])
    points: Dict[str, List[Any]] = {"x": [], "y": [], "minus": [], "plus": [], "custom": []}
    for index, (samples, confidence, accuracy, interval) in enumerate(
            zip(bins["counts"], bins["mean_confidence"], bins["accuracy"], bin_accuracy_intervals(bins))):
        if interval is None:
            continue
        points["x"].append(confidence)
        points["y"].append(accuracy)
        points["minus"].append(accuracy - interval[0])
        points["plus"].append(interval[1] - accuracy)
        points["custom"].append([index / count, (index + 1) / count, int(samples), *interval, confidence - accuracy])
    return points


BIN_HOVER = ("<b>%{fullData.name}</b><br>bin: confidence %{customdata[0]:.3f} to %{customdata[1]:.3f}<br>count: %{customdata[2]}"
             "<br>accuracy: %{y:.4f}<br>95% interval of the accuracy: [%{customdata[3]:.4f}, %{customdata[4]:.4f}]"
             "<br>confidence: %{x:.4f}<br>confidence − accuracy: %{customdata[5]:+.4f}<extra></extra>")


def reliability_figure(reliability: Mapping[str, Mapping[str, Sequence[Any]]]) -> Any:
    """Every method's reliability diagram overlaid: per non-empty bin, accuracy against mean confidence with the 95 %
    Wilson interval of the accuracy as an error bar (markers grow with the bin's count), and below it the samples per
    bin (log scale).

    Clicking a legend entry hides or shows a method; the menu above shows all methods or one alone. Hovering a bin
    gives its range, count, accuracy with its interval, confidence and their gap.
    """
    plotly = plotly_modules()
    figure = plotly.make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25], vertical_spacing=0.04)
    figure.add_trace(plotly.go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", hoverinfo="skip",
                                       line={"dash": "dash", "color": "#555555", "width": 1}), row=1, col=1)
    for index, (name, bins) in enumerate(reliability.items()):
        points, color = _bin_points(bins), METHOD_COLORS[index % len(METHOD_COLORS)]
        error = {"type": "data", "symmetric": False, "array": points["plus"], "arrayminus": points["minus"], "width": 3,
                 "color": color}
        figure.add_trace(plotly.go.Scatter(
            x=points["x"], y=points["y"], customdata=points["custom"], error_y=error, mode="markers", name=plain(name),
            marker={"size": _marker_sizes(points["custom"]), "opacity": 0.85, "color": color}, legendgroup=str(index),
            hovertemplate=BIN_HOVER), row=1, col=1)
        figure.add_trace(plotly.go.Bar(
            x=[(left + right) / 2 for left, right, *_ in points["custom"]], y=[row[2] for row in points["custom"]],
            name=plain(name), legendgroup=str(index), showlegend=False, opacity=0.6, marker={"color": color},
            hovertemplate="<b>%{fullData.name}</b><br>%{y} samples<extra></extra>"), row=2, col=1)
    figure.update_xaxes(range=[0, 1], row=1, col=1)
    figure.update_xaxes(range=[0, 1], title_text="confidence (mean per bin)", row=2, col=1)
    figure.update_yaxes(range=[0, 1.02], title_text="accuracy", row=1, col=1)
    figure.update_yaxes(type="log", title_text="samples", row=2, col=1)
    figure.update_layout(template=TEMPLATE, height=640, barmode="group", hovermode="closest",
                         margin={"t": 60, "b": 50}, updatemenus=[_method_menu(list(reliability))])
    return figure


def _marker_sizes(custom: List[List[Any]]) -> List[float]:
    """Marker diameters (px) growing with the square root of each bin's count: a full bin reads as more evidence."""
    counts = [row[2] for row in custom]
    largest = max(counts, default=1)
    return [6 + 12 * math.sqrt(count / largest) for count in counts]


def _method_menu(names: List[str]) -> Dict[str, Any]:
    """A dropdown showing every method, or one alone (its line and its count bars; the diagonal always)."""
    def visible(shown: List[str]) -> List[bool]:
        return [True, *(name in shown for name in names for _ in range(2))]

    buttons = [{"label": "all methods", "method": "restyle", "args": [{"visible": visible(names)}]}]
    buttons += [{"label": plain(name), "method": "restyle", "args": [{"visible": visible([name])}]} for name in names]
    return {"buttons": buttons, "direction": "down", "x": 0.0, "xanchor": "left", "y": 1.1, "yanchor": "top"}


def _class_label(index: int, class_names: Optional[Sequence[str]]) -> str:
    name = class_names[index] if class_names else str(index)
    return f"class {index}" if name == str(index) else f"{name} (class {index})"


def per_class_figure(classes: Mapping[str, Mapping[str, Sequence[Any]]], class_names: Optional[Sequence[str]] = None) -> Any:
    """A heatmap of each class's term of the classwise ECE (rows: classes, columns: methods); at most
    :data:`MAX_CLASSES_SHOWN` classes, those with the highest term under any method, worst on top. Hovering a cell gives
    the class, the method, the term, the samples labelled with it, and the predicted against the labels' share."""
    plotly = plotly_modules()
    names = [name for name, data in classes.items() if data["ece"]]
    count = len(classes[names[0]]["ece"])
    if class_names is not None and len(class_names) != count:
        raise ValueError(f"class_names has {len(class_names)} names but the comparison has {count} classes; pass one name "
                         "per class, in class-index order, or None (classes are then named by index).")
    worst = sorted(range(count), key=lambda k: max(classes[name]["ece"][k] for name in names), reverse=True)
    shown = worst[:MAX_CLASSES_SHOWN]
    shown.reverse()  # plotly draws the first row at the bottom
    labels = [_class_label(k, class_names) for k in shown]
    z = [[classes[name]["ece"][k] for name in names] for k in shown]
    text = [[_class_cell_text(classes[name], k, label, name) for name in names] for k, label in zip(shown, labels)]
    figure = plotly.go.Figure(plotly.go.Heatmap(
        z=z, x=[plain(name) for name in names], y=[plain(label) for label in labels], text=text, hovertemplate="%{text}<extra></extra>", colorscale="Reds", zmin=0,
        colorbar={"title": {"text": "per-class ECE"}}))
    figure.update_layout(template=TEMPLATE, height=max(320, 60 + 22 * len(shown)), margin={"t": 30, "b": 40},
                         xaxis={"title": {"text": "method"}, "side": "top"}, yaxis={"type": "category"})
    return figure


def _class_cell_text(data: Mapping[str, Sequence[Any]], k: int, label: str, name: str) -> str:
    return (f"<b>{plain(label)}</b>, {plain(name)}<br>per-class ECE: {data['ece'][k]:.4f}"
            f"<br>samples labelled: {data['samples'][k]}"
            f"<br>predicted share: {data['mean_probability'][k]:.4f}, label share: {data['frequency'][k]:.4f}")


def row_verdict(row: Mapping[str, Any], key: str) -> str:
    """A ranking row's verdict against the uncalibrated model on the guard metric ``key``, as compare gave it (its
    ``made_worse`` and ``improved`` lists, which also ask for enough test samples)."""
    if key in row["made_worse"]:
        return "made worse"
    return "improved" if key in row["improved"] else "no detectable difference"


def _best_verdict(row: Mapping[str, Any]) -> str:
    return "tied with the best" if row["tied_with_best"] else "worse than the best"


def differences_figure(rows: Sequence[Mapping[str, Any]], metric: str) -> Any:
    """The paired differences, one panel each: the ranking metric minus the best method's, and NLL and Brier minus
    the uncalibrated model's; a point and its 95 % interval per method, coloured by verdict (green: improved; orange:
    made worse, or worse than the best; grey: no detectable difference, or tied with the best). Best method on top."""
    plotly = plotly_modules()
    panels = [(f"{reporting.METRIC_NAMES[metric]} − best", lambda row: row["versus_best"], _best_verdict)]
    panels += [(f"{reporting.METRIC_NAMES[key]} − uncalibrated", lambda row, key=key: row["versus_uncalibrated"].get(key),
                lambda row, key=key: row_verdict(row, key)) for key in ("nll", "brier")]
    figure = plotly.make_subplots(rows=1, cols=len(panels), shared_yaxes=True, subplot_titles=[title for title, *_ in panels],
                                  horizontal_spacing=0.04)
    names = [plain(row["name"]) for row in reversed(rows)]
    for column, (title, interval, judged) in enumerate(panels, start=1):
        for row in reversed(rows):
            _add_difference(plotly, figure, row["name"], interval(row), f"{title}: {{}}<br>{judged(row)}", column)
        figure.add_vline(x=0, line={"color": "#333333", "width": 1}, row=1, col=column)
    figure.update_yaxes(type="category", categoryorder="array", categoryarray=names)
    figure.update_layout(template=TEMPLATE, showlegend=False, height=max(260, 90 + 40 * len(rows)),
                         margin={"t": 50, "b": 40}, hovermode="closest")
    return figure


def _add_difference(plotly: SimpleNamespace, figure: Any, name: str, interval: Optional[Mapping[str, Any]], hover: str,
                    column: int) -> None:
    """One method's point and 95 % interval in one panel, coloured by the verdict ``hover`` ends with (``{}`` in it: the
    difference); nothing for an absent difference (the best method's own "− best")."""
    if interval is None or interval.get("point") is None:
        return
    point, low, high = interval["point"], interval.get("low"), interval.get("high")
    error = None
    if low is not None and high is not None:
        error = {"type": "data", "symmetric": False, "array": [high - point], "arrayminus": [point - low]}
    shown = f"{point:+.4f} {reporting.interval_text(interval, signed=True) or '(no interval)'}"
    color = next((value for key, value in VERDICT_COLORS.items() if hover.endswith(key)), UNDETECTED_COLOR)
    figure.add_trace(plotly.go.Scatter(
        x=[point], y=[plain(name)], error_x=error, mode="markers", marker={"size": 10, "color": color},
        hovertemplate=f"<b>{plain(name)}</b><br>{hover.format(shown)}<extra></extra>"), row=1, col=column)
