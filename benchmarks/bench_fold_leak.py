"""Do class-stratified folds flatter maps with per-class biases? Cross-fitted scores against a new draw.

Folds dealt by class (this script's :func:`stratified_assignment`, in place of ``holdout.fold_assignment``'s random
deal) put each class's rows evenly over the folds, so each fold's fitting rows hold the held-out rows' class
frequencies exactly. A map with per-class biases can learn those frequencies, which a new draw will not share. Where
TS is the truth (labels drawn from ``softmax(z / 2)``), no map can beat TS on new data, so a cross-fitted score below
TS measures that optimism.
Per size, for each candidate of ``method="auto"`` among the maps below, this script gives:

* its cross-fitted NLL − TS on stratified folds, and on the library's folds (rows dealt at random,
  ``holdout.cross_fitting_folds``);
* its NLL − TS on a new draw, fitted on all the rows: the truth the cross-fitted score estimates; and
* what ``auto``'s rule (``fitting.auto.selection.choose``) chose on each deal, with the new-draw NLL − TS of that choice.

Sizes: 449 × 10 (10 seeds), 5,000 × 100 (4 seeds) and 20,000 × 1,000 (1 seed; TS and the structured maps only).
Means over seeds.

Then, on the zoo's real logits (digits CNN and ViT, BBC MiniLM; 10 seeds), ``auto``'s test NLL with each deal
against TS's, on calibration / test halves drawn at random and on halves stratified by label.

Usage::

    python benchmarks/bench_fold_leak.py            # writes results/fold_leak.md (~8 min)
    python benchmarks/bench_fold_leak.py --quick    # 449 × 10, 3 seeds; the CNN, 2 seeds; prints
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import warnings
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple
from unittest import mock

import torch
import torch.nn.functional as F

import _report
from bench_logit_fits import make_logits
from bench_quality import _paired_interval

NAME = "fold_leak"
MAPS = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix")
#: (rows, classes, seeds, candidates, rows of the new draw)
SIZES = [(449, 10, 10, MAPS, 20_000), (5_000, 100, 4, MAPS, 20_000),
         (20_000, 1_000, 1, ("temperature", "structured_vector", "structured_matrix"), 20_000)]
DEALS = ("stratified", "random")


def stratified_assignment(labels: torch.Tensor, folds: int, seed: int,
                          groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A stand-in for ``holdout.fold_assignment`` that deals by class instead of at random: the rows (or content
    groups) shuffled by the same seeded generator, each class's then dealt round-robin over the folds, one class after
    another."""
    from hf_calibrate.calibrators import holdout

    first, member = holdout._first_rows(groups, len(labels))
    distinct = len(first)
    permutation = torch.randperm(distinct, generator=holdout.seeded_generator(seed, distinct, holdout.FOLDS_SALT))
    order = permutation[torch.sort(labels.cpu()[first][permutation], stable=True).indices]
    assignment = torch.empty(distinct, dtype=torch.long)
    assignment[order] = torch.arange(distinct) % min(int(folds), distinct)
    return assignment[member]


def dealt(deal: str) -> ContextManager[Any]:
    """Within it, the library's folds are dealt as ``deal`` says: "random" (the library's own) or "stratified"."""
    from hf_calibrate.calibrators import holdout

    if deal == "random":
        return contextlib.nullcontext()
    return mock.patch.object(holdout, "fold_assignment", stratified_assignment)


def one_seed(count: int, classes: int, seed: int, maps: Sequence[str], new_rows: int) -> Dict[str, Dict[str, float]]:
    """{deal: {map: cross-fitted NLL − TS, "chose <map>": new-draw NLL − TS}, "new": {map: new-draw NLL − TS}}."""
    from hf_calibrate.calibrators.holdout import content_groups, cross_fitting_folds, default_folds
    from hf_calibrate.fitting.auto.selection import choose
    from hf_calibrate.fitting.auto.scoring import score_candidates
    from hf_calibrate.fitting.runtime.engine import Engine, EngineOptions

    class NoBar:
        def update(self, count: int) -> None:
            pass

    logits, labels = make_logits(count, classes, 100 + 2 * seed)
    new_logits, new_labels = make_logits(new_rows, classes, 101 + 2 * seed)
    groups, folds = content_groups(logits), default_folds(None, count, classes)
    result: Dict[str, Dict[str, float]] = {}
    for deal in DEALS:
        with dealt(deal):
            split = cross_fitting_folds(labels, folds, 0, groups)
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
    rows = [(method, *(f"{mean(deal, method):+.4f}" for deal in (*DEALS, "new")))
            for method in maps if method != "temperature"]
    lines = [f"### {title}", "", *_report.table(("map", "cross-fitted − TS, stratified folds", "cross-fitted − TS, "
                                                 "random folds (the library's)", "new draw − TS (the truth)"), rows, "lrrr"), ""]
    for deal in DEALS:
        choices = collections.Counter(key[len("chose "):] for seed in seeds for key in seed[deal] if key.startswith("chose "))
        gaps = [value for seed in seeds for key, value in seed[deal].items() if key.startswith("chose ")]
        lines.append(f"- auto on {deal} folds chose {dict(choices)}; new-draw NLL − TS of its choice: mean "
                     f"{sum(gaps) / len(gaps):+.4f}, largest {max(gaps):+.4f}.")
    return [*lines, ""]


# ----------------------------------------------------------------------------- the zoo's real logits

ZOO = ("digits_cnn", "digits_vit", "bbc_minilm")
ZOO_SEEDS = 10
HALVES = ("random", "stratified")


def halves_of(labels: torch.Tensor, seed: int, halves: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sorted (calibration, test) row indices, half each: drawn at random, or stratified by label (``bench_quality``'s
    halves, whose test half has the calibration half's class frequencies to within a row)."""
    from sklearn.model_selection import train_test_split

    rows = torch.arange(len(labels)).numpy()
    calibration, test = train_test_split(rows, train_size=0.5, random_state=seed,
                                         stratify=labels.numpy() if halves == "stratified" else None)
    return torch.as_tensor(calibration).sort().values, torch.as_tensor(test).sort().values


def zoo_seed(logits: torch.Tensor, labels: torch.Tensor, seed: int, halves: str) -> Dict[str, Any]:
    """Test NLL of TS and of ``auto`` with each deal of its folds, and what auto chose, on one pair of halves."""
    from bench_safe_defaults import fit_ours

    calibration, test = halves_of(labels, seed, halves)
    fit_logits, fit_labels = logits[calibration], labels[calibration]
    result: Dict[str, Any] = {}
    for deal, method in (("temperature", "temperature"), *((deal, "auto") for deal in DEALS)):
        with dealt("random" if deal == "temperature" else deal):
            probabilities, facts = fit_ours(method, fit_logits, fit_labels, seed)
        result[deal] = float(F.nll_loss(probabilities(logits[test]).clamp_min(1e-300).log(), labels[test]))
        result[f"{deal} chose"] = facts["chosen"]
    return result


def zoo_lines(args: argparse.Namespace) -> List[str]:
    from bench_safe_defaults import cached_logits

    rows = []
    for model in ZOO[:1] if args.quick else ZOO:
        logits, labels = cached_logits(model)
        for halves in HALVES:
            seeds = [zoo_seed(logits, labels, seed, halves) for seed in range(2 if args.quick else ZOO_SEEDS)]
            print(f"  {model}, {halves} halves", flush=True)
            chose = {deal: collections.Counter(seed[f"{deal} chose"] for seed in seeds) for deal in DEALS}
            rows.append((model, halves, *(_paired_interval([seed[deal] - seed["temperature"] for seed in seeds]) for deal in DEALS),
                         _paired_interval([seed["random"] - seed["stratified"] for seed in seeds]),
                         *(", ".join(f"{method} {count}" for method, count in chose[deal].most_common()) for deal in DEALS)))
    return ["### The zoo's real logits: auto on each deal, test NLL", "", *_report.table(
        ("model", "halves", "auto (stratified folds) − TS", "auto (random folds) − TS", "random − stratified",
         "chose (stratified folds)", "chose (random folds)"), rows, "llrrrll"), ""]


NOTES = [
    "## Notes",
    "",
    "- Labels are drawn from `softmax(z / 2)` (`bench_logit_fits.make_logits`, fitting draw seed 100 + 2s, new draw "
    "101 + 2s), so TS is the true model and every map's true NLL − TS is ≥ 0.",
    "- Folds: the library's default count (5 at 449 × 10 and 5,000 × 100, 2 at 20,000 × 1,000), seed 0. Random: the "
    "library's `holdout.cross_fitting_folds`. Stratified: the same, its `fold_assignment` replaced by this script's "
    "`stratified_assignment` (same seeded shuffle, then dealt by class).",
    "- Each map is fitted as auto fits it (`fitting.auto.scoring.score_candidates`: its fit on all the rows is the "
    "one scored on the new draw).",
    "- The zoo: each model's calibration ∪ test rows (`bench_safe_defaults.cached_logits`), split per seed (0–9) into "
    "halves drawn at random or stratified by label; `auto` fitted on the calibration half through `CalibratedModel.fit` "
    "(`bench_safe_defaults.fit_ours`, the seed as the fit's) with each deal, TS beside; test NLL on the other half. "
    "Intervals: Student-t 95 % over the seeds of the per-seed differences. Stratified halves give the test half the "
    "calibration half's class frequencies, which the stratified folds' leak learns: they reward it.",
]


def report_lines(args: argparse.Namespace) -> List[str]:
    synthetic = [line for title, maps, seeds in measure(args.quick) for line in size_lines(title, maps, seeds)]
    return [*synthetic, *zoo_lines(args)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    title = "Folds dealt by class flatter per-class maps, folds dealt at random do not: cross-fitted scores against a new draw"
    return _report.run_once("bench_fold_leak.py", __doc__, title, report_lines, NOTES, NAME, argv)


if __name__ == "__main__":
    raise SystemExit(main())
