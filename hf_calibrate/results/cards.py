"""Model cards for calibrated models: a calibration record in, a hub model card out.

The card is rendered from ``model_cards/template.md`` (shipped as package data) with
``huggingface_hub.ModelCard.from_template``. Its metadata carries ``base_model`` (with
``base_model_relation``) when the base's hub id is known, and a ``model-index`` with accuracy,
ECE, AdaECE, smECE, classwise ECE, NLL, Brier and MCE before and after calibration (those the
evaluation has; :data:`hf_calibrate.metrics.catalog.CARD_METRICS`) — the format hub leaderboards
read. Each metric appears twice, with ``metric_config`` ``"uncalibrated"`` / ``"calibrated"`` and
a name saying which (and "in-sample" when it was computed on the calibration data). What the
results were computed on is worded by :mod:`hf_calibrate.results.reporting`, as in the diagram and the
CLI. What the card says of the method (title, description, citation, whether predictions may
change) are attributes of its calibrator class.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from . import reporting
from .._probabilities import PROBABILITIES
from ..calibrators import calibrator_class
from ..calibrators.neural_clamping import recorded_select_metric
from ..metrics.catalog import CARD_METRICS

DIAGRAM_FILE = "reliability_diagram.png"
#: what the record keeps of an evaluation beside its metrics (see :mod:`hf_calibrate.results.evaluation`)
UNCERTAINTY_KEYS = ("difference", "verdicts", "bootstrap")
_PIPELINE_TAGS = {"image-classification": "image-classification", "text-classification": "text-classification"}
#: the Hub's base_model_relation, by whether the method trains a new head: the base's weights are never changed,
#: a few parameters are fitted on top of the frozen base (an adapter) or a new head is trained on its features
_RELATIONS = {False: "adapter", True: "finetune"}
#: the namespace of the usage snippet of a card saved to a folder without a repo id: the card is read by whoever it is
#: shared with, to whom the author's local path means nothing
REPO_PLACEHOLDER_USER = "<user>"

def _template() -> str:
    return (importlib.resources.files("hf_calibrate") / "templates" / "model_card.md").read_text(encoding="utf-8")


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _fmt_option(value: Any) -> str:
    """A hyper-parameter exactly as set (``_fmt`` would show lr=1e-5 as 0.0000)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt_option(item) for item in value) + "]"
    return str(value)


def eval_results(evaluation: Optional[Dict[str, Any]], task: str) -> List[EvalResult]:
    """The ``model-index`` entries: every card metric before and after calibration.

    Args:
        evaluation: a :meth:`CalibratedModel.evaluate` result, or the ``evaluation`` entry of a
            calibration record (same keys: ``uncalibrated``/``calibrated`` metric dicts,
            ``dataset``, optionally ``split``, ``dataset_id`` and ``in_sample``). None or empty: no
            entries. In-sample results are marked so in the dataset's name and every metric's name.
        task: the hub task type, e.g. ``"image-classification"``.
    """
    if not evaluation:
        return []
    in_sample = _in_sample_suffix(evaluation)
    results = []
    for side in ("uncalibrated", "calibrated"):
        for info in CARD_METRICS:
            if info.key not in evaluation[side]:
                continue
            results.append(
                EvalResult(
                    task_type=task, task_name=task.replace("-", " ").title(),
                    dataset_type=evaluation.get("dataset_id") or evaluation["dataset"],
                    dataset_name=reporting.model_index_dataset_name(evaluation), dataset_split=evaluation.get("split"),
                    metric_type=info.card_type, metric_value=float(evaluation[side][info.key]),
                    metric_name=f"{info.title} ({side}{in_sample})", metric_config=side,
                )
            )
    return results


FALLBACK_TITLE = "Temperature scaling (Neural Clamping fell back: δ did not help on held-out data)"


def fell_back(record: Dict[str, Any]) -> bool:
    """Whether a record is a Neural Clamping fit that fell back to temperature scaling (δ = 0)."""
    summary = record["fit"].get("summary") or {}
    return record["method"] == "neural_clamping" and bool(summary.get("fell_back_to_temperature_scaling"))


def method_title(record: Dict[str, Any]) -> str:
    """What the card calls the fitted method: its title, or the fall-back's name when NC fell back to TS; a method
    ``method="auto"`` chose says so."""
    if fell_back(record):
        return FALLBACK_TITLE
    method = calibrator_class(record["method"])
    chosen = " (chosen by `method=\"auto\"`)" if (record["fit"].get("summary") or {}).get("auto") else ""
    return (method.title or method.method) + chosen


def _auto(record: Dict[str, Any]) -> Optional[Dict[str, str]]:
    """The card's "Why this method" of a ``method="auto"`` fit: the choice and the candidates' table (None otherwise)."""
    summary = record["fit"].get("summary") or {}
    if not summary.get("auto"):
        return None
    return {"note": reporting.auto_note(summary), "table": reporting.auto_table(summary)}


def _in_sample_suffix(evaluation: Dict[str, Any]) -> str:
    """What the model-index metric names add for in-sample results: " in-sample", " partly in-sample" or nothing."""
    if not evaluation.get("in_sample"):
        return ""
    rows = evaluation.get("in_sample_rows") or {}
    return " partly in-sample" if rows.get("calibration", 0) < rows.get("total", 0) else " in-sample"


def _selection(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    summary = record["fit"].get("summary") or {}
    if record["method"] != "neural_clamping" or not summary.get("holdout_samples"):
        return None
    metric = recorded_select_metric(record["options"])
    text = reporting.fallback_note(summary, metric)
    if text is None:
        chosen = summary["selected"]
        baseline = summary["temperature_scaling"].get(f"holdout_{metric}")
        ridge = f", ρ = {chosen['ridge']}" if "ridge" in chosen else ""
        scored = "pooled held-out " + metric + " of the fold runs" if summary.get("folds", 1) > 1 else "held-out " + metric
        text = (f"γ = {chosen['gamma']}, λ = {chosen['delta_weight']}{ridge}, {_when(summary, chosen)}: "
                f"{scored} {_fmt(chosen[f'holdout_{metric}'])} against {_fmt(baseline)} for temperature "
                f"scaling; T = {_fmt(chosen['temperature'])}, ‖δ‖₂ = {_fmt(chosen['delta_norm'])}.")
    return {"holdout_samples": summary["holdout_samples"], "total_samples": record["fit"]["num_samples"],
            "text": f"{schedule_text(summary)} {text}".strip()}


def _when(summary: Dict[str, Any], chosen: Dict[str, Any]) -> str:
    """Where the chosen state stands in its run: ``epoch E of N`` (SGD) or ``iteration I`` (L-BFGS)."""
    if summary.get("optimizer") == "lbfgs":
        return f"iteration {chosen['iteration']}"
    return f"epoch {chosen['epoch']} of {summary['epochs']}"


#: how a cross-fitted L-BFGS fit became the model, by its summary's ``refit`` (records without one refitted on all the data)
REFIT_TEXT = {"all": " (refitted on all the data)", "average": " (the mean of the fold runs' δ and log T there)"}


def schedule_text(summary: Dict[str, Any]) -> str:
    """The fit's effective schedule in steps and passes over the data (empty when the summary does not say)."""
    if summary.get("optimizer") == "lbfgs":
        plan = (f"{summary['folds']}-fold cross-fitting" if summary.get("folds", 1) > 1 else "held-out selection data")
        refit = REFIT_TEXT.get(summary.get("refit", "all"), "") if summary.get("folds", 1) > 1 and not summary.get("fell_back_to_temperature_scaling") else ""
        return (f"Full-batch L-BFGS, stopped early by {plan}: {summary.get('iterations')} iteration(s) kept{refit}, "
                f"{summary.get('evaluations')} objective evaluations in all (each a forward and an input-gradient pass of the "
                "base model over one run's fitting rows).")
    if "epochs" in summary and "steps_per_epoch" in summary:
        return f"SGD: {summary['epochs']} epoch(s) × {summary['steps_per_epoch']} step(s) over {summary.get('fit_samples')} samples."
    return ""


def _listed(values: Any) -> str:
    """A per-channel list as the card shows it: one value when all channels share it."""
    if isinstance(values, list) and values and all(value == values[0] for value in values):
        return f"{values[0]} (every channel)"
    return str(values)


def _image_steps(facts: Dict[str, Any], size: str) -> List[str]:
    """The resize / crop / rescale / normalise steps of an image contract's preprocessing facts, in words."""
    mean, std = facts.get("mean", facts.get("image_mean")), facts.get("std", facts.get("image_std"))
    if "crop_pct" in facts and "do_resize" not in facts:  # timm's eval transform
        steps = [f"resized and cropped to {size} by timm's eval transform (crop_pct {facts['crop_pct']}, crop_mode "
                 f"{facts.get('crop_mode', 'center')}, {facts.get('interpolation', 'bilinear')} interpolation)",
                 "converted to a tensor in [0, 1]"]
    else:  # a transformers image processor
        steps = [f"resized to {facts['size']}" if facts.get("do_resize") and facts.get("size") else None,
                 f"centre-cropped to {facts['crop_size']}" if facts.get("do_center_crop") and facts.get("crop_size") else None,
                 f"rescaled by {facts['rescale_factor']:.6g}" if facts.get("do_rescale") and facts.get("rescale_factor") else None]
        steps = [step for step in steps if step]
    if mean is not None and std is not None and facts.get("do_normalize", True):
        steps.append(f"normalised with mean {_listed(mean)} and std {_listed(std)}")
    return steps


def _image_source(source: str) -> str:
    """Where an image contract's facts come from, and whether the saved preprocessing applies them."""
    if "callable" in source:
        return f"recorded from {source}; that callable is not saved, so preprocess inputs the same way"
    if "config" in source:
        return "as the model's config specifies; it is saved with the model, set to this size"
    return f"the image processor {source} does this; it is saved with the model, set to this size"


def input_notes(record: Dict[str, Any]) -> List[str]:
    """What preprocessing inputs need for the calibration to hold (the record's ``input_contract``), in plain words."""
    contract = record.get("input_contract") or {}
    facts = contract.get("preprocessing") or {}
    source = str(facts.get("source", ""))
    notes = []
    if contract.get("input_size") and record["base_model"]["task"] == "image-classification":
        size = "×".join(str(v) for v in contract["input_size"][-2:])
        steps = ", ".join(_image_steps(facts, size))
        if source.startswith("inputs preprocessed by the user"):
            declared = f"; the model's config declares (not verified) that images are {steps}" if steps else ""
            notes.append(f"The calibration data were preprocessed by the user into {size} inputs{declared}: preprocess "
                         "inputs the same way.")
        else:
            notes.append(f"Images are {steps or f'of size {size}'} ({_image_source(source)}).")
    elif contract.get("input_size"):
        notes.append(f"Inputs are tensors of per-sample shape {'×'.join(str(v) for v in contract['input_size'])}, "
                     "preprocessed as for the calibration data.")
    if facts.get("max_length"):
        notes.append(f"Texts are tokenized by the saved tokenizer and truncated to {facts['max_length']} tokens "
                     f"(truncation side {facts.get('truncation_side', 'right')}; its model_max_length is "
                     f"{facts['max_length']}): pass truncation=True to a text-classification pipeline, which does not "
                     "truncate otherwise.")
    elif source.startswith("inputs tokenized by the user"):
        notes.append("The calibration data were tokenized by the user, so their max_length and truncation are not "
                     "known: tokenize inputs exactly as they were.")
    if contract.get("outputs") == PROBABILITIES:
        notes.append("The base model's forward ends in a softmax: the calibration reads the log of its probabilities as "
                     "its logits, and the calibrated model returns calibrated logits (a softmax of them gives the "
                     "calibrated probabilities).")
    notes.append("The calibration holds for inputs preprocessed like that only (calibration_config.json, "
                 "`input_contract`, records it).")
    return notes


def _limitations(record: Dict[str, Any]) -> List[str]:
    items = [
        "Calibration holds for data like the calibration data; under distribution shift confidences can again be "
        "wrong, usually over-confident.",
        f"The calibration was fitted on {record['fit']['num_samples']} samples; binned metrics such as ECE are noisy "
        "on small evaluation sets.",
    ]
    classifier = (record.get("base_model") or {}).get("classifier")
    if classifier:
        items.append(f"The new head replaces the base model's layer `{classifier}`.")
    if record["method"] == "neural_clamping" and not fell_back(record):
        contract = record.get("input_contract") or {}
        items.append(
            f"δ is tied to the model's input after preprocessing ({contract.get('space')}, shape "
            f"{contract.get('shape')}): inputs must be preprocessed exactly as at calibration time; inputs of "
            "another size are refused with an error naming the size to use."
        )
        if contract.get("space") == "inputs_embeds":
            items.append("For text, δ is one vector added to the word embedding of every non-padding token — an "
                         "extension of Neural Clamping (defined for images) by hf_calibrate.")
    if record["method"] == "mac_cal":
        items.append("MaC-Cal here is a documented reconstruction designed from the paper's abstract and one figure "
                     "caption; it has not yet been checked against the paper's full text.")
    return items


def _duplicates(record: Dict[str, Any]) -> Optional[str]:
    """The sentence saying how many calibration samples repeat another (the fit summary's ``duplicate_rows``), or None
    when none does (or the record predates the count)."""
    repeated = (record["fit"].get("summary") or {}).get("duplicate_rows")
    if not repeated:
        return None
    total = record["fit"]["num_samples"]
    return (f"{repeated:,} of these {total:,} samples repeat another one, leaving {total - repeated:,} distinct; every "
            "choice made on held-out samples kept each sample's copies together.")


def card_title(record: Dict[str, Any], location: Optional[str | os.PathLike] = None) -> str:
    """The card's title: the repo's name, else the folder's, else the base model's name and the method."""
    if location is not None:
        return Path(os.path.abspath(location)).name if isinstance(location, os.PathLike) else str(location).split("/")[-1]
    base = record["base_model"]
    name = base["repo_id"].split("/")[-1] if base.get("repo_id") else f"{base['library']}-{base['task']}"
    return f"{name}-{record['method'].replace('_', '-')}"


def repo_placeholder(name: str) -> str:
    """What the usage snippet of a card saved without a repo id loads: ``"<user>/digits-resnet-ts"``, the folder's
    ``name`` under a namespace to fill in (not a valid repo id, so it loads nothing until it is filled in)."""
    return f"{REPO_PLACEHOLDER_USER}/{name}"


def _usage(record: Dict[str, Any], location: str) -> Dict[str, str]:
    """The usage snippet's lines: load from ``location`` (a hub repo id, or :func:`repo_placeholder`), call, and the
    base alone."""
    base = record["base_model"]
    library = base["library"]
    call = ("probs = model(pixel_values).softmax(-1)  # timm-style: tensor in, logits out" if library == "timm"
            else "probs = model(**inputs).logits.softmax(-1)" if library == "transformers"
            else "probs = model(x).softmax(-1)")
    base_usage = ""
    if base["weights"] == "included" and library == "timm":
        base_usage = f'The uncalibrated base: `timm.create_model("hf-hub:{location}", pretrained=True)`.'
    elif base["weights"] == "included" and library == "transformers":
        base_usage = f'The uncalibrated base: `AutoModelFor…from_pretrained("{location}", subfolder="base")`.'
    loading = f'model = CalibratedModel.from_pretrained("{location}")'
    if base["weights"] == "not_saved":
        loading = f'model = CalibratedModel.from_pretrained("{location}", base_model=base)  # your nn.Module'
    return {"loading": loading, "call": call, "base_usage": base_usage}


def _results(evaluation: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The results section's data: the metric rows and what they were computed on (None: no evaluation)."""
    if not evaluation:
        return None
    verdicts = evaluation.get("verdicts") or {}
    rows = [
        {"name": info.title, "before": reporting.value_text(evaluation, "uncalibrated", info.key),
         "after": reporting.value_text(evaluation, "calibrated", info.key),
         "change": reporting.change_text(evaluation, info.key), "verdict": verdicts.get(info.key, "")}
        for info in CARD_METRICS
        if info.key in reporting.shown_metrics(evaluation)
    ]
    return {"rows": rows, "in_sample": evaluation["in_sample"], "n_bins": evaluation.get("n_bins"),
            "in_sample_note": reporting.sample_note(evaluation),
            "label": reporting.evaluated_on(evaluation),
            "calibration": reporting.calibration_label(evaluation),
            "intervals": reporting.bootstrap_note(evaluation),
            "verdict": reporting.verdict_summary(evaluation)}


def _card_data(record: Dict[str, Any], name: str, evaluation: Optional[Dict[str, Any]]) -> ModelCardData:
    """The card's metadata: name, base model (the Hub's model tree), library, task, tags and model-index."""
    base = record["base_model"]
    method = record["method"]
    relation = {"base_model_relation": _RELATIONS[calibrator_class(method).needs_features]} if base.get("repo_id") else {}
    return ModelCardData(
        model_name=name,
        base_model=base.get("repo_id") or None,
        library_name="hf_calibrate",
        pipeline_tag=_PIPELINE_TAGS.get(base["task"]),
        tags=["calibration", "hf_calibrate", method.replace("_", "-"), *(["temperature-scaling"] if fell_back(record) else []),
              base["library"]],
        eval_results=eval_results(evaluation, base["task"]) or None,
        **relation,
    )


def recorded_evaluation(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The evaluation a record's card shows: its ``evaluation``, completed from its ``fit`` (None: none recorded)."""
    return reporting.completed_evaluation(record["evaluation"], record["fit"]) if record.get("evaluation") else None


def render_card(
    record: Dict[str, Any], *, repo_id: Optional[str | os.PathLike] = None, diagram: Optional[str] = None
) -> ModelCard:
    """The model card of a calibration record (``calibration_config.json`` contents).

    Args:
        record: the record.
        repo_id: where the model loads from: a hub repo id (a ``str``), which the title and usage snippet show,
            or the local folder it is saved to (an ``os.PathLike``, e.g. a ``Path``): the title is the folder's
            name and the snippet loads :func:`repo_placeholder` (never the folder's path, which means nothing to
            the card's readers). None: the card names the base model instead and shows no loading line it cannot
            know.
        diagram: the reliability diagram's file name in the folder, if one was drawn.
    """
    base = record["base_model"]
    method = calibrator_class(record["method"])
    name = card_title(record, repo_id)
    placeholder = repo_placeholder(name) if isinstance(repo_id, os.PathLike) else None
    location = placeholder or repo_id
    usage = _usage(record, location) if location is not None else None
    base_description = (f"[{base['repo_id']}](https://huggingface.co/{base['repo_id']})" if base.get("repo_id")
                        else f"a {base['library']} {base['task']} model")
    weights_note = {"included": "included in this repository, unchanged",
                    "reference": f"not copied: they load from {base.get('repo_id')} at revision {base.get('revision')}",
                    "not_saved": "not saved (a plain PyTorch module): pass `base_model=` when loading"}[base["weights"]]
    fit = record["fit"]
    evaluation = recorded_evaluation(record)
    return ModelCard.from_template(
        _card_data(record, name, evaluation),
        template_str=_template(),
        model_name=name,
        base_description=base_description,
        base_weights_note=weights_note,
        library_version=record["library_version"],
        changes_predictions=not method.preserves_argmax,
        method_title=method_title(record),
        method_description=(calibrator_class("temperature").description + " " + reporting.fallback_note(
            record["fit"]["summary"], recorded_select_metric(record["options"]))) if fell_back(record) else method.description,
        hyperparameters=sorted((key, _fmt_option(value)) for key, value in (record.get("options") or {}).items()),
        selection=_selection(record),
        auto=_auto(record),
        fitted=reporting.fitted_text(record["method"], record["fit"].get("summary") or {}),
        fit=fit,
        calibration_dataset=fit.get("dataset_name") or fit.get("dataset"),
        duplicates=_duplicates(record),
        results=_results(evaluation),
        diagram=diagram,
        usage=usage,
        placeholder=placeholder,
        input_notes=input_notes(record),
        limitations=_limitations(record),
        citation=method.citation,
    )


#: panels of the saved diagram, left to right
DIAGRAM_SIDES = ("uncalibrated", "calibrated")


def write_diagram(folder: Path, evaluation: Dict[str, Any], method: Optional[str] = None) -> Optional[str]:
    """Draw the before/after reliability diagrams of ``evaluation`` into ``folder``; None if matplotlib is missing or
    the evaluation has no bins (results pushed from ``evaluate``'s evaluator).

    ``evaluation``: a :meth:`CalibratedModel.evaluate` result or a record's ``evaluation`` entry; the
    title names ``method`` (the fitted method's title), what it was computed on, and whether in-sample.
    """
    try:
        from .plotting import compare_reliability_diagrams
    except ImportError:
        return None
    reliability = evaluation.get("reliability") or {}
    panels = {side: reliability[side] for side in DIAGRAM_SIDES if side in reliability}
    if not panels:
        return None
    try:
        compare_reliability_diagrams(panels, path=folder / DIAGRAM_FILE, title=diagram_title(evaluation, method))
    except ImportError:
        return None
    return DIAGRAM_FILE


def diagram_title(evaluation: Dict[str, Any], method: Optional[str] = None) -> str:
    """The title of an evaluation's reliability diagram: the method (when given), what it was computed on and, on a
    second line, whether in-sample (or not checked)."""
    note = reporting.sample_note(evaluation)
    in_sample = f"\n{note[0].upper()}{note[1:]}" if note else ""
    named = f" of {method}" if method else ""
    return f"Reliability{named} on {reporting.evaluated_on(evaluation)}{in_sample}"


def card_metrics(evaluation: Dict[str, Any], keys: Sequence[str] = tuple(info.key for info in CARD_METRICS)) -> Dict[str, Any]:
    """What the record keeps of an evaluation's numbers (JSON-able): per side the card's metrics, the number of samples
    (when known: an evaluator's metric may not give it) and every interval; and the paired differences, verdicts and
    bootstrap settings when there are any."""
    kept: Dict[str, Any] = {}
    for side in ("uncalibrated", "calibrated"):
        metrics = evaluation[side]
        counted = {"num_samples": int(metrics["num_samples"])} if "num_samples" in metrics else {}
        kept[side] = {key: float(metrics[key]) for key in keys if key in metrics} | counted
        intervals = {key: dict(value) for key, value in (metrics.get("intervals") or {}).items()}
        if intervals:
            kept[side]["intervals"] = intervals
    return kept | {key: evaluation[key] for key in UNCERTAINTY_KEYS if key in evaluation}
