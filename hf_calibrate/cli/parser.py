"""The ``hf-calibrate`` argument parser: commands, flags, help texts and examples.

Building it imports nothing heavy (``--help`` and ``--version`` answer at once): each command's
handler imports what it uses, and the method names that ``--method`` takes are looked up when
that flag is parsed or its help is shown.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any, Callable, List, Tuple

from . import commands
from .metric_keys import COMPARE_METRICS

PROG = "hf-calibrate"
EXIT_USAGE = 2

MAIN_EPILOG = """examples:
  hf-calibrate demo                  # temperature scaling, auto and Neural Clamping on two real models, offline
  hf-calibrate fit --model ./my-vit --dataset ./digits --eval-split test --method temperature --output ./vit-ts
  hf-calibrate evaluate --model ./vit-ts --dataset ./digits --split test --diagram reliability.png

'hf-calibrate <command> --help' shows a command's options and more examples."""

FIT_EPILOG = """examples:
  hf-calibrate fit --model ./my-vit --dataset ./digits --split calibration --eval-split test \\
      --method neural_clamping --option max_iterations=20 --option gamma=[0,1,2] --output ./vit-nc
  hf-calibrate fit --model resnet18 --num-classes 10 --no-pretrained --dataset ./images --method temperature --output out
  hf-calibrate fit --model ./my-vit --dataset ./digits --method auto --output ./vit-auto   # the fast choice: seconds
  hf-calibrate fit --model user/bert-news --dataset ./news --text-column body --method tst --push-to-hub user/bert-news-tst
  torchrun --nproc_per_node 2 -m hf_calibrate.cli fit --model ./my-vit --dataset ./digits --output ./vit-nc

A local dataset folder holds one split per entry: <split>/<class>/<image> folders, or <split>.csv /
<split>.jsonl files (a file is named after its split). Labels given as class names are matched to the
model's labels by name."""

EVALUATE_EPILOG = """examples:
  hf-calibrate evaluate --model ./vit-nc --dataset ./digits --split test --diagram test.png
  hf-calibrate evaluate --model user/vit-nc --dataset ./digits --split test --json
  hf-calibrate evaluate --model ./vit-nc --dataset ./digits --split test --report vit-nc.html   # explore it offline
  hf-calibrate evaluate --model user/vit-nc --dataset ./digits --split test --push-results user/vit-nc
  hf-calibrate evaluate --model ./my-vit --dataset ./digits --split test    # a plain model: its metrics"""

COMPARE_EPILOG = """examples:
  hf-calibrate compare --model ./my-vit --dataset ./digits --eval-split test --output ./vit-compare
  hf-calibrate compare --model ./my-vit --dataset ./digits --methods temperature,dirichlet,tst --metric ece --output out
  hf-calibrate compare --model ./my-vit --dataset ./digits --methods temperature,auto,neural_clamping --output out
  hf-calibrate compare --model ./my-vit --dataset ./digits --methods temperature,neural_clamping \
      --option neural_clamping.max_iterations=5 --option batch_size=64 --output out

Each method is fitted with its default options (and those --option gives it) on the calibration split, and
ranked by the NLL unless --metric says otherwise; methods whose paired difference to the best holds 0
are marked as tied with it: the test split cannot tell them apart. A method whose NLL or Brier score is
detectably worse than the uncalibrated model's is marked 'made worse', whatever its rank; one detectably
better, 'improved'. The table gives each fit's time. 'auto' takes part as any method; its row is named
after the method it chose, e.g. 'auto (temperature)', and a linear map whose check kept temperature scaling
itself after it, e.g. 'vector (temperature)'."""

DEMO_EPILOG = """examples:
  hf-calibrate demo                        # both models, output in ./demo_output
  hf-calibrate demo --models cnn --output /tmp/demo
  hf-calibrate demo --quick                # a smaller, faster configuration

The models are trained on the first run and cached in $HF_CALIBRATE_CACHE (default
~/.cache/hf_calibrate/zoo). Measured on 2 CPU cores: about 2 min the first time, 34 s after."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors as one ``hf-calibrate: error: ...`` line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples as written; an argument with ``listed_choices`` (a callable) lists them in its help when shown."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action) or ""
        listed: Callable[[], List[str]] = getattr(action, "listed_choices", None)
        return text if listed is None else f"{text}; one of {', '.join(listed())}"


def parse_option(text: str) -> Tuple[str, Any]:
    """``key=value`` → (key, value). The value is read as JSON (``[0,1,2]``, ``true``), else as a Python literal
    (``['mac_cal']``, ``True``, ``None``: the form the library's messages write), else as a bracketed list of bare
    words (``[mac_cal,vector]``: what the shell leaves of ``['mac_cal','vector']``), else kept as text."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    for read in (json.loads, ast.literal_eval, _bare_list):
        try:
            return key, read(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # json's error is a ValueError
            continue
    return key, raw


def _bare_list(raw: str) -> List[Any]:
    """``"[mac_cal, 3]"`` → ``["mac_cal", 3]``: each item read as JSON, else kept as text; ValueError if not bracketed."""
    text = raw.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(raw)
    items = [item.strip() for item in text[1:-1].split(",")] if text[1:-1].strip() else []
    return [_json_or_text(item) for item in items]


def _json_or_text(item: str) -> Any:
    try:
        return json.loads(item)
    except ValueError:
        return item


def method_names() -> List[str]:
    """The calibration methods (:data:`hf_calibrate.CALIBRATORS`; imports them, and torch), then ``auto``."""
    from ..calibrators import CALIBRATORS
    from ..fitting.auto.selection import AUTO

    return [*CALIBRATORS, AUTO]


def _method_name(text: str) -> str:
    if text not in method_names():
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(method_names())})")
    return text


def _method_list(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in method_names()]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--methods must name distinct methods among {','.join(method_names())}; got {text!r}")
    return names


def _common_arguments() -> argparse.ArgumentParser:
    common = ArgumentParser(add_help=False)
    group = common.add_argument_group("run")
    group.add_argument("--batch-size", type=int, help="samples per batch over all processes (default: the library's, 1000)")
    group.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), help="autocast for the base model's forward pass")
    group.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    group.add_argument("--bootstrap", type=int, default=1000, metavar="R",
                       help="bootstrap replicates of the results' 95%% intervals (default 1000; 0: points only)")
    group.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return common


def _model_arguments(parser: argparse.ArgumentParser, *, calibrated_too: bool) -> None:
    group = parser.add_argument_group("model")
    kinds = "an hf_calibrate calibration, " if calibrated_too else ""
    group.add_argument(
        "--model", required=True,
        help=f"{kinds}a local folder or hub repo id of a timm or transformers classifier, or a timm architecture name",
    )
    group.add_argument("--revision", help="hub revision (branch, tag or commit) of --model")
    group.add_argument("--token", help="hub token for --model and pushes (default: HF_TOKEN or the stored login)")
    group.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=True,
                       help="timm architecture names: load the pretrained weights (default) or random ones")
    group.add_argument("--num-classes", type=int, help="timm architecture names: number of classes of the new head")


def _data_arguments(parser: argparse.ArgumentParser, split_help: str) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--dataset", required=True,
        help="a datasets hub id (offline: from the local cache), a folder (one image folder, CSV or JSON-lines file per "
        "split, or a datasets.save_to_disk folder) or one CSV/JSON-lines file",
    )
    group.add_argument("--split", help=split_help)
    group.add_argument("--image-column", help="image column (default: 'image' or 'img')")
    group.add_argument("--text-column", help="text column (default: 'text', 'sentence' or 'content')")
    group.add_argument("--label-column", help="label column (default: 'labels' or 'label')")
    group.add_argument("--max-length", type=int, help="tokenizer truncation length for text (default: the tokenizer's; "
                       "for a calibrated model, the length it was calibrated with, which fit records)")


def _command(commands_: Any, name: str, common: argparse.ArgumentParser, summary: str, epilog: str, description: str) -> Any:
    return commands_.add_parser(name, parents=[common], help=summary, epilog=epilog, formatter_class=HelpFormatter,
                                description=description)


def _add_fit(commands_: Any, common: argparse.ArgumentParser) -> None:
    fit = _command(commands_, "fit", common, "fit a calibration and save or push it", FIT_EPILOG,
                   "Fit a calibration of a classifier on held-out labelled data.")
    _model_arguments(fit, calibrated_too=False)
    _data_arguments(fit, "the calibration split (default: 'calibration' or 'validation', or the only split)")
    fit.add_argument("--validation-split", help="selection split of Neural Clamping and the head methods "
                     "(default: they hold out part of the calibration split, or Neural Clamping cross-fits its folds)")
    fit.add_argument("--eval-split", help="split for the before/after table (default: the first of 'test', 'validation', "
                     "'eval', 'evaluation', 'dev' that the fit does not use; without one, the calibration split itself, "
                     "in-sample and so optimistic, with a warning)")
    method = fit.add_argument_group("method")
    method_flag = method.add_argument("--method", default="neural_clamping", type=_method_name,
                                  help="default: neural_clamping, the recommended method; 'auto' is the fast choice "
                                  "(seconds on cached logits, among the logit methods)")
    method_flag.listed_choices = method_names
    method.add_argument("--option", action="append", type=parse_option, default=[], metavar="KEY=VALUE",
                        help="a method or engine option, repeatable; values are JSON when they parse "
                        "(e.g. max_iterations=5, gamma=[0,1,2], folds=5, micro_batch_size=64)")
    method.add_argument("--seed", type=int, help="seed of the data split, shuffling and augmentation (default 0)")
    output = fit.add_argument_group("output")
    output.add_argument("--output", type=Path, help="folder for the calibrated model, its card and reliability diagram")
    output.add_argument("--push-to-hub", metavar="REPO", help="also push the calibrated model to this hub repo")
    output.add_argument("--private", action="store_true", help="create the hub repo as private")
    output.add_argument("--no-row-digests", dest="row_digests", action="store_false",
                        help="save no digests of the calibration rows (by default the record keeps 16 bytes a row, so "
                        "that the saved model tells its calibration rows; anyone holding a row could tell whether it "
                        "was one)")
    fit.set_defaults(handler=commands.run_fit)


def _add_evaluate(commands_: Any, common: argparse.ArgumentParser) -> None:
    evaluate = _command(commands_, "evaluate", common, "metrics of a calibrated or plain model", EVALUATE_EPILOG,
                        "Calibration metrics of a calibrated model (before and after) or a plain model.")
    _model_arguments(evaluate, calibrated_too=True)
    _data_arguments(evaluate, "the split to evaluate (default: 'test', or the only split)")
    report = evaluate.add_argument_group("report")
    report.add_argument("--n-bins", type=int, default=15, help="bins of the binned metrics (default 15)")
    report.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    report.add_argument("--diagram", type=Path, metavar="PATH", help="write the reliability diagram(s) as a PNG")
    report.add_argument("--report", type=Path, metavar="PATH", help="write the before/after as an HTML page to explore "
                        "in a browser, offline (a calibrated model; needs the report extra and --bootstrap > 0)")
    report.add_argument("--push-results", metavar="REPO_OR_FOLDER", help="write the results into the model card of this "
                        "calibrated hub repo or local folder (checked before the evaluation runs)")
    evaluate.set_defaults(handler=commands.run_evaluate)


def _add_compare(commands_: Any, common: argparse.ArgumentParser) -> None:
    compare = _command(commands_, "compare", common, "rank several methods with paired intervals", COMPARE_EPILOG,
                       "Fit several calibrations of one model on the same calibration data and rank them on a "
                       "held-out split, with paired bootstrap intervals.")
    _model_arguments(compare, calibrated_too=False)
    _data_arguments(compare, "the calibration split (default: 'calibration' or 'validation', or the only split)")
    compare.add_argument("--validation-split", help="selection split of Neural Clamping and the head methods")
    compare.add_argument("--eval-split", help="the held-out split they are ranked on (default: the first of 'test', "
                         "'validation', 'eval', 'evaluation', 'dev' that the fits do not use)")
    compare.add_argument("--methods", type=_method_list, default=["temperature", "vector", "neural_clamping"],
                         help="comma-separated methods (default: temperature,vector,neural_clamping)")
    compare.add_argument("--metric", default="nll", choices=COMPARE_METRICS,
                         help="the ranking metric (default: nll, a proper score)")
    compare.add_argument("--option", action="append", type=parse_option, default=[], metavar="[METHOD.]KEY=VALUE",
                         help="an option of one method (METHOD.KEY=VALUE, e.g. neural_clamping.max_iterations=5) or of every "
                         "method (KEY=VALUE, e.g. batch_size=64), repeatable; values are JSON when they parse")
    compare.add_argument("--n-bins", type=int, default=15, help="bins of the binned metrics (default 15)")
    compare.add_argument("--seed", type=int, help="seed of the fits and of the bootstrap (default 0)")
    compare.add_argument("--output", type=Path, required=True,
                         help="folder for comparison.md, comparison.json, comparison.png (the diagrams in rank order) and "
                         "comparison.html (the report to explore in a browser, offline)")
    compare.set_defaults(handler=commands.run_compare)


def _add_demo(commands_: Any, common: argparse.ArgumentParser) -> None:
    from ..demo.command import DEMO_MODELS, demo_model_list, run_demo

    demo = _command(commands_, "demo", common, "calibrate two real models and compare methods", DEMO_EPILOG,
                    "Calibrate a pretrained MiniLM (BBC News) and a timm CNN (digits) with temperature scaling and auto "
                    "(the fast choice), and the CNN with Neural Clamping (the recommended method), each with its defaults; "
                    "print a before/after table and save the calibrated models.")
    demo.add_argument("--output", type=Path, default=Path("demo_output"), help="output folder (default: ./demo_output)")
    demo.add_argument("--models", default=",".join(DEMO_MODELS), type=demo_model_list,
                      help=f"comma-separated subset of {','.join(DEMO_MODELS)} (default: all)")
    demo.add_argument("--quick", action="store_true", help="a smaller configuration (for tests; noisy numbers)")
    demo.add_argument("--cache-dir", type=Path, help="zoo cache (default: $HF_CALIBRATE_CACHE or ~/.cache/hf_calibrate/zoo)")
    demo.set_defaults(handler=run_demo)


def build_parser() -> ArgumentParser:
    """The ``hf-calibrate`` parser with its ``fit``, ``evaluate``, ``compare`` and ``demo`` subcommands."""
    from ..version import __version__

    parser = ArgumentParser(
        prog=PROG,
        description="Calibrate timm and transformers classifiers: fit a calibration, evaluate it, run the demo.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands_ = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    common = _common_arguments()
    for add in (_add_fit, _add_evaluate, _add_compare, _add_demo):
        add(commands_, common)
    return parser
