"""``hf-calibrate demo``: temperature scaling, Neural Clamping and ``auto`` on the zoo's models, each with its defaults;
one table, saved models.

Measured on 2 CPU cores: 34 s once the zoo (:mod:`.models`) is cached, 122 s on a first run, which trains it
(benchmarks/results/demo_time.md). Neural Clamping runs on the CNN only: through the MiniLM its default (about 50 passes of the
transformer) takes minutes on a CPU, so the MiniLM shows ``auto``, the fast choice (:data:`NC_LEFT_OUT`). Importing this
module imports nothing heavy (the command line's parser reads :data:`DEMO_MODELS`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .._console import Console, check_writable, flag_options, format_table
from .._errors import UserError

#: the demo's first table: uncalibrated → calibrated
DEMO_METRICS = ("accuracy", "ece", "ada_ece", "nll", "brier")
#: the demo's second table: the paired change of these, with its interval and verdict
DEMO_CHANGES = ("ece", "nll", "brier")


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """How much of a zoo model's data the demo uses; every method is fitted with the library's default options.

    Attributes:
        calibration, test: sizes of stratified subsets of the splits (None: the whole split).
        max_length: text models: tokens per article; the tokenizer is saved with it, so the
            calibrated model is used on inputs like those it was calibrated on.
        batch_size: samples per forward pass (an engine option: it changes no method's result).
    """

    calibration: Optional[int]
    test: Optional[int]
    max_length: Optional[int]
    batch_size: int


@dataclasses.dataclass(frozen=True)
class DemoSpec:
    """One model of the demo: its zoo function (in :mod:`hf_calibrate.demo`) and the name of the model it builds (that
    of its :data:`~hf_calibrate.demo.models.ZOO` entry, known before the model is loaded), data name, configurations,
    and the methods fitted, each with its default options."""

    build: str
    name: str
    dataset: str
    full: DemoConfig
    quick: DemoConfig
    methods: Tuple[str, ...]


DEMO_MODELS: Dict[str, DemoSpec] = {
    "minilm": DemoSpec(
        build="bbc_minilm", name="bbc-minilm-l6", dataset="BBC News",
        full=DemoConfig(calibration=300, test=300, max_length=64, batch_size=16),
        quick=DemoConfig(calibration=60, test=60, max_length=32, batch_size=16),
        methods=("temperature", "auto"),  # Neural Clamping through a transformer on a CPU takes minutes: NC_LEFT_OUT
    ),
    "cnn": DemoSpec(
        build="digits_timm_cnn", name="digits-timm-resnet10t", dataset="scikit-learn digits",
        full=DemoConfig(calibration=None, test=None, max_length=None, batch_size=64),
        quick=DemoConfig(calibration=200, test=200, max_length=None, batch_size=64),
        methods=("temperature", "neural_clamping", "auto"),  # the baseline, the recommended method, the fast choice
    ),
}
#: said of a demo model without Neural Clamping
NC_LEFT_OUT = ("{name}: Neural Clamping is left out of the demo here: about 50 passes of the transformer over the "
               "calibration data, minutes on a CPU; auto is the fast choice (hf-calibrate fit --method neural_clamping "
               "runs it).")


def demo_model_list(text: str) -> List[str]:
    """``--models``: comma-separated keys of :data:`DEMO_MODELS`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DEMO_MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown demo model(s) {unknown or text!r}; choose from {','.join(DEMO_MODELS)}")
    return names


def demo_folder(model: str, method: str) -> str:
    """The folder (and card title) of one demo calibration, e.g. ``bbc-minilm-l6-neural-clamping``."""
    return f"{model}-{method.replace('_', '-')}"


def _subset(split: Any, size: Optional[int], seed: int = 0) -> Any:
    """A stratified subset of ``size`` rows (all rows when None or larger)."""
    if size is None or size >= len(split):
        return split
    return split.train_test_split(train_size=size, stratify_by_column="label", seed=seed)["train"]


def _preprocessor(preprocessor: Any, max_length: Optional[int]) -> Any:
    """The zoo model's preprocessor; for text, a copy of the tokenizer that truncates at ``max_length``."""
    if max_length is None:
        return preprocessor
    tokenizer = copy.deepcopy(preprocessor)
    tokenizer.model_max_length = max_length
    return tokenizer


def run_demo(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate demo``: TS and Neural Clamping on the zoo models, one table, saved models."""
    start = time.perf_counter()
    if state.is_main_process:
        check_demo_output(args.output, args.models)
    rows, changes, settings, samples = [], [], [], []
    for position, key in enumerate(args.models, 1):
        spec = DEMO_MODELS[key]
        config = spec.quick if args.quick else spec.full
        console.note(f"[{position}/{len(args.models)}] {key}: loading the zoo model (trained on the first run, then cached)")
        model = _zoo_model(spec, args, state)
        calibration = _subset(model.dataset["calibration"], config.calibration)
        test = _subset(model.dataset["test"], config.test)
        inputs = (calibration, test, _preprocessor(model.preprocessor, config.max_length))
        settings.append(_settings_line(model.name, config, calibration, test))
        if "neural_clamping" not in spec.methods:
            settings.append("  " + NC_LEFT_OUT.format(name=model.name))
        for method in spec.methods:
            console.note(f"[{position}/{len(args.models)}] {key}: {method} on {len(calibration)} calibration samples")
            evaluation, label = _calibrate(model, spec, config, method, inputs, args, state, console)
            rows.append(_row(model.name, label, evaluation))
            changes.append(_change_row(model.name, label, evaluation))
            samples.append(_sample_line(model.name, label, evaluation))
    console.result(_report(rows, changes if args.bootstrap else [], settings, args.quick, [line for line in samples if line]))
    console.note(f"calibrated models with model cards and reliability diagrams: {args.output}/<model>-<method>/ "
                 f"(demo took {time.perf_counter() - start:.0f} s)")


def check_demo_output(output: Path, models: List[str]) -> None:
    """Fail before any zoo model is loaded when ``output``, or a calibration folder the demo would save into it
    (:func:`demo_folder`), cannot be written: a link there, or a file a save would replace but cannot prove it wrote
    (:func:`hf_calibrate.serialization.saving.check_save_target`)."""
    from ..serialization.saving import check_save_target

    check_writable(output, "--output", folder=True)
    for folder in (output / demo_folder(DEMO_MODELS[key].name, method) for key in models for method in DEMO_MODELS[key].methods):
        if folder.is_symlink():
            raise UserError(f"--output: {folder} is a symbolic link (to {os.readlink(folder)}), which the demo never saves "
                            "through; move it elsewhere, or choose another --output folder.")
        check_writable(folder, "--output", folder=True, replaceable=check_save_target)


def _zoo_model(spec: DemoSpec, args: argparse.Namespace, state: Any) -> Any:
    """The zoo's :class:`~.models.DemoModel` of ``spec``, trained or loaded by the main process first."""
    from .. import demo as zoo

    with state.main_process_first():
        return getattr(zoo, spec.build)(cache_dir=args.cache_dir, progress=args.progress)


def _calibrate(model: Any, spec: DemoSpec, config: DemoConfig, method: str, inputs: Any, args: argparse.Namespace, state: Any,
               console: Console) -> Tuple[Dict[str, Any], str]:
    """Fit ``method`` on the calibration subset, evaluate it on the test subset, save it; returns the evaluation and
    the method's row label: ``"neural_clamping (fell back to TS)"`` when δ did not help, ``"auto (<its choice>)"``.

    ``inputs``: (calibration subset, test subset, the preprocessor the model is calibrated with).
    """
    from ..modeling import CalibratedModel
    from ..results.reporting import FALLBACK_SAVED

    calibration, test, preprocessor = inputs
    calibrated = CalibratedModel.fit(
        model.model, calibration, method=method, preprocessor=preprocessor,
        dataset_name=spec.dataset, split="calibration", **{"batch_size": config.batch_size, **flag_options(args)},
    )
    fallback = calibrated.fallback_note()
    console.warn(fallback and f"{model.name}, {method}: {fallback} {FALLBACK_SAVED}")
    evaluation = calibrated.evaluate(test, dataset_name=spec.dataset, split="test", bootstrap=args.bootstrap, **flag_options(args))
    calibrated.save_pretrained(args.output / demo_folder(spec.name, method), is_main_process=state.is_main_process)
    if fallback:
        return evaluation, f"{method} (fell back to TS)"
    return evaluation, method if calibrated.method == method else f"{method} ({calibrated.method})"


def _settings_line(name: str, config: DemoConfig, calibration: Any, test: Any) -> str:
    tokens = f", articles truncated to {config.max_length} tokens" if config.max_length else ""
    return f"  {name}: {len(calibration)} calibration / {len(test)} test samples{tokens}"


def _row(model: str, method: str, evaluation: Dict[str, Any]) -> List[str]:
    before, after = evaluation["uncalibrated"], evaluation["calibrated"]
    return [model, method, str(after["num_samples"]), *(f"{before[key]:.4f} → {after[key]:.4f}" for key in DEMO_METRICS)]


def _sample_line(model: str, method: str, evaluation: Dict[str, Any]) -> Optional[str]:
    """``"<model>, <method>: evaluated on <what>"`` when what the row's evaluation was computed on is (partly) in-sample,
    or not known not to be, in the words of the fit's and evaluate's output (its card and diagram say the same); else None."""
    from ..results.reporting import evaluated_on, evaluation_label

    label = evaluation_label(evaluation)
    return None if label == evaluated_on(evaluation) else f"{model}, {method}: evaluated on {label}"


def _change_row(model: str, method: str, evaluation: Dict[str, Any]) -> List[str]:
    from ..results.reporting import change_text

    verdicts = evaluation.get("verdicts") or {}
    return [model, method, *(" ".join(filter(None, (change_text(evaluation, key), _short(verdicts.get(key)))))
                             for key in DEMO_CHANGES)]


def _short(verdict: Optional[str]) -> str:
    """A verdict as a table cell shows it."""
    return {"improved": "improved", "made worse": "worse", "unchanged": "unchanged"}.get(verdict, "no change" if verdict else "")


def _report(rows: List[List[str]], changes: List[List[str]], settings: List[str], quick: bool, samples: List[str]) -> str:
    """The demo's result: the metrics table with, under it, the rows whose evaluation is (partly) in-sample
    (:func:`_sample_line`); the change table (when ``changes``); the settings."""
    from ..results.reporting import METRIC_NAMES

    header = ["model", "method", "test n", *(METRIC_NAMES[key] for key in DEMO_METRICS)]
    change_header = ["model", "method", *(f"Δ {METRIC_NAMES[key]} [95% CI]" for key in DEMO_CHANGES)]
    change_table = [
        "Change, calibrated − uncalibrated, with its paired 95% bootstrap interval; 'no change': the interval holds 0, "
        "so this test set cannot tell the change from noise; 'unchanged': identical on every test sample:",
        format_table(change_header, changes),
        "",
    ] if changes else []
    return "\n".join([
        "",
        "Test-split metrics, uncalibrated → calibrated (lower is better except accuracy):",
        format_table(header, rows),
        *samples,
        "",
        *change_table,
        "Every method ran with the library's defaults, as fit() runs it: Neural Clamping (the recommended method) is "
        "L-BFGS on (δ, T) with a ridge, stopped by 2-fold cross-fitting and falling back to temperature scaling when δ "
        "does not help on the held-out folds; auto (the fast choice) keeps temperature scaling unless another logit "
        "method beats it on cross-fitted held-out NLL. On data subsets" + (" (--quick: even smaller; the numbers are "
        "noisy)" if quick else "") + ":",
        *settings,
    ])
