"""Run a test's worker in real, freshly started processes with ``torchrun`` (gloo on CPU).

``accelerate.debug_launcher`` forks the pytest process; once torch's intra-op thread pool has
run in the parent (any earlier test does that), a forked child can deadlock on its first
parallel kernel. Fresh interpreters started by ``torchrun`` cannot inherit that state, and
they are exactly how users launch several processes (``accelerate launch`` is torchrun
underneath), so the suite uses them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: Path, args: Sequence[str], *, num_processes: int = 2, timeout: int = 600) -> None:
    """Run ``script args...`` on ``num_processes`` CPU processes; fail the test with their output."""
    # The tests' folder first (the workers import its helpers), then the caller's path (a checkout run from PYTHONPATH).
    python_path = os.pathsep.join(filter(None, (str(Path(__file__).parent), os.environ.get("PYTHONPATH"))))
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", PYTHONPATH=python_path)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={num_processes}",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(script), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"torchrun exited with {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
