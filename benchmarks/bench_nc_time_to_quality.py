"""Neural Clamping's time to quality: the L-BFGS optimiser against the authors' recipe, side by side.

For each zoo model and seed, ``bench_quality``'s protocol reshuffles the calibration ∪ test rows
into stratified halves; every arm fits on the calibration half, on the same preprocessed tensors,
and is scored on the test half:

* **reference**: NCToolkit's ``NCWrapper.train_NC`` (read from a local copy, ``HF_CALIBRATE_NCTOOLKIT``,
  as ``bench_fidelity.py`` does) with its demo recipe — 100 epochs, batch 1000, SGD lr 0.01
  momentum 0.9, focal γ = 1, λ = 0.01, δ₀ ~ N(0, 0.001²), T₀ = 1 — on all calibration rows, with
  the base's parameters frozen (as ours; their code as shipped also computes parameter gradients,
  which only makes it slower);
* **TS**: ``method="temperature"``;
* **L-BFGS, point rule**: ``method="neural_clamping", optimizer="lbfgs", require_significant_gain=False``
  (ridge ρ = 0.1, 2 folds, stopping on the pooled held-out NLL, the fold runs' mean (δ, log T) at the
  chosen iteration: the defaults; δ kept whenever its pooled held-out NLL is lower than TS's);
* **L-BFGS, significance rule**: derived from the point rule's fit, not fitted again: δ is kept
  only when the pooled paired interval against TS lies below 0, else the fit is exactly the TS arm's
  (that is what ``require_significant_gain=True`` does), at the point rule's time;
* **auto**: ``method="auto"`` (the logit method chosen by cross-fitted NLL; it has no δ).

The SGD optimiser (500 steps by default) is not an arm: it costs about twice the reference
(``benchmarks/results/defaults.md`` has its quality).

Times are wall seconds of the whole fit (ours and TS include their forward passes over the
data), the arms run one after another within each seed so that load hits them alike, and the
ratios are per seed. Text (the BBC MiniLM): their wrapper adds its δ to its input, so it gets the
word embeddings (N, L, H) with the attention mask as one extra channel (its δ there gets no loss
gradient and stays ~0); δ has shape (H + 1,), one vector for every position, like ours.

Usage::

    HF_CALIBRATE_NCTOOLKIT=/path/to/NCToolkit python benchmarks/bench_nc_time_to_quality.py
    python benchmarks/bench_nc_time_to_quality.py --quick     # the CNN, 1 seed, reference skipped if absent; prints only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import _report
import bench_quality as quality
from _fidelity_common import NC_DEMO, cuda_is_a_no_op, find_reference, global_rng, import_nctoolkit, quiet, zoo_pool
from _fidelity_nc import LogitsOf, ReplayedBatches, num_classes

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.metrics import calibration_report

NAME = "nc_time_to_quality"
MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
ARMS = {"L-BFGS, point rule": {"optimizer": "lbfgs", "require_significant_gain": False},
        "auto": {"method": "auto"}}
#: arms computed from another arm's fit: the significance rule applied to the point rule's selection
DERIVED = {"L-BFGS, significance rule": "L-BFGS, point rule"}
METRICS = ("nll", "ece", "brier")


class EmbeddedText(nn.Module):
    """Logits of a transformers text classifier from (N, L, H + 1): word embeddings with the attention mask appended."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        mask = packed[..., -1].round().clamp(0, 1).long()
        return self.model(inputs_embeds=packed[..., :-1], attention_mask=mask).logits


def model_tensors(demo: Any, pool: Any) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """Every pool row preprocessed as the fits do, in one batch (text padded to one length): (inputs, labels)."""
    backbone = adapt(demo.model)
    inputs, labels = next(quality._batches(demo, backbone, pool, batch_size=len(pool)))
    return {key: value for key, value in inputs.items() if torch.is_tensor(value)}, labels


def reference_input(demo: Any, inputs: Dict[str, torch.Tensor]) -> Tuple[nn.Module, torch.Tensor]:
    """What their wrapper is given: the module mapping one tensor to logits, and that tensor for every pool row."""
    if "pixel_values" in inputs:
        return LogitsOf(demo.model).eval(), inputs["pixel_values"].float()
    with torch.no_grad():
        embeddings = demo.model.get_input_embeddings()(inputs["input_ids"])
    packed = torch.cat([embeddings, inputs["attention_mask"][..., None].float()], dim=-1)
    return EmbeddedText(demo.model).eval(), packed


def fit_reference(nct: Any, module: nn.Module, x: torch.Tensor, labels: torch.Tensor, classes: int, seed: int) -> Tuple[float, torch.Tensor, float]:
    """``train_NC`` with the demo recipe on (x, labels): (seconds, δ, T)."""
    batches = ReplayedBatches(seed, len(labels), NC_DEMO["batch_size"])
    flags = [parameter.requires_grad for parameter in module.parameters()]
    module.requires_grad_(False)
    started = time.perf_counter()
    try:
        with global_rng(), cuda_is_a_no_op(), quiet():
            wrapper = nct.NCWrapper(module, num_classes=classes, lambda_0=1, lambda_1=NC_DEMO["delta_weight"],
                                    image_size=tuple(x.shape[2:] if x.dim() == 3 else x.shape[1:]), init_scale=NC_DEMO["init_scale"], init_temp=1.0)
            with torch.no_grad():
                wrapper.perturbation.copy_(batches.initial_delta(wrapper.perturbation.shape, NC_DEMO["init_scale"]))
            wrapper.train_NC(DataLoader(TensorDataset(x, labels), batch_sampler=batches), epoch=NC_DEMO["epochs"], lr=NC_DEMO["lr"],
                             momentum=NC_DEMO["momentum"], focal_loss=True, gamma=NC_DEMO["gamma"])
    finally:
        for parameter, flag in zip(module.parameters(), flags):
            parameter.requires_grad_(flag)
    return time.perf_counter() - started, wrapper.perturbation.detach().clone(), float(wrapper.temperature.detach())


def scores(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    report = calibration_report(logits.double(), labels, from_logits=True)
    return {key: report[key] for key in ("accuracy", *METRICS)}


def calibrated_logits(calibrated: CalibratedModel, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        output = calibrated(**inputs) if "input_ids" in inputs else calibrated(inputs["pixel_values"])
    return getattr(output, "logits", output).float()


def fit_ours(demo: Any, inputs: Dict[str, torch.Tensor], labels: torch.Tensor, method: str, seed: int, **options: Any) -> Tuple[float, CalibratedModel]:
    """Our fit on the tensors: a ``TensorDataset`` of images, or a list of tokenized batches of 64 texts; (seconds, model)."""
    if "input_ids" in inputs:
        data: Any = [dict({key: value[i:i + 64] for key, value in inputs.items()}, labels=labels[i:i + 64]) for i in range(0, len(labels), 64)]
    else:
        data = TensorDataset(inputs["pixel_values"], labels)
    started = time.perf_counter()
    calibrated = CalibratedModel.fit(demo.model, data, method=method, progress=False, seed=seed, **options)
    return time.perf_counter() - started, calibrated


def run_seed(nct: Any, demo: Any, inputs: Dict[str, torch.Tensor], labels: torch.Tensor, seed: int, quick: bool) -> Dict[str, Any]:
    """Every arm on one reshuffle: arm → {seconds, test scores, facts}."""
    calibration, test = (torch.as_tensor(half) for half in quality._stratified_halves(labels, seed))
    cal_inputs = {key: value[calibration] for key, value in inputs.items()}
    test_inputs = {key: value[test] for key, value in inputs.items()}
    test_labels = labels[test]
    record: Dict[str, Any] = {"seed": seed, "calibration_rows": len(calibration), "test_rows": len(test)}
    seconds, ts = fit_ours(demo, cal_inputs, labels[calibration], "temperature", seed)
    record["TS"] = {"seconds": seconds, **scores(calibrated_logits(ts, test_inputs), test_labels)}
    with torch.no_grad():
        base_logits = calibrated_logits(ts, test_inputs) * float(ts.calibrator.temperature)
    record["uncalibrated"] = scores(base_logits, test_labels)
    if nct is not None:
        module, x = reference_input(demo, inputs)
        seconds, delta, temperature = fit_reference(nct, module, x[calibration], labels[calibration], num_classes(demo.model), seed)
        with torch.no_grad():
            logits = module(x[test] + delta) / temperature
        record["reference"] = {"seconds": seconds, "delta_norm": float(delta.norm()), "temperature": temperature, **scores(logits, test_labels)}
    for arm, options in list(ARMS.items())[:1 if quick else None]:  # --quick: the first arm only
        options = dict(options)
        seconds, calibrated = fit_ours(demo, cal_inputs, labels[calibration], options.pop("method", "neural_clamping"), seed, **options)
        record[arm] = {"seconds": seconds, **fit_facts(calibrated), **scores(calibrated_logits(calibrated, test_inputs), test_labels)}
    for arm, source in DERIVED.items():
        if source in record:
            record[arm] = significance_rule(record[source], record["TS"])
    print(json.dumps(record), file=sys.stderr, flush=True)
    return record


def fit_facts(calibrated: CalibratedModel) -> Dict[str, Any]:
    """What a fit says of itself: fell back, iterations, evaluations, selection, T and ‖δ‖ (a method without δ: the method)."""
    summary, calibrator = calibrated.fit_summary, calibrated.calibrator
    if calibrated.method != "neural_clamping":
        return {"fell_back": False, "iterations": None, "evaluations": None, "method": calibrated.method}
    return {"fell_back": summary["fell_back_to_temperature_scaling"], "iterations": summary.get("iterations"),
            "evaluations": summary.get("evaluations"), "selection": summary.get("selection"), "refit": summary.get("refit"),
            "temperature": float(calibrator.temperature), "delta_norm": float(calibrator.delta.norm())}


def significance_rule(point_rule: Dict[str, Any], ts: Dict[str, Any]) -> Dict[str, Any]:
    """The point rule's fit under ``require_significant_gain=True``: kept when the pooled NLL interval's high end is
    below 0, else TS's test scores (the fallback is the temperature method's fit); the time is the point rule's."""
    interval = (point_rule.get("selection") or {}).get("nll_difference")
    if not point_rule["fell_back"] and interval is not None and interval["high"] < 0:
        return dict(point_rule)
    fallback = {key: ts[key] for key in ("accuracy", *METRICS)}
    return dict(point_rule, fell_back=True, iterations=0, delta_norm=0.0, temperature=ts.get("temperature"), **fallback)


# ----------------------------------------------------------------------------- report


def model_table(model: str, runs: List[Dict[str, Any]]) -> List[str]:
    """One model: every arm's mean test scores and time, its paired differences to the reference and TS, its time ratios."""
    arms = [arm for arm in ("uncalibrated", "TS", "reference", *ARMS, *DERIVED) if arm in runs[0]]  # --quick fits one arm
    rows = []
    for arm in arms:
        values = {key: [run[arm][key] for run in runs] for key in METRICS}
        seconds = [run[arm].get("seconds") for run in runs]
        timed = all(value is not None for value in seconds)
        row = [arm, *(quality._mean_std(values[key]) for key in METRICS), f"{statistics.fmean(seconds):.1f}" if timed else "–"]
        for base in ("reference", "TS"):
            ok = base in runs[0] and arm != base and timed and arm != "uncalibrated"
            row.append(f"{statistics.median(run[arm]['seconds'] / run[base]['seconds'] for run in runs):.3f}×" if ok else "–")
        for base in ("reference", "TS"):
            ok = base in runs[0] and arm not in (base, "uncalibrated")
            row.append(quality._paired_interval([run[arm]["nll"] - run[base]["nll"] for run in runs]) if ok else "–")
        row.append(quality._paired_interval([run[arm]["ece"] - run["TS"]["ece"] for run in runs]) if arm not in ("TS", "uncalibrated") else "–")
        rows.append(row)
    headers = ["arm", "test NLL", "test ECE", "test Brier", "mean s", "time ÷ reference (median)", "time ÷ TS (median)",
               "ΔNLL − reference", "ΔNLL − TS", "ΔECE − TS"]
    return [f"### {model} ({len(runs)} seeds, {runs[0]['calibration_rows']} calibration / {runs[0]['test_rows']} test rows)", "",
            *_report.table(headers, rows), ""]


def decision_table(results: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """Per model and arm: how often the fit fell back to TS, and whether δ's use agreed with the test half."""
    rows = []
    for model, runs in results.items():
        for arm in (arm for arm in (*ARMS, *DERIVED) if arm in runs[0] and "method" not in runs[0][arm]):  # auto has no δ to decide on
            fell_back = sum(run[arm]["fell_back"] for run in runs)
            used = [run for run in runs if not run[arm]["fell_back"]]
            helped = sum(run[arm]["nll"] < run["TS"]["nll"] for run in used)
            reached = sum(run[arm]["nll"] <= run["reference"]["nll"] for run in runs) if "reference" in runs[0] else None
            evaluations = statistics.fmean(run[arm]["evaluations"] or 0 for run in runs)
            rows.append([model, arm, f"{fell_back}/{len(runs)}", f"{helped}/{len(used)}" if used else "–",
                         f"{reached}/{len(runs)}" if reached is not None else "–", f"{evaluations:.1f}",
                         f"{statistics.fmean(run[arm]['iterations'] or 0 for run in runs):.1f}"])
    headers = ["model", "arm", "fell back to TS", "δ kept and test NLL < TS's", "test NLL ≤ reference's", "mean objective evaluations", "mean iterations kept"]
    return ["## The decision whether δ helps", "", *_report.table(headers, rows), ""]


def measure(args: argparse.Namespace) -> Dict[str, List[Dict[str, Any]]]:
    reference = find_reference("nc")
    nct = import_nctoolkit(reference) if reference is not None else None
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    results = {}
    for model in models:
        demo, pool = zoo_pool(model)
        if args.quick:
            pool = pool.select(range(120))
        inputs, labels = model_tensors(demo, pool)
        results[model] = [run_seed(nct, demo, inputs, labels, seed, args.quick) for seed in range(args.repeats)]
    results["_reference"] = reference.commit if reference is not None else None  # type: ignore[assignment]
    return results


def report(session: _report.Session, results: Dict[str, Any]) -> str:
    commit = results.pop("_reference")
    lines = session.header("Neural Clamping: time to quality against the authors' recipe", ["torch", "timm", "transformers"])
    lines += [f"Reference: NCToolkit at commit `{commit}`." if commit else "Reference: not run (set HF_CALIBRATE_NCTOOLKIT).", ""]
    lines += ["Test scores are mean ± std over seeds; Δ columns are paired differences over seeds, mean and 95 % t-interval; "
              "times are wall seconds of the whole fit on one torch thread, ratios the median over seeds of the per-seed ratio.", ""]
    for model, runs in results.items():
        lines += model_table(model, runs)
    lines += decision_table(results)
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--json", default=None, help="also write the raw per-seed records here")
    return run(_report.parse(parser, argv), "bench_nc_time_to_quality.py", measure, report, NAME)


def run(args: argparse.Namespace, script: str, measure_: Callable[[argparse.Namespace], Dict[str, Any]],
        report_: Callable[[_report.Session, Dict[str, Any]], str], name: str) -> int:
    """Measure, keep the raw records when ``--json`` asks, then write (or with ``--quick`` print) the report."""
    session = _report.Session(script, args)
    results = measure_(args)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle)
    session.finish(report_(session, results), name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
