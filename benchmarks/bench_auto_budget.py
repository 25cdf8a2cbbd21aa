"""``method="auto"`` with a ``budget``: Neural Clamping as a candidate, and how good the time estimate that admits it is.

For each zoo model and seed, ``bench_quality``'s protocol reshuffles the calibration ∪ test rows into stratified
halves (``bench_nc_time_to_quality``'s tensors and fits); on the calibration half it fits

* **TS**: ``method="temperature"``;
* **auto**: ``method="auto"`` without a budget (the logit candidates only);
* **auto + NC**: ``method="auto", budget=BUDGET`` (Neural Clamping takes part when its estimate fits);
* **auto + MaC-Cal**: ``method="auto"`` with MaC-Cal named beside the logit candidates (the head methods take part
  only when named; TST and V-TST are not arms: their default fit takes about a minute here and auto fits K + 1 = 6
  of them per seed);

and scores each on the test half. Reported: test NLL / ECE (mean ± std over seeds), the paired differences
auto + NC − auto, − TS and − uncalibrated with 95 % t-intervals over seeds, what each auto chose, and Neural
Clamping's estimated against measured seconds (the estimate: PASSES_PER_FIT passes of the base model, from auto's
own timed pass). ``--estimate-only MODEL`` fits auto once with a budget of 1 s on that model, so
only the estimate is recorded (text on a CPU: a fit takes about 20 minutes, nc_time_to_quality_bbc.md).

Usage::

    python benchmarks/bench_auto_budget.py                       # CNN and ViT, 5 seeds; writes results/auto_budget.md
    python benchmarks/bench_auto_budget.py --quick               # the CNN, 1 seed, 120 rows; prints only
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

import _report
import bench_nc_time_to_quality as nc
from _fidelity_common import zoo_pool
from bench_quality import _paired_interval, _stratified_halves

from hf_calibrate.fitting.auto.selection import default_logit_candidates

NAME = "auto_budget"
MODELS = ("digits_cnn", "digits_vit")
BUDGET = 3600.0
ARMS = {"TS": ("temperature", {}), "auto": ("auto", {}), "auto + NC": ("auto", {"budget": BUDGET}),
        "auto + MaC-Cal": ("auto", {"candidates": [*default_logit_candidates(), "mac_cal"]})}


def run_seed(demo: Any, inputs: Dict[str, torch.Tensor], labels: torch.Tensor, seed: int) -> Dict[str, Any]:
    """Every arm on one reshuffle: arm → {seconds, test scores, chosen}, and Neural Clamping's estimate and time."""
    calibration, test = (torch.as_tensor(half) for half in _stratified_halves(labels, seed))
    cal_inputs = {key: value[calibration] for key, value in inputs.items()}
    test_inputs = {key: value[test] for key, value in inputs.items()}
    record: Dict[str, Any] = {"seed": seed, "calibration_rows": len(calibration)}
    for arm, (method, options) in ARMS.items():
        seconds, calibrated = nc.fit_ours(demo, cal_inputs, labels[calibration], method, seed, **options)
        record[arm] = {"seconds": seconds, "chosen": calibrated.method,
                       **nc.scores(nc.calibrated_logits(calibrated, test_inputs), labels[test])}
        if arm == "TS":
            with torch.no_grad():
                base = nc.calibrated_logits(calibrated, test_inputs) * float(calibrated.calibrator.temperature)
            record["uncalibrated"] = nc.scores(base, labels[test])
        if "budget" in options:
            record["clamping"] = clamping_facts(calibrated.fit_summary["auto"])
        if "candidates" in options:
            row = next(row for row in calibrated.fit_summary["auto"]["candidates"] if row["method"] == "mac_cal")
            record["mac_cal"] = {"seconds": row["seconds"], "excluded": row["excluded"], "versus_temperature": row["versus_temperature"],
                                 "is_temperature_scaling": False}
    print(json.dumps(record), file=sys.stderr, flush=True)
    return record


def clamping_facts(choice: Dict[str, Any]) -> Dict[str, Any]:
    """Neural Clamping's row of auto's record: its estimate, its measured seconds, its paired difference to TS."""
    row = next(row for row in choice["candidates"] if row["method"] == "neural_clamping")
    return {"estimate": choice["neural_clamping_estimate"], "seconds": row["seconds"], "excluded": row["excluded"],
            "versus_temperature": row["versus_temperature"], "is_temperature_scaling": row.get("is_temperature_scaling")}


def model_table(model: str, runs: List[Dict[str, Any]]) -> List[str]:
    lines = [f"## {model} ({runs[0]['calibration_rows']} calibration rows, {len(runs)} seeds)", ""]
    rows = []
    for arm in ("uncalibrated", *ARMS):
        nll = [run[arm]["nll"] for run in runs]
        ece = [run[arm]["ece"] for run in runs]
        seconds = [run[arm].get("seconds", 0.0) for run in runs]
        chosen = ", ".join(run[arm].get("chosen", "–") for run in runs)
        rows.append([arm, f"{statistics.mean(nll):.4f} ± {statistics.pstdev(nll):.4f}",
                     f"{statistics.mean(ece):.4f} ± {statistics.pstdev(ece):.4f}", f"{statistics.median(seconds):.1f}", chosen])
    lines += _report.table(["arm", "test NLL", "test ECE", "seconds (median)", "chosen per seed"], rows) + [""]
    paired = []
    for arm, other in (("auto + NC", "auto"), ("auto + MaC-Cal", "auto"), ("auto", "TS"), ("auto", "uncalibrated")):
        for metric in ("nll", "ece"):
            paired.append([f"{arm} − {other}", metric, _paired_interval([run[arm][metric] - run[other][metric] for run in runs])])
    lines += _report.table(["difference", "metric", "mean [95 % t-interval]"], paired) + [""]
    estimates = [[run["seed"], f"{run['clamping']['estimate']:.1f}", f"{run['clamping']['seconds']:.1f}",
                  f"{run['clamping']['seconds'] / run['clamping']['estimate']:.2f}", _difference(run["clamping"])] for run in runs]
    lines += _report.table(["seed", "NC estimate (s)", "NC measured (s)", "measured ÷ estimate", "NC held-out NLL − TS (auto's row)"], estimates)
    heads = [[run["seed"], f"{run['mac_cal']['seconds']:.1f}", _difference(run["mac_cal"])] for run in runs]
    lines += [""] + _report.table(["seed", "MaC-Cal seconds (fit + 5 folds)", "MaC-Cal held-out NLL − TS (auto's row)"], heads)
    return lines + [""]


def _difference(facts: Dict[str, Any]) -> str:
    if facts["excluded"]:
        return "left out: " + facts["excluded"][:60]
    if facts["is_temperature_scaling"]:
        return "fell back to TS"
    versus = facts["versus_temperature"]
    return f"{versus['point']:+.4f} [{versus['low']:+.4f}, {versus['high']:+.4f}]"


def estimate_only(model: str) -> Dict[str, Any]:
    """auto with a 1-second budget on all of ``model``'s calibration half (seed 0): the estimate, with NC left out."""
    demo, pool = zoo_pool(model)
    inputs, labels = nc.model_tensors(demo, pool)
    calibration, _ = _stratified_halves(labels, 0)
    started = time.perf_counter()
    _, calibrated = nc.fit_ours(demo, {key: value[torch.as_tensor(calibration)] for key, value in inputs.items()},
                                labels[torch.as_tensor(calibration)], "auto", 0, budget=1.0)
    return {"model": model, "auto_seconds": time.perf_counter() - started, **clamping_facts(calibrated.fit_summary["auto"])}


def measure(args: Any) -> Dict[str, Any]:
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    results: Dict[str, Any] = {}
    for model in models:
        demo, pool = zoo_pool(model)
        if args.quick:
            pool = pool.select(range(120))
        inputs, labels = nc.model_tensors(demo, pool)
        results[model] = [run_seed(demo, inputs, labels, seed) for seed in range(args.repeats)]
    results["_estimates"] = [estimate_only(model) for model in (args.estimate_only.split(",") if args.estimate_only else [])]
    return results


def report(session: _report.Session, results: Dict[str, Any]) -> str:
    estimates = results.pop("_estimates")
    lines = session.header("method=\"auto\" with a budget: Neural Clamping as a candidate", ["torch", "timm", "transformers"])
    lines += [f"Budget {BUDGET:.0f} s. Test scores are mean ± std over seeds; differences are paired over seeds (95 % t-interval); "
              "seconds are wall seconds of the whole fit on one torch thread.", ""]
    for model, runs in results.items():
        lines += model_table(model, runs)
    if estimates:
        lines += ["## Estimate only (budget 1 s: Neural Clamping left out)", ""]
        lines += _report.table(["model", "auto seconds", "NC estimate (s)"], [[e["model"], f"{e['auto_seconds']:.1f}", f"{e['estimate']:.0f}"] for e in estimates])
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--estimate-only", default=None, help="comma-separated zoo models to record only the estimate of")
    parser.add_argument("--json", default=None, help="also write the raw per-seed records here")
    return nc.run(_report.parse(parser, argv), "bench_auto_budget.py", measure, report, NAME)


if __name__ == "__main__":
    sys.exit(main())
