"""The handlers of ``hf-calibrate fit``, ``evaluate`` and ``compare`` (``demo``'s: :mod:`hf_calibrate.demo.command`).

Each takes the parsed arguments, the process state and the :class:`~.output.Console`, and
imports what it uses when it runs.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Dict, Optional

from .._errors import UserError
from .inputs import engine_options, fit_options, fit_splits, flag_options, load_data, per_method_options
from .output import (Console, check_diagram_target, check_writable, draw_diagram, fit_warning_lines, fit_warnings_reported_here,
                     metric_table)

if TYPE_CHECKING:
    from ..model_loading import LoadedModel


def _load_model(args: argparse.Namespace, state: Any) -> LoadedModel:
    """``--model`` (with its hub and timm flags), loaded by the main process first (it fills the hub cache)."""
    from ..model_loading import load_model

    with state.main_process_first():
        return load_model(args.model, revision=args.revision, token=args.token, pretrained=args.pretrained,
                          num_classes=args.num_classes)


def run_fit(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate fit``: load, fit, evaluate, print the table, save and/or push.

    The table is of the evaluation split (:func:`~.inputs.fit_splits`). Without one it is of the calibration
    split itself, labelled in-sample everywhere, and reuses the base logits the fit computed
    (:func:`hf_calibrate.fit_evaluate.fit_and_evaluate`): the base model runs over it once, not twice.
    """
    from ..backbones import adapt
    from ..fitting.calibrate import resolve_method, selection_readers
    from ..data.identity import source_display_name
    from ..fit_evaluate import fit_and_evaluate
    from ..results.reporting import (FALLBACK_SAVED, fallback_advice, auto_note, auto_table, evaluation_label, fitted_text,
                                     in_sample_warning)
    from ..serialization.saving import check_save_target

    if args.output is None and args.push_to_hub is None:
        raise UserError("nothing would keep the calibration: pass --output DIR and/or --push-to-hub REPO.")
    if args.validation_split and not resolve_method(args.method).reads[0]:
        raise UserError(f"--validation-split: {args.method} does not read a validation split (it fits on the calibration "
                        "split alone); drop --validation-split, or use a method that selects on one "
                        f"({', '.join(selection_readers()[0])}).")
    options = fit_options(args)
    if args.output is not None and state.is_main_process:  # a user's file in the way fails here, not after the fit
        check_writable(args.output, "--output", folder=True, replaceable=check_save_target)
    loaded = _load_model(args, state)
    if loaded.calibrated:
        raise UserError(f"{args.model} is already calibrated ({loaded.model.method}); fit a calibration of its base model instead.")
    data = load_data(args, adapt(loaded.model), state, options.get("label_column"), lambda available: fit_splits(args, available))
    role = "evaluation" if "evaluation" in data.splits else "calibration"
    if role == "evaluation" and not args.eval_split:
        console.note(f"evaluating on the split {data.names[role]!r}, which the fit does not use (--eval-split chooses another)")
    dataset = source_display_name(args.dataset)
    calibrated, evaluation = fit_and_evaluate(
        loaded.model, data.splits["calibration"], data.splits[role], method=args.method,
        validation_data=data.splits.get("validation"), dataset_name=dataset, split=data.names["calibration"],
        evaluation_options={"dataset_name": dataset, "split": data.names[role], "bootstrap": args.bootstrap,
                            **engine_options(options)},
        **{"preprocessor": loaded.preprocessor, **options},
    )
    method = args.method if args.method == calibrated.method else f"{args.method} ({calibrated.method})"
    console.result(f"{method} calibration of {args.model}, evaluated on {evaluation_label(evaluation)}:")
    console.result(metric_table(evaluation))
    fitted = fitted_text(calibrated.method, calibrated.fit_summary)
    for text in (fitted and f"fitted: {fitted}", auto_note(calibrated.fit_summary), auto_table(calibrated.fit_summary)):
        if text:
            console.result(text)
    console.warn(in_sample_warning(evaluation, data.available))
    fallback = calibrated.fallback_note()
    console.warn(fallback and f"{fallback} {FALLBACK_SAVED} {fallback_advice(calibrated.fit_summary, cli=True)}")
    for line in fit_warning_lines(calibrated):
        console.warn(line)
    save_and_push(calibrated, args, state, console, base_model_id=loaded.hub_id)


def save_and_push(calibrated: Any, args: argparse.Namespace, state: Any, console: Console, base_model_id: Optional[str]) -> None:
    """Write the calibrated model to ``--output`` and push it to ``--push-to-hub`` (main process only);
    ``base_model_id``: the base's hub repo, when known (the card's ``base_model``)."""
    if args.output is not None:
        calibrated.save_pretrained(args.output, is_main_process=state.is_main_process, repo_id=args.push_to_hub,
                                   base_model_id=base_model_id, row_digests=args.row_digests)
        console.note(f"saved the calibrated model, its model card and reliability diagram to {args.output}")
    if args.push_to_hub is not None and state.is_main_process:
        commit = calibrated.push_to_hub(args.push_to_hub, private=args.private or None, token=args.token,
                                        base_model_id=base_model_id, row_digests=args.row_digests)
        console.note(f"pushed to {args.push_to_hub}: {getattr(commit, 'commit_url', commit)}")
    state.wait_for_everyone()


def run_evaluate(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate evaluate``: metrics of a calibrated (before/after) or plain model."""
    from ..backbones import adapt
    from ..results.cards import diagram_title, method_title
    from ..data.reading import select_split
    from ..data.identity import source_display_name
    from ..results.reporting import evaluation_label, in_sample_warning
    from ..scoring import evaluate_plain_model

    if args.diagram is not None and state.is_main_process:
        check_writable(args.diagram, "--diagram", folder=False, replaceable=check_diagram_target)
    if args.report is not None:
        _check_report_target(args, state)
    target = _results_target(args) if args.push_results and state.is_main_process else None  # before anything runs
    loaded = _load_model(args, state)
    for flag in ("push_results", "report"):
        if getattr(args, flag) and not loaded.calibrated:
            raise UserError(f"--{flag.replace('_', '-')} needs an hf_calibrate calibration; {args.model} is a plain model.")
    if target is not None:
        _results_target(args, loaded.model, target)  # that it holds this very model, before evaluating
    data = load_data(args, adapt(loaded.base), state, args.label_column,
                     lambda available: {"evaluation": select_split(available, args.split, ("test",), "--split")})
    naming = dict(dataset_name=source_display_name(args.dataset), split=data.names["evaluation"], n_bins=args.n_bins,
                  bootstrap=args.bootstrap)
    options = {"preprocessor": loaded.preprocessor, **flag_options(args)}
    if loaded.calibrated:
        evaluation = loaded.model.evaluate(data.splits["evaluation"], **naming, **options)
    else:
        evaluation = evaluate_plain_model(loaded.model, data.splits["evaluation"], **naming, **options)
    if args.json:
        console.result(json.dumps({"model": args.model, **evaluation}, indent=2))
    else:
        console.result(f"{args.model} on {evaluation_label(evaluation)}:")
        console.result(metric_table(evaluation))
    console.warn(in_sample_warning(evaluation, data.available))
    if args.diagram is not None and state.is_main_process:
        method = method_title(loaded.model.calibration_record()) if loaded.calibrated else None  # as fit's diagram names it
        draw_diagram(evaluation, args.diagram, title=f"{source_display_name(args.model)}: {diagram_title(evaluation, method)}")
        console.note(f"wrote the reliability diagram to {args.diagram}")
    if args.report is not None and state.is_main_process:
        from ..results.evaluation_report import write_evaluation_report

        missing = write_evaluation_report(evaluation, args.report, loaded.model.method)
        console.warn(missing)
        if missing is None:
            console.note(f"wrote the report to explore in a browser (it works offline) to {args.report}")
    if target is not None:
        from .. import _hub

        update = _hub.push_evaluation_results(target, evaluation, token=args.token)
        console.note(f"pushed the results to {args.push_results}: {update}")


def _check_report_target(args: argparse.Namespace, state: Any) -> None:
    """``--report``: the page needs the paired intervals, and a path the command may write (before anything runs)."""
    from .._output_files import refuse_unproven
    from ..results.html_report import is_our_report

    if args.bootstrap == 0:
        raise UserError("--report shows the paired intervals, which --bootstrap 0 turns off: drop --bootstrap 0 (or give "
                        "a number of replicates from 100 on).")
    if state.is_main_process:
        check_writable(args.report, "--report", folder=False,
                       replaceable=lambda path: refuse_unproven({path: is_our_report}, instead="write the report to another --report path"))


def _results_target(args: argparse.Namespace, model: Any = None, checked: Any = None) -> Any:
    """``--push-results``' folder or repo, checked before anything is evaluated: before the model loads, that it exists
    and holds a calibration card; then (``checked``, with the loaded ``model``) that it holds that very model."""
    from .. import _hub
    from ..serialization import ArtifactError
    from ..serialization.evaluated_model import check_results_owner, model_identity

    try:
        if checked is None:
            return _hub.results_target(args.push_results, token=args.token)
        check_results_owner(model_identity(model), checked.record, checked.name, evaluated=args.model)
        return checked
    except ArtifactError as error:
        raise UserError(f"--push-results: {error}") from None


def _check_compare_splits(args: argparse.Namespace, data: Any) -> None:
    """compare ranks on a split no fit uses, with intervals: refuse anything else before fitting."""
    fitted_on = {name for role, name in data.names.items() if role != "evaluation"}
    if data.names.get("evaluation") in fitted_on:
        raise UserError(f"--eval-split {data.names['evaluation']!r} is a split the fits use, so the ranking would be in-sample "
                        "and favour the methods that fit it closest; rank on a split no fit uses.")
    if args.bootstrap == 0:
        raise UserError("compare ranks by paired bootstrap intervals: --bootstrap must be at least 100 (default 1000).")
    if "evaluation" not in data.splits:
        raise UserError(f"compare ranks methods on a split the fits do not use, and {args.dataset} has none besides "
                        f"{data.names['calibration']!r} (its splits: {data.available}); add one, or name it with --eval-split.")


def _merged(flags: Dict[str, Any], own: Dict[str, Any], method: str) -> Dict[str, Any]:
    """The flags' options with a method's own ``--option`` values; one set both ways differently is an error."""
    clashes = sorted(key for key in own if key in flags and flags[key] != own[key])
    if clashes:
        raise UserError(f"{', '.join(clashes)} of {method} given both as --option and as a flag; give each once.")
    return {**flags, **own}


def run_compare(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate compare``: fit each method, rank them on the held-out split, write the table and diagrams."""
    from time import perf_counter

    from ..results import comparison
    from ..backbones import adapt
    from ..fitting.calibrate import resolve_method
    from ..modeling import CalibratedModel
    from ..data.identity import source_display_name
    from ..results.reporting import METRIC_NAMES

    own_options = per_method_options(args.option, args.methods)  # before any loading: a typo fails at once
    if state.is_main_process:
        check_writable(args.output, "--output", folder=True, replaceable=comparison.check_folder)
    loaded = _load_model(args, state)
    if loaded.calibrated:
        raise UserError(f"{args.model} is already calibrated ({loaded.model.method}); compare calibrations of its base model.")
    data = load_data(args, adapt(loaded.model), state, args.label_column, lambda available: fit_splits(args, available))
    _check_compare_splits(args, data)
    options = {"preprocessor": loaded.preprocessor, **flag_options(args)}
    models, fit_seconds = {}, {}
    with fit_warnings_reported_here():
        for method in args.methods:
            console.note(f"fitting {method} on the split {data.names['calibration']!r}")
            validation = data.splits.get("validation") if resolve_method(method).reads[0] else None
            if "validation" in data.splits and validation is None:
                console.note(f"{method} does not read --validation-split: it fits on the calibration split alone")
            started = perf_counter()  # the fit's wall time, its pass of the base model over the data included
            model = CalibratedModel.fit(loaded.model, data.splits["calibration"], method=method,
                                        validation_data=validation, **_merged(options, own_options[method], method))
            name = _row_name(method, model)
            models[name], fit_seconds[name] = model, perf_counter() - started
            fallback = model.fallback_note()
            console.warn(fallback and f"{method}: {fallback}")
            for line in fit_warning_lines(model):
                console.warn(line)
    result = comparison.compare(models, data.splits["evaluation"], metric=args.metric, n_bins=args.n_bins,
                                bootstrap=args.bootstrap, dataset_name=source_display_name(args.dataset),
                                split=data.names["evaluation"], fit_seconds=fit_seconds, **engine_options(options))
    for row in result["rows"]:
        if row["made_worse"]:
            worse = " and ".join(METRIC_NAMES[key] for key in row["made_worse"])
            console.warn(f"{row['name']} made the {worse} on {data.names['evaluation']!r} worse than the uncalibrated model's "
                         "(paired 95 % interval above 0): it leaves the model worse calibrated than no calibration here.")
    from ..results.html_report import REPORT_FILE, missing_dependency

    table = comparison.markdown_table(result, report=None if missing_dependency() else REPORT_FILE)
    console.result(table)
    if state.is_main_process:
        comparison.write(result, table, args.output)
        console.note(f"wrote comparison.md, comparison.json and comparison.png to {args.output}")
        _write_report(result, args.output, adapt(loaded.model), console)


def _row_name(method: str, model: Any) -> str:
    """compare's name of ``method``'s fit: auto with its choice (``"auto (vector)"``), and a linear map whose
    cross-fitted check kept temperature scaling itself (its ``l2`` None) with it, ``"vector (temperature)"``: the row
    is temperature scaling's, as its card says, and should not read as a different method tied with it."""
    if model.method != method:
        return f"{method} ({model.method})"
    summary = model.fit_summary or {}
    return f"{method} (temperature)" if "l2_cv_nll" in summary and summary.get("l2", 0) is None else method


def _write_report(result: Dict[str, Any], folder: Any, model: Any, console: Console) -> None:
    """comparison.html, the report to explore (classes named as the ``model`` adapter names them); without plotly, a
    warning naming the extra to install instead (compare's other files are written all the same)."""
    from ..backbones.base import model_label_names
    from ..results.html_report import REPORT_FILE, write_comparison_report

    missing = write_comparison_report(result, folder, class_names=model_label_names(model))
    console.warn(missing)
    if missing is None:
        console.note(f"wrote {REPORT_FILE}, the report to explore in a browser (it works offline), to {folder}")
