"""Safe defaults: every logit method's default against the uncalibrated model and temperature scaling.

For each zoo model (timm CNN and transformers ViT on sklearn digits, the pretrained MiniLM on BBC
News; ``bench_quality.py``'s helpers) the base's logits over its ``calibration`` ∪ ``test`` rows are
computed once and cached on disk (``$HF_CALIBRATE_CACHE/../bench_logits``, keyed by the zoo
model's folder). Each seed reshuffles them into stratified calibration / test halves (about 450
rows each for digits); every logit method is fitted with its default options through
``CalibratedModel.fit`` on the calibration half (``nn.Identity`` as the model: these methods see
only logits) and scored on the test half. Peers (netcal, probmetrics, torch-uncertainty), where
installed, are fitted with their own defaults on the same halves.

``method="auto"`` is fitted the same way; the report says what it chose per seed and whether its
test NLL is worse than TS's or the uncalibrated model's beyond the paired interval.

Arms (``--arms``), each on the same halves per seed, the test half always as it is:

* ``logits``: the calibration half as it is;
* ``duplicated_30x10`` / ``duplicated_100x2``: the calibration half cut to 30 (100) distinct rows, a stratified
  sample of it, each repeated 10 (2) times — few rows many times, many rows twice; TS and every method are
  fitted on the same 300 (200) rows;
* ``probabilities``: the model ends in a softmax, so every method is handed softmax(logits) as its "logits" (float32,
  calibration and test halves alike); "uncalibrated" is those probabilities themselves (what the user had), TS is TS
  fitted on them. Each fit should say that the outputs are probabilities, and read their log.

The peers run in the ``logits`` arm only. ``--arm-repeats`` sets the seeds of the other arms.

Reported per arm and model: mean ± std over the seeds of test NLL, ECE (15 equal-width bins), Brier and fit time;
the paired differences method − uncalibrated and method − TS with 95 % Student-t intervals over
the seeds (same split per seed); the warnings each default said (and, in the extra arms, whether the arm's
warning was among them, and refusals); and, with ``--baseline RAW.json`` (a ``--raw`` file of an earlier
version of the package, e.g. ``main``), that version's NLL beside today's ("before", ``logits`` arm). Choices inside
the fits (regularisation strength, prior) are made on the calibration half alone, by cross-fitting; the test half
only scores.

Usage::

    python benchmarks/bench_safe_defaults.py                    # 3 models × 5 seeds, every arm; writes results/safe_defaults.md
    python benchmarks/bench_safe_defaults.py --quick            # the CNN, 1 seed; prints only
    python benchmarks/bench_safe_defaults.py --arms logits --arm-repeats 3
    PYTHONPATH=../main python benchmarks/bench_safe_defaults.py --arms logits --raw /tmp/before.json --output /tmp/before.md
    python benchmarks/bench_safe_defaults.py --baseline /tmp/before.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import TensorDataset

import _report
from _safe_peers import PEERS, peer_missing
from bench_quality import _features_and_logits, _paired_interval, _stratified_halves, _zoo

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators.requirements import InsufficientDataError
from hf_calibrate.metrics import calibration_report

NAME = "safe_defaults"
OUR_METHODS = ("temperature", "vector", "structured_vector", "matrix", "dirichlet", "structured_matrix", "histogram", "isotonic", "auto")
METRICS = ("nll", "ece", "brier", "accuracy")
MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
#: per seed → per method → {metric: value, "warnings": count, "said": the kinds of warning said, ...}
Runs = List[Dict[str, Dict[str, Any]]]
#: per model → its runs (one arm)
Raw = Dict[str, Runs]
#: the warnings the extra arms look for: kind → a phrase of the library's warning
WARNING_KINDS = {"duplicates": "rows that repeat another row", "probabilities": "outputs are probabilities"}


@dataclasses.dataclass(frozen=True)
class Halves:
    """One seed's data as the methods see it: the calibration rows they are fitted on, the test rows they map, and the
    test probabilities the user had before calibrating (``uncalibrated``, (N, C) float64)."""

    fit_logits: torch.Tensor
    fit_labels: torch.Tensor
    test_logits: torch.Tensor
    test_labels: torch.Tensor
    uncalibrated: torch.Tensor


def stratified_subset(labels: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """Sorted indices of ``count`` rows of (N,) ``labels``, a seeded sample stratified by label (sklearn's)."""
    from sklearn.model_selection import train_test_split

    kept, _ = train_test_split(torch.arange(len(labels)).numpy(), train_size=count, stratify=labels.numpy(), random_state=seed)
    return torch.as_tensor(kept).sort().values


def as_given(halves: Halves, seed: int) -> Halves:
    """The halves as they are."""
    return halves


def duplicated(distinct: int, copies: int, halves: Halves, seed: int) -> Halves:
    """The calibration half cut to ``distinct`` of its rows (:func:`stratified_subset`), each repeated ``copies`` times."""
    kept = stratified_subset(halves.fit_labels, distinct, seed).repeat(copies)
    return dataclasses.replace(halves, fit_logits=halves.fit_logits[kept], fit_labels=halves.fit_labels[kept])


def as_probabilities(halves: Halves, seed: int) -> Halves:
    """Both halves' logits replaced by the float32 softmax of them (a model whose forward ends in a softmax); the
    uncalibrated probabilities stay those, the model's own."""
    return dataclasses.replace(halves, fit_logits=torch.softmax(halves.fit_logits, dim=1),
                               test_logits=torch.softmax(halves.test_logits, dim=1))


@dataclasses.dataclass(frozen=True)
class Arm:
    """A form of the calibration data: ``prepare(halves, seed)`` makes it from the stratified halves; ``warning``: the
    kind of warning (:data:`WARNING_KINDS`) every fit should say; ``peers``: whether the peers run too."""

    key: str
    title: str
    about: str
    prepare: Callable[[Halves, int], Halves]
    warning: Optional[str] = None
    peers: bool = False


MAIN = "logits"
ARMS = (
    Arm(MAIN, "Logits as they are", "The calibration half as it is.", as_given, peers=True),
    Arm("duplicated_30x10", "Duplicated rows: 30 distinct × 10 copies",
        "The calibration half cut to 30 distinct rows (a stratified sample of it, per seed), each repeated 10 times: "
        "300 rows, on which TS and every method are fitted. The test half is as in the first arm. Copies do not move "
        "TS's maximum-likelihood temperature, so TS here is TS on 30 rows, which can be above the uncalibrated NLL. "
        "The methods that need a misclassified row refuse the data where none of the 30 is misclassified.",
        functools.partial(duplicated, 30, 10), "duplicates"),
    Arm("duplicated_100x2", "Duplicated rows: 100 distinct × 2 copies",
        "The calibration half cut to 100 distinct rows (a stratified sample of it, per seed), each twice: 200 rows. "
        "The test half is as in the first arm.", functools.partial(duplicated, 100, 2), "duplicates"),
    Arm("probabilities", "Probabilities as logits",
        "The model ends in a softmax: every method (TS included) is fitted on softmax(logits) of the calibration half "
        "and maps softmax(logits) of the test half, as such a model hands them over. \"uncalibrated\" is those test "
        "probabilities themselves, what the user had; TS is TS fitted on the probabilities. Every fit should say that the "
        "outputs are probabilities, and read their log. (Log-probabilities, from a "
        "final log_softmax, are the logits up to a per-row constant, which softmax ignores: not an arm.)",
        as_probabilities, "probabilities"),
)


def cached_logits(model_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The base's (N, C) float32 logits and (N,) labels over its calibration ∪ test rows, computed once and cached."""
    from datasets import concatenate_datasets

    from hf_calibrate.demo.models import default_cache_dir

    demo = _zoo(model_name)
    path = default_cache_dir().parent / "bench_logits" / f"{demo.path.name}.pt"
    if path.is_file():
        cached = torch.load(path)
        return cached["logits"], cached["labels"]
    pool = concatenate_datasets([demo.dataset["calibration"], demo.dataset["test"]])
    _, logits, labels = _features_and_logits(demo, pool)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"logits": logits, "labels": labels}, path)
    return logits, labels


def scores(probabilities: Optional[torch.Tensor], labels: torch.Tensor) -> Dict[str, float]:
    """Test metrics of (N, C) probabilities; NaN for each when there are none (a refused fit) or some row is not a
    distribution (a peer's failure)."""
    if probabilities is None or not bool(torch.isfinite(probabilities).all()):
        return {key: math.nan for key in METRICS}
    report = calibration_report(probabilities.double(), labels)
    return {key: float(report[key]) for key in METRICS}


def said_kinds(messages: Sequence[str]) -> List[str]:
    """The kinds of :data:`WARNING_KINDS` among the warning ``messages``."""
    return [kind for kind, phrase in WARNING_KINDS.items() if any(phrase in message for message in messages)]


Predict = Callable[[torch.Tensor], torch.Tensor]


def fit_ours(method: str, logits: torch.Tensor, labels: torch.Tensor, seed: int) -> Tuple[Optional[Predict], Dict[str, Any]]:
    """Our default fit of ``method`` on (logits, labels): (logits → probabilities, or None when it refused the data;
    {"warnings": how many distinct warnings it said (as a user sees them: ``auto``'s candidates' included), "messages":
    those, "said": their kinds (:func:`said_kinds`), "seconds": its wall time, "chosen": the method it fitted (``auto``'s choice),
    "refused": 1 when it refused})."""
    start = time.perf_counter()
    calibrated, refused = None, 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            calibrated = CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method=method, seed=seed, progress=False)
        except InsufficientDataError:
            refused = 1
    messages = sorted({str(warning.message) for warning in caught if issubclass(warning.category, UserWarning)})
    facts = {"warnings": len(messages), "said": said_kinds(messages), "messages": messages, "seconds": time.perf_counter() - start,
             "chosen": None if calibrated is None else calibrated.method, "refused": refused}
    if calibrated is None:
        return None, facts

    def probabilities(test_logits: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(calibrated(test_logits).double(), dim=1)

    return probabilities, facts


def run_seed(arm: Arm, logits: torch.Tensor, labels: torch.Tensor, seed: int, peers: Sequence[Any]) -> Dict[str, Dict[str, Any]]:
    """Every method (ours, then the peers where the arm runs them) on one reshuffle, the calibration half in the arm's
    form: method → {metric: value, "warnings": count, ...}."""
    calibration, test = (torch.as_tensor(rows) for rows in _stratified_halves(labels, seed))
    halves = arm.prepare(Halves(logits[calibration], labels[calibration], logits[test], labels[test],
                                torch.softmax(logits[test].double(), dim=1)), seed)
    results = {"uncalibrated": scores(halves.uncalibrated, halves.test_labels)}
    for method in OUR_METHODS:
        probabilities, facts = fit_ours(method, halves.fit_logits, halves.fit_labels, seed)
        results[method] = {**scores(None if probabilities is None else probabilities(halves.test_logits), halves.test_labels), **facts}
    for peer in peers if arm.peers else ():
        probabilities = peer.fit(halves.fit_logits, halves.fit_labels)
        results[peer.label] = scores(probabilities(halves.test_logits), halves.test_labels)
    return results


def chosen_arms(args: argparse.Namespace) -> List[Arm]:
    """The arms ``--arms`` names (all by default; the first only with ``--quick``), in :data:`ARMS`' order."""
    known = {arm.key: arm for arm in ARMS}
    names = args.arms.split(",") if args.arms else [MAIN] if args.quick else list(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return [arm for arm in ARMS if arm.key in names]


def arm_seeds(arm: Arm, args: argparse.Namespace) -> int:
    """Seeds of ``arm``: ``--repeats`` for the first, ``--arm-repeats`` (default ``--repeats``) for the others."""
    return args.repeats if arm.key == MAIN or args.arm_repeats is None else args.arm_repeats


def measure(args: argparse.Namespace) -> Dict[str, Raw]:
    """Per arm → per model → the seeds' results (:func:`run_seed`); written to ``--raw`` as JSON when given."""
    models = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else list(MODELS))
    peers = [peer for peer in PEERS if peer_missing(peer) is None]
    arms = chosen_arms(args)
    raw: Dict[str, Raw] = {arm.key: {} for arm in arms}
    for model_name in models:
        logits, labels = cached_logits(model_name)
        for arm in arms:
            start = time.perf_counter()
            raw[arm.key][model_name] = [run_seed(arm, logits, labels, seed, peers) for seed in range(arm_seeds(arm, args))]
            print(f"{model_name}, {arm.key}: {arm_seeds(arm, args)} seeds done in {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)
    if args.raw is not None:
        args.raw.write_text(json.dumps(raw, indent=1) + "\n")
    return raw


# ----------------------------------------------------------------------------- report


def _mean_std(values: Sequence[float]) -> str:
    """Mean ± std over the seeds with a result (not NaN), saying how many those are when some have none."""
    kept = [value for value in values if not math.isnan(value)]
    if not kept:
        return f"no result in {len(values)} seeds"
    mean = statistics.fmean(kept)
    text = f"{mean:.4f} ± {statistics.stdev(kept):.4f}" if len(kept) > 1 else f"{mean:.4f}"
    return text if len(kept) == len(values) else f"{text} ({len(kept)} of {len(values)} seeds)"


def _differences(runs: Runs, method: str, reference: str, key: str) -> List[float]:
    """Per seed, method − reference; seeds where either has no result (NaN) are left out."""
    differences = [run[method][key] - run[reference][key] for run in runs]
    return [difference for difference in differences if not math.isnan(difference)]


def _interval(differences: Sequence[float]) -> str:
    """Mean and 95 % t-interval of paired differences (``bench_quality``'s), "–" when none."""
    return _paired_interval(differences) if differences else "–"


def _worse_than(runs: Runs, method: str, reference: str) -> bool:
    """Whether the method's mean test NLL is above the reference's (over the seeds where both have one)."""
    differences = _differences(runs, method, reference, "nll")
    return bool(differences) and statistics.fmean(differences) > 0


def _warnings_cell(runs: Runs, method: str, arm: Arm) -> str:
    """The warnings our fit of ``method`` said over the seeds; in an arm with a warning of its own, in how many seeds it
    was among them; and how many fits refused the data."""
    if method not in OUR_METHODS:
        return "–"
    cell = str(sum(int(run[method].get("warnings", 0)) for run in runs))
    if arm.warning is not None:
        cell += f" ({arm.warning}: {sum(arm.warning in run[method].get('said', ()) for run in runs)}/{len(runs)})"
    refused = sum(int(run[method].get("refused", 0)) for run in runs)
    return cell + (f", refused {refused}" if refused else "")


def _model_table(runs: Runs, before: Optional[Runs], arm: Arm) -> List[str]:
    header = ["method", "NLL", "ΔNLL vs uncalibrated [95% CI]", "ΔNLL vs TS [95% CI]", "ECE", "ΔECE vs TS [95% CI]", "Brier",
              "warnings", "fit s"]
    if before:
        header[2:2] = ["NLL before", "ΔNLL vs uncalibrated before"]
    rows = []
    for method in runs[0]:
        nll = [run[method]["nll"] for run in runs]
        cells = [method, _mean_std(nll)]
        if before:
            known = method in before[0]
            cells += [_mean_std([run[method]["nll"] for run in before]) if known else "–",
                      _interval(_differences(before, method, "uncalibrated", "nll")) if known and method != "uncalibrated" else "–"]
        versus = [_interval(_differences(runs, method, reference, key)) if method not in ("uncalibrated", reference) else "–"
                  for reference, key in (("uncalibrated", "nll"), ("temperature", "nll"))]
        cells += versus + [_mean_std([run[method]["ece"] for run in runs]),
                           _interval(_differences(runs, method, "temperature", "ece")) if method not in ("uncalibrated", "temperature") else "–",
                           _mean_std([run[method]["brier"] for run in runs]), _warnings_cell(runs, method, arm), _seconds(runs, method)]
        rows.append(cells)
    return _report.table(header, rows)


def _seconds(runs: Runs, method: str) -> str:
    """The mean wall time of our fit over the seeds ("–" for the uncalibrated model and the peers)."""
    times = [run[method]["seconds"] for run in runs if "seconds" in run[method]]
    return f"{statistics.fmean(times):.2f}" if times else "–"


def _auto_lines(raw: Raw) -> List[str]:
    """What ``auto`` chose per model over the seeds, and its goal: test NLL ≤ min(TS, uncalibrated) within noise."""
    lines = []
    for model, runs in raw.items():
        if "auto" not in runs[0]:
            continue
        chosen = collections.Counter(run["auto"]["chosen"] or "nothing (refused)" for run in runs)
        worse = [reference for reference in ("temperature", "uncalibrated")
                 if _resolved_worse(_differences(runs, "auto", reference, "nll"))]
        lines.append(f"- {model}: auto chose {', '.join(f'{name} ({count}×)' for name, count in chosen.most_common())}; "
                     f"ΔNLL vs TS {_interval(_differences(runs, 'auto', 'temperature', 'nll'))}; worse than "
                     f"{' or '.join(worse) if worse else 'neither TS nor the uncalibrated model'} beyond the paired interval.")
    return lines


def _goal_lines(raw: Raw, arm: Arm) -> List[str]:
    """The goal, checked per model: no default's mean test NLL above the uncalibrated model's, and none worse
    than TS, or than the uncalibrated model, by more than its paired interval (an interval wholly above 0); in an arm
    with a warning of its own, the fits that did not say it, and the fits that refused the data."""
    lines = []
    for model, runs in raw.items():
        ours = [m for m in OUR_METHODS if m in runs[0]]
        above = [m for m in ours if _worse_than(runs, m, "uncalibrated")]
        resolved = {reference: [m for m in ours if m != reference and _resolved_worse(_differences(runs, m, reference, "nll"))]
                    for reference in ("temperature", "uncalibrated")}
        line = (f"- {model}: mean test NLL above the uncalibrated model's: {', '.join(above) or 'none'}; "
                f"worse than TS beyond its paired 95 % interval: {', '.join(resolved['temperature']) or 'none'}; "
                f"worse than the uncalibrated model beyond it: {', '.join(resolved['uncalibrated']) or 'none'}")
        if arm.warning is not None:
            silent = {m: sum(not run[m]["refused"] and arm.warning not in run[m]["said"] for run in runs) for m in ours}
            line += (f"; fits that did not say the {arm.warning} warning: "
                     + (", ".join(f"{m} ({n} of {len(runs)})" for m, n in silent.items() if n) or "none"))
        refused = {m: sum(int(run[m].get("refused", 0)) for run in runs) for m in ours}
        if any(refused.values()):
            line += "; refused the data: " + ", ".join(f"{m} ({n} of {len(runs)})" for m, n in refused.items() if n)
        lines.append(line + ".")
    return lines


def _resolved_worse(differences: Sequence[float]) -> bool:
    """Whether the 95 % t-interval of the paired differences lies wholly above 0."""
    from scipy import stats

    if len(differences) < 2:
        return False
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return statistics.fmean(differences) - half > 0


#: why the binning methods can stay above TS's NLL (the goal allows it where the table says why)
BINNING_NOTE = (
    "Why histogram and isotonic can stay above TS's NLL: their maps see only the uncalibrated confidence (top-label: "
    "one number per row), and a histogram is constant within each bin, so even at their strongest prior they lose "
    "part of TS's resolution (the ordering of rows within a bin), which a proper score charges for; in exchange "
    "they fix miscalibration that no single temperature can — compare their ΔECE vs TS. Their prior towards TS "
    "(chosen by cross-fitted NLL on the calibration half) is what keeps them below the uncalibrated NLL."
)


def _seeds(raw: Raw) -> int:
    return len(next(iter(raw.values())))


def _arm_summary(arm: Arm, raw: Raw) -> List[str]:
    """The arm's goal lines and what ``auto`` chose, for the top of the report."""
    return [f"**{arm.title}** ({_seeds(raw)} seeds):", "", *_goal_lines(raw, arm), "", "`auto` (per seed: what it chose, on "
            "the calibration half alone):", "", *_auto_lines(raw), ""]


def _arm_sections(arm: Arm, raw: Raw, before: Optional[Raw]) -> List[str]:
    """The arm's section: what its data are, then a table per model."""
    said = f" (and in how many seeds the {arm.warning} warning was among them)" if arm.warning else ""
    lines = [f"## {arm.title}", "", f"{arm.about} Test half, mean ± std over {_seeds(raw)} seeds; Δ: paired differences "
             "(same split per seed), mean and 95 % t-interval over the seeds, negative = better; \"(k of n seeds)\": the "
             "seeds with a result, the others' fit refused the data (ours: \"refused\" in the warnings column) or gave non-finite probabilities "
             "(a peer); warnings: "
             f"the distinct warnings each fit said, over all seeds{said}.", ""]
    for model, runs in raw.items():
        lines += [f"### {model}", "", *_model_table(runs, (before or {}).get(model), arm), ""]
    return lines


def report(session: _report.Session, raw: Dict[str, Raw], baseline: Optional[Raw], baseline_path: Optional[Path] = None) -> str:
    arms = [arm for arm in ARMS if arm.key in raw]
    body = ["Goal: in every arm, on the zoo models × seeds, no method's default has a mean test NLL above "
            "the uncalibrated model's, and none is worse than TS, or than the uncalibrated model, by more than its paired "
            "interval.", ""]
    for arm in arms:
        body += _arm_summary(arm, raw[arm.key])
    body += [BINNING_NOTE, ""]
    if baseline_path is not None:
        body += [f"\"before\" columns (first arm): `{baseline_path}`, this script's `--raw` output for an earlier version of "
                 "the package (same models, seeds and halves).", ""]
    for arm in arms:
        body += _arm_sections(arm, raw[arm.key], baseline if arm.key == MAIN else None)
    missing = {peer.label: peer_missing(peer) for peer in PEERS} if MAIN in raw else {}
    notes = [f"- {label}: " + ("run with its defaults" if reason is None else f"**not run** ({reason})") for label, reason in missing.items()]
    seeds = ", ".join(f"{_seeds(raw[arm.key])} in {arm.key}" for arm in arms)
    header = session.header("Safe defaults of the logit methods on small, nearly separable calibration data",
                            ["torch", "numpy"], extra=f"Seeds (`--repeats`, `--arm-repeats`): {seeds}.")
    return "\n".join(header + body + ["Peers (in the first arm only; the other arms leave them out to save time):", "",
                                      *(notes or ["- not run: the first arm was not"]), ""])


def load_baseline(path: Optional[Path]) -> Optional[Raw]:
    """The first arm of a ``--raw`` file (an older file, of one arm, is that arm)."""
    if path is None:
        return None
    data = json.loads(path.read_text())
    return data.get(MAIN, data)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _report.parser(__doc__, default_repeats=5, quick_repeats=1)
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--arms", default=None, help=f"comma-separated subset of {','.join(arm.key for arm in ARMS)} (default: all)")
    parser.add_argument("--arm-repeats", type=int, default=None, help="seeds of the arms but the first (default: --repeats)")
    parser.add_argument("--raw", type=Path, default=None, help="write the per-seed results here as JSON")
    parser.add_argument("--baseline", type=Path, default=None, help="a --raw file of an earlier version: its NLL is shown as 'before'")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_safe_defaults.py", args)
    session.finish(report(session, measure(args), load_baseline(args.baseline), args.baseline), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
