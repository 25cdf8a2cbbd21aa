"""Reliability table: every broken input, option, artifact and interrupted save we try, and how each ended.

Each case ends in one of five outcomes: *refused clearly* (an error naming the problem and the
fix), *handled correctly*, *silent bad result*, *files lost*, or *unclear error*. The last three
must be 0.

* Artifacts (corrupt records and tensors, saves over a user's files, load options, a save killed
  at every step, hypothesis-style fuzzing of a valid artifact, and hostile folders): ``tests/serialization/test_reliability_artifacts.py``
  run as a script classifies every case itself (``reliability_counts``).
* Data, options, labels, input sizes: the parametrised cases of ``tests/integration/test_reliability_inputs.py``,
  ``tests/backbones/test_reliability_input_size.py`` and ``tests/fitting/test_distributed_faults.py`` (2 processes),
  and the cases on malformed batches and labels, empty streams, out-of-vocabulary token ids, in-sample detection
  of derived ``datasets`` data, intervals on too few samples, samplers and batch samplers, and the in-sample rows of
  a saved and reloaded model: the test files and functions listed after them in :data:`INPUT_TEST_FILES`.
  Each test function states one expected outcome (below); a case that passes ended that way, a case that fails did not (counted as *unclear
  error*: the test's message says whether the result was silent or the error unclear).

Usage::

    python benchmarks/bench_reliability.py            # writes benchmarks/results/reliability.md
    python benchmarks/bench_reliability.py --quick    # 100 fuzz mutations; prints only
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List, Tuple

import _report

OUTCOMES = ("refused clearly", "handled correctly", "silent bad result", "files lost", "unclear error")
REFUSED, HANDLED = OUTCOMES[:2]
TESTS = _report.ROOT / "tests"
#: test function → (group, the outcome its cases must end in)
INPUT_CASES: Dict[str, Tuple[str, str]] = {
    "test_nonfinite_input_is_refused_naming_the_sample_and_the_fix": ("bad input: NaN/inf in the data", REFUSED),
    "test_model_emitting_nonfinite_logits_is_refused": ("bad input: model emits NaN/inf", REFUSED),
    "test_calibrators_refuse_nonfinite_logits_given_directly": ("bad input: NaN/inf logits given directly", REFUSED),
    "test_evaluate_and_metrics_name_the_nonfinite_samples": ("bad input: NaN/inf logits given directly", REFUSED),
    "test_bad_fit_option_names_the_option_the_value_and_what_is_allowed": ("bad options and types", REFUSED),
    "test_neural_clamping_options_built_directly_are_checked_like_fit": ("bad options and types", REFUSED),
    "test_bad_evaluate_option_is_named_like_fit": ("bad options and types", REFUSED),
    "test_metric_flags_and_label_types_are_checked": ("bad options and types", REFUSED),
    "test_evaluate_modules_refuse_what_they_would_cast": ("bad options and types", REFUSED),
    "test_unknown_class_names_list_the_models_labels": ("labels as class names", REFUSED),
    "test_class_names_as_labels_are_matched_to_the_model": ("labels as class names", HANDLED),
    "test_classlabel_names_matched_ignoring_case_else_refused_naming_the_cast": ("labels as class names", HANDLED),
    "test_models_with_generic_label_names": ("labels as class names", HANDLED),
    "test_every_bad_sample_of_a_batch_is_named_across_micro_batches": ("bad input: NaN/inf in the data", REFUSED),
    "test_a_record_without_fingerprint_keeps_the_size_check": ("input size and preprocessing", REFUSED),
    "test_every_process_raises_the_same_error_for_data_only_one_holds": ("bad input: held by one of 2 processes", REFUSED),
    "test_mac_cal_keeps_the_head_it_validated": ("MaC-Cal keeps the validated head", HANDLED),
    "test_another_input_size_at_inference_names_the_size_to_use": ("input size and preprocessing", REFUSED),
    "test_calibration_samples_of_different_sizes_are_a_clear_error": ("input size and preprocessing", REFUSED),
    "test_samples_of_different_sizes_in_one_batch_name_both_sizes": ("input size and preprocessing", REFUSED),
    "test_unknown_classifier_lists_the_candidates": ("input size and preprocessing", REFUSED),
    # malformed batches and labels, bad samples, token ids, in-sample detection of derived data
    "test_a_batch_with_more_inputs_than_labels_names_both_counts": ("batches, labels and empty data", REFUSED),
    "test_empty_streams_are_refused_naming_the_fix": ("batches, labels and empty data", REFUSED),
    "test_label_shape_errors_speak_of_the_users_batches": ("batches, labels and empty data", REFUSED),
    "test_errors_name_the_data_by_their_role": ("batches, labels and empty data", REFUSED),
    "test_a_bad_sample_is_named_by_its_place_in_the_users_data": ("bad input: NaN/inf in the data", REFUSED),
    "test_evaluation_errors_do_not_call_the_data_calibration_data": ("batches, labels and empty data", REFUSED),
    "test_a_bad_sample_is_named_by_its_position_not_by_the_fits_batch": ("bad input: NaN/inf in the data", REFUSED),
    "test_token_ids_outside_the_vocabulary_are_named_with_the_fix": ("token ids outside the vocabulary", REFUSED),
    "test_token_ids_outside_the_vocabulary_name_the_samples_and_the_fix": ("token ids outside the vocabulary", REFUSED),
    "test_token_type_ids_outside_the_models_token_types_name_the_samples_and_the_fix": ("token ids outside the vocabulary", REFUSED),
    "test_data_derived_from_the_calibration_data_hold_its_rows": ("in-sample: data derived from the calibration data", HANDLED),
    "test_other_rows_are_not_taken_for_calibration_rows": ("in-sample: data derived from the calibration data", HANDLED),
    "test_streams_whose_rows_cannot_be_traced_are_unknown_not_held_out": ("in-sample: data derived from the calibration data", HANDLED),
    "test_evaluate_reports_derived_calibration_data_as_in_sample": ("in-sample: data derived from the calibration data", HANDLED),
    "test_evaluate_says_unknown_where_it_cannot_know": ("in-sample: data derived from the calibration data", HANDLED),
    "test_evaluate_counts_every_row_of_data_derived_from_the_calibration_data": ("in-sample: data derived from the calibration data", HANDLED),
    "test_evaluate_says_how_many_rows_of_partly_in_sample_data_are_calibration_rows": ("in-sample: data derived from the calibration data", HANDLED),
    "test_a_genuinely_different_test_set_is_held_out": ("in-sample: data derived from the calibration data", HANDLED),
    "test_rows_that_cannot_be_compared_are_unknown_not_held_out": ("in-sample: data derived from the calibration data", HANDLED),
    "test_row_digests_are_the_same_for_the_same_rows_in_any_layout_and_differ_otherwise": ("in-sample: data derived from the calibration data", HANDLED),
    "test_shared_rows_count_rows_by_memory_and_by_content": ("in-sample: data derived from the calibration data", HANDLED),
    # samplers, in-sample rows of loaders and of a reloaded model, intervals on too few samples
    "test_a_loader_is_read_as_the_rows_one_pass_yields": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_batch_sampler_over_part_of_the_rows_is_read_as_that_part": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_weighted_sampler_without_replacement_is_read_as_one_draw": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_loader_that_would_read_a_row_twice_is_refused": ("samplers: a loader read as the rows it yields", REFUSED),
    "test_a_sampler_yielding_a_row_twice_is_refused": ("samplers: a loader read as the rows it yields", REFUSED),
    "test_a_custom_random_sampler_is_drawn_once_so_the_rows_read_are_the_rows_named": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_shuffling_loader_leaves_its_generator_and_the_global_one_as_they_were": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_batch_sampler_may_yield_index_tensors_arrays_or_ranges": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_a_sampler_yielding_more_than_its_len_is_refused_not_read_forever": ("samplers: a loader read as the rows it yields", REFUSED),
    "test_the_very_loader_given_to_fit_is_in_sample": ("in-sample: data derived from the calibration data", HANDLED),
    "test_rows_of_calibration_data_passed_inline_are_known_after_the_object_is_gone": ("in-sample: data derived from the calibration data", HANDLED),
    "test_a_loaders_sampler_decides_which_rows_are_read_and_counted": ("samplers: a loader read as the rows it yields", HANDLED),
    "test_rows_split_twice_are_known_and_a_users_own_subset_class_is_no_torch_subset": ("in-sample: data derived from the calibration data", HANDLED),
    "test_a_gone_fitted_object_without_digests_leaves_its_rows_unknown_not_held_out": ("in-sample: data derived from the calibration data", HANDLED),
    "test_in_sample_false_over_calibration_rows_is_kept_but_warned_about": ("in-sample: data derived from the calibration data", HANDLED),
    "test_a_loaded_model_knows_its_calibration_rows": ("in-sample: a saved and reloaded model", HANDLED),
    "test_a_loaded_model_fitted_on_tensors_knows_its_tensor_rows": ("in-sample: a saved and reloaded model", HANDLED),
    "test_tensor_rows_are_compared_by_content": ("in-sample: data derived from the calibration data", HANDLED),
    "test_a_save_without_row_digests_leaves_whether_in_sample_unknown": ("in-sample: a saved and reloaded model", HANDLED),
    "test_a_loaded_model_saved_again_keeps_its_row_digests": ("in-sample: a saved and reloaded model", HANDLED),
    "test_malformed_row_digests_are_refused_naming_the_key": ("in-sample: a saved and reloaded model", REFUSED),
    "test_too_few_test_samples_give_no_interval_and_no_verdict": ("intervals: too few samples or replicates", HANDLED),
    "test_too_few_samples_or_replicates_give_no_interval_never_a_degenerate_one": ("intervals: too few samples or replicates", HANDLED),
    "test_too_few_samples_give_no_interval_and_say_why": ("intervals: too few samples or replicates", HANDLED),
}
INPUT_TEST_FILES = (
    "integration/test_reliability_inputs.py", "backbones/test_reliability_input_size.py", "fitting/test_distributed_faults.py",
    # data errors and in-sample detection: the cases of these files (or functions) are all listed in INPUT_CASES
    "data/test_data_errors.py", "data/test_lineage.py",
    # samplers and saved row digests: the cases of these files are all listed in INPUT_CASES
    "data/test_samplers.py", "serialization/test_saved_row_digests.py",
    "fitting/test_fit_errors.py::test_evaluation_errors_do_not_call_the_data_calibration_data",
    "fitting/test_fit_errors.py::test_a_bad_sample_is_named_by_its_position_not_by_the_fits_batch",
    "backbones/test_backbones.py::test_token_ids_outside_the_vocabulary_are_named_with_the_fix",
    "results/test_evaluation_intervals.py::test_too_few_test_samples_give_no_interval_and_no_verdict",
    "metrics/test_metrics_intervals.py::test_too_few_samples_or_replicates_give_no_interval_never_a_degenerate_one",
    "metrics/test_evaluate_modules.py::test_too_few_samples_give_no_interval_and_say_why",
)
DEFAULT_INPUT_GROUP = ("input size and preprocessing", HANDLED)


def input_counts() -> Dict[str, Dict[str, int]]:
    """Run the data/option/input-size reliability tests; count each case's outcome per group."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                   *(str(TESTS / name) for name in INPUT_TEST_FILES)]
        subprocess.run(command, cwd=_report.ROOT, capture_output=True, text=True, check=False)
        cases = ElementTree.parse(report).getroot().iter("testcase")
        counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for case in cases:
            function = case.get("name", "").split("[")[0]
            group, expected = INPUT_CASES.get(function, DEFAULT_INPUT_GROUP)
            failed = case.find("failure") is not None or case.find("error") is not None
            counts[group]["unclear error" if failed else expected] += 1
    return {group: {outcome: counter.get(outcome, 0) for outcome in OUTCOMES} for group, counter in counts.items()}


def artifact_counts(fuzz_iterations: int) -> Dict[str, Dict[str, int]]:
    """``tests/serialization/test_reliability_artifacts.py`` as a script: every artifact case classified by itself."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", RELIABILITY_FUZZ_ITERATIONS=str(fuzz_iterations))
    command = [sys.executable, str(TESTS / "serialization" / "test_reliability_artifacts.py")]
    result = subprocess.run(command, cwd=_report.ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout[result.stdout.index("{"):])


def measure(args: argparse.Namespace) -> Dict[str, Dict[str, int]]:
    """Outcome counts per group: the input tests under pytest, then the artifact cases as a script."""
    return {**input_counts(), **artifact_counts(100 if args.quick else args.fuzz)}


def report(session: _report.Session, counts: Dict[str, Dict[str, int]]) -> str:
    totals: collections.Counter = collections.Counter()
    rows = []
    for group, row in counts.items():
        totals.update(row)
        rows.append((group, sum(row.values()), *(row[outcome] for outcome in OUTCOMES)))
    rows.append(("**all**", sum(totals.values()), *(totals[outcome] for outcome in OUTCOMES)))
    lines = [
        *session.header("Reliability: broken inputs, options, artifacts and interrupted saves", ("torch",)),
        *_report.table(("group", "cases", *OUTCOMES), rows, "lrrrrrr"),
        "",
        "*silent bad result*, *files lost* and *unclear error* must be 0. The groups load, save, load options, "
        "kill (a save over a user's files killed at every step: loading the folder then changes nothing and gives the "
        "old or the new artifact or refuses it as torn, and saving again completes it), fuzz (mutations of a valid "
        "artifact's record and tensors) and hostile (folders made to attack the loader and the next save: old save "
        "journals, links out of the folder, a staging folder that is a link, sealed records claiming a user's files, "
        "torn folders; each case fails as *files lost* if anything outside the folder changed, and as *silent bad "
        "result* if loading wrote anything) come from `tests/serialization/test_reliability_artifacts.py` and "
        "`tests/serialization/test_hostile_folders.py`, which classify each case themselves; the "
        "others are the cases of `tests/integration/test_reliability_inputs.py`, `tests/backbones/test_reliability_input_size.py` and "
        "`tests/fitting/test_distributed_faults.py` (4 scenarios of bad data read by one of 2 torchrun processes, counted as one case), "
        "and the cases on malformed batches and labels, empty streams, out-of-vocabulary token ids, in-sample detection of "
        "data derived from the calibration data and intervals on too few samples, and on loaders and saved rows (a "
        "DataLoader read as the rows one pass of it yields, whatever sampler or batch sampler picks them, and a sampler "
        "that would read a row twice refused; a saved and reloaded model telling calibration rows by the digests its "
        "record keeps, and saying unknown where it cannot compare): the files and functions listed in "
        "`INPUT_TEST_FILES`, each test stating its expected outcome.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> None:
    parser = _report.parser(__doc__, default_repeats=1, quick_repeats=1)
    parser.add_argument("--fuzz", type=int, default=1000, help="fuzz mutations of a valid artifact (default 1000; --quick: 100)")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_reliability.py", args)
    session.finish(report(session, measure(args)), "reliability")


if __name__ == "__main__":
    main()
