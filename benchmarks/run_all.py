"""Run the quality and speed suites and regenerate every committed Markdown table.

Suites, in order (each a script in this folder, writing ``benchmarks/results/<name>.md`` on a
full run):

* ``quality``    — ``bench_quality.py`` (calibration quality of every method, clean and under shift);
* ``metrics``    — ``bench_metrics.py`` (metric speed and memory vs torchmetrics/netcal);
* ``nc_cost``    — ``bench_nc_cost.py`` (Neural Clamping epoch cost vs its floor);
* ``nc_time_to_quality`` — ``bench_nc_time_to_quality.py`` (Neural Clamping by L-BFGS vs the authors' recipe: time and test quality);
* ``inference``  — ``bench_inference.py`` (CalibratedModel inference overhead);
* ``logit_fits`` — ``bench_logit_fits.py`` (logit-space fit times on 50k × 1000 logits);
* ``head_cost``  — ``bench_head_cost.py`` (head retraining cost vs one backbone pass);
* ``intervals``  — ``bench_intervals.py`` (bootstrap interval coverage on synthetic data);
* ``scale``      — ``bench_scale.py`` (streamed calibration data: memory against N, throughput vs a bare loop);
* ``safe_defaults`` — ``bench_safe_defaults.py`` (every logit method's default vs uncalibrated and TS, peers beside);
* ``fit_cost``   — ``bench_fit_cost.py`` (every logit method and auto at 450 × 10, 5,000 × 100, 25,000 × 1,000: time,
  memory and held-out NLL, probmetrics beside);
* ``fold_count`` — ``bench_fold_count.py`` (the default checks' folds on large logits: 5 against 2, paired);
* ``fold_leak`` — ``bench_fold_leak.py`` (folds dealt by class or at random: against a new draw where TS is the truth,
  and auto on the zoo);
* ``fit_precision`` — ``bench_fit_precision.py`` (logit fits in float32 against float64: time and held-out NLL);
* ``joint_check`` — ``bench_joint_check.py`` (a linear map's check fitted jointly against one fold at a time);
* ``demo_time`` — ``bench_demo_time.py`` (``hf-calibrate demo`` as a user runs it: an empty zoo cache, then the filled one);
* ``mac_cal_ablation`` — ``bench_mac_cal_ablation.py`` (where MaC-Cal's gain comes from: paired arms against its default);
* ``gpu``        — ``bench_gpu.py``: only when a GPU is visible, or when named in ``--only``.

Afterwards (full runs) ``benchmarks/results/README.md`` is rewritten: an index of every table
with the machine and date it was produced on.

Usage::

    python benchmarks/run_all.py                        # everything, full sizes (tens of minutes on a CPU)
    python benchmarks/run_all.py --quick                # every suite at tiny sizes; prints only, writes nothing
    python benchmarks/run_all.py --only nc_cost,inference
    python benchmarks/run_all.py --index-only           # just rebuild results/README.md

``--quick`` and ``--threads`` pass through to every script. ``--in-process`` runs the scripts
one after another in this interpreter (``runpy``), paying the torch/transformers import once:
what the smoke test uses.
"""

from __future__ import annotations

import argparse
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# name → (script, kind, one-line description)
SUITES: Dict[str, Tuple[str, str, str]] = {
    "quality": ("bench_quality.py", "quality", "calibration quality of every method"),
    "metrics": ("bench_metrics.py", "speed", "calibration metrics: speed and memory vs torchmetrics / netcal"),
    "nc_cost": ("bench_nc_cost.py", "speed", "Neural Clamping fit: cost per epoch vs the forward + input-backward floor"),
    "nc_time_to_quality": ("bench_nc_time_to_quality.py", "quality and speed",
                           "Neural Clamping by L-BFGS against the authors' recipe: time to quality, paired test scores"),
    "inference": ("bench_inference.py", "speed", "CalibratedModel inference vs the base model"),
    "logit_fits": ("bench_logit_fits.py", "speed", "logit-space calibrators: fit time on 50,000 × 1,000 logits"),
    "head_cost": ("bench_head_cost.py", "speed", "head retraining: feature extraction vs per-epoch head cost"),
    "intervals": ("bench_intervals.py", "quality", "bootstrap intervals: coverage of the truth on synthetic data"),
    "evaluate_cost": ("bench_evaluate_cost.py", "speed", "what the intervals cost an evaluation: bootstrap=1000 vs 0"),
    "defaults": ("bench_defaults.py", "quality", "evidence for the fit defaults: paired arms of Neural Clamping and the heads' temperature"),
    "scale": ("bench_scale.py", "speed", "streams at scale: peak memory against N, throughput against a bare loop"),
    "safe_defaults": ("bench_safe_defaults.py", "quality", "safe defaults: every logit method's default vs uncalibrated and TS, peers beside"),
    "fit_cost": ("bench_fit_cost.py", "speed and quality", "logit methods and auto at the sizes users have: time, peak memory, held-out NLL, probmetrics beside"),
    "fold_count": ("bench_fold_count.py", "quality", "the default checks' folds on large logits: 5 against 2, paired"),
    "fold_leak": ("bench_fold_leak.py", "quality", "folds dealt by class or at random: against a new draw where TS is the truth, and auto on the zoo"),
    "fit_precision": ("bench_fit_precision.py", "speed and quality", "logit fits in float32 against float64: time and held-out NLL"),
    "joint_check": ("bench_joint_check.py", "speed", "a linear map's check fitted jointly against one fold at a time: time and scores"),
    "demo_time": ("bench_demo_time.py", "speed", "hf-calibrate demo as a user runs it: first run and cached run, wall time and peak memory"),
    "mac_cal_ablation": ("bench_mac_cal_ablation.py", "quality", "MaC-Cal ablation: each part of the reconstruction against its default, paired"),
    "auto_budget": ("bench_auto_budget.py", "quality and speed", "method=\"auto\" with a budget: Neural Clamping and MaC-Cal as candidates, NC's time estimate"),
    "gpu": ("bench_gpu.py", "speed (GPU)", "Neural Clamping fit throughput on GPU, fp32/bf16, 1 vs N GPUs"),
}
GPU_NOTE = "not measured in this repository (no GPU on its benchmark machine); run `bench_gpu.py` on a GPU machine"
MARKER = "==> "


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def selected(only: Optional[str]) -> List[str]:
    if only:
        names = [name.strip() for name in only.split(",") if name.strip()]
        unknown = sorted(set(names) - set(SUITES))
        if unknown:
            raise SystemExit(f"unknown suite(s) {unknown}; choose from {', '.join(SUITES)}")
        return names
    return [name for name in SUITES if name != "gpu" or gpu_available()]


def run_one(script: Path, flags: List[str], in_process: bool) -> int:
    if not in_process:
        return subprocess.call([sys.executable, str(script), *flags], cwd=HERE.parent)
    saved = sys.argv
    sys.argv = [str(script), *flags]
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
        sys.stdout.flush()


# ----------------------------------------------------------------------------- index


def describe(path: Path) -> Dict[str, str]:
    """Title, date, command and machine line of one results file (what the report header holds)."""
    text = path.read_text()
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), path.stem)
    produced = re.search(r"Produced by `([^`]*)` on ([^(]+?) \(", text)
    cpu = re.search(r"^- CPU: (.*)$", text, re.MULTILINE)
    return {
        "title": title,
        "command": produced.group(1) if produced else "?",
        "date": produced.group(2).strip() if produced else "?",
        "machine": cpu.group(1).strip() if cpu else "?",
    }


def write_index() -> Path:
    lines = [
        "# Benchmark results",
        "",
        "Written by `python benchmarks/run_all.py` (which reruns every suite and rewrites this index). Each "
        "table states its command, date and machine; compare ratios within a table, not absolute times across "
        "machines. How each is measured: [`benchmarks/README.md`](../README.md).",
        "",
        "| table | what | kind | date | machine | command |",
        "|---|---|---|---|---|---|",
    ]
    listed = set()
    for name, (script, kind, what) in SUITES.items():
        path = RESULTS / f"{name}.md"
        listed.add(path.name)
        if path.exists():
            info = describe(path)
            lines.append(f"| [{name}.md]({name}.md) | {what} | {kind} | {info['date']} | {info['machine']} | `{info['command']}` |")
        elif name == "gpu":
            lines.append(f"| gpu.md (absent) | {what} | {kind} | – | {GPU_NOTE} | `python benchmarks/{script}` |")
        else:
            lines.append(f"| {name}.md (absent) | {what} | {kind} | – | not run yet | `python benchmarks/{script}` |")
    for path in sorted(RESULTS.glob("*.md")):
        if path.name not in listed and path.name != "README.md":
            info = describe(path)
            lines.append(f"| [{path.name}]({path.name}) | {info['title']} | – | {info['date']} | {info['machine']} | `{info['command']}` |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    index = RESULTS / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index


# ----------------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes; the scripts print only, no file is written")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(SUITES)}")
    parser.add_argument("--threads", type=int, default=None, help="passed to every speed script (their default: 1)")
    parser.add_argument("--in-process", action="store_true", help="run the scripts in this interpreter (runpy)")
    parser.add_argument("--keep-going", action="store_true", help="run the remaining suites after a failure")
    parser.add_argument("--index-only", action="store_true", help="only rewrite results/README.md")
    args = parser.parse_args(argv)
    if args.index_only:
        print(f"wrote {write_index()}")
        return 0
    statuses: List[Tuple[str, str, float]] = []
    failed = False
    for name in selected(args.only):
        script, kind, _ = SUITES[name]
        path = HERE / script
        flags = ["--quick"] if args.quick else []
        if args.threads is not None and kind.startswith("speed"):
            flags += ["--threads", str(args.threads)]
        print(f"{MARKER}{script}{''.join(' ' + f for f in flags)}: start", flush=True)
        started = time.perf_counter()
        code = run_one(path, flags, args.in_process)
        seconds = time.perf_counter() - started
        print(f"{MARKER}{script}: exit {code} ({seconds:.0f} s)", flush=True)
        statuses.append((name, "ok" if code == 0 else f"exit {code}", seconds))
        if code != 0:
            failed = True
            if not args.keep_going:
                break
    if not args.quick:
        print(f"wrote {write_index()}", file=sys.stderr)
    print("\n| suite | status | seconds |\n|---|---|---:|")
    for name, status, seconds in statuses:
        print(f"| {name} | {status} | {seconds:.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
