"""CalibrationMetrics across 2 CPU processes (torchrun, gloo; see ``tests/_launch.py``) equals one process on all data."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from hf_calibrate.metrics import CalibrationMetrics, calibration_report

pytestmark = pytest.mark.multiprocess

NUM_CLASSES, N_BINS, NUM_SAMPLES = 7, 12, 1001

# name → (rows of rank 0, rows of rank 1, batch size); together each covers all samples once.
SCENARIOS: Dict[str, Tuple[List[int], List[int], int]] = {
    "uneven": (list(range(0, 301)), list(range(301, NUM_SAMPLES)), 64),
    "interleaved": (list(range(0, NUM_SAMPLES, 2)), list(range(1, NUM_SAMPLES, 2)), 100),
    "tiny_shard": (list(range(0, 3)), list(range(3, NUM_SAMPLES)), 1000),
    "empty_shard": ([], list(range(NUM_SAMPLES)), 250),
}


def make_data() -> Tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data (roughly calibrated, with ties and exact 0/1 entries) rebuilt in every process."""
    generator = torch.Generator().manual_seed(1234)
    logits = torch.randn(NUM_SAMPLES, NUM_CLASSES, generator=generator, dtype=torch.float64) * 2.5
    probs = torch.softmax(logits, dim=1)
    probs[:50] = torch.nn.functional.one_hot(torch.arange(50) % NUM_CLASSES, NUM_CLASSES).double()
    probs[50:100] = 1.0 / NUM_CLASSES  # ties, all-equal confidence
    labels = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return probs, labels


def _worker(out_dir: str) -> None:
    """Runs in each torchrun process: update with this rank's shard, compute, write JSON.

    Accelerate's ``PartialState`` initialises the gloo group, as it does for a user's script.
    """
    import torch.distributed as dist
    from accelerate import PartialState

    PartialState(cpu=True)

    rank = dist.get_rank()
    probs, labels = make_data()
    results = {"world": dist.get_world_size()}
    for name, shards in SCENARIOS.items():
        rows, batch = shards[rank], shards[2]
        for adaptive in (True, False):
            metrics = CalibrationMetrics(NUM_CLASSES, n_bins=N_BINS, adaptive=adaptive)
            for start in range(0, len(rows), batch):
                index = torch.tensor(rows[start : start + batch], dtype=torch.long)
                metrics.update(probs[index], labels[index])
            result = metrics.compute()
            result["local_num_samples"] = len(rows)
            result["reliability_counts"] = metrics.reliability().counts.tolist()
            results[f"{name}/adaptive={adaptive}"] = result
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def test_two_processes_equal_one_process(tmp_path: Path) -> None:
    from _launch import torchrun

    torchrun(Path(__file__), [str(tmp_path)])
    ranks = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2)]
    probs, labels = make_data()
    want = calibration_report(probs, labels, n_bins=N_BINS)
    want_counts = CalibrationMetrics(NUM_CLASSES, n_bins=N_BINS)
    want_counts.update(probs, labels)
    want_counts = want_counts.reliability().counts.tolist()
    assert all(r["world"] == 2 for r in ranks)  # really two processes in one group
    for name, (rows0, rows1, _) in SCENARIOS.items():
        for adaptive in (True, False):
            key = f"{name}/adaptive={adaptive}"
            for rank, rows in enumerate((rows0, rows1)):
                got = ranks[rank][key]
                assert got["local_num_samples"] == len(rows)
                assert got["num_samples"] == NUM_SAMPLES, key
                assert got["reliability_counts"] == want_counts, key
                for metric, value in want.items():
                    if metric == "ada_ece" and not adaptive:
                        assert metric not in got
                        continue
                    assert got[metric] == pytest.approx(value, rel=1e-12, abs=1e-15), (key, metric)
            # every process reports the same numbers
            assert ranks[0][key] | {"local_num_samples": 0} == ranks[1][key] | {"local_num_samples": 0}
    # AdaECE sees the same sorted sequence whatever the split: identical to the last bit
    for name in SCENARIOS:
        assert ranks[0][f"{name}/adaptive=True"]["ada_ece"] == want["ada_ece"]


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _worker(sys.argv[1])
    shut_down()
