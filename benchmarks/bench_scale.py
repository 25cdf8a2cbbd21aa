"""Streams at scale: memory against N, and throughput against a bare loop (docs/design.md §3.0).

The calibration set is a stream: a torch ``IterableDataset`` that generates N seeded synthetic
3×16×16 images in batches of 256, labelled by sampling the model's sharpened softmax (the same
samples on every pass), handed over as ``DataLoader(stream, batch_size=None)``. The model is one
linear layer over the pixels (10 classes), so that the data path — ours and the loader's —
dominates, not the model.

* **Memory.** For N = 25k, 50k, 100k and 200k, each stage runs in a fresh process, three times (the table shows
  the median and the range: how much memory the allocator keeps varies from run to run); a thread samples
  the process's resident memory every 2 ms, and the table shows the peak during the stage above the
  resident memory just before it (imports, model and loader done). Stages: *bare loop* (the loop of
  the throughput table, for reference), *logits* (one scan,
  ``Engine.collect_logits``), *temperature* (``CalibratedModel.fit(method="temperature")``) and
  *NC, 2 epochs* (``method="neural_clamping", epochs=2``, ``cache_bytes`` 64 MiB: the 3 KB images
  of N ≥ 25k do not fit, so every pass reads the stream again, shuffled within blocks). The slope
  of a least-squares line through the four points is the memory that grows per sample; the logits
  themselves are 40 bytes per sample (10 float32), held at most a few times while they are gathered.
* **Throughput.** In one process, interleaved rounds of a bare loop over the same loader (the
  model's forward pass under ``no_grad``, outputs discarded) and of the logits scan; the ratio of
  their medians is the scan's throughput relative to the bare loop (target ≥ 0.9×).

Usage::

    python benchmarks/bench_scale.py           # writes benchmarks/results/scale.md
    python benchmarks/bench_scale.py --quick   # small N, all in this process (a smoke run), prints only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import _report

NAME = "scale"
CLASSES, IMAGE, BATCH = 10, (3, 16, 16), 256
CACHE_BYTES = 64 << 20
SIZES, QUICK_SIZES = (25_000, 50_000, 100_000, 200_000), (2_000, 4_000)
THROUGHPUT_N, QUICK_THROUGHPUT_N = 100_000, 4_000
STAGES = ("bare", "logits", "temperature", "nc")
TARGET = 0.9
MEMORY_RUNS = 3  # fresh processes per (stage, N): the allocator's retention varies from run to run


class SyntheticStream(IterableDataset):
    """N seeded synthetic images in batches of BATCH, labelled by sampling softmax(2 · the model's logits) (an
    informative, under-confident model); every pass gives the same samples."""

    def __init__(self, count: int, net: nn.Module) -> None:
        self.count, self.layer = count, net[1]

    @torch.no_grad()
    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        for start in range(0, self.count, BATCH):
            size = min(BATCH, self.count - start)
            pixels = torch.randn(size, *IMAGE, generator=generator)
            scores = 2 * self.layer(pixels.flatten(1)) - torch.log(-torch.log(torch.rand(size, CLASSES, generator=generator)))
            yield pixels, scores.argmax(dim=1)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(IMAGE[0] * IMAGE[1] * IMAGE[2], CLASSES)).eval()


def stream(count: int) -> Tuple[nn.Module, DataLoader]:
    """(the model, a loader handing over the stream's batches as they are)."""
    net = model()
    return net, DataLoader(SyntheticStream(count, net), batch_size=None)


def stage_runner(stage: str, count: int, batch_size: int = 1000) -> Callable[[], Any]:
    """The work of one stage over a stream of ``count`` samples (imports done here, before it runs); ``batch_size``
    is the engine's (the logits scan's forward batches: the loader's batches are joined or cut to it)."""
    from hf_calibrate import CalibratedModel
    from hf_calibrate.backbones import adapt
    from hf_calibrate.data import prepare_data
    from hf_calibrate.fitting import Engine, EngineOptions

    net, loader = stream(count)
    if stage == "bare":
        return lambda: _bare_loop(net, loader)
    if stage == "logits":
        engine, backbone = Engine(EngineOptions(progress=False, batch_size=batch_size)), adapt(net)
        return lambda: engine.collect_logits(backbone, prepare_data(loader, backbone))
    if stage == "temperature":
        return lambda: CalibratedModel.fit(net, loader, method="temperature", progress=False)
    return lambda: CalibratedModel.fit(net, loader, method="neural_clamping", epochs=2, cache_bytes=CACHE_BYTES, progress=False)


@torch.no_grad()
def _bare_loop(net: nn.Module, loader: DataLoader) -> None:
    """The loop a user would write: every batch through the model, outputs dropped."""
    for inputs, _ in loader:
        net(inputs)


# ----------------------------------------------------------------------------- memory, one process per point


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """The highest resident memory seen by a thread reading it every 2 ms, while in the ``with`` block."""

    def __init__(self) -> None:
        self.peak, self._done = resident_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, resident_bytes())

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())


def measure_point(stage: str, count: int) -> Dict[str, float]:
    """Run one stage once (after a warm-up on a small stream) and return its memory and time."""
    stage_runner(stage, 1_000)()  # first calls import and initialise what they need
    run = stage_runner(stage, count)
    before = resident_bytes()
    started = time.perf_counter()
    with PeakSampler() as sampler:
        run()
    return {"before": before, "peak": sampler.peak, "seconds": time.perf_counter() - started}


def memory_table(sizes: Sequence[int], threads: int, fresh: bool, runs: int) -> Dict[str, Dict[int, Dict[str, float]]]:
    """{stage: {N: point}}, each point the run of median growth out of ``runs``, each run in a fresh interpreter
    (``fresh``; else in this one, for a smoke run), with the lowest and highest growth seen (``low``, ``high``)."""
    results: Dict[str, Dict[int, Dict[str, float]]] = {stage: {} for stage in STAGES}
    for stage in STAGES:
        for count in sizes:
            points = sorted((_memory_point(stage, count, threads, fresh) for _ in range(runs)), key=_growth)
            results[stage][count] = {**points[len(points) // 2], "low": _growth(points[0]), "high": _growth(points[-1]), "runs": runs}
            print(f"scale: {stage} N={count:,} done", file=sys.stderr, flush=True)
    return results


def _memory_point(stage: str, count: int, threads: int, fresh: bool) -> Dict[str, float]:
    if not fresh:
        return measure_point(stage, count)
    command = [sys.executable, __file__, "--measure", stage, str(count), "--threads", str(threads)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def _growth(point: Dict[str, float]) -> float:
    """Bytes: the peak resident memory of a stage above the resident memory just before it."""
    return point["peak"] - point["before"]


def slope(points: Dict[int, Dict[str, float]], smallest: int = 0) -> float:
    """Least-squares bytes per sample of (peak − before) against N, over the points with N ≥ ``smallest``."""
    xs = [x for x in points if x >= smallest]
    ys = [_growth(points[x]) for x in xs]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


# ----------------------------------------------------------------------------- throughput, one process


def throughput(count: int, rounds: int) -> Tuple[_report.Timing, ...]:
    """(bare loop, logits scan, the scan with the loader's batch size, loader alone) over the same stream, interleaved."""
    net, loader = stream(count)
    scan, scan_as_loaded = stage_runner("logits", count), stage_runner("logits", count, batch_size=BATCH)

    def bare() -> None:
        with torch.no_grad():
            for inputs, _ in loader:
                net(inputs)

    def loader_only() -> None:
        for _ in loader:
            pass

    contenders = {"bare": bare, "scan": scan, "as loaded": scan_as_loaded, "loader": loader_only}
    timings = _report.interleaved(contenders, rounds, warmup=1, progress="throughput")
    return tuple(timings[name] for name in contenders)


@dataclasses.dataclass
class Results:
    """{stage: {N: point}} memory, the throughput timings (bare, scan, as loaded, loader) and their N."""

    memory: Dict[str, Dict[int, Dict[str, float]]]
    timings: Tuple[_report.Timing, ...]
    count: int


def measure(args: argparse.Namespace) -> Results:
    """Memory against N (fresh processes on a full run), then the interleaved throughput rounds."""
    memory = memory_table(QUICK_SIZES if args.quick else SIZES, args.threads, fresh=not args.quick, runs=1 if args.quick else MEMORY_RUNS)
    count = QUICK_THROUGHPUT_N if args.quick else THROUGHPUT_N
    return Results(memory, throughput(count, args.repeats), count)


# ----------------------------------------------------------------------------- report


def _memory_cell(point: Dict[str, float]) -> str:
    """The median growth, with the range over the runs when there were several."""
    cell = _report.fmt_bytes(_growth(point))
    return cell if point["low"] == point["high"] else f"{cell} ({_report.fmt_bytes(point['low'])}–{_report.fmt_bytes(point['high'])})"


def report(session: _report.Session, results: Results) -> str:
    memory, count = results.memory, results.count
    bare, scan, as_loaded, loader = results.timings
    sizes = list(memory["logits"])
    rows = [(f"{n:,}", *(_memory_cell(memory[stage][n]) for stage in STAGES),
             f"{memory['nc'][n]['seconds']:.1f}") for n in sizes]
    upper = sorted(sizes)[-3:]
    slopes = [(stage, f"{slope(memory[stage]):.0f}", f"{slope(memory[stage], upper[0]):.0f}") for stage in STAGES]
    ratio = bare.median / scan.median
    lines = [
        *session.header("Streams at scale: memory against N, throughput against a bare loop", ("torch",)),
        f"## Peak memory above the start of the stage, median over {memory['nc'][sizes[0]]['runs']} runs (their range) (streamed {IMAGE[0]}×{IMAGE[1]}×{IMAGE[2]} images, batches of {BATCH}, "
        f"{CLASSES} classes, one linear layer)",
        "",
        *_report.table(("N", "bare loop", "logits scan", "temperature fit", "NC, 2 epochs", "NC seconds"), rows, "rrrrrr"),
        "",
        *_report.table(("stage", "bytes per sample (slope over all N)", f"slope over N ≥ {upper[0]:,}"), slopes, "lrr"),
        "",
        f"The logits are {CLASSES * 4} bytes per sample; the inputs {IMAGE[0] * IMAGE[1] * IMAGE[2] * 4:,} bytes per sample "
        f"(NC keeps them only up to `cache_bytes` = {_report.fmt_bytes(CACHE_BYTES)}). A stage whose memory levels off once "
        "its fixed-size buffers are full (the cache, the allocator's arenas) has a large slope over all N but ~0 over the "
        "larger N; what grows per sample past that is index bookkeeping (int64 plan tensors).",
        "",
        f"## Throughput over {count:,} streamed samples ({bare.runs} interleaved rounds, medians)",
        "",
        *_report.table(("loop", "median s", "samples/s", "relative to the bare loop"), [
            ("loader alone (no model)", f"{loader.median:.3f}", f"{count / loader.median:,.0f}", "–"),
            ("bare loop: forward pass, outputs dropped", f"{bare.median:.3f}", f"{count / bare.median:,.0f}", "1.00×"),
            ("logits scan (Engine.collect_logits), batch_size 1000", f"{scan.median:.3f}", f"{count / scan.median:,.0f}", f"{ratio:.2f}×"),
            (f"the same with batch_size {BATCH}, the loader's", f"{as_loaded.median:.3f}", f"{count / as_loaded.median:,.0f}",
             f"{bare.median / as_loaded.median:.2f}×"),
        ], "lrrr"),
        "",
        f"Target ≥ {TARGET}× the bare loop (default batch_size): {_report.verdict(ratio >= TARGET)}. With the default "
        f"batch_size the scan joins the loader's batches of {BATCH} into the batches of 1,000 a map-style dataset is "
        "passed in (one copy of the inputs, and what makes every form's fit the map-style fit bit for bit); with "
        "batch_size equal to the loader's it passes them on as they are.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--measure"]:
        stage, count = argv[1], int(argv[2])
        _report.parse(_report.parser(__doc__, default_repeats=1, quick_repeats=1), argv[3:])
        print(json.dumps(measure_point(stage, count)))
        return
    args = _report.parse(_report.parser(__doc__, default_repeats=5, quick_repeats=2), argv)
    session = _report.Session("bench_scale.py", args)
    session.finish(report(session, measure(args)), NAME)


if __name__ == "__main__":
    main()
