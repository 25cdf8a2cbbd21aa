"""comparison.html: the report ``hf-calibrate compare`` writes to explore a comparison in a browser, offline.

One real compare (the CLI, on the cached digits CNN, three methods, auto among them) feeds every test. The page is
loaded in Debian's real headless chromium, driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
no port, no websocket package), with every host unresolvable and a dead proxy, so nothing outside the file could
load: the tests read the console errors and uncaught exceptions the page raised, every request it made, what plotly
rendered, a bin's hover text, and a screenshot. Without chromium those tests are skipped, saying so.
"""

from __future__ import annotations

import base64
import doctest
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from _files import write_image_folder

from hf_calibrate.cli import main
from hf_calibrate.metrics import CalibrationMetrics
from hf_calibrate.results import comparison, html_report
from hf_calibrate.results.report_data import bin_accuracy_intervals, per_class_calibration, wilson_interval
from hf_calibrate.results.report_figures import reliability_figure

pytestmark = pytest.mark.usefixtures("single_thread")
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y "
                                    "chromium; .ci/run installs it): the report cannot be loaded in a real browser here")
METHODS = "temperature,histogram,auto"
#: the plots of a report with per-class data: reliability, paired differences, per-class heatmap
PLOT_IDS = ("reliability", "differences", "per-class")
WINDOW = (1280, 2600)


def compare_command(model: Path, data: Path, output: Path, methods: str = METHODS) -> List[str]:
    auto = ["--option", 'auto.candidates=["isotonic"]'] if "auto" in methods else []
    return ["compare", "--model", str(model), "--dataset", str(data), "--methods", methods, *auto, "--bootstrap", "100",
            "--no-progress", "--output", str(output)]


@pytest.fixture(scope="module")
def compared(digits_cnn, tmp_path_factory) -> Dict[str, Any]:
    """The CLI's compare of temperature, histogram and auto on 150 calibration and 150 test digits."""
    root = tmp_path_factory.mktemp("report")
    dataset = digits_cnn.dataset
    data = write_image_folder(root / "digits", {split: dataset[split].select(range(150)) for split in ("calibration", "test")})
    output = root / "out"
    assert main(compare_command(digits_cnn.path, data, output)) == 0
    result = json.loads((output / "comparison.json").read_text(encoding="utf-8"))
    return {"model": digits_cnn.path, "data": data, "output": output, "result": result,
            "report": output / html_report.REPORT_FILE}


# ----------------------------------------------------------------------------- the file


def test_compare_writes_a_self_contained_signed_report(compared):
    page = compared["report"].read_text(encoding="utf-8")
    assert html_report.is_our_report(compared["report"])
    sources = re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=", page, flags=re.IGNORECASE)
    assert sources == []  # every script is inline: nothing is fetched, from a CDN or elsewhere
    assert page.count("Plotly.newPlot(") == len(PLOT_IDS)
    for name in ("uncalibrated", "temperature", "histogram", "auto ("):
        assert name in page
    assert "auto&#x27;s decision (auto (" in page and "held-out NLL" in page and "<strong>chosen</strong>" in page
    link = f"[{html_report.REPORT_FILE}]({html_report.REPORT_FILE})"
    assert link in (compared["output"] / "comparison.md").read_text(encoding="utf-8")  # the table links to its report


def test_the_result_carries_each_classes_calibration_and_autos_decision(compared):
    """Per-class terms whose mean is the row's classwise ECE; label counts that sum to the test size."""
    result = compared["result"]
    for row in result["rows"]:
        classes = result["classes"][row["name"]]
        assert len(classes["ece"]) == 10  # the ten digits
        assert sum(classes["ece"]) / 10 == pytest.approx(row["metrics"]["classwise_ece"], rel=1e-9)
        assert sum(classes["samples"]) == row["metrics"]["num_samples"] == 150
        assert sum(classes["frequency"]) == pytest.approx(1.0) and sum(classes["mean_probability"]) == pytest.approx(1.0)
    [(name, decision)] = result["auto"].items()
    assert name == f"auto ({decision['chosen']})" and {row["method"] for row in decision["candidates"]} >= {"isotonic"}


def test_bins_hover_with_count_accuracy_confidence_and_their_wilson_interval(compared):
    reliability = compared["result"]["reliability"]
    figure = reliability_figure(reliability)
    lines = [trace for trace in figure.data if trace.type == "scatter" and trace.name in reliability]
    assert [trace.name for trace in lines] == list(reliability)
    for trace in lines:
        for word in ("count", "accuracy", "confidence", "interval"):
            assert word in trace.hovertemplate
        bins = reliability[trace.name]
        filled = [index for index, count in enumerate(bins["counts"]) if count]
        intervals = [interval for interval in bin_accuracy_intervals(bins) if interval is not None]
        assert [row[2] for row in trace.customdata] == [bins["counts"][index] for index in filled]
        assert [end for row in trace.customdata for end in row[3:5]] == pytest.approx([end for pair in intervals for end in pair])
        assert all(low <= accuracy <= high for accuracy, (low, high) in zip(trace.y, intervals))


def test_a_later_write_replaces_its_own_report_and_a_users_file_is_refused(compared, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    assert html_report.write_comparison_report(compared["result"], output) is None
    assert html_report.write_comparison_report({**compared["result"], "dataset": "renamed digits"}, output) is None
    assert "Calibration comparison on renamed digits" in (output / html_report.REPORT_FILE).read_text(encoding="utf-8")
    (output / html_report.REPORT_FILE).write_text("<p>my notes</p>\n")
    with pytest.raises(FileExistsError, match="comparison.html was not written by hf_calibrate"):
        comparison.check_folder(output)  # what compare checks before it loads the model
    with pytest.raises(FileExistsError, match="comparison.html was not written by hf_calibrate"):
        html_report.write_comparison_report(compared["result"], output)
    assert (output / html_report.REPORT_FILE).read_text() == "<p>my notes</p>\n"


def test_without_plotly_compare_writes_its_other_files_and_names_the_extra(compared, monkeypatch, capsys, tmp_path):
    """plotly made unimportable: a clear error from the library, and from the CLI a warning, the other three files,
    and the earlier report (which would describe another comparison) removed."""
    output = tmp_path / "out"
    output.mkdir()
    html_report.write_comparison_report(compared["result"], output)
    assert (output / html_report.REPORT_FILE).exists()
    for name in [name for name in sys.modules if name == "plotly" or name.startswith("plotly.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(ImportError, match=re.escape('pip install "hf-calibrate[report]"')):
        html_report.comparison_report(compared["result"])
    assert main(compare_command(compared["model"], compared["data"], output, methods="temperature")) == 0
    err = capsys.readouterr().err
    assert 'warning: comparison.html not written (the earlier one removed): the HTML report needs plotly' in err
    assert 'pip install "hf-calibrate[report]"' in err
    assert sorted(path.name for path in output.iterdir()) == sorted(comparison.FILES)
    assert html_report.REPORT_FILE not in (output / "comparison.md").read_text(encoding="utf-8")  # no dead link


def test_documented_errors(compared):
    with pytest.raises(ValueError, match="result must be a comparison result"):
        html_report.comparison_report({"rows": []})
    rows = [{key: value for key, value in row.items() if key != "improved"} for row in compared["result"]["rows"]]
    with pytest.raises(ValueError, match=r"it lacks \['improved'\]"):  # the verdicts are compare's: none re-derived here
        html_report.comparison_report({**compared["result"], "rows": rows})
    with pytest.raises(ValueError, match="class_names has 2 names but the comparison has 10 classes"):
        html_report.comparison_report(compared["result"], class_names=["zero", "one"])
    with pytest.raises(ValueError, match="accumulator must be a CalibrationMetrics"):
        per_class_calibration({"ece": 0.1})
    for count, accuracy, confidence, message in [(0, 0.5, 0.95, "count"), (5, 1.5, 0.95, "accuracy"), (5, 0.5, 1.0, "confidence")]:
        with pytest.raises(ValueError, match=message):
            wilson_interval(count, accuracy, confidence)
    assert per_class_calibration(_fed(CalibrationMetrics(3, classwise=False)))["ece"] == []
    for names in ("zero one two", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]):
        with pytest.raises(ValueError, match="class_names must be a list of strings"):
            html_report.comparison_report(compared["result"], class_names=names)
    a_file = compared["output"] / "comparison.md"
    with pytest.raises(ValueError, match="is a file, not a folder"):
        html_report.write_comparison_report(compared["result"], a_file)


def test_a_missing_folder_is_made(compared, tmp_path):
    assert html_report.write_comparison_report(compared["result"], tmp_path / "new" / "deeper") is None
    assert html_report.is_our_report(tmp_path / "new" / "deeper" / html_report.REPORT_FILE)


def test_names_from_the_model_and_the_user_are_drawn_as_text_not_markup(compared):
    """plotly draws labels as a subset of HTML: a class or method name holding a link or a style must stay text."""
    from hf_calibrate.results.report_figures import per_class_figure, reliability_figure

    hostile = '<a href="https://example.invalid/login">verify</a>'
    result = compared["result"]
    classes = {name: data for name, data in result["classes"].items() if data.get("ece")}
    names = [hostile] + [f"<b>{k}</b>" for k in range(1, len(next(iter(classes.values()))["ece"]))]
    figure = per_class_figure(classes, names)
    labels = [str(label) for label in figure.data[0].y]
    assert any("&lt;a href=" in label for label in labels) and not any("<" in label for label in labels)
    drawn = reliability_figure({hostile: next(iter(result["reliability"].values()))})
    assert {trace.name for trace in drawn.data[1:]} == {'&lt;a href="https://example.invalid/login"&gt;verify&lt;/a&gt;'}
    assert all("<a" not in button["label"] for button in drawn.layout.updatemenus[0].buttons)


def test_the_wilson_example_holds():
    from hf_calibrate.results import report_data

    outcome = doctest.testmod(report_data)
    assert outcome.attempted >= 1 and outcome.failed == 0


def _fed(accumulator: CalibrationMetrics) -> CalibrationMetrics:
    import torch

    accumulator.update(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]), torch.tensor([0, 1]))
    return accumulator


# ----------------------------------------------------------------------------- in a real browser


class DevTools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe``: JSON messages ending in NUL, written to the
    browser's fd 3 and read from its fd 4. Events that arrive while waiting for an answer are kept in ``events``."""

    def __init__(self, user_data: Path) -> None:
        to_browser, self._browser_in = os.pipe()
        self._browser_out, from_browser = os.pipe()

        def attach_pipes() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes the answers
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe", "--no-first-run",
             f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={user_data}",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "about:blank"],
            preexec_fn=attach_pipes, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self.events: List[Dict[str, Any]] = []
        self._buffer, self._next_id, self.session = b"", 0, None

    def _receive(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._browser_out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._browser_out, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> Dict[str, Any]:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._browser_in, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in answer, answer
        return answer["result"].get("value")

    def open(self, url: str, timeout: float = 60.0) -> None:
        """A new page, every domain whose events the tests read enabled, loaded from ``url``."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(event.get("method") == "Page.loadEventFired" for event in self.events):
            self.events.append(self._receive(deadline))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._browser_in)
        os.close(self._browser_out)


@pytest.fixture(scope="module")
def browsed(compared, tmp_path_factory):
    """The report loaded in headless chromium, offline, its plots drawn."""
    browser = DevTools(tmp_path_factory.mktemp("chromium-profile"))
    try:
        browser.open(compared["report"].resolve().as_uri())
        deadline = time.monotonic() + 30
        while browser.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length") < 2 * len(PLOT_IDS):
            assert time.monotonic() < deadline, "plotly did not draw every plot within 30 s"
            time.sleep(0.2)
        yield browser
    finally:
        browser.close()


def page_errors(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The uncaught exceptions, ``console.error``/``console.assert`` calls and error log entries (a resource that failed
    to load is one) among DevTools ``events``."""
    return [event["params"] for event in events
            if event.get("method") == "Runtime.exceptionThrown"
            or (event.get("method") == "Runtime.consoleAPICalled" and event["params"]["type"] in ("error", "assert"))
            or (event.get("method") == "Log.entryAdded" and event["params"]["entry"]["level"] == "error")]


def requested_urls(events: List[Dict[str, Any]]) -> List[str]:
    return [event["params"]["request"]["url"] for event in events if event.get("method") == "Network.requestWillBeSent"]


def local(url: str) -> bool:
    return url.startswith(("file:", "data:", "blob:"))


@needs_chromium
def test_the_page_raises_no_console_error_and_fetches_nothing(browsed):
    assert page_errors(browsed.events) == []
    requested = requested_urls(browsed.events)
    assert requested and all(local(url) for url in requested), requested


@needs_chromium
def test_the_checks_see_a_console_error_an_exception_and_a_blocked_fetch(tmp_path):
    """The control: a page that fetches a CDN script, logs an error and throws fails each check above."""
    page = tmp_path / "broken.html"
    page.write_text('<html><head><script src="https://cdn.plot.ly/plotly.min.js"></script></head>'
                    '<body><script>console.error("broken"); undefinedFunction();</script></body></html>')
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(page.as_uri())
        browser.evaluate("1")  # the events of the page's scripts arrive before this answer
    finally:
        browser.close()
    methods = {error.get("type") or ("exception" if "exceptionDetails" in error else error["entry"]["source"])
               for error in page_errors(browser.events)}
    assert methods == {"error", "exception", "network"}, page_errors(browser.events)
    assert [url for url in requested_urls(browser.events) if not local(url)] == ["https://cdn.plot.ly/plotly.min.js"]


@needs_chromium
def test_every_plot_is_drawn_with_its_traces(browsed, compared):
    drawn = browsed.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => "
                             "[d.id, d.querySelectorAll('.main-svg').length, d.querySelectorAll('.trace, .hm image').length])")
    assert [plot_id for plot_id, *_ in drawn] == list(PLOT_IDS)
    assert all(svgs >= 2 and traces >= 1 for _, svgs, traces in drawn), drawn  # a heatmap draws an image
    methods = len(compared["result"]["reliability"])
    assert browsed.evaluate("document.getElementById('reliability').data.length") == 1 + 2 * methods


@needs_chromium
def test_hovering_a_bin_shows_its_count_accuracy_interval_and_confidence(browsed):
    text = browsed.evaluate("Plotly.Fx.hover('reliability', [{curveNumber: 1, pointNumber: 0}]);"
                            "document.querySelector('#reliability .hoverlayer').textContent")
    for word in ("count:", "accuracy:", "95% interval of the accuracy: [", "confidence:"):
        assert word in text, text


@needs_chromium
def test_the_menu_shows_one_method_alone(browsed, compared):
    names = list(compared["result"]["reliability"])
    shown = browsed.evaluate("(async () => { const d = document.getElementById('reliability');"
                             "await Plotly.restyle(d, d.layout.updatemenus[0].buttons[2].args[0]);"
                             "const names = d.data.filter(t => t.visible === true).map(t => t.name);"
                             "await Plotly.restyle(d, d.layout.updatemenus[0].buttons[0].args[0]); return names; })()")
    assert shown == ["perfect calibration", names[1], names[1]]


@needs_chromium
def test_the_screenshot_is_not_blank(browsed, tmp_path):
    from PIL import Image, ImageStat

    data = base64.b64decode(browsed.call("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "report.png").write_bytes(data)
    image = Image.open(io.BytesIO(data)).convert("L")
    assert image.size[0] == WINDOW[0] and image.size[1] > WINDOW[1] / 2  # the viewport: the window less its frame
    assert ImageStat.Stat(image).stddev[0] > 10 and len(image.getcolors(maxcolors=1 << 16) or []) > 50


# ----------------------------------------------------------------------------- hf-calibrate evaluate --report


@pytest.fixture(scope="module")
def evaluated(compared, tmp_path_factory):
    """A temperature scaling of the digits CNN fitted by the CLI, then ``evaluate --report`` on the test split."""
    root = tmp_path_factory.mktemp("evaluated")
    folder, page = root / "digits-ts", root / "digits-ts.html"
    fit = ["fit", "--model", str(compared["model"]), "--dataset", str(compared["data"]), "--split", "calibration",
           "--eval-split", "test", "--method", "temperature", "--bootstrap", "100", "--no-progress", "--output", str(folder)]
    assert main(fit) == 0
    evaluate = ["evaluate", "--model", str(folder), "--dataset", str(compared["data"]), "--split", "test",
                "--bootstrap", "100", "--no-progress", "--report", str(page)]
    assert main(evaluate) == 0
    return {"folder": folder, "report": page}


def test_evaluate_writes_the_before_after_as_a_signed_page(evaluated):
    page = evaluated["report"].read_text(encoding="utf-8")
    assert html_report.is_our_report(evaluated["report"])
    assert page.count("Plotly.newPlot(") == 2  # reliability and paired differences: no per-class data in an evaluation
    assert "temperature" in page and "uncalibrated" in page and "NLL − uncalibrated" in page


def test_an_evaluation_reads_as_two_rows_of_a_comparison(evaluated):
    """The rows hold the evaluation's own numbers: each side's metrics and bins, the paired difference calibrated −
    uncalibrated as the calibration's guard, and read the other way round as the worse row's difference to the best."""
    from hf_calibrate.results.evaluation_report import evaluation_as_comparison

    evaluation = json.loads((evaluated["folder"] / "calibration_config.json").read_text(encoding="utf-8"))["evaluation"]
    result = evaluation_as_comparison(evaluation, "temperature")
    rows = {row["name"]: row for row in result["rows"]}
    assert rows["temperature"]["versus_uncalibrated"] == {key: evaluation["difference"][key] for key in ("nll", "brier")}
    best, other = result["rows"]
    assert best["versus_best"] is None and best["metrics"]["nll"] <= other["metrics"]["nll"]
    difference = evaluation["difference"]["nll"]
    sign = 1 if other["name"] == "temperature" else -1
    assert other["versus_best"]["point"] == sign * difference["point"]
    assert sorted([other["versus_best"]["low"], other["versus_best"]["high"]]) == sorted(
        [sign * difference["low"], sign * difference["high"]])
    assert result["reliability"] == {"temperature": evaluation["reliability"]["calibrated"],
                                     "uncalibrated": evaluation["reliability"]["uncalibrated"]}
    verdicts = evaluation["verdicts"]
    assert rows["temperature"]["made_worse"] == [key for key in ("nll", "brier") if verdicts[key] == "made worse"]
    assert rows["temperature"]["improved"] == [key for key in ("nll", "brier") if verdicts[key] == "improved"]


def test_evaluate_report_refusals_name_the_fix(compared, evaluated, tmp_path, capsys):
    from hf_calibrate.results.evaluation_report import evaluation_as_comparison

    base = ["evaluate", "--dataset", str(compared["data"]), "--split", "test", "--no-progress"]
    assert main([*base, "--model", str(evaluated["folder"]), "--bootstrap", "0", "--report", str(tmp_path / "r.html")]) != 0
    assert "drop --bootstrap 0" in capsys.readouterr().err
    assert main([*base, "--model", str(compared["model"]), "--report", str(tmp_path / "r.html")]) != 0
    assert "--report needs an hf_calibrate calibration" in capsys.readouterr().err
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my notes</html>")
    assert main([*base, "--model", str(evaluated["folder"]), "--report", str(mine)]) != 0
    assert "hf_calibrate replaces only files it can prove it wrote" in capsys.readouterr().err
    assert mine.read_text() == "<html>my notes</html>" and not (tmp_path / "r.html").exists()
    evaluation = json.loads((evaluated["folder"] / "calibration_config.json").read_text(encoding="utf-8"))["evaluation"]
    with pytest.raises(ValueError, match="bootstrap > 0"):
        evaluation_as_comparison({**evaluation, "difference": {}}, "temperature")
    with pytest.raises(ValueError, match="a plain model's has no before/after"):
        evaluation_as_comparison({"uncalibrated": evaluation["uncalibrated"]}, "temperature")
    with pytest.raises(ValueError, match="name must be the calibration's method name"):
        evaluation_as_comparison(evaluation, "uncalibrated")


@needs_chromium
def test_the_evaluation_page_draws_offline_without_console_errors(evaluated, tmp_path):
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(evaluated["report"].resolve().as_uri())
        deadline = time.monotonic() + 30
        while browser.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length") < 4:
            assert time.monotonic() < deadline, "plotly did not draw both plots within 30 s"
            time.sleep(0.2)
    finally:
        browser.close()
    assert page_errors(browser.events) == []
    assert all(local(url) for url in requested_urls(browser.events))
