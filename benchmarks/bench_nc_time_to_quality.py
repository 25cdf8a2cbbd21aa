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

Arms run only when ``--arms`` names them (a study of the "does δ help" decision;
the hf_calibrate code is not changed, the options are passed or its fold runs read). The study's records
(``results/nc_fresh_seeds_records.jsonl``) were made when the default patience was 4: there the point rule, and
every arm built on it, ran with patience 4; the default is now 12, the patience-12 arm's.

* **L-BFGS, 3 folds** / **L-BFGS, 5 folds**: the point rule with ``folds=3`` / ``folds=5``;
* **L-BFGS, patience 12**: the point rule with ``patience=12`` (= ``max_iterations``: every run takes all 12
  iterations unless it converges);
* **L-BFGS, patience from the first gain**: the point rule, but the runs stop ``patience`` (4) iterations after
  the best iteration only once an iteration has beaten iteration 0; until then they go on, to ``max_iterations``
  (``nc_lbfgs.patience_spent`` replaced by :func:`spent_after_a_gain`). Where the default keeps δ it is the
  default's fit exactly; it differs only where the default stopped with iteration 0 best;
* **L-BFGS, repeated 2 folds ×3**: repeated cross-fitting — the point rule's fit and two more with
  other fold assignments (fold seeds seed + 1000·r); every calibration row's held-out NLL at each
  iteration is averaged over the three assignments, the iteration is chosen on that averaged
  curve (up to the shortest run's last iteration), δ is kept when it beats iteration 0 (TS) there,
  and the fitted (δ, log T) is the mean of the six fold runs' at that iteration; else TS.

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
    # fresh seeds 100-109, the decision study's arms, a per-seed table, records as JSON lines:
    python benchmarks/bench_nc_time_to_quality.py --models digits_cnn --first-seed 100 --repeats 10 \
        --arms point,folds3,folds5,repeated --per-seed --records benchmarks/results/nc_fresh_seeds_records.jsonl \
        --output benchmarks/results/nc_fresh_seeds.md
    # the report of earlier runs' records (several files: their records in order), fitting nothing:
    python benchmarks/bench_nc_time_to_quality.py --per-seed --from-records a.jsonl b.jsonl --output report.md
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
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import _report
import bench_quality as quality
from _fidelity_common import NC_DEMO, cuda_is_a_no_op, find_reference, global_rng, import_nctoolkit, quiet, zoo_pool
from _fidelity_nc import LogitsOf, ReplayedBatches, num_classes

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.fitting.clamping import lbfgs as nc_lbfgs
from hf_calibrate.fitting.clamping import lbfgs_fit as nc_lbfgs_fit
from hf_calibrate.metrics import calibration_report

NAME = "nc_time_to_quality"
MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
ARMS = {"L-BFGS, point rule": {"optimizer": "lbfgs", "require_significant_gain": False},
        "auto": {"method": "auto"},
        "L-BFGS, 3 folds": {"optimizer": "lbfgs", "require_significant_gain": False, "folds": 3},
        "L-BFGS, 5 folds": {"optimizer": "lbfgs", "require_significant_gain": False, "folds": 5},
        "L-BFGS, patience 12": {"optimizer": "lbfgs", "require_significant_gain": False, "patience": 12},
        "L-BFGS, patience from the first gain": {"optimizer": "lbfgs", "require_significant_gain": False}}
#: ``--arms`` keys → arm names; the default runs the first two (and the derived significance rule)
ARM_KEYS = {"point": "L-BFGS, point rule", "auto": "auto", "folds3": "L-BFGS, 3 folds", "folds5": "L-BFGS, 5 folds",
            "patience12": "L-BFGS, patience 12", "firstgain": "L-BFGS, patience from the first gain",
            "repeated": "L-BFGS, repeated 2 folds ×3"}
DEFAULT_ARMS = "point,auto"
#: repeated cross-fitting: this many fold assignments, the r-th with fold seed ``seed + REPEAT_SEED_STEP·r``
REPEATED_FITS, REPEAT_SEED_STEP = 3, 1000
#: the reference's test gain over TS (nats) beyond which a fallback counts as a lost gain
LOST_GAIN_THRESHOLDS = (0.0, 0.002, 0.005)
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


def run_seed(nct: Any, demo: Any, inputs: Dict[str, torch.Tensor], labels: torch.Tensor, seed: int, quick: bool,
             arms: Sequence[str] = tuple(ARM_KEYS[key] for key in DEFAULT_ARMS.split(","))) -> Dict[str, Any]:
    """Every arm of ``arms`` (and TS, the reference, the derived arms) on one reshuffle: arm → {seconds, test scores, facts}."""
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
    captured = CapturedRuns()  # the point rule's fold runs: the first assignment of repeated cross-fitting
    for arm in [arm for arm in ARMS if arm in arms][:1 if quick else None]:  # --quick: the first arm only
        options = dict(ARMS[arm])
        with ReplacedLockstep(arm == ARM_KEYS["firstgain"]), captured if arm == ARM_KEYS["point"] else CapturedRuns():
            seconds, calibrated = fit_ours(demo, cal_inputs, labels[calibration], options.pop("method", "neural_clamping"), seed, **options)
        record[arm] = {"seconds": seconds, **fit_facts(calibrated), **scores(calibrated_logits(calibrated, test_inputs), test_labels)}
    if ARM_KEYS["repeated"] in arms and not quick and ARM_KEYS["point"] in record:
        point = record[ARM_KEYS["point"]]
        seconds, calibrated, facts = fit_repeated(demo, cal_inputs, labels[calibration], seed, captured)
        record[ARM_KEYS["repeated"]] = {**facts, "seconds": point["seconds"] + seconds, "evaluations": point["evaluations"] + facts["evaluations"],
                                        **scores(calibrated_logits(calibrated, test_inputs), test_labels)}
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


class CapturedRuns:
    """While entered, the L-BFGS fold runs of every cross-fit (``nc_lbfgs_fit.lockstep``'s runs: held-out logits and θ
    per iteration), one list per fit, in ``fits``; the fit itself is unchanged."""

    def __init__(self) -> None:
        self.fits: List[List[Any]] = []

    def __enter__(self) -> "CapturedRuns":
        self.original = original = nc_lbfgs_fit.lockstep

        def lockstep(runs: List[Any], *args: Any, **kwargs: Any) -> List[float]:
            self.fits.append(runs)
            return original(runs, *args, **kwargs)

        nc_lbfgs_fit.lockstep = lockstep
        return self

    def __exit__(self, *exc: Any) -> None:
        nc_lbfgs_fit.lockstep = self.original


def spent_after_a_gain(iteration: int, best: int, patience: int) -> bool:
    """``nc_lbfgs.patience_spent`` with one change: patience counts only once an iteration has beaten iteration 0
    (TS); until then the rounds go on to ``max_iterations`` (or until every run has converged)."""
    return best > 0 and iteration - best >= patience


class ReplacedLockstep:
    """While entered (when ``active``), the L-BFGS rounds stop by :func:`spent_after_a_gain`."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def __enter__(self) -> "ReplacedLockstep":
        self.original = nc_lbfgs.patience_spent
        if self.active:
            nc_lbfgs.patience_spent = spent_after_a_gain
        return self

    def __exit__(self, *exc: Any) -> None:
        nc_lbfgs.patience_spent = self.original


def fit_repeated(demo: Any, inputs: Dict[str, torch.Tensor], labels: torch.Tensor, seed: int,
                 first: CapturedRuns) -> Tuple[float, CalibratedModel, Dict[str, Any]]:
    """Repeated cross-fitting: ``first`` (the point rule's fold runs) and ``REPEATED_FITS − 1`` fits more with other
    fold seeds, decided on their averaged held-out curve (:func:`averaged_curve_choice`). Returns the seconds and the
    objective evaluations beyond the first fit's, the model (the last fit's, set to the choice) and its facts."""
    started, captured, evaluations = time.perf_counter(), CapturedRuns(), 0
    with captured:
        for repeat in range(1, REPEATED_FITS):
            _, calibrated = fit_ours(demo, inputs, labels, "neural_clamping", seed + REPEAT_SEED_STEP * repeat, optimizer="lbfgs")
            evaluations += calibrated.fit_summary["evaluations"]
    fits = first.fits + captured.fits
    choice = averaged_curve_choice(fits, labels)
    calibrator = calibrated.calibrator
    with torch.no_grad():
        if choice["kept"]:
            calibrator.delta.copy_(choice.pop("theta")[:-1].reshape(calibrator.delta.shape).to(calibrator.delta))
            calibrator.log_temperature.copy_(torch.tensor(choice["log_temperature"]))
        else:  # the temperature method's fit on all rows: the TS arm's model
            choice.pop("theta")
            calibrator.delta.zero_()
            calibrator.log_temperature.fill_(calibrated.fit_summary["temperature_scaling"]["fallback_log_temperature"])
    facts = {"fell_back": not choice["kept"], "iterations": choice["iteration"], "evaluations": evaluations,
             "selection": {"nll_difference": choice["nll_difference"]}, "refit": "average", "curve": choice["curve"],
             "temperature": float(calibrator.temperature), "delta_norm": float(calibrator.delta.norm())}
    return time.perf_counter() - started, calibrated, facts


def averaged_curve_choice(fits: List[List[Any]], labels: torch.Tensor) -> Dict[str, Any]:
    """The point rule on the held-out NLL averaged over fold assignments: each fit's runs hold out every row once, so
    each row has one held-out NLL per fit and iteration; their mean over fits, then over rows, is the curve (up to the
    shortest fit's last iteration). δ is kept at the curve's minimum when it is below iteration 0 (TS cross-fitted);
    θ is then the mean of every fit's runs' θ at that iteration. Also the rows' paired difference to iteration 0."""
    per_fit = [held_out_losses(runs, labels) for runs in fits]
    length = min(len(losses) for losses in per_fit)
    rows = torch.stack([losses[:length] for losses in per_fit]).mean(0)  # (iterations, N): averaged over fits
    curve = rows.mean(1)
    best = int(curve.argmin())
    kept = best > 0 and bool(curve[best] < curve[0])
    theta = torch.stack([run.snapshots[best] for runs in fits for run in runs]).mean(0)
    differences = rows[best] - rows[0]
    half = 1.959964 * float(differences.std()) / len(differences) ** 0.5
    point = float(differences.mean())
    return {"kept": kept, "iteration": best if kept else 0, "curve": [float(value) for value in curve], "theta": theta,
            "log_temperature": float(theta[-1]), "nll_difference": {"point": point, "low": point - half, "high": point + half}}


def held_out_losses(runs: List[Any], labels: torch.Tensor) -> torch.Tensor:
    """(iterations, N) float64 held-out NLL of every calibration row at every iteration of one cross-fit's runs."""
    iterations = min(len(run.scored) for run in runs)
    losses = torch.full((iterations, len(labels)), float("nan"), dtype=torch.float64)
    for run in runs:
        held = run.held.cpu()
        for iteration in range(iterations):
            losses[iteration, held] = functional.cross_entropy(run.scored[iteration].double().cpu(), labels[held], reduction="none")
    return losses


# ----------------------------------------------------------------------------- report


def model_table(model: str, runs: List[Dict[str, Any]]) -> List[str]:
    """One model: every arm's mean test scores and time, its paired differences to the reference and TS, its time ratios."""
    arms = [arm for arm in ("uncalibrated", "TS", "reference", *ARMS, ARM_KEYS["repeated"], *DERIVED) if arm in runs[0]]  # --quick fits one arm
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


def delta_arms(runs: List[Dict[str, Any]]) -> List[str]:
    """The arms of ``runs`` that decide on δ (auto has none), in the tables' order."""
    return [arm for arm in (*ARMS, ARM_KEYS["repeated"], *DERIVED) if arm in runs[0] and "method" not in runs[0][arm]]


def decision_table(results: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """Per model and arm: how often the fit fell back to TS, and whether δ's use agreed with the test half."""
    rows = []
    for model, runs in results.items():
        for arm in delta_arms(runs):
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


def per_seed_table(model: str, runs: List[Dict[str, Any]]) -> List[str]:
    """One model, one row per seed: the reference's test gain over TS, and per δ arm "δ" (kept) or "TS" (fell back)
    with its test NLL minus TS's and minus the reference's."""
    arms = delta_arms(runs)
    rows = []
    for run in runs:
        row = [str(run["seed"]), f"{run['TS']['nll'] - run['reference']['nll']:+.4f}" if "reference" in run else "–"]
        for arm in arms:
            versus_reference = f" / {run[arm]['nll'] - run['reference']['nll']:+.4f}" if "reference" in run else ""
            row.append(f"{'TS' if run[arm]['fell_back'] else 'δ'} {run[arm]['nll'] - run['TS']['nll']:+.4f}{versus_reference}")
        rows.append(row)
    headers = ["seed", "reference gain (TS − reference NLL)", *arms]
    return [f"### {model}: per seed — kept δ or fell back to TS; test NLL − TS / − reference", "", *_report.table(headers, rows), ""]


def lost_gain_table(results: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """Per model and δ arm: fallbacks where the reference's test NLL was below TS's by more than each threshold,
    and δ kept with a test NLL above TS's."""
    rows = []
    for model, runs in results.items():
        if "reference" not in runs[0]:
            continue
        gains = [run["TS"]["nll"] - run["reference"]["nll"] for run in runs]
        for arm in delta_arms(runs):
            row = [model, arm]
            for threshold in LOST_GAIN_THRESHOLDS:
                gained = [run for run, gain in zip(runs, gains) if gain > threshold]
                row.append(f"{sum(run[arm]['fell_back'] for run in gained)}/{len(gained)}")
            row.append(f"{sum(not run[arm]['fell_back'] and run[arm]['nll'] > run['TS']['nll'] for run in runs)}/{len(runs)}")
            rows.append(row)
    headers = ["model", "arm", *(f"fell back where reference gained > {threshold:g}" for threshold in LOST_GAIN_THRESHOLDS),
               "kept δ with test NLL > TS's"]
    return ["## Lost gains and harmful δ", "", *_report.table(headers, rows), ""]


def measure(args: argparse.Namespace) -> Dict[str, List[Dict[str, Any]]]:
    reference = find_reference("nc")
    if args.from_records:
        return read_records(args.from_records, reference.commit if reference is not None else None)
    nct = import_nctoolkit(reference) if reference is not None else None
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    arms = [ARM_KEYS[key] for key in args.arms.split(",")]
    if args.records:
        open(args.records, "w").close()
    results = {}
    for model in models:
        demo, pool = zoo_pool(model)
        if args.quick:
            pool = pool.select(range(120))
        inputs, labels = model_tensors(demo, pool)
        results[model] = []
        for seed in range(args.first_seed, args.first_seed + args.repeats):
            results[model].append(run_seed(nct, demo, inputs, labels, seed, args.quick, arms))
            write_record(args.records, model, results[model][-1])
    results["_reference"] = reference.commit if reference is not None else None  # type: ignore[assignment]
    return results


def read_records(paths: Sequence[str], commit: Optional[str]) -> Dict[str, Any]:
    """Results from ``--records`` files instead of fits: model → its records in file order; ``commit``: the reference's."""
    results: Dict[str, Any] = {}
    for path in paths:
        with open(path) as handle:
            for line in handle:
                record = json.loads(line)
                results.setdefault(record.pop("model"), []).append(record)
    results["_reference"] = commit
    return results


def write_record(path: Optional[str], model: str, record: Dict[str, Any]) -> None:
    """Append one seed's record, with its model, to the JSON-lines file ``path`` (when given)."""
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"model": model, **record}) + "\n")


def report(session: _report.Session, results: Dict[str, Any]) -> str:
    commit = results.pop("_reference")
    lines = session.header("Neural Clamping: time to quality against the authors' recipe", ["torch", "timm", "transformers"])
    lines += [f"Reference: NCToolkit at commit `{commit}`." if commit else "Reference: not run (set HF_CALIBRATE_NCTOOLKIT).", ""]
    if session.args.from_records:
        lines += [f"Rendered from the per-seed records of earlier runs: {', '.join(f'`{path}`' for path in session.args.from_records)} "
                  "(the machine lines above are the rendering's).", ""]
    lines += ["Test scores are mean ± std over seeds; Δ columns are paired differences over seeds, mean and 95 % t-interval; "
              "times are wall seconds of the whole fit on one torch thread, ratios the median over seeds of the per-seed ratio.", ""]
    for model, runs in results.items():
        lines += model_table(model, runs)
    lines += decision_table(results)
    if session.args.per_seed:
        lines += lost_gain_table(results)
        for model, runs in results.items():
            lines += per_seed_table(model, runs)
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--json", default=None, help="also write the raw per-seed records here")
    parser.add_argument("--records", default=None, help="also write the per-seed records here as JSON lines, each with its model")
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed … first-seed + repeats − 1 (default 0)")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated, from {', '.join(ARM_KEYS)} (default {DEFAULT_ARMS}; "
                        "repeated needs point)")
    parser.add_argument("--per-seed", action="store_true", help="add the per-seed table and the lost-gain counts to the report")
    parser.add_argument("--from-records", nargs="+", default=None, help="fit nothing: report the records of these --records files")
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
