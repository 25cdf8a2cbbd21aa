"""Reliability diagrams draw exactly the data of :class:`ReliabilityBins` and write valid PNGs."""

from __future__ import annotations

import doctest
import os
import stat
import struct
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hf_calibrate.results import plotting  # noqa: E402
from hf_calibrate.metrics import ReliabilityBins, reliability_bins  # noqa: E402
from hf_calibrate.results.plotting import compare_reliability_diagrams, reliability_diagram  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def overconfident_bins(n_bins: int = 15, scale: float = 3.0) -> ReliabilityBins:
    """Softmax of scaled noisy logits with a true signal: a typical over-confident model."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (2000,), generator=generator)
    logits = torch.randn(2000, 10, generator=generator)
    logits[torch.arange(2000), labels] += 1.5
    return reliability_bins(scale * logits, labels, n_bins=n_bins, from_logits=True)


BINS = overconfident_bins()

# Two classes: confidences 0.55, 0.6 (bin 5) and 0.95, 0.97 (bin 9) of 10; bins 0-4 and 6-8 are empty.
SPARSE_PROBS = torch.tensor([[0.55, 0.45], [0.95, 0.05], [0.03, 0.97], [0.6, 0.4]], dtype=torch.float64)
SPARSE_LABELS = torch.tensor([0, 1, 1, 0])


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def bars(ax, label: str):
    """The rectangles of the bar container drawn with ``label`` (empty when none was drawn)."""
    containers = [c for c in ax.containers if c.get_label() == label]
    assert len(containers) <= 1
    return list(containers[0]) if containers else []


def test_writes_a_valid_png_atomically(tmp_path):
    path = tmp_path / "reliability.png"
    figure = reliability_diagram(BINS, title="over-confident", path=path)
    width, height = png_size(path)
    expected = [round(inches * plotting.DPI) for inches in plotting.PANEL_SIZE]
    assert (width, height) == tuple(expected) and 300 < width < 2000
    assert path.stat().st_size > 10_000  # a drawn figure, not a blank canvas
    assert isinstance(figure, Figure) and isinstance(figure.canvas, FigureCanvasAgg)
    assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # like any open()-written file, not 0600


def test_a_failed_write_leaves_the_old_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "reliability.png"
    path.write_bytes(b"previous")

    def broken_savefig(self, stream, **kwargs):
        stream.write(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        reliability_diagram(BINS, path=path)
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]


def test_bars_are_the_bins_accuracy_and_the_gaps_reach_mean_confidence():
    bins = BINS
    ax, count_ax = reliability_diagram(bins).axes
    filled = bins.counts > 0
    accuracy_bars = bars(ax, "accuracy")
    np.testing.assert_allclose([b.get_height() for b in accuracy_bars], bins.accuracy[filled])
    np.testing.assert_allclose([b.get_x() for b in accuracy_bars], bins.edges[:-1][filled])
    np.testing.assert_allclose([b.get_width() for b in accuracy_bars], np.diff(bins.edges)[filled])

    over = bars(ax, plotting.OVERCONFIDENT_LABEL)
    assert len(over) > len(bars(ax, plotting.UNDERCONFIDENT_LABEL))  # scaled logits: mostly over-confident
    gaps = {round(b.get_x(), 9): (b.get_y(), b.get_y() + b.get_height()) for b in over}
    lefts, accuracies, confidences = bins.edges[:-1][filled], bins.accuracy[filled], bins.mean_confidence[filled]
    for left, accuracy, confidence in zip(lefts, accuracies, confidences):
        if confidence > accuracy:
            assert gaps[round(left, 9)] == pytest.approx((accuracy, confidence))

    np.testing.assert_allclose([b.get_height() for b in bars(count_ax, "samples")], bins.counts[filled])
    assert count_ax.get_yscale() == "log"


def test_over_and_under_confidence_are_drawn_distinguishably():
    # Bin 0 is under-confident (accuracy 0.4 > confidence 0.3), bin 1 over-confident (0.6 < 0.9).
    bins = ReliabilityBins(
        edges=np.array([0.0, 0.5, 1.0]), counts=np.array([10, 10]),
        mean_confidence=np.array([0.3, 0.9]), accuracy=np.array([0.4, 0.6]), ece=0.2,
    )
    ax = reliability_diagram(bins).axes[0]
    [under], [over] = bars(ax, plotting.UNDERCONFIDENT_LABEL), bars(ax, plotting.OVERCONFIDENT_LABEL)
    assert (under.get_x(), under.get_y(), under.get_y() + under.get_height()) == pytest.approx((0.0, 0.3, 0.4))
    assert (over.get_x(), over.get_y(), over.get_y() + over.get_height()) == pytest.approx((0.5, 0.6, 0.9))
    accuracy_face = bars(ax, "accuracy")[0].get_facecolor()
    assert len({under.get_edgecolor(), over.get_edgecolor(), accuracy_face}) == 3
    assert under.get_hatch() != over.get_hatch()


def visible_patch(ax, x: float, y: float):
    """The patch whose face shows at data point (x, y): the last drawn (by zorder, then order) of those with a
    face that contain it, or None. Hatch-only patches (no face) let what is under them show."""
    shown = None
    for patch in sorted(ax.patches, key=lambda p: p.get_zorder()):
        left, bottom = patch.get_x(), patch.get_y()
        inside = left <= x <= left + patch.get_width() and bottom <= y <= bottom + patch.get_height()
        if inside and patch.get_facecolor()[3] > 0:
            shown = patch
    return shown


def test_bars_show_the_accuracy_in_both_directions_of_miscalibration():
    """The bar the legend calls accuracy is what shows up to the accuracy, in under-confident bins too (accuracy
    0.40, confidence 0.24: the bar must not stop at 0.24); each gap spans accuracy to confidence, labelled by side."""
    bins = ReliabilityBins(
        edges=np.array([0.0, 0.5, 1.0]), counts=np.array([10, 10]),
        mean_confidence=np.array([0.24, 0.9]), accuracy=np.array([0.40, 0.6]), ece=0.23,
    )
    ax = reliability_diagram(bins).axes[0]
    under_bin, over_bin = bars(ax, "accuracy")
    assert [under_bin.get_height(), over_bin.get_height()] == pytest.approx([0.40, 0.6])
    for y in (0.1, 0.3, 0.39):  # below the confidence and between confidence and accuracy: the accuracy bar
        assert visible_patch(ax, 0.25, y) is under_bin, y
    assert visible_patch(ax, 0.25, 0.45) is None  # above the accuracy: nothing
    assert visible_patch(ax, 0.75, 0.5) is over_bin
    [over_gap] = [p for p in ax.patches if visible_patch(ax, 0.75, 0.8) is p]
    assert (over_gap.get_y(), over_gap.get_y() + over_gap.get_height()) == pytest.approx((0.6, 0.9))
    under_gaps = [p for p in ax.patches if p is not under_bin and p.get_x() == 0.0 and p.get_hatch()]
    assert [(p.get_y(), p.get_y() + p.get_height()) for p in under_gaps] == [pytest.approx((0.24, 0.40))]
    legend = [text.get_text() for text in reliability_diagram(bins).legends[0].get_texts()]
    assert any("over-confident" in t and "confidence above accuracy" in t for t in legend), legend
    assert any("under-confident" in t and "accuracy above confidence" in t for t in legend), legend


def test_bins_in_their_json_form_draw_the_same():
    """``evaluate`` returns bins as ``ReliabilityBins.to_dict()``; the diagrams take that form as it is."""
    as_dict = reliability_diagram(BINS.to_dict()).axes[0]
    as_bins = reliability_diagram(BINS).axes[0]
    assert [b.get_height() for b in bars(as_dict, "accuracy")] == pytest.approx([b.get_height() for b in bars(as_bins, "accuracy")])
    assert as_dict.get_title() == as_bins.get_title()
    figure = compare_reliability_diagrams({"uncalibrated": BINS.to_dict(), "calibrated": BINS})
    assert len(figure.axes) == 4
    with pytest.raises(ValueError, match="JSON form of ReliabilityBins"):
        reliability_diagram({"counts": [1]})


def test_empty_bins_draw_nothing():
    bins = reliability_bins(SPARSE_PROBS, SPARSE_LABELS, n_bins=10)
    assert bins.counts.tolist() == [0, 0, 0, 0, 0, 2, 0, 0, 0, 2]
    ax, count_ax = reliability_diagram(bins).axes
    accuracy_bars = bars(ax, "accuracy")
    assert [round(b.get_x(), 9) for b in accuracy_bars] == [0.5, 0.9]
    assert [b.get_height() for b in accuracy_bars] == [1.0, 0.5]
    gaps = bars(ax, plotting.OVERCONFIDENT_LABEL) + bars(ax, plotting.UNDERCONFIDENT_LABEL)
    assert sorted(round(b.get_x(), 9) for b in gaps) == [0.5, 0.9]
    assert [b.get_height() for b in bars(count_ax, "samples")] == [2, 2]


def test_title_carries_the_ece():
    ax = reliability_diagram(BINS, title="ViT-S/16, CIFAR-10").axes[0]
    assert ax.get_title() == f"ViT-S/16, CIFAR-10\nECE = {BINS.ece:.4f}"
    other = overconfident_bins(scale=1.0)
    assert reliability_diagram(other).axes[0].get_title() == f"ECE = {other.ece:.4f}" != f"ECE = {BINS.ece:.4f}"


def test_probs_and_labels_are_binned_like_reliability_bins():
    ax = reliability_diagram(probs=SPARSE_PROBS, labels=SPARSE_LABELS, n_bins=10).axes[0]
    expected = reliability_bins(SPARSE_PROBS, SPARSE_LABELS, n_bins=10)
    assert ax.get_title() == f"ECE = {expected.ece:.4f}"
    assert [b.get_height() for b in bars(ax, "accuracy")] == expected.accuracy[expected.counts > 0].tolist()


def test_draws_into_the_callers_axes():
    figure = Figure()
    ax, count_ax = figure.subplots(2, 1)
    assert reliability_diagram(BINS, ax=ax, count_ax=count_ax) is figure
    assert len(bars(ax, "accuracy")) == len(bars(count_ax, "samples")) == int((BINS.counts > 0).sum())

    lone = Figure().subplots()
    reliability_diagram(BINS, ax=lone)
    assert len(lone.figure.axes) == 1 and lone.get_legend() is not None


def test_compare_draws_one_column_per_entry(tmp_path):
    path = tmp_path / "compare.png"
    panels = {
        "uncalibrated": BINS,
        "temperature": overconfident_bins(scale=1.0),
        "sparse": reliability_bins(SPARSE_PROBS, SPARSE_LABELS, n_bins=10),
    }
    figure = compare_reliability_diagrams(panels, title="calibration", path=path)
    reliability_axes = figure.axes[0::2]
    assert [ax.get_title() for ax in reliability_axes] == [f"{name}\nECE = {b.ece:.4f}" for name, b in panels.items()]
    for ax, b in zip(reliability_axes, panels.values()):
        assert [bar.get_height() for bar in bars(ax, "accuracy")] == pytest.approx(b.accuracy[b.counts > 0].tolist())
    assert len(figure.legends) == 1 and figure.get_suptitle() == "calibration"
    width, height = png_size(path)
    single = [round(inches * plotting.DPI) for inches in plotting.PANEL_SIZE]
    assert (width, height) == (3 * single[0], single[1])


def test_many_diagrams_wrap_into_rows_of_a_readable_figure():
    """Seven panels (a comparison of six methods): rows of at most MAX_COLUMNS, each panel the size of one diagram,
    so the figure stays as wide as MAX_COLUMNS diagrams; the legend's text is no smaller than the axes' labels.
    (Its PNG has the figure's size in pixels: test_compare_draws_one_column_per_entry.)"""
    names = [f"method {index}" for index in range(7)]
    figure = compare_reliability_diagrams({name: BINS for name in names}, title="seven",
                                          captions={"method 0": "NLL 0.1234 [0.1000, 0.1500]"})
    panels = figure.axes[0::2]
    rows = sorted({round(ax.get_position().y0, 6) for ax in panels}, reverse=True)
    assert len(rows) == 2 and plotting.MAX_COLUMNS == 4
    assert [ax.get_title().split("\n")[0] for ax in panels] == names  # in order, row by row
    assert [ax.get_position().y0 for ax in panels] == sorted((ax.get_position().y0 for ax in panels), reverse=True)
    assert panels[0].get_title() == "method 0\nNLL 0.1234 [0.1000, 0.1500]"  # its caption in place of the ECE
    assert panels[1].get_title() == f"method 1\nECE = {BINS.ece:.4f}"
    width, height = (round(inches * plotting.DPI) for inches in figure.get_size_inches())
    single = [round(inches * plotting.DPI) for inches in plotting.PANEL_SIZE]
    assert (width, height) == (4 * single[0], 2 * single[1]) and width <= 2600
    legend_sizes = {text.get_fontsize() for text in figure.legends[0].get_texts()}
    assert min(legend_sizes) >= panels[0].yaxis.label.get_fontsize()


@pytest.mark.parametrize("panels", range(1, 14))
def test_grid_shape_uses_the_fewest_rows_and_spreads_the_panels_evenly(panels):
    rows, columns = plotting.grid_shape(panels)
    assert columns <= plotting.MAX_COLUMNS and rows == -(-panels // plotting.MAX_COLUMNS)
    assert (rows - 1) * columns < panels <= rows * columns  # no empty row
    assert rows * columns - panels < rows  # the last row lacks fewer panels than there are rows


def test_captions_must_name_panels_and_be_text():
    with pytest.raises(ValueError, match=r"captions name panels that diagrams do not hold: \['c'\]"):
        compare_reliability_diagrams({"a": BINS, "b": BINS}, captions={"c": "NLL 0.1"})
    with pytest.raises(ValueError, match="captions must be a mapping of panel title -> str"):
        compare_reliability_diagrams({"a": BINS}, captions={"a": 0.1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "either bins or probs"),
        ({"bins": BINS, "probs": SPARSE_PROBS, "labels": SPARSE_LABELS}, "either bins or probs"),
        ({"probs": SPARSE_PROBS}, "probs needs labels"),
        ({"bins": BINS, "labels": SPARSE_LABELS}, "labels are only used with probs"),
        ({"bins": BINS.accuracy}, "must be a ReliabilityBins"),
        ({"probs": SPARSE_PROBS / 2, "labels": SPARSE_LABELS}, "sum to 1"),
        ({"probs": SPARSE_PROBS, "labels": SPARSE_LABELS, "n_bins": 0}, "n_bins must be"),
        ({"probs": SPARSE_PROBS, "labels": SPARSE_LABELS, "count_ax": object()}, "count_ax is only used together"),
    ],
)
def test_invalid_input_raises_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        reliability_diagram(**kwargs)


def test_inconsistent_bins_raise_value_error():
    truncated = ReliabilityBins(BINS.edges, BINS.counts, BINS.mean_confidence[:-1], BINS.accuracy, BINS.ece)
    with pytest.raises(ValueError, match="inconsistent"):
        reliability_diagram(truncated)
    empty = ReliabilityBins(BINS.edges, 0 * BINS.counts, BINS.mean_confidence, BINS.accuracy, BINS.ece)
    with pytest.raises(ValueError, match="every bin is empty"):
        reliability_diagram(empty)
    with pytest.raises(ValueError, match="non-empty mapping"):
        compare_reliability_diagrams({})
    with pytest.raises(ValueError, match=r"diagrams\['b'\] must be a ReliabilityBins"):
        compare_reliability_diagrams({"a": BINS, "b": BINS.accuracy})


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'hf-calibrate\[plot\]'"):
        reliability_diagram(BINS)


def test_docstring_examples_run():
    result = doctest.testmod(plotting, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 6 and result.failed == 0


# ----------------------------------------------------------------------------- titles break between phrases

#: a diagram title as the CLI's evaluate words it: model, method, data (a long hub dataset name) and the in-sample note
LONG_TITLE = (
    "digits-resnet-ts: Reliability of Temperature scaling on some-organisation/scikit-learn-handwritten-digits-8px, "
    "validation split, 450 samples\nIn-sample: data the calibration was fitted on, so optimistic"
)


def _assert_broken_between_phrases(title: str, wrapped: str) -> None:
    """``wrapped`` is ``title`` with some of its spaces made line breaks, each after ", ", "; ", ": " or ")", or before
    "(": never inside a phrase such as "validation split" or "450 samples"."""
    assert wrapped.replace("\n", " ") == title.replace("\n", " ")
    for index, (was, now) in enumerate(zip(title, wrapped)):
        if (was, now) == (" ", "\n"):
            assert wrapped[index - 1] in ",;:)" or wrapped[index + 1] == "(", wrapped


@pytest.mark.parametrize("width", [10, 25, 40, 60, 90, 200])
def test_phrase_lines_break_only_between_phrases_and_only_where_a_line_would_not_fit(width):
    def fits(line: str) -> bool:
        return len(line) <= width

    _assert_broken_between_phrases(LONG_TITLE, "\n".join(plotting.phrase_lines(LONG_TITLE, fits)))
    for title_line in LONG_TITLE.split("\n"):  # its own line breaks are kept; each line is broken on its own
        lines = plotting.phrase_lines(title_line, fits)
        assert all(fits(line) or len(plotting.PHRASE_BREAK.split(line)) == 1 for line in lines)  # too wide: one phrase
        for line, following in zip(lines, lines[1:]):  # broken only where the next phrase did not fit
            assert not fits(f"{line} {plotting.PHRASE_BREAK.split(following)[0]}")


def test_a_long_diagram_title_wraps_between_phrases_in_both_kinds_of_figure():
    """The title as drawn (matplotlib wraps nothing more: ``wrap`` is off) breaks only between phrases."""
    compared = compare_reliability_diagrams({"uncalibrated": BINS, "calibrated": BINS}, title=LONG_TITLE)
    single = reliability_diagram(BINS, title=LONG_TITLE).axes[0]
    ece = f"\nECE = {BINS.ece:.4f}"
    for text, title in [(compared._suptitle, LONG_TITLE), (single.title, LONG_TITLE + ece)]:
        wrapped = text.get_text()
        assert wrapped.count("\n") > title.count("\n") and not text.get_wrap()  # too wide for one line: broken
        _assert_broken_between_phrases(title, wrapped)
