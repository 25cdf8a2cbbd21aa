"""Model cards for calibrated models: a calibration record in, a hub model card out.

The card is rendered from ``model_cards/template.md`` (shipped as package data) with
``huggingface_hub.ModelCard.from_template``. Its metadata carries ``base_model`` and a
``model-index`` with accuracy, ECE, AdaECE, classwise ECE, NLL and Brier before and after
calibration — the format hub leaderboards read. Each metric appears twice, with
``metric_config`` ``"uncalibrated"`` / ``"calibrated"`` and a name saying which.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .metrics import ReliabilityBins

DIAGRAM_FILE = "reliability_diagram.png"
# (key in a metrics dict, metric type for the model-index, display name)
CARD_METRICS = (
    ("accuracy", "accuracy", "Accuracy"),
    ("ece", "ece", "ECE"),
    ("ada_ece", "ada_ece", "AdaECE"),
    ("classwise_ece", "classwise_ece", "Classwise ECE"),
    ("nll", "nll", "NLL"),
    ("brier", "brier", "Brier"),
    ("mce", "mce", "MCE"),
)
_PIPELINE_TAGS = {"image-classification": "image-classification", "text-classification": "text-classification"}

_CITATIONS = {
    "temperature": "@inproceedings{guo2017calibration, title={On Calibration of Modern Neural Networks}, "
    "author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.}, booktitle={ICML}, year={2017}}",
    "dirichlet": "@inproceedings{kull2019beyond, title={Beyond temperature scaling: Obtaining well-calibrated "
    "multi-class probabilities with Dirichlet calibration}, author={Kull, Meelis and Perello Nieto, Miquel and "
    "K{\\\"a}ngsepp, Markus and Silva Filho, Telmo and Song, Hao and Flach, Peter}, booktitle={NeurIPS}, year={2019}}",
    "histogram": "@inproceedings{zadrozny2001obtaining, title={Obtaining calibrated probability estimates from "
    "decision trees and naive Bayesian classifiers}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={ICML}, year={2001}}",
    "isotonic": "@inproceedings{zadrozny2002transforming, title={Transforming classifier scores into accurate "
    "multiclass probability estimates}, author={Zadrozny, Bianca and Elkan, Charles}, booktitle={KDD}, year={2002}}",
    "neural_clamping": "@article{tang2024neural, title={Neural Clamping: Joint Input Perturbation and Temperature "
    "Scaling for Neural Network Calibration}, author={Tang, Yung-Chen and Chen, Pin-Yu and Ho, Tsung-Yi}, "
    "journal={Transactions on Machine Learning Research}, year={2024}}",
    "tst": "@inproceedings{jordahn2024decoupling, title={Decoupling Feature Extraction and Classification Layers "
    "for Calibrated Neural Networks}, author={Jordahn, Mikkel and Olmos, Pablo M.}, booktitle={ICML}, year={2024}}",
    "mac_cal": "@misc{ni2025maccal, title={MaC-Cal}, author={Ni and Zhao and Yang and Guo}, year={2025}, "
    "eprint={2508.09116}, archivePrefix={arXiv}}",
}
_CITATIONS["vector"] = _CITATIONS["matrix"] = _CITATIONS["temperature"]
_CITATIONS["vtst"] = _CITATIONS["tst"]

METHODS: Dict[str, Dict[str, str]] = {
    "temperature": {"title": "temperature scaling", "text": "The logits are divided by one scalar temperature T fitted "
                    "to minimise the negative log-likelihood on the calibration data. Predictions are unchanged."},
    "vector": {"title": "vector scaling", "text": "Each class logit gets its own positive scale and bias, fitted by "
               "L-BFGS on the NLL starting from the temperature-scaling optimum."},
    "matrix": {"title": "matrix scaling (ODIR)", "text": "The logits go through a full linear map W z + b fitted on "
               "the NLL with off-diagonal and intercept regularisation (Kull et al., 2019)."},
    "dirichlet": {"title": "Dirichlet calibration (ODIR)", "text": "The log-probabilities go through a linear map "
                  "W log p + b fitted on the NLL with off-diagonal and intercept regularisation (Kull et al., 2019)."},
    "histogram": {"title": "histogram binning", "text": "Confidences are mapped to the observed frequency of their "
                  "equal-width bin on the calibration data."},
    "isotonic": {"title": "isotonic regression", "text": "Confidences are mapped through a monotone piecewise-linear "
                 "function fitted by isotonic regression on the calibration data."},
    "neural_clamping": {"title": "Neural Clamping", "text": "A universal input perturbation δ (one tensor shaped like "
                        "one model input, added after normalisation) and a temperature T are learned on the frozen "
                        "classifier by SGD on the focal loss plus λ‖δ‖₂ (Tang, Chen & Ho, TMLR 2024). A held-out "
                        "part of the calibration data selects the epoch and hyper-parameters and falls back to "
                        "plain temperature scaling (δ = 0) when δ does not help there."},
}


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
            ``dataset``, optionally ``split`` and ``dataset_id``). None or empty: no entries.
        task: the hub task type, e.g. ``"image-classification"``.
    """
    if not evaluation:
        return []
    results = []
    for side in ("uncalibrated", "calibrated"):
        for key, metric_type, name in CARD_METRICS:
            if key not in evaluation[side]:
                continue
            results.append(
                EvalResult(
                    task_type=task, task_name=task.replace("-", " ").title(),
                    dataset_type=evaluation.get("dataset_id") or evaluation["dataset"],
                    dataset_name=evaluation["dataset"], dataset_split=evaluation.get("split"),
                    metric_type=metric_type, metric_value=float(evaluation[side][key]),
                    metric_name=f"{name} ({side})", metric_config=side,
                )
            )
    return results


def _selection(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    summary = record["fit"].get("summary") or {}
    if record["method"] != "neural_clamping" or not summary.get("holdout_samples"):
        return None
    metric = record["options"].get("select_metric", "ece")
    baseline = summary["temperature_scaling"].get(f"holdout_{metric}")
    if summary.get("fell_back_to_temperature_scaling"):
        scaling = summary["temperature_scaling"]
        text = (f"δ did not beat temperature scaling (held-out {metric} {_fmt(baseline)}), so the fit fell back to "
                f"temperature scaling (δ = 0, T = {_fmt(scaling.get('fallback_temperature', scaling['temperature']))}).")
    else:
        chosen = summary["selected"]
        text = (f"γ = {chosen['gamma']}, λ = {chosen['delta_weight']}, epoch {chosen['epoch']} of {summary['epochs']}: "
                f"held-out {metric} {_fmt(chosen[f'holdout_{metric}'])} against {_fmt(baseline)} for temperature "
                f"scaling; T = {_fmt(chosen['temperature'])}, ‖δ‖₂ = {_fmt(chosen['delta_norm'])}.")
    return {"holdout_samples": summary["holdout_samples"], "total_samples": record["fit"]["num_samples"], "text": text}


def _preprocessing_notes(record: Dict[str, Any]) -> List[str]:
    """What the calibration's inputs looked like (``input_contract``) and which layer a new head replaces."""
    contract = record.get("input_contract") or {}
    facts = contract.get("preprocessing") or {}
    notes = []
    if contract.get("input_size"):
        size = "×".join(str(v) for v in contract["input_size"])
        mean, std = facts.get("mean", facts.get("image_mean")), facts.get("std", facts.get("image_std"))
        normalised = f" normalised with mean {mean} and std {std}," if mean is not None and std is not None else ""
        notes.append(f"Calibrated on inputs of size {size} ({contract.get('space')},{normalised} as recorded in "
                     "calibration_config.json); the saved preprocessing produces that size. The calibration holds "
                     "for inputs preprocessed like that only.")
    if facts.get("max_length"):
        saved = (f"the saved tokenizer's model_max_length is {facts['max_length']}, so pass truncation=True to a "
                 "pipeline for long texts") if facts.get("source") else "tokenize inputs the same way"
        notes.append(f"Calibrated on texts truncated to {facts['max_length']} tokens; {saved}.")
    classifier = (record.get("base_model") or {}).get("classifier")
    if classifier:
        notes.append(f"The new head replaces the base model's layer `{classifier}`.")
    return notes


def _limitations(record: Dict[str, Any]) -> List[str]:
    items = [
        "Calibration holds for data like the calibration data; under distribution shift confidences can again be "
        "wrong, usually over-confident.",
        f"The calibration was fitted on {record['fit']['num_samples']} samples; binned metrics such as ECE are noisy "
        "on small evaluation sets.",
    ]
    items.extend(_preprocessing_notes(record))
    if record["method"] == "neural_clamping":
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
        items.append("MaC-Cal here is a documented reconstruction from the paper's abstract: only the abstract and "
                     "one figure caption are public.")
    return items


def render_card(
    record: Dict[str, Any], *, repo_id: Optional[str] = None, diagram: Optional[str] = None
) -> ModelCard:
    """The model card of a calibration record (``calibration_config.json`` contents)."""
    base = record["base_model"]
    method = record["method"]
    info = METHODS.get(method, {"title": method, "text": ""})
    evaluation = record.get("evaluation")
    name = (repo_id or "calibrated-model").split("/")[-1]
    card_data = ModelCardData(
        model_name=name,
        base_model=base.get("repo_id") or None,
        library_name="hf_calibrate",
        pipeline_tag=_PIPELINE_TAGS.get(base["task"]),
        tags=["calibration", "hf_calibrate", method.replace("_", "-"), base["library"]],
        eval_results=eval_results(evaluation, base["task"]) or None,
    )
    results = [
        {"name": display, "before": _fmt(evaluation["uncalibrated"][key]), "after": _fmt(evaluation["calibrated"][key])}
        for key, _, display in CARD_METRICS
        if evaluation and key in evaluation["calibrated"]
    ]
    base_description = (f"[{base['repo_id']}](https://huggingface.co/{base['repo_id']})" if base.get("repo_id")
                        else f"a {base['library']} {base['task']} model")
    weights_note = {"included": "included in this repository, unchanged",
                    "reference": f"not copied: they load from {base.get('repo_id')} at revision {base.get('revision')}",
                    "not_saved": "not saved (a plain PyTorch module): pass `base_model=` when loading"}[base["weights"]]
    library = base["library"]
    usage = ("probs = model(pixel_values).softmax(-1)  # timm-style: tensor in, logits out" if library == "timm"
             else "probs = model(**inputs).logits.softmax(-1)" if library == "transformers"
             else "probs = model(x).softmax(-1)")
    base_usage = ""
    if base["weights"] == "included" and library == "timm":
        base_usage = f'The uncalibrated base: `timm.create_model("hf-hub:{repo_id or "<repo>"}", pretrained=True)`.'
    elif base["weights"] == "included" and library == "transformers":
        base_usage = f'The uncalibrated base: `AutoModelFor…from_pretrained("{repo_id or "<repo>"}", subfolder="base")`.'
    card = ModelCard.from_template(
        card_data,
        template_str=_template(),
        model_name=name,
        base_description=base_description,
        base_weights_note=weights_note,
        library_version=record["library_version"],
        changes_predictions=method not in ("temperature",),
        method_title=info["title"],
        method_description=info["text"],
        hyperparameters=sorted((key, _fmt_option(value)) for key, value in (record.get("options") or {}).items()),
        selection=_selection(record),
        fit=record["fit"],
        results=results,
        evaluation_dataset=evaluation and evaluation["dataset"],
        evaluation_samples=evaluation and evaluation["calibrated"]["num_samples"],
        n_bins=evaluation and evaluation.get("n_bins"),
        diagram=diagram,
        repo_id=repo_id or "<repo>",
        usage=usage,
        base_usage=base_usage,
        limitations=_limitations(record),
        citation=_CITATIONS.get(method, ""),
    )
    return card


def write_diagram(folder: Path, reliability: Dict[str, ReliabilityBins]) -> Optional[str]:
    """Draw the before/after reliability diagrams into ``folder``; None if matplotlib is missing."""
    try:
        from .plotting import compare_reliability_diagrams
    except ImportError:
        return None
    try:
        compare_reliability_diagrams(dict(reliability), path=folder / DIAGRAM_FILE, title="Reliability before and after calibration")
    except ImportError:
        return None
    return DIAGRAM_FILE


def card_metrics(evaluation: Dict[str, Any], keys: Sequence[str] = tuple(key for key, _, _ in CARD_METRICS)) -> Dict[str, Dict[str, float]]:
    """The card's metrics of an evaluation, per side (JSON-able)."""
    return {side: {key: float(evaluation[side][key]) for key in keys if key in evaluation[side]} | {"num_samples": int(evaluation[side]["num_samples"])}
            for side in ("uncalibrated", "calibrated")}
