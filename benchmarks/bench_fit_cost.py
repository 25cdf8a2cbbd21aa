"""Fit cost of every logit method and of ``auto`` at the sizes users have, with probmetrics beside it.

Three sizes, each fitted on one set of cached logits and scored on another of the same size:

* **~450 × 10**: the zoo's digits CNN and ViT (real logits: the calibration half of their 899 cached rows, scored on
  the other half; ``bench_safe_defaults.cached_logits``);
* **5,000 × 100** and **25,000 × 1,000**: synthetic float32 logits ``3·randn(N, C)`` whose labels are drawn from
  ``softmax(a ⊙ z + b)`` with per-class scales a ∈ [0.25, 0.75] and biases b ~ N(0, 0.5²), so temperature scaling
  leaves per-class miscalibration for the richer maps to find. The fitting draw is the first of seeds 0, 2, 4, … whose
  labels hold every class (with a class absent, auto rightly leaves the per-class maps out, and would not time them);
  the held-out draw is the next seed.

Per row: the fit's wall time (one torch thread; every method fitted once beforehand on a small problem, so one-off
imports — torch._dynamo on the first L-BFGS, 1–2 s; scipy.optimize on the first isotonic fit — are not counted), its
peak resident memory above what the process held before it (sampled every 2 ms), and its held-out NLL. The peers are
probmetrics' defaults: ``ts-mix`` (TS), ``svs`` (structured vector) and ``sms`` (structured matrix), fitted with
``fit_torch`` on the same logits. Each of our methods is set beside its closest peer (TS: ts-mix; vector and
structured vector: svs; matrix, Dirichlet and structured matrix: sms) with the time ratio and the NLL difference; the
goal is ratio ≤ 1 at NLL ≤ peer + 0.002. ``auto`` is scored on its choice's held-out NLL.

Usage::

    python benchmarks/bench_fit_cost.py                 # the three sizes; writes results/fit_cost.md (~20 min)
    python benchmarks/bench_fit_cost.py --quick         # ~450 × 10 only, prints
    python benchmarks/bench_fit_cost.py --sizes 5000x100
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import _report
from _safe_peers import _probmetrics, peer_missing, PEERS

NAME = "fit_cost"
METHODS = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix", "histogram", "isotonic")
PEER_OF = {"temperature": "ts-mix", "vector": "svs", "structured_vector": "svs", "matrix": "sms", "dirichlet": "sms",
           "structured_matrix": "sms"}
#: the goals for auto's fit time, seconds, by size label
AUTO_GOAL = {"digits": 1.0, "5000x100": 30.0, "25000x1000": 600.0}
#: peers not run at a size, with the reason
SKIPPED_PEERS = {"25000x1000": {"sms": "not run: probmetrics fits its 10⁶ weights with torchmin's L-BFGS in float64"}}
Predict = Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class Row:
    label: str
    seconds: Optional[float]
    peak_bytes: Optional[int]
    nll: Optional[float]
    note: str = ""


class PeakMemory:
    """The peak resident set size of this process above its size at the start, sampled every 2 ms by a thread."""

    def __enter__(self) -> "PeakMemory":
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def above_start(self) -> int:
        return self.peak - self.start


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def synthetic(count: int, classes: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``3·randn`` float32 logits and labels from softmax(a ⊙ z + b), a and b fixed per class (seed 0)."""
    fixed = torch.Generator().manual_seed(0)
    scale = 0.25 + 0.5 * torch.rand(classes, generator=fixed)
    bias = 0.5 * torch.randn(classes, generator=fixed)
    generator = torch.Generator().manual_seed(seed + 1)
    logits = 3 * torch.randn(count, classes, generator=generator)
    labels = torch.cat([torch.multinomial(torch.softmax(logits[s:s + 5000].double() * scale + bias, 1), 1, generator=generator).squeeze(1)
                        for s in range(0, count, 5000)])
    return logits, labels


def problems(sizes: Sequence[str]) -> List[Tuple[str, str, Tuple[torch.Tensor, ...]]]:
    """(size label, title, (fit logits, fit labels, test logits, test labels)) for each size asked."""
    found = []
    for size in sizes:
        if size == "digits":
            from bench_safe_defaults import cached_logits

            for model in ("digits_cnn", "digits_vit"):
                logits, labels = cached_logits(model)
                order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
                half = len(labels) // 2
                fit, test = order[:half], order[half:]
                found.append((size, f"{model}: {half} × {logits.shape[1]} (real logits)", (logits[fit], labels[fit], logits[test], labels[test])))
        else:
            count, classes = (int(part) for part in size.split("x"))
            seed = next(seed for seed in range(0, 100, 2) if len(synthetic(count, classes, seed)[1].unique()) == classes)
            title = f"{count:,} × {classes:,} (synthetic, seed {seed})"
            found.append((size, title, (*synthetic(count, classes, seed), *synthetic(count, classes, seed + 1))))
    return found


def ours(method: str) -> Callable[[torch.Tensor, torch.Tensor], Predict]:
    from hf_calibrate.calibrators import calibrator_class, parse_options

    def fit(logits: torch.Tensor, labels: torch.Tensor) -> Predict:
        cls = calibrator_class(method)
        options = parse_options(cls.Options, {}, method)
        calibrator = cls.create(logits.shape[1], options)
        calibrator.fit_logits(logits, labels, options)
        calibrator.is_fitted = True
        return lambda test: torch.softmax(calibrator(test).double(), 1)

    return fit


def auto(logits: torch.Tensor, labels: torch.Tensor) -> Predict:
    """``method="auto"`` on the cached logits, as ``CalibratedModel.fit`` runs it after its one pass of the base."""
    from hf_calibrate.calibrators.holdout import content_groups, cross_fitting_folds, default_folds
    from hf_calibrate.fitting.auto.selection import choose, default_logit_candidates
    from hf_calibrate.fitting.auto.scoring import score_candidates
    from hf_calibrate.fitting.runtime.engine import Engine, EngineOptions

    class NoBar:
        def update(self, count: int) -> None:
            pass

    groups = content_groups(logits)
    folds = cross_fitting_folds(labels, default_folds(None, *logits.shape), 0, groups)
    scored = score_candidates(list(default_logit_candidates()), logits, labels, folds, Engine(EngineOptions()), NoBar(), groups)
    method = choose(scored, groups).method
    calibrator = next(entry.fitted[0] for entry in scored if entry.method == method)
    auto.chosen = method  # type: ignore[attr-defined]
    return lambda test: torch.softmax(calibrator(test).double(), 1)


def measured(label: str, fit: Callable[[torch.Tensor, torch.Tensor], Predict], data: Tuple[torch.Tensor, ...],
             repeats: int = 1) -> Row:
    """``fit`` on the data's first half, ``repeats`` times: the median time, the largest peak, the held-out NLL."""
    logits, labels, test, test_labels = data
    seconds, peaks = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            with PeakMemory() as memory:
                started = time.perf_counter()
                predict = fit(logits, labels)
                seconds.append(time.perf_counter() - started)
            peaks.append(memory.above_start)
        with torch.no_grad():
            nll = float(F.nll_loss(predict(test).clamp_min(1e-300).log(), test_labels))
    return Row(label, statistics.median(seconds), max(peaks), nll)


def warm_up() -> None:
    """Fit every method and peer once on 200 × 5 logits: one-off imports are not a fit's cost."""
    data = (*synthetic(200, 5, 0), *synthetic(200, 5, 1))
    for method in METHODS:
        measured(method, ours(method), data)
    for name in ("ts-mix", "svs", "sms"):
        measured(name, _probmetrics(name), data)


def measure_size(size: str, data: Tuple[torch.Tensor, ...], peers_ok: bool, repeats: int) -> Dict[str, Row]:
    """Every row of one size, each fit timed once per round in interleaved rounds (ours, auto, the peers; so that the
    machine's load hits them alike): ``repeats`` rounds at 449 × 10, 3 at 5,000 × 100, 1 at 25,000 × 1,000; the
    median time, the largest peak."""
    repeats = {"digits": repeats, "5000x100": 3}.get(size, 1)
    rows: Dict[str, Row] = {"uncalibrated": Row("uncalibrated", None, None, float(F.cross_entropy(data[2].double(), data[3])))}
    contenders: Dict[str, Callable[[torch.Tensor, torch.Tensor], Predict]] = {method: ours(method) for method in METHODS}
    contenders["auto"] = auto
    for name in ("ts-mix", "svs", "sms"):
        reason = SKIPPED_PEERS.get(size, {}).get(name) or (None if peers_ok else "probmetrics is not installed")
        if reason:
            rows[f"probmetrics {name}"] = Row(f"probmetrics {name}", None, None, None, reason)
        else:
            contenders[f"probmetrics {name}"] = _probmetrics(name)
    rounds: Dict[str, List[Row]] = {label: [] for label in contenders}
    for _ in range(repeats):
        for label, fit in contenders.items():
            rounds[label].append(measured(label, fit, data))
            print(f"  {label}: {rounds[label][-1].seconds:.3f} s", flush=True)
    for label, measures in rounds.items():
        rows[label] = Row(label, statistics.median(row.seconds for row in measures), max(row.peak_bytes for row in measures), measures[-1].nll)
    rows["auto"].note = f"chose {auto.chosen}"  # type: ignore[attr-defined]
    return {label: rows[label] for label in ("uncalibrated", *METHODS, "auto", *(f"probmetrics {name}" for name in ("ts-mix", "svs", "sms")))}


def _versus_peer(method: str, rows: Dict[str, Row]) -> str:
    peer = rows.get(f"probmetrics {PEER_OF.get(method, '')}")
    row = rows[method]
    if peer is None or peer.seconds is None or row.seconds is None:
        return "–"
    ratio, gap = row.seconds / peer.seconds, row.nll - peer.nll
    met = ratio <= 1.0 and gap <= 0.002
    return f"{PEER_OF[method]}: time × {ratio:.2f}, NLL {gap:+.4f} — {'met' if met else 'not met'}"


def _estimate(label: str, shape: Tuple[int, int]) -> str:
    """The peak memory the method's footprint estimates before its fit (``Calibrator.footprint``), or –."""
    from hf_calibrate.calibrators import CALIBRATORS

    footprint = getattr(CALIBRATORS.get(label), "footprint", None)
    return "–" if footprint is None else _report.fmt_bytes(footprint.bytes(*shape))


def size_table(size: str, title: str, rows: Dict[str, Row], shape: Tuple[int, int]) -> List[str]:
    ts = rows["temperature"].nll
    table_rows = []
    for label, row in rows.items():
        seconds = "–" if row.seconds is None else _report.fmt_seconds(row.seconds)
        peak = "–" if row.peak_bytes is None else _report.fmt_bytes(max(row.peak_bytes, 0))
        estimate = _estimate(label, shape)
        nll = "–" if row.nll is None else f"{row.nll:.4f}"
        versus_ts = "–" if row.nll is None or label == "temperature" else f"{row.nll - ts:+.4f}"
        goal = _versus_peer(label, rows) if label in PEER_OF else ""
        if label == "auto":
            goal = f"≤ {AUTO_GOAL[size]:g} s: {'met' if row.seconds <= AUTO_GOAL[size] else 'not met'}"
        table_rows.append((label, seconds, peak, estimate, nll, versus_ts, goal, row.note))
    headers = ("fit", "time", "peak memory (RSS above start)", "estimated before the fit", "held-out NLL", "NLL − TS",
               "goal", "note")
    return [f"### {title}", "", *_report.table(headers, table_rows, "lrrrrrll"), ""]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=3)
    parser.add_argument("--sizes", default=None, help="comma-separated: digits, 5000x100, 25000x1000 (default: all three)")
    args = _report.parse(parser, argv)
    sizes = (args.sizes or ("digits" if args.quick else "digits,5000x100,25000x1000")).split(",")
    session = _report.Session("bench_fit_cost.py", args)
    peers_ok = peer_missing(next(peer for peer in PEERS if peer.module == "probmetrics.calibrators")) is None
    warm_up()
    lines = []
    for size, title, data in problems(sizes):
        print(title, flush=True)
        lines += size_table(size, title, measure_size(size, data, peers_ok, args.repeats), tuple(data[0].shape))
    title = "Fit cost at the sizes users have, with probmetrics beside it"
    lines = [*session.header(title, ["torch", "probmetrics"]), "", *lines, *NOTES]
    session.finish("\n".join(lines) + "\n", NAME, write_default=not args.quick)
    return 0


NOTES = [
    "## Notes",
    "",
    "- Time: the median of `--repeats` fits at ~450 × 10, of 3 at 5,000 × 100, one fit at 25,000 × 1,000, every fit "
    "(ours, auto and the peers) timed once per round in interleaved rounds (this shared 2-core machine varies by about "
    "±30 % run to run); the imports a first fit pays once per process are paid before the table (`warm_up`).",
    "- Peak memory is the process's resident set above its size before the fit, sampled every 2 ms: it includes "
    "what the allocator had already freed and kept, so small fits can show 0 B.",
    "- `auto` runs every logit candidate on all rows and on its default folds (5, or 2 from 10⁷ logit values on: 2 "
    "at 25,000 × 1,000), and is scored on the held-out NLL of what it chose.",
    "- vector, matrix and Dirichlet fit their own maps (of the logits, or of log softmax(z)) with the same ridge rule "
    "as svs/sms (λ = 1: C/N per diagonal parameter and bias, C(C − 1)/N per off-diagonal weight); structured vector "
    "and structured matrix are svs and sms themselves, so their NLL should match the peer's to the optimiser's "
    "tolerance.",
]


if __name__ == "__main__":
    raise SystemExit(main())
