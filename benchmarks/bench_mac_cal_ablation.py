"""Where MaC-Cal's gain comes from: paired ablations of our reconstruction's parts.

MaC-Cal (``hf_calibrate.calibrators.mac_cal``) is our reconstruction from the paper's abstract and
one figure caption (docs/design.md §3.4). Each arm below changes one of the parts we chose and is
fitted beside the default on the same calibration half, seed and cached features:

* ``default``: ``method="mac_cal"`` with its defaults (linear head started from the base
  classifier, one Bernoulli(r) weight mask per training batch, prediction = mean softmax over
  M = 10 stored masks at r, 30 epochs, Adam 3e-3, controller η = 1 from r₀ = 0.9);
* ``full weights``: prediction (validation, so the controller too, and test) with the full
  weights, r ignored outside training — what our first reconstruction did;
* ``heads' step budget``: ``epochs=None``, the head family's default (40 epochs, stretched to at
  least 6,000 Adam steps), instead of MaC-Cal's 30-epoch override; the controller then also
  runs once per (much shorter) epoch;
* ``fresh head``: ``init_from_base=False`` (the head's seeded random initialisation) at the
  default 30 epochs; ``fresh head + step budget`` gives the fresh head the 6,000 steps too,
  since 30 epochs of a few hundred rows are only ~60 steps;
* ``per-sample masks``: a fresh mask per training row (B × C × d) instead of one per batch;
* ``no masks`` (a control): r = 1 throughout, the controller off — the same head, schedule and
  epoch selection without any masking, to see what the masks add at all.

Arms without a library option are subclasses defined here (registered under their own method
names in this process only). Each is fitted through ``CalibratedModel.fit`` on the base's cached
penultimate features with a copy of the base's classifier layer as the model, as in
``bench_quality.py``; temperature scaling (TS) is fitted on the cached logits. Per seed the zoo
model's calibration ∪ test rows are reshuffled into stratified halves (``bench_quality``'s);
the test half only scores.

Reported per model: mean ± std over the seeds of test NLL, ECE (15 equal-width bins), Brier
and fit time; paired differences arm − default, arm − TS and arm − uncalibrated with 95 %
Student-t intervals over the seeds; the kept epoch and its retention rate r.

Usage::

    python benchmarks/bench_mac_cal_ablation.py                     # 3 models × 5 seeds; writes results/mac_cal_ablation.md
    python benchmarks/bench_mac_cal_ablation.py --quick             # the CNN, 1 seed; prints only
    python benchmarks/bench_mac_cal_ablation.py --repeats 10 --json benchmarks/results/mac_cal_ablation.jsonl
    python benchmarks/bench_mac_cal_ablation.py --from-json benchmarks/results/mac_cal_ablation.jsonl   # report only
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import _report
from bench_quality import _features_and_logits, _paired_interval, _stratified_halves, _zoo
from bench_safe_defaults import _resolved_worse, fit_ours, scores

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.calibrators.base import CALIBRATORS
from hf_calibrate.calibrators.heads import DEFAULT_EPOCHS, MIN_DEFAULT_STEPS
from hf_calibrate.calibrators.mac_cal import MaskedClassifierHead, _MaskedLinear

NAME = "mac_cal_ablation"
MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
METRICS = ("nll", "ece", "brier", "accuracy")
DEFAULT_ARM = "default"
REFERENCES = ("temperature", "uncalibrated")
#: one record per (model, seed): {"model", "seed", "train_rows", "arms": {arm: {metric: value, ...}}}
Record = Dict[str, Any]


# ----------------------------------------------------------------------------- the arms' heads


class _FullWeightLinear(_MaskedLinear):
    """Training as MaC-Cal's (one Bernoulli(r) mask per batch, 1/r scaling); prediction with the full weights."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.training:
            return super().forward(features)
        return F.linear(features, self.weight, self.bias)


class _PerSampleLinear(_MaskedLinear):
    """A fresh Bernoulli(r) mask of the weights for every training row (B × C × d); prediction as MaC-Cal's."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        r = float(self.retention)
        if not self.training or r >= 1.0:
            return super().forward(features)
        masks = self._draw((features.shape[0], *self.weight.shape), self.generator)  # (B, C, d)
        return torch.einsum("bd,bcd->bc", features, self.weight[None] * masks / r) + self.bias


def _arm_class(label: str, head: Type[_MaskedLinear] = _MaskedLinear, **defaults: Any) -> Type[MaskedClassifierHead]:
    """MaC-Cal with ``head`` as its module and its Options' ``defaults`` changed, registered as ``mac_cal[label]``
    (reused when this module runs twice in one process)."""
    method = f"mac_cal[{label}]"
    if method in CALIBRATORS:
        return CALIBRATORS[method]

    def __init__(self: MaskedClassifierHead, num_classes: int, feature_dim: int, samples: int = 10) -> None:
        MaskedClassifierHead.__init__(self, num_classes, feature_dim, samples)
        self.head_module = head(feature_dim, num_classes, self.samples)

    namespace: Dict[str, Any] = {"method": method, "__init__": __init__, "__module__": __name__}
    if defaults:  # e.g. epochs=None, which the option checks refuse as a passed value but the head family reads as its default
        fields = [(name, Optional[int], dataclasses.field(default=value)) for name, value in defaults.items()]
        namespace["Options"] = dataclasses.make_dataclass("Options", fields, bases=(MaskedClassifierHead.Options,))
    return type(f"MacCal_{label.replace(' ', '_')}", (MaskedClassifierHead,), namespace)


FULL_WEIGHTS = _arm_class("full weights", _FullWeightLinear)
PER_SAMPLE = _arm_class("per-sample masks", _PerSampleLinear)
STEP_BUDGET = _arm_class("heads' step budget", epochs=None)

#: arm → (method, fit options on top of its defaults, what differs from the default)
ARMS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    DEFAULT_ARM: ("mac_cal", {}, "MaC-Cal's defaults: head from the base classifier, one mask per batch, mean softmax over "
                  "M = 10 stored masks at prediction, epochs=30, Adam lr 3e-3"),
    "full weights": (FULL_WEIGHTS.method, {}, "prediction (validation, hence the controller, and test) with the full weights"),
    "heads' step budget": (STEP_BUDGET.method, {}, f"epochs=None: the heads' default ({DEFAULT_EPOCHS} epochs, stretched to at "
                           f"least {MIN_DEFAULT_STEPS:,} Adam steps) instead of MaC-Cal's 30 epochs; lr stays 3e-3"),
    "fresh head": ("mac_cal", {"init_from_base": False}, "init_from_base=False: a freshly initialised head (30 epochs)"),
    "fresh head + step budget": (STEP_BUDGET.method, {"init_from_base": False},
                                 "a fresh head with the heads' step budget (so that it is trained to convergence)"),
    "per-sample masks": (PER_SAMPLE.method, {}, "a fresh mask per training row instead of one per batch"),
    "no masks": ("mac_cal", {"initial_retention": 1.0, "controller_gain": 0.0},
                 "control, not one of our choices: r = 1 throughout (controller off), i.e. the base classifier fine-tuned by "
                 "the same schedule and epoch selection without any mask"),
}


# ----------------------------------------------------------------------------- data


def cached_features(model_name: str) -> Tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(zoo model, features (N, d), logits (N, C), labels (N,)) over its calibration ∪ test rows; the base's
    outputs are computed once and cached on disk (``$HF_CALIBRATE_CACHE/../bench_features``)."""
    from datasets import concatenate_datasets

    from hf_calibrate.demo.models import default_cache_dir

    demo = _zoo(model_name)
    path = default_cache_dir().parent / "bench_features" / f"{demo.path.name}.pt"
    if path.is_file():
        cached = torch.load(path)
        return demo, cached["features"], cached["logits"], cached["labels"]
    pool = concatenate_datasets([demo.dataset["calibration"], demo.dataset["test"]])
    features, logits, labels = _features_and_logits(demo, pool)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"features": features, "logits": logits, "labels": labels}, path)
    return demo, features, logits, labels


# ----------------------------------------------------------------------------- measuring


def fit_arm(arm: str, layer: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, seed: int,
            quick: bool) -> Tuple[Callable[[torch.Tensor], torch.Tensor], Dict[str, Any]]:
    """One arm's fit: (features → probabilities, facts: seconds, kept epoch, epochs run, r at the kept epoch)."""
    method, options, _ = ARMS[arm]
    options = dict(options)
    if quick:
        options["epochs"] = 20 if method == STEP_BUDGET.method else 3
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calibrated = CalibratedModel.fit(layer, TensorDataset(features, labels), method=method, progress=False, seed=seed, **options)
    seconds = time.perf_counter() - started
    summary = calibrated.fit_summary
    history = summary.get("history") or []
    best = summary.get("best_epoch")
    facts = {"seconds": seconds, "best_epoch": best, "epochs_run": summary.get("epochs_run"),
             "retention": history[best - 1].get("retention") if best and len(history) >= best else None,
             "still_improving": bool(summary.get("still_improving"))}

    def probabilities(test_features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(calibrated(test_features).double(), dim=1)

    return probabilities, facts


def run_seed(model_name: str, demo: Any, features: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, seed: int,
             arms: Sequence[str], quick: bool) -> Record:
    """Every arm, TS and the uncalibrated model on one reshuffle."""
    calibration, test = (torch.as_tensor(rows) for rows in _stratified_halves(labels, seed))
    test_labels = labels[test]
    results: Dict[str, Dict[str, Any]] = {"uncalibrated": scores(torch.softmax(logits[test].double(), dim=1), test_labels)}
    probabilities, facts = fit_ours("temperature", logits[calibration], labels[calibration], seed)
    results["temperature"] = {**scores(probabilities(logits[test]), test_labels), "seconds": facts["seconds"]}
    layer = copy.deepcopy(adapt(demo.model).final_layer()).requires_grad_(False)
    for arm in arms:
        probabilities, facts = fit_arm(arm, layer, features[calibration], labels[calibration], seed, quick)
        results[arm] = {**scores(probabilities(features[test]), test_labels), **facts}
    return {"model": model_name, "seed": seed, "calibration_rows": len(calibration), "test_rows": len(test),
            "feature_dim": int(features.shape[1]), "classes": int(logits.shape[1]), "arms": results}


def measure(args: argparse.Namespace) -> List[Record]:
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    arms = args.arms.split(",") if args.arms else list(ARMS)
    if DEFAULT_ARM not in arms:
        arms.insert(0, DEFAULT_ARM)
    records: List[Record] = []
    sink = open(args.json, "w") if args.json else None
    try:
        for model_name in models:
            demo, features, logits, labels = cached_features(model_name)
            for seed in range(args.repeats):
                started = time.perf_counter()
                record = run_seed(model_name, demo, features, logits, labels, seed, arms, args.quick)
                records.append(record)
                if sink is not None:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                print(f"{model_name} seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        if sink is not None:
            sink.close()
    return records


# ----------------------------------------------------------------------------- report


def _by_model(records: Sequence[Record]) -> Dict[str, List[Record]]:
    grouped: Dict[str, List[Record]] = {}
    for record in records:
        grouped.setdefault(record["model"], []).append(record)
    return grouped


def _values(runs: Sequence[Record], arm: str, key: str) -> List[float]:
    return [run["arms"][arm][key] for run in runs]


def _differences(runs: Sequence[Record], arm: str, reference: str, key: str) -> List[float]:
    return [run["arms"][arm][key] - run["arms"][reference][key] for run in runs]


def _mean_std(values: Sequence[float], digits: int = 4) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _resolved_better(differences: Sequence[float]) -> bool:
    """Whether the 95 % t-interval of the paired differences lies wholly below 0."""
    return _resolved_worse([-d for d in differences])


def _sign(differences: Sequence[float]) -> str:
    """'better' / 'worse' when the interval excludes 0 (lower is better), else 'tie'."""
    return "better" if _resolved_better(differences) else "worse" if _resolved_worse(differences) else "tie"


def _facts(runs: Sequence[Record], arm: str) -> Tuple[str, str, str]:
    """(mean fit seconds, kept epoch / epochs run (median), r at the kept epoch (mean; range))."""
    entries = [run["arms"][arm] for run in runs]
    seconds = f"{statistics.fmean(e['seconds'] for e in entries):.2f}"
    if entries[0].get("best_epoch") is None:
        return seconds, "–", "–"
    epochs = f"{statistics.median(e['best_epoch'] for e in entries):.0f} / {statistics.median(e['epochs_run'] for e in entries):.0f}"
    improving = sum(e["still_improving"] for e in entries)
    if improving:
        epochs += f" (last epoch best in {improving})"
    rs = [e["retention"] for e in entries if e.get("retention") is not None]
    retention = f"{statistics.fmean(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "–"
    return seconds, epochs, retention


def _model_tables(runs: Sequence[Record], arms: Sequence[str]) -> List[str]:
    seeds = len(runs)
    first = runs[0]
    lines = [f"{first['calibration_rows']} calibration rows (80 % train, 20 % validation inside each head fit) and "
             f"{first['test_rows']} test rows per seed; d = {first['feature_dim']}, C = {first['classes']}; {seeds} seeds.", "",
             "Scores on the test half (mean ± std over the seeds) and each arm − the default (paired, same split and seed; "
             "mean and 95 % t-interval over the seeds; negative = the arm is better):", ""]
    header = ["arm", "NLL", "ΔNLL vs default", "ECE", "ΔECE vs default", "Brier", "ΔBrier vs default", "acc", "fit s",
              "kept epoch / run", "r at kept epoch"]
    rows = []
    for arm in [*arms, *REFERENCES]:
        cells = [arm, _mean_std(_values(runs, arm, "nll"))]
        for key in ("nll", "ece", "brier"):
            if key != "nll":
                cells.append(_mean_std(_values(runs, arm, key)))
            cells.append(_paired_interval(_differences(runs, arm, DEFAULT_ARM, key)) if arm != DEFAULT_ARM else "–")
        cells.append(f"{statistics.fmean(_values(runs, arm, 'accuracy')):.4f}")
        if arm in REFERENCES:
            seconds = statistics.fmean(_values(runs, arm, "seconds")) if arm == "temperature" else math.nan
            cells += [f"{seconds:.2f}" if seconds == seconds else "–", "–", "–"]
        else:
            cells += list(_facts(runs, arm))
        rows.append(cells)
    lines += _report.table(header, rows) + ["", "Each arm against TS and the uncalibrated model (paired, as above):", ""]
    header = ["arm", "ΔNLL vs TS", "ΔECE vs TS", "ΔBrier vs TS", "ΔNLL vs uncalibrated", "ΔECE vs uncalibrated"]
    rows = []
    for arm in [*arms, "temperature"]:
        cells = [arm]
        for reference, keys in (("temperature", ("nll", "ece", "brier")), ("uncalibrated", ("nll", "ece"))):
            for key in keys:
                cells.append(_paired_interval(_differences(runs, arm, reference, key)) if arm != reference else "–")
        rows.append(cells)
    return lines + _report.table(header, rows) + [""]


def verdicts(records: Sequence[Record], arms: Sequence[str]) -> List[str]:
    """The rule for adopting an arm: better than the default beyond the paired NLL interval, without being worse beyond the
    ECE interval. An arm qualifies only if it does so on some model and is worse beyond an interval (NLL or ECE) on none."""
    grouped = _by_model(records)
    lines = []
    for arm in arms:
        if arm == DEFAULT_ARM:
            continue
        per_model, qualifies, harms = [], False, False
        for model, runs in grouped.items():
            nll, ece = (_sign(_differences(runs, arm, DEFAULT_ARM, key)) for key in ("nll", "ece"))
            per_model.append(f"{model}: NLL {nll}, ECE {ece}")
            qualifies |= nll == "better" and ece != "worse"
            harms |= "worse" in (nll, ece)
        outcome = ("**supports changing the default**" if qualifies and not harms else
                   "does not support changing the default" + (" (better on some model but worse on another)" if qualifies else ""))
        lines.append(f"- {arm} vs default — {'; '.join(per_model)} → {outcome}.")
    return lines


def report(session: _report.Session, records: Sequence[Record], source: Optional[Path] = None) -> str:
    grouped = _by_model(records)
    arms = [arm for arm in records[0]["arms"] if arm not in REFERENCES]
    seeds = sorted({len(runs) for runs in grouped.values()})
    body = ["Arms (each fitted on the same calibration half, seed and cached features as the default):", ""]
    body += _report.table(["arm", "what differs from the default"], [[arm, ARMS[arm][2] if arm in ARMS else "?"] for arm in arms])
    body += ["", "Verdicts (\"better\"/\"worse\": the paired 95 % interval of arm − default excludes 0; \"tie\": it does not):", "",
             *verdicts(records, arms), ""]
    if source is not None:
        body += [f"Report re-rendered from the per-seed records `{source}`.", ""]
    for model, runs in grouped.items():
        body += [f"## {model}", ""] + _model_tables(runs, arms)
    header = session.header("MaC-Cal ablation: where the reconstruction's gain comes from", ["torch", "numpy"],
                            extra=f"Seeds = `--repeats` ({', '.join(map(str, seeds))}); fit seconds are means over the seeds "
                                  "(the arms of one seed run back to back).")
    return "\n".join(header + body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--arms", default=None, help=f"comma-separated subset of: {', '.join(ARMS)} (the default is always run)")
    parser.add_argument("--json", type=Path, default=None, help="write the per-seed records here, one JSON object a line")
    parser.add_argument("--from-json", type=Path, default=None, help="render the report from a --json file instead of measuring")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_mac_cal_ablation.py", args)
    if args.from_json is not None:
        records = [json.loads(line) for line in args.from_json.read_text().splitlines() if line.strip()]
        session.finish(report(session, records, args.from_json), NAME, write_default=False)
        return 0
    session.finish(report(session, measure(args)), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
