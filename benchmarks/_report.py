"""Shared parts of the benchmark scripts: command line, machine description, interleaved timing, Markdown.

Every benchmark in this folder

* takes ``--quick`` (small sizes, prints only), ``--threads`` (``torch.set_num_threads``,
  default 1: on a shared machine torch's intra-op pool mostly waits for descheduled threads,
  which swamps what is measured; 0 keeps torch's default), ``--repeats`` and ``--output``;
* times its contenders in *interleaved rounds* (each contender once per round, in the same
  process, on the same data) so background load hits them alike, and reports medians and
  ratios within that one run;
* prints a Markdown report that starts with the command, the date and the machine, and writes
  it to ``benchmarks/results/<name>.md`` on a full run (or to ``--output``);
* splits its ``main`` into ``measure(args) -> results`` (the timed work) and
  ``report(session, results) -> str`` (the Markdown), with ``session.args`` the parsed options.

Scripts run as ``python benchmarks/<script>.py``: Python puts this folder first on ``sys.path``,
so ``import _report`` needs no path edit, and ``hf_calibrate`` is the installed package
(``pip install -e .`` in a checkout).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import importlib
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

THREADS_NOTE = (
    "Threads pinned with `--threads`: on a machine whose cores are busy with other work, torch's "
    "intra-op thread pool spends most of its time waiting for descheduled threads, which swamps "
    "what is being measured."
)

# ----------------------------------------------------------------------------- command line


def parser(doc: Optional[str], *, default_repeats: int, quick_repeats: int) -> argparse.ArgumentParser:
    """An ArgumentParser with the options every benchmark shares."""
    result = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--quick", action="store_true", help="small sizes and few rounds; prints only (unless --output)")
    result.add_argument(
        "--repeats", type=int, default=None, help=f"interleaved timed rounds (default {default_repeats}, quick {quick_repeats})"
    )
    result.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1; 0 keeps torch's default)")
    result.add_argument("--output", type=Path, default=None, help="write the report here (default for a full run: benchmarks/results/)")
    result.set_defaults(_default_repeats=default_repeats, _quick_repeats=quick_repeats)
    return result


def parse(parser_: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse, fill ``repeats``, record the flags as typed (``args.flags``), pin the threads."""
    args = parser_.parse_args(argv)
    if args.repeats is None:
        args.repeats = args._quick_repeats if args.quick else args._default_repeats
    args.flags = "".join(f" {arg}" for arg in (sys.argv[1:] if argv is None else argv))
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def run_once(script: str, doc: Optional[str], title: str, body: Callable[[argparse.Namespace], List[str]],
             notes: Sequence[str], name: str, argv: Optional[Sequence[str]] = None) -> int:
    """``main`` of a benchmark measured once (no timed rounds): the shared options, then a report of ``title``, the
    machine, ``body(args)``'s Markdown lines and ``notes``, printed and (full run) written to ``results/<name>.md``."""
    args = parse(parser(doc, default_repeats=1, quick_repeats=1), argv)
    session = Session(script, args)
    lines = body(args)
    session.finish("\n".join([*session.header(title, ["torch"]), *lines, *notes]) + "\n", name, write_default=not args.quick)
    return 0


# ----------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (platform.processor() as a fallback)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> Tuple[float, ...]:
    return tuple(round(x, 2) for x in os.getloadavg())


def versions(packages: Iterable[str]) -> str:
    """``Python 3.11.7, torch 2.x, ...`` for the named importable packages (a module without ``__version__``, such as
    probmetrics, by its installed distribution's version)."""
    parts = [f"Python {platform.python_version()}"]
    for name in packages:
        module = importlib.import_module(name)
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
        parts.append(f"{name} {version}")
    return ", ".join(parts)


def gpu_description() -> Optional[str]:
    if not torch.cuda.is_available():
        return None
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)}× {names[0]}" if len(set(names)) == 1 else ", ".join(names)


class Session:
    """Start time and load of one benchmark run; writes the report header and saves the report."""

    def __init__(self, script: str, args: argparse.Namespace) -> None:
        self.script = script
        self.args = args
        self.load_start = load_average()
        self.started = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def produced_line(self) -> str:
        """``Produced by `python benchmarks/<script> <flags>` on <date> (<elapsed> s).`` — date and time taken now."""
        self.date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f"Produced by `python benchmarks/{self.script}{self.args.flags}` on {self.date} ({self.elapsed:.0f} s)."

    def machine_lines(self, packages: Iterable[str], *, extra: str = "") -> List[str]:
        """Bullet lines: CPU and threads (and GPUs), library versions, load average at start and end."""
        cpu = f"- CPU: {cpu_model()}, {os.cpu_count()} logical cores; torch threads: {torch.get_num_threads()}"
        gpu = gpu_description()
        lines = [cpu + (f"; GPU: {gpu}" if gpu else ""), f"- {versions(packages)}"]
        note = THREADS_NOTE if self.args.threads else ""
        lines.append(
            f"- Load average (1, 5, 15 min) at start {self.load_start}, at end {load_average()} — the machine is "
            f"shared, so absolute times are noisy; ratios come from interleaved rounds in one process. {note}"
            + (f" {extra}" if extra else "")
        )
        return lines

    def header(self, title: str, packages: Iterable[str], *, extra: str = "") -> List[str]:
        return [f"# {title}", "", self.produced_line(), "", *self.machine_lines(packages, extra=extra), ""]

    def finish(self, text: str, name: str, *, write_default: bool = True) -> Optional[Path]:
        """Print ``text``; write it to ``--output``, or to ``results/<name>.md`` on a full run (if ``write_default``)."""
        print(text)
        output = self.args.output or (None if self.args.quick or not write_default else RESULTS / f"{name}.md")
        if output is not None:
            output = Path(output)
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text)
            print(f"wrote {output}", file=sys.stderr)
        return output


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Timing:
    """Seconds of every timed run of one contender, and the value its last run returned."""

    name: str
    seconds: List[float] = dataclasses.field(default_factory=list)
    value: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def min(self) -> float:
        return min(self.seconds) if self.seconds else float("nan")

    @property
    def runs(self) -> int:
        return len(self.seconds)


@dataclasses.dataclass
class Measured:
    """What a contender returns when it times itself: the seconds to record (one or several) and a value."""

    seconds: Sequence[float]
    value: Any = None


def interleaved(
    contenders: Mapping[str, Callable[[], Any]],
    rounds: int,
    *,
    skip: Optional[Callable[[str, int], bool]] = None,
    warmup: int = 0,
    progress: Optional[str] = None,
) -> Dict[str, Timing]:
    """Run every contender once per round, in order, ``rounds`` times; return their timings.

    A contender returning :class:`Measured` supplies its own seconds (e.g. per-epoch times it
    recorded); otherwise its wall-clock time is recorded. ``skip(name, round)`` leaves a run
    out (e.g. a slow contender timed fewer times). ``warmup`` untimed rounds come first.
    ``gc.collect()`` runs before each call.
    """
    timings = {name: Timing(name) for name in contenders}
    for round_index in range(-warmup, rounds):
        for name, run in contenders.items():
            if round_index >= 0 and skip is not None and skip(name, round_index):
                continue
            gc.collect()
            start = time.perf_counter()
            value = run()
            seconds = time.perf_counter() - start
            if round_index < 0:
                continue
            if isinstance(value, Measured):
                timings[name].seconds.extend(value.seconds)
                timings[name].value = value.value
            else:
                timings[name].seconds.append(seconds)
                timings[name].value = value
        if progress and round_index >= 0:
            print(f"{progress}: round {round_index + 1}/{rounds}", file=sys.stderr, flush=True)
    return timings


def paired_ratio(timing: Timing, base: Timing) -> float:
    """Median over runs of (this contender's i-th time / the base's i-th time).

    With interleaved rounds the i-th runs of two contenders ran seconds apart, so slow drifts in the
    machine's load cancel in each quotient — steadier than the ratio of the two medians.
    """
    pairs = [a / b for a, b in zip(timing.seconds, base.seconds)]
    return statistics.median(pairs) if pairs else float("nan")


# ----------------------------------------------------------------------------- Markdown


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: Optional[str] = None) -> List[str]:
    """Markdown table lines; ``align`` is one character per column: ``l`` (default) or ``r``."""
    align = align or "l" * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return lines


def fmt_bytes(num: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GiB"


def fmt_seconds(seconds: float) -> str:
    """Seconds with 3 significant-ish digits: 0.000123 → 0.123 ms, 1.234 → 1.23 s."""
    if seconds != seconds:  # nan
        return "–"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# ----------------------------------------------------------------------------- models (built from configs, never downloaded)


def timm_model(name: str, image_size: int, num_classes: int = 10, seed: int = 0, **kwargs: Any) -> torch.nn.Module:
    """``timm.create_model(name, pretrained=False)`` for ``image_size`` inputs, random init from ``seed``, eval mode.

    ``pretrained_cfg`` records the input size, so Neural Clamping's δ takes that shape.
    """
    import timm

    overlay = dict(input_size=(3, image_size, image_size), crop_pct=1.0, num_classes=num_classes)
    if name.startswith("vit"):
        kwargs.setdefault("img_size", image_size)
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, num_classes=num_classes, pretrained_cfg_overlay=overlay, **kwargs).eval()


def transformers_vit(
    image_size: int, *, patch_size: int = 8, hidden_size: int = 192, layers: int = 6, heads: int = 3,
    num_classes: int = 10, seed: int = 0,
) -> torch.nn.Module:
    """A transformers ``ViTForImageClassification`` from a ``ViTConfig`` (ViT-Tiny width by default), eval mode."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(
        image_size=image_size, patch_size=patch_size, hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden_size, num_labels=num_classes,
    )
    return ViTForImageClassification(config).eval()


def logits_of(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(N, C) logits of a timm model (tensor in) or a transformers model (``pixel_values=``, ModelOutput out)."""
    if getattr(model, "main_input_name", None) == "pixel_values" and hasattr(model, "config"):
        return model(pixel_values=pixels).logits
    return model(pixels)


def synthetic_images(model: torch.nn.Module, count: int, image_size: int, *, seed: int = 0, batch: int = 256):
    """Seeded N(0, 1) "normalised" images and labels drawn from the model's own softmax (so losses are sane)."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(count, 3, image_size, image_size, generator=generator)
    with torch.no_grad():
        logits = torch.cat([logits_of(model, pixels[s : s + batch]) for s in range(0, count, batch)])
    labels = torch.multinomial(torch.softmax(logits.double(), dim=1), 1, generator=generator).squeeze(1)
    return pixels, labels
