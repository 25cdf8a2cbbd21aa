"""Do class-stratified folds flatter maps with per-class biases? Cross-fitted scores against a new draw (issue 41).

``holdout.fold_assignment`` deals each class's rows evenly over the folds, so each fold's fitting rows hold the
held-out rows' class frequencies exactly. A map with per-class biases can learn those frequencies, which a new draw
will not share. Where TS is the truth (labels drawn from ``softmax(z / 2)``), no map can beat TS on new data, so a
cross-fitted score below TS measures that optimism. Per size, for each candidate of ``method="auto"`` among the maps
below, this script gives:

* its cross-fitted NLL − TS on the library's stratified folds, and on seeded shuffled folds (rows dealt at random);
* its NLL − TS on a new draw, fitted on all the rows: the truth the cross-fitted score estimates; and
* what ``auto``'s rule (``fitting.auto.choose``) chose on each deal, with the new-draw NLL − TS of that choice.

Sizes: 449 × 10 (10 seeds), 5,000 × 100 (4 seeds) and 20,000 × 1,000 (1 seed; TS and the structured maps only).
Means over seeds.

Usage::

    python benchmarks/bench_fold_leak.py            # writes results/fold_leak.md (~5 min)
    python benchmarks/bench_fold_leak.py --quick    # 449 × 10, 3 seeds, prints
"""

from __future__ import annotations

import argparse
import collections
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import _report
from bench_logit_fits import make_logits

NAME = "fold_leak"
MAPS = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix")
#: (rows, classes, seeds, candidates, rows of the new draw)
SIZES = [(449, 10, 10, MAPS, 20_000), (5_000, 100, 4, MAPS, 20_000),
         (20_000, 1_000, 1, ("temperature", "structured_vector", "structured_matrix"), 20_000)]
DEALS = ("stratified", "shuffled")


def shuffled_folds(count: int, folds: int, seed: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """K (fitting, held-out) index pairs of rows dealt at random (seeded), not by class."""
    assignment = torch.empty(count, dtype=torch.long)
    assignment[torch.randperm(count, generator=torch.Generator().manual_seed(seed))] = torch.arange(count) % folds
    return [((assignment != k).nonzero().squeeze(1), (assignment == k).nonzero().squeeze(1)) for k in range(folds)]


def one_seed(count: int, classes: int, seed: int, maps: Sequence[str], new_rows: int) -> Dict[str, Dict[str, float]]:
    """{deal: {map: cross-fitted NLL − TS, "chose <map>": new-draw NLL − TS}, "new": {map: new-draw NLL − TS}}."""
    from hf_calibrate.calibrators.holdout import content_groups, default_folds, stratified_folds
    from hf_calibrate.fitting.auto import choose
    from hf_calibrate.fitting.auto_scoring import score_candidates
    from hf_calibrate.fitting.engine import Engine, EngineOptions

    class NoBar:
        def update(self, count: int) -> None:
            pass

    logits, labels = make_logits(count, classes, 100 + 2 * seed)
    new_logits, new_labels = make_logits(new_rows, classes, 101 + 2 * seed)
    groups, folds = content_groups(logits), default_folds(None, count, classes)
    result: Dict[str, Dict[str, float]] = {}
    for deal in DEALS:
        split = stratified_folds(labels, folds, 0, groups) if deal == "stratified" else shuffled_folds(count, folds, seed)
        scored = score_candidates(list(maps), logits, labels, split, Engine(EngineOptions()), NoBar(), groups)
        with torch.no_grad():
            new = {entry.method: float(F.cross_entropy(entry.fitted[0](new_logits).double(), new_labels)) for entry in scored}
        result["new"] = {method: nll - new["temperature"] for method, nll in new.items()}
        result[deal] = {entry.method: float((entry.nll - scored[0].nll).mean()) for entry in scored}
        chosen = choose(scored, groups).method
        result[deal][f"chose {chosen}"] = result["new"][chosen]
    return result


def measure(quick: bool) -> List[Tuple[str, Sequence[str], List[Dict[str, Dict[str, float]]]]]:
    sizes = [(449, 10, 3, MAPS, 20_000)] if quick else SIZES
    results = []
    for count, classes, seeds, maps, new_rows in sizes:
        print(f"{count:,} × {classes:,}", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append((f"{count:,} × {classes:,}, {seeds} seed{'s' if seeds > 1 else ''}", maps,
                            [one_seed(count, classes, seed, maps, new_rows) for seed in range(seeds)]))
    return results


def size_lines(title: str, maps: Sequence[str], seeds: List[Dict[str, Dict[str, float]]]) -> List[str]:
    mean = lambda deal, method: sum(seed[deal][method] for seed in seeds) / len(seeds)  # noqa: E731
    rows = [(method, f"{mean('stratified', method):+.4f}", f"{mean('shuffled', method):+.4f}", f"{mean('new', method):+.4f}")
            for method in maps if method != "temperature"]
    lines = [f"### {title}", "", *_report.table(("map", "cross-fitted − TS, stratified folds", "cross-fitted − TS, "
                                                 "shuffled folds", "new draw − TS (the truth)"), rows, "lrrr"), ""]
    for deal in DEALS:
        choices = collections.Counter(key[len("chose "):] for seed in seeds for key in seed[deal] if key.startswith("chose "))
        gaps = [value for seed in seeds for key, value in seed[deal].items() if key.startswith("chose ")]
        lines.append(f"- auto on {deal} folds chose {dict(choices)}; new-draw NLL − TS of its choice: mean "
                     f"{sum(gaps) / len(gaps):+.4f}, largest {max(gaps):+.4f}.")
    return [*lines, ""]


NOTES = [
    "## Notes",
    "",
    "- Labels are drawn from `softmax(z / 2)` (`bench_logit_fits.make_logits`, fitting draw seed 100 + 2s, new draw "
    "101 + 2s), so TS is the true model and every map's true NLL − TS is ≥ 0.",
    "- Folds: the library's default count (5 at 449 × 10 and 5,000 × 100, 2 at 20,000 × 1,000); the shuffled deal is "
    "this script's `shuffled_folds`, the proposed fix, not the library's.",
    "- Each map is fitted as auto fits it (`fitting.auto_scoring.score_candidates`: its fit on all the rows is the "
    "one scored on the new draw).",
]


def report_lines(args: argparse.Namespace) -> List[str]:
    return [line for title, maps, seeds in measure(args.quick) for line in size_lines(title, maps, seeds)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "Class-stratified folds flatter per-class maps: cross-fitted scores against a new draw (issue 41)"
    return _report.run_once("bench_fold_leak.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    raise SystemExit(main())
