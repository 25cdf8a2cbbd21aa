"""CalibrationMetrics across 2 CPU processes (torchrun, gloo; see ``tests/_launch.py``) equals one process on all data.

One torchrun launch serves every test of the module (fixture ``ranks``): starting the processes
costs more than the work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from hf_calibrate.metrics import (
    CalibrationMetrics,
    bootstrap_intervals,
    calibration_report,
    paired_bootstrap_intervals,
    paired_intervals,
)

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


# Bootstrap (docs/design.md §2, "Intervals"): few replicates suffice to compare; smECE costs one
# bandwidth search per replicate, so it runs in one scenario only (the strided shards).
BOOTSTRAP = {"bootstrap": 100, "seed": 5}  # the fewest replicates that give intervals (MIN_INTERVAL_REPLICATES)
INTERVAL_METRICS = ["accuracy", "ece", "mce", "rms_ce", "ada_ece", "nll", "brier"]
PER_SAMPLE = ("ada_ece", "smooth_ece")


def sharpened(probs: torch.Tensor) -> torch.Tensor:
    """A second, overconfident model of the same samples (for the paired intervals)."""
    return torch.softmax(probs.clamp(min=1e-12).log() * 2.0, dim=1)


def _bootstrap_results(rank: int, probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, dict]:
    """Intervals (with global sample_index), paired intervals, and default indices on strided shards."""
    results = {}
    for name in ("uneven", "interleaved", "empty_shard"):
        rows, batch = SCENARIOS[name][rank], SCENARIOS[name][2]
        plain, sharp = (CalibrationMetrics(NUM_CLASSES, n_bins=N_BINS, **BOOTSTRAP) for _ in range(2))
        counted = CalibrationMetrics(NUM_CLASSES, n_bins=N_BINS, **BOOTSTRAP)  # no sample_index
        for start in range(0, len(rows), batch):
            index = torch.tensor(rows[start : start + batch], dtype=torch.long)
            plain.update(probs[index], labels[index], sample_index=index)
            sharp.update(sharpened(probs[index]), labels[index], sample_index=index)
            counted.update(probs[index], labels[index])
        metrics = INTERVAL_METRICS + (["smooth_ece"] if name == "interleaved" else [])
        results[name] = {
            "intervals": {k: v.to_dict() for k, v in plain.intervals(metrics=metrics).items()},
            "compute": plain.compute()["intervals"],
            "paired": {k: v.to_dict() for k, v in paired_intervals(plain, sharp).items()},
            "counted": {k: v.to_dict() for k, v in counted.intervals().items()},
        }
    return results


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
    results["bootstrap"] = _bootstrap_results(rank, probs, labels)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> List[dict]:
    """Each process's JSON from one torchrun launch of ``_worker``."""
    from _launch import torchrun

    out_dir = tmp_path_factory.mktemp("metrics_distributed")
    torchrun(Path(__file__), [str(out_dir)])
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]


def test_two_processes_equal_one_process(ranks: List[dict]) -> None:
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


def _assert_same_intervals(got: Dict[str, dict], want: Dict[str, dict], where: str) -> None:
    """Summed statistics agree to rounding; per-sample metrics (one canonical sequence) to the last bit."""
    assert got.keys() == want.keys(), where
    for metric, interval in want.items():
        for field in ("point", "low", "high"):
            if metric in PER_SAMPLE:
                assert got[metric][field] == interval[field], (where, metric, field)
            else:
                assert got[metric][field] == pytest.approx(interval[field], rel=1e-12, abs=1e-15), (where, metric, field)
        assert (got[metric]["replicates"], got[metric]["seed"]) == (BOOTSTRAP["bootstrap"], BOOTSTRAP["seed"])


def test_two_processes_bootstrap_equals_one_process(ranks: List[dict]) -> None:
    """Each process feeds its share with global sample_index: the intervals are the one-process ones."""
    probs, labels = make_data()
    options = {"n_bins": N_BINS, "replicates": BOOTSTRAP["bootstrap"], "seed": BOOTSTRAP["seed"]}

    def as_dicts(intervals):
        return {name: interval.to_dict() for name, interval in intervals.items()}

    want = as_dicts(bootstrap_intervals(probs, labels, metrics=INTERVAL_METRICS + ["smooth_ece"], **options))
    want_paired = as_dicts(paired_bootstrap_intervals(probs, sharpened(probs), labels, **options))
    without_smooth = {name: want[name] for name in INTERVAL_METRICS}
    for name in ("uneven", "interleaved", "empty_shard"):
        for rank in range(2):
            got = ranks[rank]["bootstrap"][name]
            _assert_same_intervals(got["intervals"], want if name == "interleaved" else without_smooth, f"{name}/{rank}")
            _assert_same_intervals(got["compute"], without_smooth, f"{name}/{rank}/compute")
            _assert_same_intervals(got["paired"], want_paired, f"{name}/{rank}/paired")
        assert ranks[0]["bootstrap"][name] == ranks[1]["bootstrap"][name]  # every process reports the same
    # Default indices are rank + 2·count: on strided shards (DistributedSampler order) the global index.
    _assert_same_intervals(ranks[0]["bootstrap"]["interleaved"]["counted"], without_smooth, "counted")


if __name__ == "__main__":
    from hf_calibrate._distributed import shut_down

    _worker(sys.argv[1])
    shut_down()
