"""Evidence for the fit defaults: paired arms of Neural Clamping and of the heads' temperature.

The same protocol as ``bench_quality.py`` (its helpers are imported): each zoo model's
``calibration`` ∪ ``test`` rows are reshuffled per seed into stratified calibration / test halves,
every arm is fitted on the calibration half through ``CalibratedModel.fit`` and scored on the
clean test half. Every arm of one seed sees the same split, so arms are compared by *paired*
differences over the seeds (mean and 95 % t-interval), and per seed by the paired bootstrap
(``hf_calibrate.metrics.paired_bootstrap_intervals``, 1000 replicates) of arm − TS on the test half.

Arms:

* Neural Clamping, the default (held-out NLL selects the epoch and the fallback to TS), against
  the same fit selected by held-out 15-bin ECE or by held-out smECE. Every check records all the
  criteria, so the other criteria's picks are read off the default run's history: a pick that
  does not beat TS's held-out score is the fallback (δ = 0 and the TS temperature of the whole
  calibration half, i.e. exactly the ``temperature`` arm), a pick equal to NLL's is the default's
  result, and any other pick is refitted with ``epochs`` = the picked epoch (the epoch shuffle
  is seeded per epoch, so this reruns the same prefix; the table reports that the refit selected
  that epoch);
* Neural Clamping selected by 5-fold cross-validation (digits models only, for its cost): one
  fit per stratified fold, with that fold as its ``validation_data``; the epoch minimising the
  mean held-out NLL over the folds is refitted on the whole calibration half
  (``holdout_fraction=0``, ``epochs`` = that epoch), and the arm falls back to TS when that mean
  does not beat TS's mean held-out NLL;
* Neural Clamping with ``augment=True`` (images) and with ``delta_init="gradient"``;
* each head (TST, V-TST, MaC-Cal) fitted once with ``temperature=True`` (the temperature fitted
  on the head's held-out validation part after training), scored as fitted ("+ TS") and with its
  temperature reset to 1 — exactly the ``temperature=False`` fit, since the temperature is fitted
  after the head and changes nothing else.

Not run, for their cost on this machine: k-fold selection on the BBC MiniLM (6 fits of ~4 min
per seed), bootstrap-averaged selection, and a cross-fitted head temperature (K head trainings;
TST takes ~1 min and V-TST ~2 min per fit on the CNN).

Usage::

    python benchmarks/bench_defaults.py            # 3 models × 5 seeds, one process per model; writes results/defaults.md
    python benchmarks/bench_defaults.py --quick    # the CNN, 1 seed, short fits; prints only
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import _report
from bench_quality import (
    HEAD_METHODS, _data_options, _mean_std, _nc_logits, _nc_schedule, _paired_interval, _Sets, _stratified_halves, _zoo,
)

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.metrics import calibration_report, paired_bootstrap_intervals, smooth_calibration_error, verdict
from hf_calibrate.metrics.catalog import METRIC_INFO

NAME = "defaults"
MODELS = ("bbc_minilm", "digits_cnn", "digits_vit")  # longest first: with fewer --jobs than models it starts first
METRICS = tuple((key, METRIC_INFO[key].title) for key in ("ece", "smooth_ece", "nll", "brier"))
BOOTSTRAP_METRICS = ("ece", "nll")
REPLICATES = 1000
DEFAULT_NC = "NC (select NLL: default)"
#: selection criteria read off the default run's history: arm label → select_metric
DERIVED_NC = {"NC select ECE": "ece", "NC select smECE": "smooth_ece"}
#: Neural Clamping arms fitted on their own: label → options on top of the default
FITTED_NC = {"NC augment": {"augment": True}, "NC delta_init=gradient": {"delta_init": "gradient"}}
#: k-fold selection: K fits (one per fold held out) pick the epoch by the mean held-out NLL curve, then a
#: refit on the whole calibration half; K + 1 fits, so only on the digits models (~20 min per BBC seed)
KFOLD, KFOLD_NC, KFOLD_MODELS = 5, "NC select NLL, 5-fold + refit", ("digits_cnn", "digits_vit")

Record = Dict[str, Any]


def _schedule(model_name: str, quick: bool) -> Dict[str, Any]:
    """``bench_quality``'s reduced schedule with an explicit ``eval_every``, so that a refit to a
    picked epoch checks on the same epochs as the run it was picked from."""
    schedule = dict(_nc_schedule(model_name, quick))
    schedule.setdefault("eval_every", max(1, schedule["epochs"] // 20))
    return schedule


def _scores(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    report = calibration_report(logits.double(), labels, from_logits=True)
    scores = {key: report[key] for key in ("accuracy", "ece", "nll", "brier")}
    scores["smooth_ece"] = smooth_calibration_error(logits.double(), labels, from_logits=True)
    return scores


class _Seed:
    """One reshuffle: the calibration / test halves, and the test logits and facts of every arm."""

    def __init__(self, sets: _Sets, seed: int) -> None:
        self.sets, self.seed = sets, seed
        self.calibration, self.test = _stratified_halves(sets.labels, seed)
        self.test_labels = sets.labels[torch.as_tensor(self.test)]
        self.logits: Dict[str, torch.Tensor] = {}
        self.facts: Dict[str, Dict[str, Any]] = {}

    def cached(self, kind: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(calibration inputs, test inputs) of the cached base outputs: ``kind`` 0 features, 1 logits."""
        values = self.sets.outputs["clean"][kind]
        return values[torch.as_tensor(self.calibration)], values[torch.as_tensor(self.test)]

    def test_logits(self, calibrated: CalibratedModel) -> torch.Tensor:
        """A Neural Clamping fit's logits on the clean test half (δ on the input), in row order."""
        return _nc_logits(calibrated, self.sets.demo, self.sets.pool.select(self.test))[0]

    def record(self) -> Record:
        """JSON-able: arm → test scores; arm → facts; arm → per-seed paired bootstrap of arm − TS."""
        reference = self.logits["temperature"]
        paired = {}
        for arm, logits in self.logits.items():
            if arm in ("temperature", "uncalibrated"):
                continue
            intervals = paired_bootstrap_intervals(logits.double(), reference.double(), self.test_labels, metrics=list(BOOTSTRAP_METRICS),
                                                   replicates=REPLICATES, seed=self.seed, from_logits=True)
            paired[arm] = {name: [i.point, i.low, i.high, verdict(i)] for name, i in intervals.items()}
        scores = {arm: _scores(logits, self.test_labels) for arm, logits in self.logits.items()}
        return {"seed": self.seed, "scores": scores, "facts": self.facts, "paired_vs_ts": paired}


def _logit_arms(run: _Seed) -> None:
    calibration_logits, test_logits = run.cached(1)
    run.logits["uncalibrated"] = test_logits
    labels = run.sets.labels[torch.as_tensor(run.calibration)]
    calibrated = CalibratedModel.fit(nn.Identity(), TensorDataset(calibration_logits, labels), method="temperature", progress=False, seed=run.seed)
    with torch.no_grad():
        run.logits["temperature"] = calibrated(test_logits)


def _head_arms(run: _Seed, quick: bool) -> None:
    """Each head fitted once with its temperature; scored with it ("+ TS") and with T reset to 1."""
    calibration_features, test_features = run.cached(0)
    labels = run.sets.labels[torch.as_tensor(run.calibration)]
    layer = copy.deepcopy(adapt(run.sets.demo.model).final_layer()).requires_grad_(False)
    for method in HEAD_METHODS:
        started = time.perf_counter()
        calibrated = CalibratedModel.fit(layer, TensorDataset(calibration_features, labels), method=method, temperature=True, progress=False,
                                         seed=run.seed, **(dict(epochs=3) if quick else {}))
        temperature = float(calibrated.calibrator.log_temperature.exp())
        run.facts[f"{method} + TS"] = {"seconds": time.perf_counter() - started, "temperature": temperature}
        with torch.no_grad():
            run.logits[f"{method} + TS"] = calibrated(test_features)
            calibrated.calibrator.log_temperature.zero_()
            run.logits[method] = calibrated(test_features)


def _fit_nc(run: _Seed, schedule: Dict[str, Any], rows: Optional[np.ndarray] = None, **options: Any) -> Tuple[CalibratedModel, Dict[str, Any]]:
    """Neural Clamping on ``rows`` of the pool (default: the calibration half); returns the model and its facts."""
    sets = run.sets
    started = time.perf_counter()
    calibrated = CalibratedModel.fit(sets.demo.model, sets.pool.select(run.calibration if rows is None else rows), method="neural_clamping",
                                     progress=False, seed=run.seed, **{**schedule, **options}, **_data_options(sets.demo))
    summary = calibrated.fit_summary
    facts = {"seconds": time.perf_counter() - started, "fell_back": bool(summary["fell_back_to_temperature_scaling"]),
             "epoch": None if summary["fell_back_to_temperature_scaling"] else summary["selected"]["epoch"]}
    return calibrated, facts


def _pick(summary: Dict[str, Any], metric: str) -> Optional[int]:
    """The epoch held-out ``metric`` selects in a fit's history (earliest best), or None for the fallback to TS."""
    key = f"holdout_{metric}"
    best = min((record for record in summary["history"] if key in record), key=lambda record: record[key])
    return best["epoch"] if best[key] < summary["temperature_scaling"][key] else None


def _nc_arms(run: _Seed, schedule: Dict[str, Any], image: bool) -> None:
    default, facts = _fit_nc(run, schedule)
    run.logits[DEFAULT_NC], run.facts[DEFAULT_NC] = run.test_logits(default), facts
    for label, metric in DERIVED_NC.items():
        epoch = _pick(default.fit_summary, metric)
        if epoch is None:
            run.logits[label], run.facts[label] = run.logits["temperature"], {"fell_back": True, "epoch": None, "source": "TS arm"}
        elif epoch == facts["epoch"]:
            run.logits[label], run.facts[label] = run.logits[DEFAULT_NC], {"fell_back": False, "epoch": epoch, "source": "default arm"}
        else:
            refit, refit_facts = _fit_nc(run, dict(schedule, epochs=epoch), select_metric=metric)
            run.logits[label] = run.test_logits(refit)
            run.facts[label] = dict(refit_facts, source="refit", refit_selected_pick=refit_facts["epoch"] == epoch)
    for label, options in FITTED_NC.items():
        if options.get("augment") and not image:
            continue
        calibrated, run.facts[label] = _fit_nc(run, schedule, **options)
        run.logits[label] = run.test_logits(calibrated)


def _kfold_arm(run: _Seed, schedule: Dict[str, Any]) -> None:
    from sklearn.model_selection import StratifiedKFold

    sets, started = run.sets, time.perf_counter()
    labels = sets.labels[torch.as_tensor(run.calibration)].numpy()
    curves, baselines = [], []
    for fit_part, fold in StratifiedKFold(KFOLD, shuffle=True, random_state=run.seed).split(run.calibration, labels):
        fitted, _ = _fit_nc(run, schedule, rows=run.calibration[fit_part], validation_data=sets.pool.select(run.calibration[fold]))
        summary = fitted.fit_summary
        curves.append({record["epoch"]: record["holdout_nll"] for record in summary["history"] if "holdout_nll" in record})
        baselines.append(summary["temperature_scaling"]["holdout_nll"])
    mean_curve = {epoch: statistics.fmean(curve[epoch] for curve in curves) for epoch in sorted(curves[0])}
    epoch = min(mean_curve, key=mean_curve.get)  # the earliest among equal means: the keys are sorted
    if mean_curve[epoch] < statistics.fmean(baselines):
        refit, _ = _fit_nc(run, dict(schedule, epochs=epoch), holdout_fraction=0.0)
        run.logits[KFOLD_NC] = run.test_logits(refit)
    else:
        run.logits[KFOLD_NC], epoch = run.logits["temperature"], None
    run.facts[KFOLD_NC] = {"seconds": time.perf_counter() - started, "fell_back": epoch is None, "epoch": epoch, "source": "k-fold"}


def run_model(model_name: str, seeds: Sequence[int], quick: bool, raw: Optional[Path]) -> List[Record]:
    """Every arm on each seed's split of one zoo model; the records so far are rewritten to ``raw`` after each seed."""
    from datasets import concatenate_datasets

    demo = _zoo(model_name)
    pool = concatenate_datasets([demo.dataset["calibration"], demo.dataset["test"]])
    sets = _Sets(demo, pool, "text" if model_name == "bbc_minilm" else "image", quick=True)  # clean rows only
    records: List[Record] = []
    for seed in seeds:
        started = time.perf_counter()
        run = _Seed(sets, seed)
        _logit_arms(run)
        _head_arms(run, quick)
        _nc_arms(run, _schedule(model_name, quick), image=model_name != "bbc_minilm")
        if model_name in KFOLD_MODELS:
            _kfold_arm(run, _schedule(model_name, quick))
        records.append(run.record())
        if raw is not None:
            raw.write_text(json.dumps({"model": model_name, "rows": len(pool), "records": records}))
        print(f"{model_name} seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return records


# ----------------------------------------------------------------------------- report


def _pairs(arms: Sequence[str]) -> List[Tuple[str, str]]:
    """(arm, reference) rows of the paired tables: each NC arm against the default NC, every calibrated arm
    against TS, and each head with its temperature against the same head without."""
    nc_arms = [arm for arm in arms if arm.startswith("NC ") and arm != DEFAULT_NC]
    pairs = [(arm, DEFAULT_NC) for arm in nc_arms]
    pairs += [(f"{method} + TS", method) for method in HEAD_METHODS if method in arms]
    return pairs + [(arm, "temperature") for arm in arms if arm not in ("temperature", "uncalibrated")]


def _paired_rows(records: Sequence[Record], arms: Sequence[str]) -> List[str]:
    lines = ["| arm | reference | " + " | ".join(f"Δ{title}" for _, title in METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
    for arm, reference in _pairs(arms):
        both = [r["scores"] for r in records if arm in r["scores"] and reference in r["scores"]]
        cells = [_paired_interval([s[arm][key] - s[reference][key] for s in both]) for key, _ in METRICS]
        lines.append(f"| {arm} | {reference} | " + " | ".join(cells) + " |")
    return lines + [""]


def _fallbacks(records: Sequence[Record], arm: str) -> str:
    facts = [r["facts"][arm] for r in records if arm in r["facts"] and "fell_back" in r["facts"][arm]]
    return f"{sum(f['fell_back'] for f in facts)}/{len(facts)}" if facts else "–"


def _score_rows(records: Sequence[Record], arms: Sequence[str]) -> List[str]:
    lines = ["| arm | acc | " + " | ".join(title for _, title in METRICS) + " | fell back to TS | fit s |", "|---|---|" + "---|" * (len(METRICS) + 2)]
    for arm in arms:
        cells = [_mean_std([r["scores"][arm][key] for r in records]) for key in ["accuracy"] + [key for key, _ in METRICS]]
        seconds = [r["facts"][arm]["seconds"] for r in records if "seconds" in r["facts"].get(arm, {})]
        cells += [_fallbacks(records, arm), f"{statistics.median(seconds):.0f}" if seconds else "–"]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + [""]


def _verdict_rows(records: Sequence[Record], arms: Sequence[str]) -> List[str]:
    """Per seed, the paired bootstrap of arm − TS on the test half: how many seeds it resolves either way."""
    lines = ["| arm | " + " | ".join(f"{name.upper()}: better / unresolved / worse" for name in BOOTSTRAP_METRICS) + " |",
             "|---|" + "---|" * len(BOOTSTRAP_METRICS)]
    for arm in arms:
        if arm not in records[0]["paired_vs_ts"]:
            continue
        cells = []
        for name in BOOTSTRAP_METRICS:
            verdicts = [r["paired_vs_ts"][arm][name][3] for r in records if arm in r["paired_vs_ts"]]
            better, worse = verdicts.count("improved"), verdicts.count("made worse")
            cells.append(f"{better} / {len(verdicts) - better - worse} / {worse}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + [""]


def _refit_note(records: Sequence[Record]) -> str:
    refits = [facts for r in records for facts in r["facts"].values() if facts.get("source") == "refit"]
    sources = [r["facts"][label].get("source") for r in records for label in DERIVED_NC if label in r["facts"]]
    return (f"Other criteria's picks ({len(sources)}): {sources.count('TS arm')} fell back to TS, {sources.count('default arm')} were NLL's "
            f"pick, {len(refits)} were refitted; the refit selected the picked epoch in {sum(f['refit_selected_pick'] for f in refits)} "
            f"of {len(refits)}.")


def _model_section(model_name: str, result: Dict[str, Any], quick: bool) -> List[str]:
    records = result["records"]
    arms = list(records[0]["scores"])
    demo_test = _zoo(model_name).recipe["test"]
    return [
        f"## {model_name}: {result['rows']} rows reshuffled into calibration / test halves, {len(records)} seeds", "",
        f"Base on its original test split: accuracy {demo_test['accuracy']:.4f}, ECE {demo_test['ece']:.4f}. Neural Clamping "
        f"schedule: `{_schedule(model_name, quick)}`. {_refit_note(records)}", "",
        "Clean test half, mean ± std over the seeds:", "", *_score_rows(records, arms),
        "Paired differences (arm − reference on the same split per seed; mean and 95 % t-interval over the seeds; negative = arm better):", "",
        *_paired_rows(records, arms),
        f"Per seed, the paired bootstrap of arm − TS on its test half ({REPLICATES} replicates, 95 %): seeds where it resolves "
        "the arm better, leaves it unresolved, or resolves it worse:", "", *_verdict_rows(records, arms),
    ]


def _pooled_section(results: Dict[str, Dict[str, Any]]) -> List[str]:
    """The paired differences over every (model, seed): the evidence for a default across the zoo."""
    records = [r for result in results.values() for r in result["records"]]
    arms = list(dict.fromkeys(arm for r in records for arm in r["scores"]))
    return [f"## Pooled over the models: {len(records)} (model, seed) pairs", "",
            "Paired differences as below, each model's seeds together (an arm some models lack — augment and k-fold "
            "on text — is paired over the models that have it):", "", *_paired_rows(records, arms)]


# ----------------------------------------------------------------------------- command line


def _run_children(models: Sequence[str], args: Any, directory: Path) -> None:
    """One subprocess per model, ``args.jobs`` at a time, each writing ``directory/<model>.json``."""
    def child(model_name: str) -> None:
        command = [sys.executable, __file__, "--models", model_name, "--repeats", str(args.repeats), "--threads", str(args.threads),
                   "--raw", str(directory), "--child"] + (["--quick"] if args.quick else [])
        subprocess.run(command, check=True)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(child, name) for name in models]:
            future.result()


def _results(models: Sequence[str], args: Any, directory: Path) -> Dict[str, Dict[str, Any]]:
    if args.jobs > 1 and len(models) > 1:
        _run_children(models, args, directory)
    else:
        for model_name in models:
            run_model(model_name, range(args.repeats), args.quick, directory / f"{model_name}.json")
    return {name: json.loads((directory / f"{name}.json").read_text()) for name in models}


def measure(args: argparse.Namespace) -> Dict[str, Dict[str, Any]]:
    """model → its per-seed records, run here or in ``--jobs`` child processes (kept under ``--raw``)."""
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.raw or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        return _results(models, args, directory)


def report(session: _report.Session, results: Dict[str, Dict[str, Any]]) -> str:
    body = [] if len(results) < 2 else _pooled_section(results)
    for model_name in sorted(results, key=MODELS.index):
        body += _model_section(model_name, results[model_name], session.args.quick)
    header = session.header("Evidence for the fit defaults", ["torch", "timm", "transformers"],
                            extra="Seeds = `--repeats`; fit seconds are medians over the seeds, with `--jobs` models running side by side.")
    return "\n".join(header + body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="models fitted at once, one process of --threads threads each (default: the logical cores)")
    parser.add_argument("--raw", type=Path, default=None, help="keep each model's per-seed records here as <model>.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # a --jobs worker: records only, no report
    args = _report.parse(parser, argv)
    session = _report.Session("bench_defaults.py", args)
    results = measure(args)
    if args.child:
        return 0
    session.finish(report(session, results), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
