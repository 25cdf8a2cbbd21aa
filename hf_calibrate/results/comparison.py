"""Several calibrations of one base model, ranked on the same test data with paired intervals.

Every calibrated model scores the same samples under the same Poisson-bootstrap weights (each
sample keyed by its dataset index, one seed), so the difference between two methods has a
*paired* interval: replicate r resamples both alike, and the noise of the test set largely
cancels. :func:`compare` ranks the methods, and the uncalibrated base, by one metric — by default
the NLL, a proper score, which no over-confident fit can game the way it can a binned ECE; a row
whose paired difference to the best holds 0 is *tied* with it: this test set cannot tell them apart.
Whatever the ranking metric, each method's NLL and Brier score are also compared with the
uncalibrated base's (:data:`GUARD_METRICS`): a method whose paired interval of either lies wholly on
the better side of 0 ``improved`` it, one whose interval lies wholly on the worse side ``made_worse``
it (it left the model worse calibrated than no calibration at all, even where it ranks well on ECE),
and an interval that holds 0 is no detectable difference (:func:`guard_verdict`).

The JSON result::

    {"metric": "nll", "dataset": str, "split": str or None, "bootstrap": {...},
     "in_sample": [names of the models fitted on these very data (their rows are optimistic)],
     "rows": [{"name": str, "metrics": {metric: value}, "interval": interval of the metric,
               "versus_best": interval of metric(row) − metric(best) or None (the best row),
               "tied_with_best": bool,
               "versus_uncalibrated": {metric: interval of metric(row) − metric(uncalibrated)} for
                                      GUARD_METRICS (empty for the uncalibrated row),
               "improved": [the GUARD_METRICS made detectably better],
               "made_worse": [the GUARD_METRICS made detectably worse],
               "verdict": "made worse" (any made worse), "improved" (else any improved), "no detectable
                          difference" (neither), or None (the uncalibrated row),
               "fit_seconds": wall time of the method's fit in seconds, or None (the uncalibrated row, or a
                              fit compare was not told the time of)}, ...],   # best first
     "reliability": {name: ReliabilityBins.to_dict()},        # uncalibrated first, then as given
     "classes": {name: report_data.per_class_calibration(...)},  # each class's classwise-ECE term, as reliability
     "auto": {name: its fit_summary["auto"]} for the models method="auto" fitted}   # auto's decision

:func:`write` saves it as ``comparison.json`` with two more keys: ``"written_by"`` (:data:`WRITTEN_BY`) and
``"files"``, {"comparison.md": [SHA-256], "comparison.png": [SHA-256]}, the digests of the files it wrote beside it:
the proof that lets a later write replace them (and only them).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Tuple, runtime_checkable

from . import evaluation, reporting
from .html_report import REPORT_FILE, is_our_report
from .report_data import auto_decisions, per_class_calibration
from .._atomic import write_atomically, write_text_atomically
from .._output_files import digest_proof, refuse_unproven
from ..data.identity import data_display_name, data_split
from ..metrics import CalibrationMetrics, Interval, interval_report, verdict
from ..metrics.interval_options import MIN_INTERVAL_SAMPLES
from ..metrics.intervals import DEFAULT_CONFIDENCE, HIGHER_IS_BETTER, VERDICTS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the name of the base model's row
UNCALIBRATED = "uncalibrated"
#: the columns of :func:`markdown_table` beside the ranked metric
TABLE_METRICS = ("accuracy", "ece", "nll", "brier")
#: the ranking metric by default: a proper score
DEFAULT_METRIC = "nll"
#: proper scores every method is held against the uncalibrated base on, whatever the ranking metric
GUARD_METRICS = ("nll", "brier")
#: a method's verdict against the uncalibrated base on a guard metric: its paired interval lies wholly on the better
#: side of 0, wholly on the worse side, or holds 0 (or there is none)
IMPROVED, MADE_WORSE, NO_DIFFERENCE = VERDICTS[0], VERDICTS[1], "no detectable difference"


@runtime_checkable
class ComparedModel(Protocol):
    """What :func:`compare` asks of each model (:class:`hf_calibrate.CalibratedModel` is one): what it calibrates
    (``provenance["base_fingerprint"]``), whether it was fitted on the data, and its evaluation's accumulators on them
    (``keywords``: ``evaluate``'s own, ``options``: engine options; :func:`hf_calibrate.model_evaluation.accumulate`)."""

    provenance: Dict[str, Any]

    def fitted_on(self, data: Any) -> Optional[bool]: ...

    def _accumulate(
        self, data: Any, keywords: evaluation.EvaluationKeywords, options: Dict[str, Any]
    ) -> Tuple[CalibrationMetrics, CalibrationMetrics]: ...


def _check_models(models: Any) -> Dict[str, ComparedModel]:
    """A non-empty {name: CalibratedModel} of one base (the same weights fingerprint)."""
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty mapping of name -> CalibratedModel, e.g. {'temperature': ts, ...}.")
    for name, model in models.items():
        if not isinstance(name, str) or not name or name == UNCALIBRATED:
            raise ValueError(f"model names must be non-empty strings other than {UNCALIBRATED!r}, got {name!r}.")
        if not isinstance(model, ComparedModel):
            raise ValueError(f"models[{name!r}] must be a CalibratedModel, got {type(model).__name__}.")
    fingerprints = {name: model.provenance.get("base_fingerprint") for name, model in models.items()}
    if len(set(fingerprints.values())) > 1:
        raise ValueError(
            f"the models calibrate different base models (weights fingerprints {fingerprints}); compare calibrations "
            "of one base, so that their 'uncalibrated' row and paired differences mean something."
        )
    return dict(models)


def _check_metric(metric: Any) -> str:
    if metric not in evaluation.INTERVAL_METRICS:
        raise ValueError(f"metric must be one of {list(evaluation.INTERVAL_METRICS)} (it needs intervals), got {metric!r}.")
    return metric


def _accumulators(
    models: Dict[str, ComparedModel], data: Any, keywords: evaluation.EvaluationKeywords, options: Dict[str, Any]
) -> Dict[str, CalibrationMetrics]:
    """{name: calibrated accumulator} of every model, and the base's under :data:`UNCALIBRATED` (first)."""
    scored: Dict[str, CalibrationMetrics] = {}
    for name, model in models.items():
        uncalibrated, calibrated = model._accumulate(data, keywords, dict(options))
        scored.setdefault(UNCALIBRATED, uncalibrated)
        scored[name] = calibrated
    return scored


def _check_fit_seconds(fit_seconds: Any, models: Mapping[str, Any]) -> Dict[str, float]:
    """``fit_seconds`` checked: {name of one of ``models``: seconds ≥ 0} (empty for None)."""
    if fit_seconds is None:
        return {}
    if not isinstance(fit_seconds, Mapping):
        raise ValueError(f"fit_seconds must be a mapping of model name -> seconds, got {type(fit_seconds).__name__}.")
    unknown = sorted(str(name) for name in fit_seconds if name not in models)
    if unknown:
        raise ValueError(f"fit_seconds names models that models does not hold: {unknown}; key it by the names of models "
                         f"({list(models)}).")
    for name, seconds in fit_seconds.items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
            raise ValueError(f"fit_seconds[{name!r}] must be a finite number of seconds >= 0, got {seconds!r}.")
    return {name: float(seconds) for name, seconds in fit_seconds.items()}


def _rows(scored: Dict[str, CalibrationMetrics], metric: str, confidence: float,
          fit_seconds: Dict[str, float]) -> List[Dict[str, Any]]:
    """The ranked rows: best first by ``metric``, each with its interval, paired difference to the best, verdict
    against the uncalibrated base and fit time (None where ``fit_seconds`` has none)."""
    points = {name: evaluation.summarize_one(accumulator, names=[metric], confidence=confidence)
              for name, accumulator in scored.items()}
    sign = -1 if metric in HIGHER_IS_BETTER else 1
    # equal scores keep their order, but the uncalibrated base goes after the methods it ties with: a calibration that
    # kept the argmax ties it on accuracy, and "best" should name a method the user can pick
    order = sorted(scored, key=lambda name: (sign * points[name][metric], name == UNCALIBRATED))
    best = order[0]
    rows = []
    for name in order:
        versus: Optional[Interval] = None
        if name != best:
            versus = interval_report(scored[name], scored[best], metrics=[metric], confidence=confidence).difference[metric]
        guard = _versus_uncalibrated(scored, name, confidence)
        verdicts = {key: guard_verdict(interval, points[name]["num_samples"], key) for key, interval in guard.items()}
        rows.append({
            "name": name,
            "metrics": {key: value for key, value in points[name].items() if key != "intervals"},
            "interval": points[name]["intervals"][metric],
            "versus_best": None if versus is None else versus.to_dict(),
            # no interval (every replicate empty, NaN ends) cannot tell the two apart either
            "tied_with_best": versus is None or not versus.excludes_zero,
            "versus_uncalibrated": {key: interval.to_dict() for key, interval in guard.items()},
            **_verdict_fields(verdicts),
            "fit_seconds": fit_seconds.get(name),
        })
    return rows


def guard_verdict(difference: Interval, samples: float, metric: str) -> str:
    """What a paired difference metric(row) − metric(uncalibrated) says: :data:`IMPROVED` when its interval lies wholly
    on the better side of 0 (below it; above it for a metric where higher is better), :data:`MADE_WORSE` wholly on the
    worse side, else :data:`NO_DIFFERENCE` — as an evaluation's verdict would, never a change below
    :data:`hf_calibrate.metrics.interval_options.MIN_INTERVAL_SAMPLES` test samples (``samples``).

    Example:
        >>> better = Interval(point=-0.02, low=-0.03, high=-0.01, confidence=0.95, replicates=1000, seed=0)
        >>> guard_verdict(better, 450, "nll"), guard_verdict(better, 450, "accuracy"), guard_verdict(better, 20, "nll")
        ('improved', 'made worse', 'no detectable difference')
    """
    said = verdict(difference, lower_is_better=metric not in HIGHER_IS_BETTER)
    return said if samples >= MIN_INTERVAL_SAMPLES and said in (IMPROVED, MADE_WORSE) else NO_DIFFERENCE


def _verdict_fields(verdicts: Dict[str, str]) -> Dict[str, Any]:
    """A row's ``improved``, ``made_worse`` and ``verdict`` from {guard metric: :func:`guard_verdict`} (none: the base's)."""
    improved = [key for key, said in verdicts.items() if said == IMPROVED]
    worse = [key for key, said in verdicts.items() if said == MADE_WORSE]
    overall = (MADE_WORSE if worse else IMPROVED if improved else NO_DIFFERENCE) if verdicts else None
    return {"improved": improved, "made_worse": worse, "verdict": overall}


def _versus_uncalibrated(scored: Dict[str, CalibrationMetrics], name: str, confidence: float) -> Dict[str, Interval]:
    """{metric: paired interval of metric(name) − metric(uncalibrated)} for :data:`GUARD_METRICS` (none for the base)."""
    if name == UNCALIBRATED:
        return {}
    report = interval_report(scored[name], scored[UNCALIBRATED], metrics=list(GUARD_METRICS), confidence=confidence)
    return {key: report.difference[key] for key in GUARD_METRICS}


def compare(
    models: Mapping[str, Any],
    data: Any,
    *,
    metric: str = DEFAULT_METRIC,
    n_bins: int = 15,
    bootstrap: int = evaluation.DEFAULT_BOOTSTRAP,
    dataset_name: Optional[str] = None,
    split: Optional[str] = None,
    fit_seconds: Optional[Mapping[str, float]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """Rank calibrations of one base on labelled ``data`` by ``metric``, with paired bootstrap intervals.

    Args:
        models: {name: CalibratedModel}, all calibrations of the same base model.
        data: the test data, in any form :meth:`CalibratedModel.evaluate` takes.
        metric: the ranking metric, one of :data:`hf_calibrate.results.evaluation.INTERVAL_METRICS`
            (lower is better, accuracy higher); default ``"nll"``. Every row is also held against the
            uncalibrated base on NLL and Brier (``verdict``), whatever the metric.
        n_bins, bootstrap: bins of the binned metrics; bootstrap replicates R ≥ 1 of the 95 % intervals.
        dataset_name, split: how the result names the data.
        fit_seconds: {name: wall time of that model's fit, in seconds}, as the caller measured it (the CLI times each
            fit); the rows of models it leaves out, and the uncalibrated row, have ``fit_seconds`` None.
        **options: engine options of the evaluations (``batch_size``, ``seed``, ``progress``, ...).

    Returns:
        Plain JSON data (module docstring). Each model runs its own pass over ``data``.
    """
    models, metric = _check_models(models), _check_metric(metric)
    seconds = _check_fit_seconds(fit_seconds, models)
    if not evaluation.check_bootstrap(bootstrap):
        raise ValueError(f"bootstrap must be >= {evaluation.MIN_BOOTSTRAP} for a comparison: its ranking rests on the paired "
                         "intervals.")
    keywords = evaluation.EvaluationKeywords(n_bins=n_bins, dataset_name=dataset_name, split=split, bootstrap=bootstrap)
    scored = _accumulators(models, data, keywords, options)
    first = next(iter(scored.values()))
    return {
        "metric": metric,
        "dataset": dataset_name or data_display_name(data),
        "split": split or data_split(data),
        "bootstrap": evaluation.bootstrap_settings(first),
        "in_sample": sorted(name for name, model in models.items() if model.fitted_on(data)),
        "rows": _rows(scored, metric, DEFAULT_CONFIDENCE, seconds),
        "reliability": {name: accumulator.reliability().to_dict() for name, accumulator in scored.items()},
        "classes": {name: per_class_calibration(accumulator) for name, accumulator in scored.items()},
        "auto": auto_decisions(models),
    }


def _cells(row: Dict[str, Any], metric: str) -> Tuple[str, ...]:
    point = f"{row['metrics'][metric]:.4f} {reporting.interval_text(row['interval'])}"
    versus = row["versus_best"]
    difference = "best" if versus is None else f"{versus['point']:+.4f} {reporting.interval_text(versus, signed=True)}"
    others = tuple(f"{row['metrics'][key]:.4f}" for key in TABLE_METRICS if key != metric)
    return (row["name"], point, difference, "yes" if row["tied_with_best"] else "no", verdict_text(row), *others,
            reporting.fit_time_text(row.get("fit_seconds")))


def verdict_text(row: Dict[str, Any]) -> str:
    """The "vs uncalibrated" cell: ``"improved: NLL, Brier"``, ``"**made worse: NLL**"`` (and ``"; improved: Brier"``
    where the other improved), ``"no detectable difference"``, or "–" for the uncalibrated row."""
    if row.get("verdict") is None:
        return "–"

    def named(keys: List[str]) -> str:
        return ", ".join(reporting.METRIC_NAMES[key] for key in keys)

    improved, worse = row.get("improved") or [], row.get("made_worse") or []
    parts = ([f"**{MADE_WORSE}: {named(worse)}**"] if worse else []) + ([f"{IMPROVED}: {named(improved)}"] if improved else [])
    return "; ".join(parts) or NO_DIFFERENCE


def markdown_table(result: Dict[str, Any], report: Optional[str] = None) -> str:
    """The ranking as a Markdown table, with what it was computed on and how to read the intervals; ``report``: the
    file name of the HTML report written beside it, linked under the table (None: no link)."""
    metric = result["metric"]
    name = reporting.METRIC_NAMES[metric]
    others = [reporting.METRIC_NAMES[key] for key in TABLE_METRICS if key != metric]
    header = ["method", f"{name} [95% CI]", f"{name} − best [95% CI]", "tied with best", "vs uncalibrated", *others,
              "fit time"]
    samples = result["rows"][0]["metrics"]["num_samples"]
    guards = " and ".join(reporting.METRIC_NAMES[key] for key in GUARD_METRICS)
    bootstrap = result["bootstrap"]
    in_sample = result.get("in_sample") or []
    warning = ([f"**In-sample for {', '.join(in_sample)}**: these data are data they were fitted on, so their rows are "
                "optimistic and the ranking favours them. Rank on a split no fit used.", ""] if in_sample else [])
    lines = [
        *warning,
        f"Ranked by {name} on {reporting.data_label(result['dataset'], result['split'], samples)}; "
        f"{bootstrap['confidence']:.0%} Poisson-bootstrap intervals ({bootstrap['replicates']} replicates, seed "
        f"{bootstrap['seed']}), paired across methods: a method whose difference to the best holds 0 is tied with it. "
        f"'vs uncalibrated' reads the paired difference of each method's {guards} to the uncalibrated model's: "
        f"'{IMPROVED}' where its interval lies below 0, '{MADE_WORSE}' where it lies above 0 (the method left the "
        f"model worse calibrated than no calibration), '{NO_DIFFERENCE}' where it holds 0. 'fit time' is the wall "
        "time of each method's fit, its pass of the base model over the calibration data included ('–': not measured).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_cells(row, metric)) + " |" for row in result["rows"]),
    ]
    if report:
        lines += ["", f"Explore the reliability diagrams, per-class calibration and paired differences in [{report}]({report}) "
                      "(a page that opens offline in a browser)."]
    return "\n".join(lines) + "\n"


#: the files :func:`write` writes into its folder
FILES = ("comparison.md", "comparison.json", "comparison.png")
#: comparison.json's marker of a record :func:`write` wrote (its ``files`` proves which of the other files are ours)
WRITTEN_BY = "hf_calibrate.results.comparison.write"


def recorded_digests(record: Path) -> Optional[Dict[str, List[str]]]:
    """``files`` of a comparison.json :func:`write` wrote: {file name: the SHA-256 digests of the versions it wrote};
    None for any other entry (missing, a link, a user's file, unreadable)."""
    if record.is_symlink() or not record.is_file():
        return None
    try:
        content = json.loads(record.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    files = content.get("files") if isinstance(content, dict) and content.get("written_by") == WRITTEN_BY else None
    lists = isinstance(files, dict) and all(isinstance(digests, list) for digests in files.values())
    return files if lists and all(isinstance(digest, str) for digests in files.values() for digest in digests) else None


def check_folder(folder: Path) -> None:
    """Raise FileExistsError naming each file of :data:`FILES` in ``folder`` that :func:`write` would replace but
    cannot prove it wrote: comparison.json by its marker and ``files``, the others by the digests it lists
    (:mod:`hf_calibrate._output_files`), and the HTML report :func:`.html_report.write_comparison_report` writes
    beside them (comparison.html) by its own last line; links are never written through."""
    markdown, record, picture = (folder / name for name in FILES)
    digests = recorded_digests(record) or {}
    refuse_unproven({
        markdown: digest_proof(digests.get(markdown.name, [])),
        record: lambda path: recorded_digests(path) is not None,
        picture: digest_proof(digests.get(picture.name, [])),
        folder / REPORT_FILE: is_our_report,  # the HTML report carries its own proof (html_report)
    }, instead="write the comparison to another folder")


def write(result: Dict[str, Any], table: str, folder: Path) -> None:
    """``comparison.md`` (``table``), ``comparison.json`` (``result``, with the SHA-256 of the other two files) and
    ``comparison.png`` (every row's reliability diagram in the table's order, :func:`diagram`) into ``folder``.

    Refuses (FileExistsError, before writing anything) to replace a file it cannot prove it wrote (:func:`check_folder`).
    Each file is written atomically; comparison.json lists the earlier and the new digests while the others are
    replaced, so a write killed midway leaves every file proven for the next one.
    """
    from .plotting import png_bytes

    check_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    markdown, record, picture = (folder / name for name in FILES)
    contents = {markdown.name: table.encode("utf-8"), picture.name: png_bytes(diagram(result))}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    earlier = recorded_digests(record) or {}
    during = {name: list(dict.fromkeys([*earlier.get(name, []), digest])) for name, digest in digests.items()}
    _write_record(record, result, during)  # a write killed below leaves each file a version listed here
    for name, data in contents.items():
        write_atomically(folder / name, lambda stream, data=data: stream.write(data))
    _write_record(record, result, {name: [digest] for name, digest in digests.items()})


def diagram(result: Dict[str, Any]) -> "Figure":
    """comparison.png's figure: each row's reliability diagram in the ranking's order (the table's), titled with its
    rank and name, over its ranking metric with its 95 % interval (``"1. vector"``, ``"NLL 0.0411 [0.0147, 0.0788]"``),
    in rows of at most :data:`hf_calibrate.results.plotting.MAX_COLUMNS` panels."""
    from .plotting import compare_reliability_diagrams

    metric = reporting.METRIC_NAMES[result["metric"]]
    panels, captions = {}, {}
    for rank, row in enumerate(result["rows"], start=1):
        title = f"{rank}. {row['name']}"
        panels[title] = result["reliability"][row["name"]]
        captions[title] = f"{metric} {row['metrics'][result['metric']]:.4f} {reporting.interval_text(row['interval'])}".rstrip()
    title = f"Reliability on {reporting.data_label(result['dataset'], result['split'])}, ranked by {metric}"
    return compare_reliability_diagrams(panels, title=title, captions=captions)


def _write_record(path: Path, result: Dict[str, Any], digests: Dict[str, List[str]]) -> None:
    """comparison.json: ``result``, the marker :data:`WRITTEN_BY` and ``files``, {file name: SHA-256 digests}."""
    write_text_atomically(path, json.dumps({**result, "written_by": WRITTEN_BY, "files": digests}, indent=2) + "\n")
