"""Calibration quality of every method on the zoo's real models, clean and under shift (docs/design.md §6).

For each zoo model (``hf_calibrate.demo``: timm CNN and transformers ViT trained on sklearn
digits, the pretrained MiniLM with a head trained on BBC News; each base trained once on its
``train`` split and then fixed) and each seed, the ``calibration`` ∪ ``test`` rows are
reshuffled into new stratified calibration / test halves. Every method is fitted on the
calibration half and scored on the test half, clean and corrupted (``hf_calibrate.corruptions``
at one severity, every corruption of the modality: noise, blur, rotation for images; token
dropout, character noise for text). The tables give mean ± std over the seeds.

How each method is fitted — all through the public ``CalibratedModel.fit``:

* logit-space methods (TS, vector, matrix, Dirichlet, histogram, isotonic) on the base's
  logits, cached once per model (the model passed to ``fit`` is ``nn.Identity``). These methods
  see nothing but logits, so this is the same fit as on the model, without repeating its
  forward pass for every method and seed;
* head methods (TST, V-TST, MaC-Cal, each also "+ TS": ``temperature=True``, the temperature fitted
  on the head's held-out validation part) on the base's penultimate features, cached once per
  model, with a copy of the base's classifier layer as the model — the backbone is frozen and
  in eval mode, so its features are the same in every fit;
* Neural Clamping on the real model and the real rows (δ enters the input), with the schedule
  in the table header (reduced on CPU; the SGD optimiser's default is 500 steps).

Usage::

    python benchmarks/bench_quality.py            # 3 models × 5 seeds; writes results/quality.md
    python benchmarks/bench_quality.py --quick    # the CNN, 1 seed, short fits; prints only
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import _report

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.corruptions import corrupted_versions
from hf_calibrate.data import prepare_data
from hf_calibrate.metrics import calibration_report
from hf_calibrate.metrics.catalog import METRIC_INFO

NAME = "quality"
LOGIT_METHODS = ("temperature", "vector", "matrix", "dirichlet", "histogram", "isotonic")
HEAD_METHODS = ("tst", "vtst", "mac_cal")
COLUMNS = tuple((key, METRIC_INFO[key].short_title) for key in ("accuracy", "ece", "ada_ece", "classwise_ece", "nll", "brier"))
SHIFT_SEVERITY = 3
#: Neural Clamping arms: the default (held-out NLL selects the epoch and the fallback to TS) and the
#: former default criterion, held-out 15-bin ECE — the evidence for the change of default
NC_ARMS = {"neural_clamping": {}, "neural_clamping (select ECE)": {"select_metric": "ece"}}


def _nc_schedule(model_name: str, quick: bool) -> Dict[str, Any]:
    """Neural Clamping options per model: reduced schedules that fit a 2-core CPU budget."""
    if quick:
        return dict(epochs=3, batch_size=128)
    if model_name == "bbc_minilm":  # one MiniLM forward+backward over the data costs ~10 s here
        return dict(epochs=4, batch_size=64, eval_every=1)
    return dict(epochs=60, batch_size=128)


def _zoo(name: str) -> Any:
    from hf_calibrate import demo

    return {"digits_cnn": demo.digits_timm_cnn, "digits_vit": demo.digits_vit, "bbc_minilm": demo.bbc_minilm}[name](progress=False)


def _data_options(demo: Any) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    if demo.library == "transformers":
        options["preprocessor"] = demo.preprocessor
    if "max_length" in demo.recipe["hparams"]:
        options["max_length"] = demo.recipe["hparams"]["max_length"]
    return options


def _batches(demo: Any, backbone: Any, dataset: Any, batch_size: int = 128) -> Iterator[Tuple[Dict[str, Any], torch.Tensor]]:
    """(model inputs, labels) batches of ``dataset``, preprocessed as the fits do."""
    prepared = prepare_data(dataset, backbone, **_data_options(demo))
    for start in range(0, len(prepared), batch_size):
        yield prepared.collate([prepared.dataset[i] for i in range(start, min(start + batch_size, len(prepared)))])


def _features_and_logits(demo: Any, dataset: Any) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the frozen base: penultimate features (N, d), logits (N, C), labels (N,)."""
    backbone = adapt(demo.model)
    features, logits, labels = [], [], []
    for inputs, batch_labels in _batches(demo, backbone, dataset):
        with torch.no_grad(), backbone.features_captured() as captured:
            logits.append(backbone.logits(inputs).float())
        features.append(captured.inputs[-1].reshape(captured.inputs[-1].shape[0], -1).float())
        labels.append(batch_labels)
    return torch.cat(features), torch.cat(logits), torch.cat(labels)


def _stratified_halves(labels: torch.Tensor, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(labels))
    calibration, test = train_test_split(indices, train_size=0.5, stratify=labels.numpy(), random_state=seed)
    return np.sort(calibration), np.sort(test)


def _report_of(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    report = calibration_report(torch.softmax(logits.double(), dim=1), labels)
    return {key: report[key] for key, _ in COLUMNS}


class _Sets:
    """Cached base outputs of one model: the clean pool and each corrupted copy of it."""

    def __init__(self, demo: Any, pool: Any, modality: str, quick: bool) -> None:
        self.demo, self.pool = demo, pool
        self.names: List[str] = ["clean"]
        self.datasets: Dict[str, Any] = {"clean": pool}
        if not quick:
            for kind, _, corrupted in corrupted_versions(pool, modality, severities=(SHIFT_SEVERITY,)):
                self.names.append(kind)
                self.datasets[kind] = corrupted
        self.outputs = {name: _features_and_logits(demo, data) for name, data in self.datasets.items()}

    @property
    def labels(self) -> torch.Tensor:
        return self.outputs["clean"][2]


def _evaluate_cached(calibrated: CalibratedModel, sets: _Sets, rows: np.ndarray, use_features: bool) -> Dict[str, Dict[str, float]]:
    index = torch.as_tensor(rows)
    results = {}
    with torch.no_grad():
        for name in sets.names:
            features, logits, labels = sets.outputs[name]
            out = calibrated((features if use_features else logits)[index])
            results[name] = _report_of(out, labels[index])
    return results


def _nc_logits(calibrated: CalibratedModel, demo: Any, dataset: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """One pass of the calibrated model (δ on the input) over ``dataset``: its logits (N, C) and labels (N,), in row order."""
    logits, labels = [], []
    for inputs, batch_labels in _batches(demo, calibrated.backbone, dataset):
        with torch.no_grad():
            output = calibrated(**inputs)
        logits.append(getattr(output, "logits", output).float())
        labels.append(batch_labels)
    return torch.cat(logits), torch.cat(labels)


def _evaluate_nc(calibrated: CalibratedModel, sets: _Sets, rows: np.ndarray) -> Dict[str, Dict[str, float]]:
    """Neural Clamping's metrics on every set: one pass of the calibrated model each."""
    return {name: _report_of(*_nc_logits(calibrated, sets.demo, sets.datasets[name].select(rows))) for name in sets.names}


def run_seed(sets: _Sets, seed: int, nc_options: Dict[str, Any], quick: bool) -> Tuple[Dict[str, Dict[str, Dict[str, float]]], Dict[str, Any]]:
    """Every method on one reshuffle: method → set → metric; plus facts (NC fallback, λ, seconds)."""
    calibration, test = _stratified_halves(sets.labels, seed)
    cal_index = torch.as_tensor(calibration)
    features, logits, labels = sets.outputs["clean"]
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    facts: Dict[str, Any] = {"seconds": {}}
    results["uncalibrated"] = {
        name: _report_of(sets.outputs[name][1][torch.as_tensor(test)], sets.outputs[name][2][torch.as_tensor(test)]) for name in sets.names
    }
    logit_data = TensorDataset(logits[cal_index], labels[cal_index])
    for method in LOGIT_METHODS:
        started = time.perf_counter()
        calibrated = CalibratedModel.fit(nn.Identity(), logit_data, method=method, progress=False, seed=seed)
        facts["seconds"][method] = time.perf_counter() - started
        results[method] = _evaluate_cached(calibrated, sets, test, use_features=False)
    head_layer = copy.deepcopy(adapt(sets.demo.model).final_layer()).requires_grad_(False)
    feature_data = TensorDataset(features[cal_index], labels[cal_index])
    head_options = dict(epochs=3) if quick else {}
    for method in HEAD_METHODS:
        for with_ts in (False, True):
            label = f"{method} + TS" if with_ts else method
            started = time.perf_counter()
            calibrated = CalibratedModel.fit(head_layer, feature_data, method=method, temperature=with_ts, progress=False, seed=seed, **head_options)
            facts["seconds"][label] = time.perf_counter() - started
            results[label] = _evaluate_cached(calibrated, sets, test, use_features=True)
    for label, arm in NC_ARMS.items():
        started = time.perf_counter()
        nc = CalibratedModel.fit(sets.demo.model, sets.pool.select(calibration), method="neural_clamping", progress=False, seed=seed,
                                 **nc_options, **arm, **_data_options(sets.demo))
        facts["seconds"][label] = time.perf_counter() - started
        facts.setdefault("nc_fell_back", {})[label] = bool(nc.fit_summary["fell_back_to_temperature_scaling"])
        results[label] = _evaluate_nc(nc, sets, test)
    return results, facts


def _mean_std(values: Sequence[float]) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "–"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {std:.4f}"


def _tables(model_name: str, sets: _Sets, runs: List[Tuple[Dict, Dict]], nc_options: Dict[str, Any]) -> List[str]:
    demo = sets.demo
    methods = list(runs[0][0])
    seeds = len(runs)
    lines = [f"## {model_name}: {demo.recipe['name']} ({demo.library}), {len(sets.pool)} rows reshuffled into calibration / test halves", ""]
    base_test = demo.recipe["test"]
    lines.append(
        f"Base on its original test split: accuracy {base_test['accuracy']:.4f}, ECE {base_test['ece']:.4f}, mean confidence "
        f"{base_test['mean_confidence']:.4f}. Neural Clamping schedule: `{nc_options}`; it fell back to TS (δ = 0): "
        + "; ".join(f"{label} in {sum(f['nc_fell_back'][label] for _, f in runs)}" for label in NC_ARMS) + f" of {seeds} seeds."
    )
    lines += ["", f"Clean test half, mean ± std over {seeds} seeds (lower is better except acc; **bold**: best ECE and best NLL):", ""]
    lines.append("| method | " + " | ".join(title for _, title in COLUMNS) + " | fit s |")
    lines.append("|---|" + "---|" * (len(COLUMNS) + 1))
    means = {m: {k: statistics.fmean(r[m]["clean"][k] for r, _ in runs) for k, _ in COLUMNS} for m in methods}
    best = {k: min(means[m][k] for m in methods) for k in ("ece", "nll")}
    for method in methods:
        cells = []
        for key, _ in COLUMNS:
            text = _mean_std([r[method]["clean"][key] for r, _ in runs])
            cells.append(f"**{text}**" if key in best and means[method][key] == best[key] else text)
        seconds = [f["seconds"][method] for _, f in runs if method in f["seconds"]]
        cells.append(f"{statistics.median(seconds):.1f}" if seconds else "–")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    shifted = [name for name in sets.names if name != "clean"]
    if shifted:
        lines += ["", f"Under shift (severity {SHIFT_SEVERITY}): ECE and NLL on each corrupted copy of the test half, mean ± std over {seeds} seeds:", ""]
        lines.append("| method | " + " | ".join(f"ECE {n}" for n in shifted) + " | " + " | ".join(f"NLL {n}" for n in shifted) + " |")
        lines.append("|---|" + "---|" * (2 * len(shifted)))
        for method in methods:
            cells = [_mean_std([r[method][n]["ece"] for r, _ in runs]) for n in shifted]
            cells += [_mean_std([r[method][n]["nll"] for r, _ in runs]) for n in shifted]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    ts = [r["temperature"]["clean"]["ece"] for r, _ in runs]
    wins = {m: sum(r[m]["clean"]["ece"] < t for (r, _), t in zip(runs, ts)) for m in methods if m != "temperature"}
    lines += ["", "Seeds (of %d) where the method's clean test ECE is below temperature scaling's: " % seeds
              + ", ".join(f"{m} {w}" for m, w in wins.items()) + ".", ""]
    return lines + _paired_table(runs, methods)


def _pairs(methods: Sequence[str]) -> List[Tuple[str, str]]:
    """(method, reference) rows of the paired table: every method against TS, V-TST against TST, and
    the default Neural Clamping against its other arms."""
    pairs = [(m, "temperature") for m in methods if m not in ("temperature", "uncalibrated")]
    pairs += [(m, "tst") for m in ("vtst", "vtst + TS") if m in methods and "tst" in methods]
    return pairs + [("neural_clamping", label) for label in NC_ARMS if label != "neural_clamping" and label in methods]


def _paired_interval(differences: Sequence[float]) -> str:
    """Mean of paired differences with its 95 % Student-t interval over the seeds."""
    from scipy import stats

    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return f"{mean:+.4f}"
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]"


def _paired_table(runs: List[Tuple[Dict, Dict]], methods: Sequence[str]) -> List[str]:
    """Clean test ECE and NLL differences (method − reference) on the same split per seed: an interval
    that excludes 0 is a difference the seeds resolve; one that spans 0 is not."""
    lines = [f"Paired differences on the clean test half (method − reference, same split per seed; mean and 95 % "
             f"t-interval over {len(runs)} seeds; negative = method better):", "",
             "| method | reference | ΔECE | ΔNLL |", "|---|---|---|---|"]
    for method, reference in _pairs(methods):
        cells = [_paired_interval([r[method]["clean"][key] - r[reference]["clean"][key] for r, _ in runs]) for key in ("ece", "nll")]
        lines.append(f"| {method} | {reference} | " + " | ".join(cells) + " |")
    return lines + [""]


@dataclasses.dataclass
class ModelRuns:
    """One zoo model's data sets, Neural Clamping schedule and per-seed (results, facts) runs."""

    model_name: str
    sets: _Sets
    runs: List[Tuple[Dict, Dict]]
    nc_options: Dict[str, Any]


def measure(args: argparse.Namespace) -> List[ModelRuns]:
    """Every method on each model of ``--models``, one run per seed (``--repeats`` seeds)."""
    from datasets import concatenate_datasets

    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else ["digits_cnn", "digits_vit", "bbc_minilm"])
    seeds = list(range(args.repeats))  # --repeats is the number of seeds here
    measured = []
    for model_name in models:
        demo = _zoo(model_name)
        pool = concatenate_datasets([demo.dataset["calibration"], demo.dataset["test"]])
        modality = "text" if model_name == "bbc_minilm" else "image"
        sets = _Sets(demo, pool, modality, args.quick)
        nc_options = _nc_schedule(model_name, args.quick)
        runs = []
        for seed in seeds:
            started = time.perf_counter()
            runs.append(run_seed(sets, seed, nc_options, args.quick))
            print(f"{model_name} seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        measured.append(ModelRuns(model_name, sets, runs, nc_options))
    return measured


def report(session: _report.Session, results: List[ModelRuns]) -> str:
    body: List[str] = []
    for model in results:
        body += _tables(model.model_name, model.sets, model.runs, model.nc_options)
    header = session.header(
        "Calibration quality of every method", ["torch", "timm", "transformers"],
        extra="Seeds = `--repeats`. Fit seconds are medians over seeds (logit and head methods on cached outputs; Neural Clamping on the model).",
    )
    return "\n".join(header + body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help="comma-separated subset of digits_cnn,digits_vit,bbc_minilm")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_quality.py", args)
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
