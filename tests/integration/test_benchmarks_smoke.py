"""Every benchmark script runs with ``--quick`` and prints a Markdown table.

One subprocess runs them all through ``benchmarks/run_all.py --quick --in-process`` (each
script's ``__main__`` in turn, via ``runpy``), so torch, timm and transformers are imported
once rather than once per script; ``--quick`` scripts print only and write no file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "metrics": "bench_metrics.py",
    "nc_cost": "bench_nc_cost.py",
    "nc_time_to_quality": "bench_nc_time_to_quality.py",  # the digits CNN on 120 rows, 1 seed; the reference only if its copy is set
    "inference": "bench_inference.py",
    "logit_fits": "bench_logit_fits.py",
    "head_cost": "bench_head_cost.py",
    "evaluate_cost": "bench_evaluate_cost.py",
    "defaults": "bench_defaults.py",  # the zoo's digits CNN (cached by the suite), 1 seed, 3-epoch fits
    "scale": "bench_scale.py",  # streams of 2k and 4k samples, memory measured in-process
    "safe_defaults": "bench_safe_defaults.py",  # the digits CNN's cached logits, 1 seed, peers where installed
    "mac_cal_ablation": "bench_mac_cal_ablation.py",  # the digits CNN's cached features, 1 seed
    "auto_budget": "bench_auto_budget.py",  # the digits CNN on 120 rows, 1 seed
    "gpu": "bench_gpu.py",  # on CPU with --quick: tiny models, marked as not GPU numbers
}
TABLE_RULE = re.compile(r"^\|(-{3,}:?\|)+$", re.MULTILINE)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    results = ROOT / "benchmarks" / "results"
    before = {path: path.stat().st_mtime for path in results.glob("*.md")}
    process = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--in-process", "--only", ",".join(SCRIPTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    after = {path: path.stat().st_mtime for path in results.glob("*.md")}
    return process, before, after


def sections(stdout: str) -> dict:
    """script → (exit code, its printed output), from run_all's ``==> script: start`` / ``exit N`` markers."""
    found = {}
    for match in re.finditer(r"^==> (\S+)[^\n]*: start\n(.*?)^==> \1: exit (-?\d+)", stdout, re.MULTILINE | re.DOTALL):
        found[match.group(1)] = (int(match.group(3)), match.group(2))
    return found


def test_run_all_quick_exits_zero(quick_run):
    process, _, _ = quick_run
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_exits_zero_and_prints_a_table(quick_run, name):
    process, _, _ = quick_run
    found = sections(process.stdout)
    script = SCRIPTS[name]
    assert script in found, f"{script} did not run:\n{process.stdout[-2000:]}\n{process.stderr[-2000:]}"
    code, output = found[script]
    assert code == 0, output[-2000:] + process.stderr[-2000:]
    assert output.lstrip().startswith("# "), output[:500]
    assert "Produced by `python benchmarks/" in output and "- CPU:" in output
    assert TABLE_RULE.search(output), output[:2000]


def test_quick_runs_write_no_committed_file(quick_run):
    _, before, after = quick_run
    assert before == after


def test_gpu_script_says_gpu_numbers_were_not_measured(quick_run):
    process, _, _ = quick_run
    _, output = sections(process.stdout)["bench_gpu.py"]
    assert "NOT GPU NUMBERS" in output and "not measured in this repository" in output
