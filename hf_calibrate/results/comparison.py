"""Several calibrations of one base model, ranked on the same test data with paired intervals.

Every calibrated model scores the same samples under the same Poisson-bootstrap weights (each
sample keyed by its dataset index, one seed), so the difference between two methods has a
*paired* interval: replicate r resamples both alike, and the noise of the test set largely
cancels. :func:`compare` ranks the methods, and the uncalibrated base, by one metric — by default
the NLL, a proper score, which no over-confident fit can game the way it can a binned ECE; a row
whose paired difference to the best holds 0 is *tied* with it: this test set cannot tell them apart.
Whatever the ranking metric, each method's NLL and Brier score are also compared with the
uncalibrated base's (:data:`GUARD_METRICS`), and a method that makes either detectably worse (its
paired interval lies above 0) is flagged ``made_worse``: it left the model worse calibrated than no
calibration at all, even where it ranks well on ECE.

The JSON result::

    {"metric": "nll", "dataset": str, "split": str or None, "bootstrap": {...},
     "in_sample": [names of the models fitted on these very data (their rows are optimistic)],
     "rows": [{"name": str, "metrics": {metric: value}, "interval": interval of the metric,
               "versus_best": interval of metric(row) − metric(best) or None (the best row),
               "tied_with_best": bool,
               "versus_uncalibrated": {metric: interval of metric(row) − metric(uncalibrated)} for
                                      GUARD_METRICS (empty for the uncalibrated row),
               "made_worse": [the GUARD_METRICS made detectably worse]}, ...],   # best first
     "reliability": {name: ReliabilityBins.to_dict()}}        # uncalibrated first, then as given

:func:`write` saves it as ``comparison.json`` with two more keys: ``"written_by"`` (:data:`WRITTEN_BY`) and
``"files"``, {"comparison.md": [SHA-256], "comparison.png": [SHA-256]}, the digests of the files it wrote beside it:
the proof that lets a later write replace them (and only them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple, runtime_checkable

from .. import _auto_registration
from . import evaluation, reporting
from .._atomic import write_atomically, write_text_atomically
from .._output_files import digest_proof, refuse_unproven
from ..metrics import CalibrationMetrics, Interval, interval_report, verdict
from ..metrics.interval_options import MIN_INTERVAL_SAMPLES
from ..metrics.intervals import DEFAULT_CONFIDENCE, HIGHER_IS_BETTER, VERDICTS

#: the name of the base model's row
UNCALIBRATED = "uncalibrated"
#: the columns of :func:`markdown_table` beside the ranked metric
TABLE_METRICS = ("accuracy", "ece", "nll", "brier")
#: the ranking metric by default: a proper score
DEFAULT_METRIC = "nll"
#: proper scores every method is held against the uncalibrated base on, whatever the ranking metric
GUARD_METRICS = ("nll", "brier")


@runtime_checkable
class ComparedModel(Protocol):
    """What :func:`compare` asks of each model (:class:`hf_calibrate.CalibratedModel` is one): what it calibrates
    (``provenance["base_fingerprint"]``), whether it was fitted on the data, and its evaluation's accumulators on them
    (``own``: ``evaluate``'s keywords, ``options``: engine options; :func:`hf_calibrate.model_evaluation.accumulate`)."""

    provenance: Dict[str, Any]

    def fitted_on(self, data: Any) -> Optional[bool]: ...

    def _accumulate(
        self, data: Any, own: Dict[str, Any], options: Dict[str, Any]
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
    models: Dict[str, ComparedModel], data: Any, own: Dict[str, Any], options: Dict[str, Any]
) -> Dict[str, CalibrationMetrics]:
    """{name: calibrated accumulator} of every model, and the base's under :data:`UNCALIBRATED` (first)."""
    scored: Dict[str, CalibrationMetrics] = {}
    for name, model in models.items():
        uncalibrated, calibrated = model._accumulate(data, own, dict(options))
        scored.setdefault(UNCALIBRATED, uncalibrated)
        scored[name] = calibrated
    return scored


def _rows(scored: Dict[str, CalibrationMetrics], metric: str, confidence: float) -> List[Dict[str, Any]]:
    """The ranked rows: best first by ``metric``, each with its interval and paired difference to the best."""
    points = {name: evaluation.summarize_one(accumulator, names=[metric], confidence=confidence)
              for name, accumulator in scored.items()}
    higher_is_better = metric in HIGHER_IS_BETTER
    order = sorted(scored, key=lambda name: points[name][metric], reverse=higher_is_better)
    best = order[0]
    rows = []
    for name in order:
        versus: Optional[Interval] = None
        if name != best:
            versus = interval_report(scored[name], scored[best], metrics=[metric], confidence=confidence).difference[metric]
        guard = _versus_uncalibrated(scored, name, confidence)
        rows.append({
            "name": name,
            "metrics": {key: value for key, value in points[name].items() if key != "intervals"},
            "interval": points[name]["intervals"][metric],
            "versus_best": None if versus is None else versus.to_dict(),
            # no interval (every replicate empty, NaN ends) cannot tell the two apart either
            "tied_with_best": versus is None or not versus.excludes_zero,
            "versus_uncalibrated": {key: interval.to_dict() for key, interval in guard.items()},
            "made_worse": [key for key, interval in guard.items() if _made_worse(interval, points[name]["num_samples"])],
        })
    return rows


def _made_worse(difference: Interval, samples: float) -> bool:
    """Whether a paired difference row − uncalibrated says "made worse" (as an evaluation's verdict would: never below
    :data:`hf_calibrate.metrics.interval_options.MIN_INTERVAL_SAMPLES` test samples)."""
    return samples >= MIN_INTERVAL_SAMPLES and verdict(difference) == VERDICTS[1]


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
    **options: Any,
) -> Dict[str, Any]:
    """Rank calibrations of one base on labelled ``data`` by ``metric``, with paired bootstrap intervals.

    Args:
        models: {name: CalibratedModel}, all calibrations of the same base model.
        data: the test data, in any form :meth:`CalibratedModel.evaluate` takes.
        metric: the ranking metric, one of :data:`hf_calibrate.results.evaluation.INTERVAL_METRICS`
            (lower is better, accuracy higher); default ``"nll"``. Every row is also held against the
            uncalibrated base on NLL and Brier (``made_worse``), whatever the metric.
        n_bins, bootstrap: bins of the binned metrics; bootstrap replicates R ≥ 1 of the 95 % intervals.
        dataset_name, split: how the result names the data.
        **options: engine options of the evaluations (``batch_size``, ``seed``, ``progress``, ...).

    Returns:
        Plain JSON data (module docstring). Each model runs its own pass over ``data``.
    """
    models, metric = _check_models(models), _check_metric(metric)
    if not evaluation.check_bootstrap(bootstrap):
        raise ValueError(f"bootstrap must be >= {evaluation.MIN_BOOTSTRAP} for a comparison: its ranking rests on the paired "
                         "intervals.")
    own = {"n_bins": n_bins, "dataset_name": dataset_name, "split": split, "in_sample": None, "bootstrap": bootstrap}
    scored = _accumulators(models, data, own, options)
    first = next(iter(scored.values()))
    return {
        "metric": metric,
        "dataset": dataset_name or reporting.data_display_name(data),
        "split": split or reporting.data_split(data),
        "bootstrap": evaluation.bootstrap_settings(first),
        "in_sample": sorted(name for name, model in models.items() if model.fitted_on(data)),
        "rows": _rows(scored, metric, DEFAULT_CONFIDENCE),
        "reliability": {name: accumulator.reliability().to_dict() for name, accumulator in scored.items()},
    }


def _cells(row: Dict[str, Any], metric: str) -> Tuple[str, ...]:
    point = f"{row['metrics'][metric]:.4f} {reporting.interval_text(row['interval'])}"
    versus = row["versus_best"]
    difference = "best" if versus is None else f"{versus['point']:+.4f} {reporting.interval_text(versus, signed=True)}"
    others = tuple(f"{row['metrics'][key]:.4f}" for key in TABLE_METRICS if key != metric)
    return (row["name"], point, difference, "yes" if row["tied_with_best"] else "no", made_worse_text(row), *others)


def made_worse_text(row: Dict[str, Any]) -> str:
    """``"**made worse: NLL, Brier**"`` for a row that made a guard metric detectably worse than uncalibrated; else "–"."""
    worse = row.get("made_worse") or []
    return f"**made worse: {', '.join(reporting.METRIC_NAMES[key] for key in worse)}**" if worse else "–"


def markdown_table(result: Dict[str, Any]) -> str:
    """The ranking as a Markdown table, with what it was computed on and how to read the intervals."""
    metric = result["metric"]
    name = reporting.METRIC_NAMES[metric]
    others = [reporting.METRIC_NAMES[key] for key in TABLE_METRICS if key != metric]
    header = ["method", f"{name} [95% CI]", f"{name} − best [95% CI]", "tied with best", "vs uncalibrated", *others]
    samples = result["rows"][0]["metrics"]["num_samples"]
    bootstrap = result["bootstrap"]
    in_sample = result.get("in_sample") or []
    warning = ([f"**In-sample for {', '.join(in_sample)}**: these data are data they were fitted on, so their rows are "
                "optimistic and the ranking favours them. Rank on a split no fit used.", ""] if in_sample else [])
    lines = [
        *warning,
        f"Ranked by {name} on {reporting.data_label(result['dataset'], result['split'], samples)}; "
        f"{bootstrap['confidence']:.0%} Poisson-bootstrap intervals ({bootstrap['replicates']} replicates, seed "
        f"{bootstrap['seed']}), paired across methods: a method whose difference to the best holds 0 is tied with it. "
        f"'made worse' marks a method whose {' or '.join(reporting.METRIC_NAMES[key] for key in GUARD_METRICS)} is "
        "detectably worse than the uncalibrated model's: it left the model worse calibrated than no calibration.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_cells(row, metric)) + " |" for row in result["rows"]),
    ]
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
    (:mod:`hf_calibrate._output_files`); links are never written through."""
    markdown, record, diagram = (folder / name for name in FILES)
    digests = recorded_digests(record) or {}
    refuse_unproven({
        markdown: digest_proof(digests.get(markdown.name, [])),
        record: lambda path: recorded_digests(path) is not None,
        diagram: digest_proof(digests.get(diagram.name, [])),
    }, instead="write the comparison to another folder")


def write(result: Dict[str, Any], table: str, folder: Path) -> None:
    """``comparison.md`` (``table``), ``comparison.json`` (``result``, with the SHA-256 of the other two files) and
    ``comparison.png`` (every row's reliability diagram side by side, uncalibrated first) into ``folder``.

    Refuses (FileExistsError, before writing anything) to replace a file it cannot prove it wrote (:func:`check_folder`).
    Each file is written atomically; comparison.json lists the earlier and the new digests while the others are
    replaced, so a write killed midway leaves every file proven for the next one.
    """
    from .plotting import compare_reliability_diagrams, png_bytes

    check_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    markdown, record, diagram = (folder / name for name in FILES)
    title = f"Reliability on {reporting.data_label(result['dataset'], result['split'])}"
    contents = {markdown.name: table.encode("utf-8"),
                diagram.name: png_bytes(compare_reliability_diagrams(result["reliability"], title=title))}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    earlier = recorded_digests(record) or {}
    during = {name: list(dict.fromkeys([*earlier.get(name, []), digest])) for name, digest in digests.items()}
    _write_record(record, result, during)  # a write killed below leaves each file a version listed here
    for name, data in contents.items():
        write_atomically(folder / name, lambda stream, data=data: stream.write(data))
    _write_record(record, result, {name: [digest] for name, digest in digests.items()})


def _write_record(path: Path, result: Dict[str, Any], digests: Dict[str, List[str]]) -> None:
    """comparison.json: ``result``, the marker :data:`WRITTEN_BY` and ``files``, {file name: SHA-256 digests}."""
    write_text_atomically(path, json.dumps({**result, "written_by": WRITTEN_BY, "files": digests}, indent=2) + "\n")


_auto_registration.finish_pending(__name__)  # when importing this module brought transformers in first
