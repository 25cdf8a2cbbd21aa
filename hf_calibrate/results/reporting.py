"""What results were computed on, said in one place, so the model card, the reliability diagram, the CLI
and the warnings of ``fit`` say the same.

An *evaluation* (a :meth:`CalibratedModel.evaluate` result, or the ``evaluation`` entry of a
calibration record) names what it was computed on and what the calibration was fitted on:

``dataset``, ``split``
    the evaluation data's display name and split (the split may be None);
``in_sample``
    True when the evaluation data are or hold data the calibration was fitted on (its calibration,
    validation or temperature data): such numbers are optimistic; None when that is unknown;
``in_sample_rows``
    when in-sample, ``{"calibration": rows that are, "total": rows}`` (absent or None: not counted);
``calibration_dataset``, ``calibration_split``
    the display name and split of the calibration data.

How data are named and recognised (display names, splits, fingerprints, whether they are calibration rows) is
:mod:`hf_calibrate.data.identity` and :mod:`hf_calibrate.data.calibration_rows`; this module says it in words.
"""

from __future__ import annotations

from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence


from ..metrics.catalog import CARD_METRICS, METRIC_CATALOG

#: (key in a metrics dict, title) of the metrics the card shows before and after calibration, in the order results
#: show them (from :data:`hf_calibrate.metrics.catalog.METRIC_CATALOG`)
METRICS = tuple((info.key, info.title) for info in CARD_METRICS)
#: key → title of every metric of the catalog
METRIC_NAMES = {info.key: info.title for info in METRIC_CATALOG}
#: splits taken, in this order, as held-out evaluation data when none is named
HELD_OUT_SPLITS = ("test", "validation", "eval", "evaluation", "dev")
IN_SAMPLE_NOTE = "in-sample: data the calibration was fitted on, so optimistic"
UNKNOWN_SAMPLE_NOTE = "in-sample not checked: whether these are data the calibration was fitted on is unknown"
FALLBACK_SAVED = "The saved model is this temperature scaling."
#: how to lengthen each Neural Clamping optimiser's schedule, as options of ``fit`` and of ``hf-calibrate fit``
SCHEDULE_OPTIONS = {"sgd": ("options epochs, lr", "--option epochs=N, --option lr=X"),
                    "lbfgs": ("options max_iterations (with patience as large), or ridge=[0.03, 0.1, 0.3] to choose among",
                              "--option max_iterations=N, --option 'ridge=[0.03, 0.1, 0.3]'")}


def fallback_advice(summary: Mapping[str, Any], cli: bool = False) -> str:
    """What to try when Neural Clamping fell back to TS, for the fit's optimiser (``cli``: in ``hf-calibrate fit``'s terms)."""
    api, command = SCHEDULE_OPTIONS["lbfgs" if summary.get("optimizer") == "lbfgs" else "sgd"]
    if cli:
        return (f"To get a δ that helps, try more calibration data or --validation-split, a longer schedule ({command}), "
                "or --method temperature, which fits this same model directly.")
    return (f"To get a δ that helps, try more calibration data or a separate validation split, a longer schedule ({api}) "
            "or another select_metric; or use the method 'temperature', which fits this same model directly.")


# ----------------------------------------------------------------------------- names of data


def data_label(name: str, split: Optional[str], samples: Optional[int] = None) -> str:
    """``"digits, test split, 450 samples"``: a dataset's display name, split and size, as results show them."""
    parts = [name, *([f"{split} split"] if split else []), *([f"{samples} samples"] if samples is not None else [])]
    return ", ".join(parts)


def held_out_split(available: Sequence[str], used: Collection[str]) -> Optional[str]:
    """The first of :data:`HELD_OUT_SPLITS` in ``available`` that the fit does not use, or None."""
    return next((name for name in HELD_OUT_SPLITS if name in available and name not in used), None)


# ----------------------------------------------------------------------------- labels of evaluations


def _samples(evaluation: Mapping[str, Any]) -> Optional[int]:
    side = evaluation.get("calibrated") or evaluation.get("uncalibrated") or {}
    return side.get("num_samples")


def evaluated_on(evaluation: Mapping[str, Any]) -> str:
    """What ``evaluation`` was computed on, in words: ``"digits, test split, 450 samples"``."""
    return data_label(evaluation["dataset"], evaluation.get("split"), _samples(evaluation))


def evaluation_label(evaluation: Mapping[str, Any]) -> str:
    """:func:`evaluated_on`, marked as in-sample when it is, or as unknown when that could not be told (how the CLI's
    output names an evaluation)."""
    label, note = evaluated_on(evaluation), sample_note(evaluation)
    return f"{label} ({note})" if note else label


def sample_note(evaluation: Mapping[str, Any]) -> Optional[str]:
    """What results say of whether ``evaluation``'s data are calibration data: :func:`in_sample_note` when they are,
    :data:`UNKNOWN_SAMPLE_NOTE` when that could not be checked (``in_sample`` None), else None (held out)."""
    if _not_checked(evaluation):
        return UNKNOWN_SAMPLE_NOTE
    return in_sample_note(evaluation) if evaluation.get("in_sample") else None


def _not_checked(evaluation: Mapping[str, Any]) -> bool:
    """Whether it could not be checked if ``evaluation``'s data are calibration data (``in_sample`` given, None);
    records saved before ``in_sample`` existed lack the key, and are not unchecked."""
    return "in_sample" in evaluation and evaluation["in_sample"] is None


def in_sample_note(evaluation: Mapping[str, Any]) -> str:
    """:data:`IN_SAMPLE_NOTE`, or, when only some rows of the data are calibration rows, how many:
    ``"partly in-sample: 30 of 150 rows are data the calibration was fitted on, so optimistic"``."""
    part = _in_sample_part(evaluation)
    return f"partly in-sample: {part} are data the calibration was fitted on, so optimistic" if part else IN_SAMPLE_NOTE


def _in_sample_part(evaluation: Mapping[str, Any]) -> Optional[str]:
    """``"30 of 150 rows"`` when only some rows of the evaluated data are calibration rows (``in_sample_rows``), else None."""
    rows = evaluation.get("in_sample_rows")
    return f"{rows['calibration']} of {rows['total']} rows" if rows and rows["calibration"] < rows["total"] else None


def calibration_label(evaluation: Mapping[str, Any]) -> Optional[str]:
    """What the evaluated calibration was fitted on, in words (None when the evaluation does not say)."""
    name = evaluation.get("calibration_dataset")
    return data_label(name, evaluation.get("calibration_split")) if name else None


def in_sample_warning(evaluation: Mapping[str, Any], available_splits: Sequence[str]) -> Optional[str]:
    """The command line's warning about in-sample results, and what to do (None when they are not in-sample)."""
    if not evaluation.get("in_sample"):
        return None
    part, split = _in_sample_part(evaluation), evaluation.get("split")
    what = f"partly in-sample: {part} of the split {split!r} are" if part else f"in-sample: the split {split!r} is"
    fix = "Drop those rows (the same content is in both splits), or evaluate" if part else "Evaluate"
    return (
        f"these results are {what} data the calibration was fitted on, so they are optimistic. {fix} on a split the "
        f"fit did not use (the dataset's splits: {list(available_splits)}), with --eval-split SPLIT for fit or --split "
        "SPLIT for evaluate."
    )


def model_index_dataset_name(evaluation: Mapping[str, Any]) -> str:
    """The model-index ``dataset.name`` of ``evaluation``: its display name, marked as calibration data when in-sample,
    and as not checked when that is unknown (a leaderboard would otherwise take it for held-out data)."""
    name, part = evaluation["dataset"], _in_sample_part(evaluation)
    if part:
        return f"{name} (partly in-sample: {part} are calibration data)"
    if _not_checked(evaluation):
        return f"{name} (in-sample not checked)"
    return f"{name} (in-sample: the calibration data)" if evaluation.get("in_sample") else name


def completed_evaluation(evaluation: Mapping[str, Any], fit: Mapping[str, Any]) -> Dict[str, Any]:
    """``evaluation`` with the keys records saved before they existed lack, read off the record's ``fit``.

    Such an evaluation counts as in-sample when it names the split the calibration was fitted on.
    """
    completed = dict(evaluation)
    completed.setdefault("calibration_dataset", fit.get("dataset_name") or fit.get("dataset"))
    completed.setdefault("calibration_split", fit.get("split"))
    if "in_sample" not in completed:
        split = completed.get("split")
        completed["in_sample"] = bool(split) and split == completed["calibration_split"]
    return completed


# ----------------------------------------------------------------------------- Neural Clamping's fallback


def fallback_note(summary: Mapping[str, Any], select_metric: str) -> Optional[str]:
    """The sentence saying a Neural Clamping fit that selected on ``select_metric`` fell back to temperature
    scaling (None when it did not)."""
    if not summary.get("fell_back_to_temperature_scaling"):
        return None
    scaling = summary.get("temperature_scaling") or {}
    baseline = scaling.get(f"holdout_{select_metric}")
    temperature = scaling.get("fallback_temperature", scaling.get("temperature"))
    score = f", held-out {select_metric} {baseline:.4f} for temperature scaling" if baseline is not None else ""
    return (
        f"Neural Clamping's δ did not beat temperature scaling on the held-out selection data "
        f"({summary.get('holdout_samples')} samples{score}), so the fitted model is plain temperature scaling: "
        f"δ = 0, T = {temperature:.4f}."
    )


# ----------------------------------------------------------------------------- what a fit learnt


def fitted_text(method: str, summary: Mapping[str, Any]) -> Optional[str]:
    """What a fit of ``method`` learnt, in words, from its ``fit_summary``: the temperature T, δ's L2 norm, a linear
    map's l2 pull towards temperature scaling, a binning method's prior (None when the summary does not say)."""
    if summary.get("fell_back_to_temperature_scaling"):
        scaling = summary.get("temperature_scaling") or {}
        temperature = scaling.get("fallback_temperature", scaling.get("temperature"))
        return None if temperature is None else f"T = {temperature:.4g}, δ = 0 (fell back to temperature scaling)"
    selected = summary.get("selected") or {}
    if method == "neural_clamping" and "temperature" in selected:
        return f"T = {selected['temperature']:.4g}, ‖δ‖₂ = {selected['delta_norm']:.4g}"
    if "epsilon" in summary and summary.get("temperature") is not None:  # structured vector / matrix scaling
        what = "a linear map" if method == "structured_matrix" else "per-class scales and biases"
        return (f"{what} on temperature scaling's log-probabilities (T = {summary['temperature']:.4g}, "
                f"uniform mixture ε = {summary['epsilon']:.3g}), ridge l2 = {summary['l2']:g}")
    if "l2" in summary and summary.get("temperature") is not None:
        if summary["l2"] is None:
            return f"temperature scaling itself (its cross-fitted l2 choice), T = {summary['temperature']:.4g}"
        return f"pulled towards temperature scaling (T = {summary['temperature']:.4g}) with l2 = {summary['l2']:g}"
    if "prior" in summary:
        prior = summary["prior"]
        return ("prior m = ∞: the values are temperature scaling's probabilities, averaged per bin or block" if prior is None
                else f"prior m = {prior:g} pseudo-samples centred on temperature scaling's probability")
    if method == "temperature" and summary.get("temperature") is not None:
        return f"T = {summary['temperature']:.4g}"
    return None


# ----------------------------------------------------------------------------- method="auto"'s choice


def auto_note(summary: Mapping[str, Any]) -> Optional[str]:
    """The sentences saying which method ``method="auto"`` chose and why, how the chosen one was scored when not on
    auto's folds, and Neural Clamping's time estimate against the budget (None when the fit was not ``auto``)."""
    choice = summary.get("auto")
    if not choice:
        return None
    chosen = next((row for row in choice["candidates"] if row["method"] == choice["chosen"]), {})
    scored_by = chosen.get("scored_by")
    how = "held-out NLL" if scored_by else f"{choice['folds']}-fold cross-fitted NLL"
    note = f"auto chose {choice['chosen']} by {how} on the {choice['samples']} calibration samples: {choice['reason']}"
    return " ".join(filter(None, [note, scored_by and f"({choice['chosen']} was {scored_by}.)", _budget_text(choice)]))


def seconds_text(seconds: float) -> str:
    """A duration for people: ``"1,198 s"``, or two significant digits under a second (``"0.43 s"``)."""
    return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:,.0f} s"


def fit_time_text(seconds: Optional[float]) -> str:
    """A table's "fit time" cell: :func:`seconds_text`, or "–" where it was not measured (None)."""
    return "–" if seconds is None else seconds_text(seconds)


def _budget_text(choice: Mapping[str, Any]) -> Optional[str]:
    """The budget sentence: the budget given (seconds) and Neural Clamping's estimated fit time (None without either)."""
    budget, estimate = choice.get("budget"), choice.get("neural_clamping_estimate")
    if estimate is None:
        return None
    given = "no budget was given" if budget is None else f"the budget was {budget:g} s"
    return f"Neural Clamping's fit was estimated at {seconds_text(estimate)}; {given}."


def auto_table(summary: Mapping[str, Any]) -> Optional[str]:
    """The markdown table of ``method="auto"``'s candidates: held-out NLL (nats per sample, every calibration sample
    scored by a fit that did not see it), its paired difference to temperature scaling with the 95 % interval, the
    seconds of its fits, and whether it was chosen or why it was left out, with the evidence of the rule's last step:
    the lowest held-out NLL of those that beat temperature scaling, and each compared candidate's paired difference
    to it (None when the fit was not ``auto``)."""
    choice = summary.get("auto")
    if not choice:
        return None
    lines = ["| candidate | held-out NLL | minus temperature scaling | seconds | |", "|---|---|---|---|---|"]
    for row in choice["candidates"]:
        nll = "—" if row["held_out_nll"] is None else f"{row['held_out_nll']:.4f}"
        versus = row["versus_temperature"]
        difference = "" if versus is None else f"{versus['point']:+.4f} {interval_text(versus, signed=True)}".strip()
        lines.append(f"| {row['method']} | {nll} | {difference} | {row['seconds']:.2f} | {_auto_status(row, choice)} |")
    return "\n".join(lines)


def _auto_status(row: Mapping[str, Any], choice: Mapping[str, Any]) -> str:
    if row["excluded"]:
        return "left out: " + row["excluded"].replace("|", "/")
    if row["method"] == "uncalibrated":
        return "no calibration (nothing to fit)"
    if row.get("is_temperature_scaling"):
        return ("its fit fell back to temperature scaling (δ did not help on its held-out folds)" if row["method"] == "neural_clamping"
                else "its l2 selection chose temperature scaling itself")
    status = "**chosen**" if row["method"] == choice["chosen"] else ""
    return "; ".join(filter(None, [status, _versus_best_text(row, choice), row.get("scored_by")]))


def _versus_best_text(row: Mapping[str, Any], choice: Mapping[str, Any]) -> Optional[str]:
    """The rule's last step in a candidate's row, where it compared candidates: the lowest held-out NLL of those that
    beat temperature scaling, or the paired difference to it of a candidate compared with it, and whether that shows
    it worse (None otherwise)."""
    best, versus = choice.get("best"), row.get("versus_best")
    if versus is not None:
        verdict = "not shown worse, and simpler" if row["method"] == choice["chosen"] else "shown worse, passed over"
        return f"minus {best}: {versus['point']:+.4f} {interval_text(versus, signed=True)}, {verdict}"
    compared = any(other.get("versus_best") for other in choice["candidates"])
    return "the lowest held-out NLL of those that beat temperature scaling" if compared and row["method"] == best else None


# ----------------------------------------------------------------------------- numbers with their uncertainty


def interval_text(interval: Optional[Mapping[str, Any]], *, signed: bool = False) -> str:
    """``"[0.0510, 0.0930]"`` of an interval's JSON form (signed: ``"[-0.0620, -0.0240]"``); ``"(no interval)"`` when it
    says why it has none (too few samples or replicates), ``""`` for None or ends that are missing for another reason."""
    if interval and interval.get("reason"):
        return "(no interval)"
    if not interval or interval.get("low") is None or interval.get("high") is None:
        return ""
    return f"[{_endpoint(interval['low'], signed)}, {_endpoint(interval['high'], signed)}]"


def _endpoint(value: float, signed: bool) -> str:
    """An interval's end to 4 decimals; a signed one too close to 0 for them in 2 significant digits, so that the
    side of 0 it lies on (what its verdict reads) shows: ``-3.2e-05``, not ``-0.0000``."""
    if signed and value != 0.0 and abs(value) < 5e-5:
        return f"{value:+.1e}"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def value_text(evaluation: Mapping[str, Any], side: str, key: str) -> str:
    """One side's value of ``key`` with its interval when the evaluation has one: ``"0.0712 [0.0510, 0.0930]"``."""
    interval = (evaluation[side].get("intervals") or {}).get(key)
    return " ".join(filter(None, (f"{evaluation[side][key]:.4f}", interval_text(interval))))


def change_text(evaluation: Mapping[str, Any], key: str) -> str:
    """calibrated − uncalibrated of ``key`` with its paired interval when there is one: ``"-0.0431 [-0.0620, -0.0240]"``."""
    change = evaluation["calibrated"][key] - evaluation["uncalibrated"][key]
    interval = (evaluation.get("difference") or {}).get(key)
    return " ".join(filter(None, (_endpoint(change, signed=True), interval_text(interval, signed=True))))


def shown_metrics(evaluation: Mapping[str, Any], keys: Sequence[str] = tuple(key for key, _ in METRICS)) -> List[str]:
    """The ``keys`` an evaluation has for both its sides (every key of a plain model's single side)."""
    sides = [evaluation[side] for side in ("uncalibrated", "calibrated") if side in evaluation]
    return [key for key in keys if all(key in side for side in sides)]


def bootstrap_note(evaluation: Mapping[str, Any]) -> Optional[str]:
    """How the intervals were made, in words (None when the evaluation has none)."""
    bootstrap = evaluation.get("bootstrap")
    if not bootstrap:
        return None
    paired = "; the change is paired: both sides resampled alike" if "calibrated" in evaluation else ""
    return (
        f"[low, high]: {bootstrap['confidence']:.0%} Poisson-bootstrap intervals ({bootstrap['replicates']} replicates, "
        f"seed {bootstrap['seed']}){paired}"
    )


def verdict_summary(evaluation: Mapping[str, Any], keys: Sequence[str] = ("ece", "nll", "brier")) -> Optional[str]:
    """One line of what calibration did, in plain words: ``"ECE improved; NLL improved; Brier: no detectable …"``."""
    verdicts = evaluation.get("verdicts") or {}
    parts = [f"{METRIC_NAMES[key]}: {verdicts[key]}" if verdicts[key] == "no detectable change at this test size"
             else f"{METRIC_NAMES[key]} {verdicts[key]}" for key in keys if key in verdicts]
    return "; ".join(parts) or None
