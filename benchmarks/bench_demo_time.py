"""How long ``hf-calibrate demo`` takes as a user runs it: first with an empty zoo cache, then with the cache it filled.

The README's Quick start states these times. Each run is the installed command line in a fresh process
(``python -m hf_calibrate.cli demo --no-progress``), with torch's default threads, as a user runs it, and with
``HF_CALIBRATE_CACHE`` pointing at a new folder: the first run trains the two zoo models into it, the second finds
them there. Per run: the wall time, the peak resident memory of the demo's process (``ru_maxrss`` of a wrapper's
children: each run has a wrapper of its own), and whether its two tables are the same as the first run's (the zoo is
trained bit-identically, so they should be).

Usage::

    python benchmarks/bench_demo_time.py           # the full demo, twice; writes results/demo_time.md (~3 min)
    python benchmarks/bench_demo_time.py --quick   # the demo's --quick configuration of the CNN alone, prints
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import _report

NAME = "demo_time"
#: runs one command (argv[1:]) and prints its wall seconds and its peak resident memory (KiB, Linux) as JSON
WRAPPER = ("import json, resource, subprocess, sys, time; start = time.perf_counter(); "
           "out = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
           "print(json.dumps({'seconds': time.perf_counter() - start, 'peak_kib': resource.getrusage("
           "resource.RUSAGE_CHILDREN).ru_maxrss, 'code': out.returncode, 'stdout': out.stdout, 'stderr': out.stderr[-2000:]}))")


def run_demo(cache: Path, output: Path, quick: bool) -> Dict[str, Any]:
    """One demo run in a fresh process: its seconds, peak KiB, exit code and the lines of its tables."""
    command = [sys.executable, "-m", "hf_calibrate.cli", "demo", "--no-progress", "--output", str(output)]
    command += ["--quick", "--models", "cnn"] if quick else []
    environment = {**os.environ, "HF_CALIBRATE_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    wrapped = subprocess.run([sys.executable, "-c", WRAPPER, *command], capture_output=True, text=True, env=environment,
                             cwd=_report.ROOT, check=True)
    run = json.loads(wrapped.stdout)
    if run["code"] != 0:
        raise RuntimeError(f"the demo failed (exit {run['code']}):\n{run['stderr']}")
    run["tables"] = [line for line in run["stdout"].splitlines() if "→" in line or re.search(r"\[[-+]\d", line)]
    return run


def report_lines(args: Any) -> List[str]:
    """Two runs, an empty cache then the filled one, as a Markdown table."""
    with tempfile.TemporaryDirectory(prefix="demo_time_") as folder:
        root = Path(folder)
        first = run_demo(root / "zoo", root / "first", args.quick)
        cached = run_demo(root / "zoo", root / "cached", args.quick)
    rows = [("first run (trains the zoo)", first), ("second run (zoo cached)", cached)]
    lines = ["| run | wall time | peak memory (the demo's process) | tables as the first run's |", "|---|---:|---:|---|"]
    for label, run in rows:
        same = "yes" if run["tables"] == first["tables"] else "**no**"
        lines.append(f"| {label} | {run['seconds']:.0f} s | {run['peak_kib'] / 2**20:.2f} GiB | {same} |")
    return ["", f"`hf-calibrate demo{' --quick --models cnn' if args.quick else ''}`:", "", *lines, "", "The demo's tables:",
            "", "```", *first["tables"], "```"]


NOTES = [
    "",
    "## Notes",
    "",
    "- Each run is a fresh process with torch's default threads (`--threads`, and the torch threads in the header, are "
    "this script's own process only), timed alone, not in interleaved rounds: the times are what a user of this machine "
    "sees. Nothing else should run meanwhile; the load average above says what did.",
]


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "`hf-calibrate demo`: first run and cached run"
    return _report.run_once("bench_demo_time.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    sys.exit(main())
