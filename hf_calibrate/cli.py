"""The ``hf-calibrate`` command line: ``fit``, ``evaluate`` and ``demo``.

A thin layer over the library: it turns arguments into a model (timm architecture name,
hub repo id or local folder), a ``datasets.Dataset`` split (hub id or local folder/file)
and calls :meth:`CalibratedModel.fit`, :meth:`~CalibratedModel.evaluate`,
:meth:`~CalibratedModel.save_pretrained` and :meth:`~CalibratedModel.push_to_hub`.

Every command runs unchanged under ``accelerate launch`` / ``torchrun``: all processes
compute, only the main process prints and writes. A problem with the user's input ends the
command with one ``hf-calibrate: error: ...`` line on stderr and a non-zero exit status
(``--debug`` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

PROG = "hf-calibrate"
EXIT_ERROR = 1
EXIT_USAGE = 2
#: the metrics of the command line's tables (titles: :data:`hf_calibrate.reporting.METRICS`)
TABLE_METRICS = ("accuracy", "ece", "ada_ece", "smooth_ece", "classwise_ece", "nll", "brier")
DEMO_METRICS = ("accuracy", "ece", "ada_ece", "nll", "brier")
#: the demo's second table: the paired change of these, with its interval and verdict
DEMO_CHANGES = ("ece", "nll", "brier")
#: EngineOptions fields with a command-line flag of the same name
FLAG_OPTIONS = ("batch_size", "seed", "mixed_precision", "image_column", "text_column", "label_column", "max_length")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
TABLE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Error types that describe a problem with the user's input, printed without "unexpected".
USER_ERRORS: Tuple[type, ...] = (ValueError, TypeError, OSError, ImportError, FloatingPointError)


class UserError(Exception):
    """A problem with the command's input; reported as one line, without a traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors as one ``hf-calibrate: error: ...`` line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{PROG}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


class Console:
    """Output of the main process only: results on stdout, notes on stderr when stdout holds JSON."""

    def __init__(self, is_main: bool, json_output: bool = False) -> None:
        self.is_main = is_main
        self.json_output = json_output

    def result(self, text: str) -> None:
        if self.is_main:
            print(text, flush=True)

    def note(self, text: str) -> None:
        if self.is_main:
            print(text, file=sys.stderr if self.json_output else sys.stdout, flush=True)

    def warn(self, text: Optional[str]) -> None:
        """A ``warning: ...`` line on stderr, something the user should act on (nothing when ``text`` is None)."""
        if self.is_main and text is not None:
            print(f"warning: {text}", file=sys.stderr, flush=True)


# ============================================================================ arguments


def parse_option(text: str) -> Tuple[str, Any]:
    """``key=value`` → (key, value); the value is parsed as JSON when it is JSON, else kept as text."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def fit_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The ``**options`` of ``CalibratedModel.fit``: ``--option`` pairs and the flags that were given."""
    options: Dict[str, Any] = {}
    for key, value in args.option:
        if key in options:
            raise UserError(f"--option {key}=... is given twice.")
        options[key] = value
    for key, value in flag_options(args).items():
        if key in options and options[key] != value:
            raise UserError(f"{key} is given both as --option and as --{key.replace('_', '-')}.")
        options[key] = value
    return options


def flag_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Engine and data options set by flags (``--batch-size``, ``--label-column``, ...), left out when not given."""
    options = {name: getattr(args, name, None) for name in FLAG_OPTIONS}
    options = {name: value for name, value in options.items() if value is not None}
    if not args.progress:
        options["progress"] = False
    return options


def engine_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options of ``options`` that every fit and evaluation takes (``EngineOptions`` fields)."""
    from .fitting import EngineOptions

    names = {field.name for field in dataclasses.fields(EngineOptions)}
    return {name: value for name, value in options.items() if name in names}


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


MAIN_EPILOG = """examples:
  hf-calibrate demo                  # Neural Clamping and temperature scaling on two real models, offline
  hf-calibrate fit --model ./my-vit --dataset ./digits --eval-split test --method temperature --output ./vit-ts
  hf-calibrate evaluate --model ./vit-ts --dataset ./digits --split test --diagram reliability.png

'hf-calibrate <command> --help' shows a command's options and more examples."""

FIT_EPILOG = """examples:
  hf-calibrate fit --model ./my-vit --dataset ./digits --split calibration --eval-split test \\
      --method neural_clamping --option epochs=20 --option gamma=[0,1,2] --output ./vit-nc
  hf-calibrate fit --model resnet18 --num-classes 10 --no-pretrained --dataset ./images --method temperature --output out
  hf-calibrate fit --model user/bert-news --dataset ./news --text-column body --method tst --push-to-hub user/bert-news-tst
  torchrun --nproc_per_node 2 -m hf_calibrate.cli fit --model ./my-vit --dataset ./digits --output ./vit-nc

A local dataset folder holds one split per entry: <split>/<class>/<image> folders, or <split>.csv /
<split>.jsonl files (a file is named after its split). Labels given as class names are matched to the
model's labels by name."""

EVALUATE_EPILOG = """examples:
  hf-calibrate evaluate --model ./vit-nc --dataset ./digits --split test --diagram test.png
  hf-calibrate evaluate --model user/vit-nc --dataset ./digits --split test --json
  hf-calibrate evaluate --model user/vit-nc --dataset ./digits --split test --push-results user/vit-nc
  hf-calibrate evaluate --model ./my-vit --dataset ./digits --split test    # a plain model: its metrics"""

COMPARE_EPILOG = """examples:
  hf-calibrate compare --model ./my-vit --dataset ./digits --eval-split test --output ./vit-compare
  hf-calibrate compare --model ./my-vit --dataset ./digits --methods temperature,dirichlet,tst --metric nll --output out

Each method is fitted with its default options on the calibration split; methods whose paired
difference to the best holds 0 are marked as tied with it: the test split cannot tell them apart."""

DEMO_EPILOG = """examples:
  hf-calibrate demo                        # both models, output in ./demo_output
  hf-calibrate demo --models cnn --output /tmp/demo
  hf-calibrate demo --quick                # a smaller, faster configuration

The models are trained on the first run (a few minutes on a laptop CPU) and cached in
$HF_CALIBRATE_CACHE (default ~/.cache/hf_calibrate/zoo)."""


def build_parser() -> ArgumentParser:
    """The ``hf-calibrate`` parser with its ``fit``, ``evaluate`` and ``demo`` subcommands."""
    from .calibrators import CALIBRATORS
    from .version import __version__

    parser = ArgumentParser(
        prog=PROG,
        description="Calibrate timm and transformers classifiers: fit a calibration, evaluate it, run the demo.",
        epilog=MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    common = _common_arguments()
    raw = argparse.RawDescriptionHelpFormatter

    fit = commands.add_parser("fit", parents=[common], help="fit a calibration and save or push it", epilog=FIT_EPILOG,
                              formatter_class=raw, description="Fit a calibration of a classifier on held-out labelled data.")
    _model_arguments(fit, calibrated_too=False)
    _data_arguments(fit, "the calibration split (default: 'calibration' or 'validation', or the only split)")
    fit.add_argument("--validation-split", help="selection split of Neural Clamping and the head methods "
                     "(default: they hold out part of the calibration split)")
    fit.add_argument("--eval-split", help="split for the before/after table (default: the first of 'test', 'validation', "
                     "'eval', 'evaluation', 'dev' that the fit does not use; without one, the calibration split itself, "
                     "in-sample and so optimistic, with a warning)")
    method = fit.add_argument_group("method")
    method.add_argument("--method", default="neural_clamping", choices=list(CALIBRATORS), help="default: neural_clamping")
    method.add_argument("--option", action="append", type=parse_option, default=[], metavar="KEY=VALUE",
                        help="a method or engine option, repeatable; values are JSON when they parse "
                        "(e.g. epochs=5, gamma=[0,1,2], augment=true, micro_batch_size=64)")
    method.add_argument("--seed", type=int, help="seed of the data split, shuffling and augmentation (default 0)")
    output = fit.add_argument_group("output")
    output.add_argument("--output", type=Path, help="folder for the calibrated model, its card and reliability diagram")
    output.add_argument("--push-to-hub", metavar="REPO", help="also push the calibrated model to this hub repo")
    output.add_argument("--private", action="store_true", help="create the hub repo as private")
    fit.set_defaults(handler=run_fit)

    evaluate = commands.add_parser("evaluate", parents=[common], help="metrics of a calibrated or plain model",
                                   epilog=EVALUATE_EPILOG, formatter_class=raw,
                                   description="Calibration metrics of a calibrated model (before and after) or a plain model.")
    _model_arguments(evaluate, calibrated_too=True)
    _data_arguments(evaluate, "the split to evaluate (default: 'test', or the only split)")
    report = evaluate.add_argument_group("report")
    report.add_argument("--n-bins", type=int, default=15, help="bins of the binned metrics (default 15)")
    report.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    report.add_argument("--diagram", type=Path, metavar="PATH", help="write the reliability diagram(s) as a PNG")
    report.add_argument("--push-results", metavar="REPO", help="write the results into this calibrated repo's model card")
    evaluate.set_defaults(handler=run_evaluate)

    compare = commands.add_parser("compare", parents=[common], help="rank several methods with paired intervals",
                                  epilog=COMPARE_EPILOG, formatter_class=raw,
                                  description="Fit several calibrations of one model on the same calibration data and "
                                  "rank them on a held-out split, with paired bootstrap intervals.")
    _model_arguments(compare, calibrated_too=False)
    _data_arguments(compare, "the calibration split (default: 'calibration' or 'validation', or the only split)")
    compare.add_argument("--validation-split", help="selection split of Neural Clamping and the head methods")
    compare.add_argument("--eval-split", help="the held-out split they are ranked on (default: the first of 'test', "
                         "'validation', 'eval', 'evaluation', 'dev' that the fits do not use)")
    compare.add_argument("--methods", type=_method_list, default=["temperature", "vector", "neural_clamping"],
                         help="comma-separated methods (default: temperature,vector,neural_clamping)")
    compare.add_argument("--metric", default="ece", choices=COMPARE_METRICS, help="the ranking metric (default: ece)")
    compare.add_argument("--n-bins", type=int, default=15, help="bins of the binned metrics (default 15)")
    compare.add_argument("--seed", type=int, help="seed of the fits and of the bootstrap (default 0)")
    compare.add_argument("--output", type=Path, required=True,
                         help="folder for comparison.md, comparison.json and comparison.png (side-by-side diagrams)")
    compare.set_defaults(handler=run_compare)

    demo = commands.add_parser("demo", parents=[common], help="calibrate two real models and compare methods",
                               epilog=DEMO_EPILOG, formatter_class=raw,
                               description="Calibrate a pretrained MiniLM (BBC News) and a timm CNN (digits) with temperature "
                               "scaling and Neural Clamping; print a before/after table and save the calibrated models.")
    demo.add_argument("--output", type=Path, default=Path("demo_output"), help="output folder (default: ./demo_output)")
    demo.add_argument("--models", default=",".join(DEMO_MODELS), type=_demo_model_list,
                      help=f"comma-separated subset of {','.join(DEMO_MODELS)} (default: all)")
    demo.add_argument("--quick", action="store_true", help="a smaller configuration (for tests; noisy numbers)")
    demo.add_argument("--cache-dir", type=Path, help="zoo cache (default: $HF_CALIBRATE_CACHE or ~/.cache/hf_calibrate/zoo)")
    demo.set_defaults(handler=run_demo)
    return parser


# ============================================================================ models


@dataclasses.dataclass
class LoadedModel:
    """A model named on the command line, ready for ``fit`` or ``evaluate``.

    Attributes:
        model: the classifier (a ``CalibratedModel`` when ``calibrated``).
        preprocessor: its tokenizer or image processor (None: timm's own data config).
        name: how the user named it.
        calibrated: whether it is an hf_calibrate calibration.
        hub_id: the hub repo its weights came from, when known (the card's ``base_model``).
    """

    model: Any
    preprocessor: Any
    name: str
    calibrated: bool
    hub_id: Optional[str] = None

    @property
    def base(self) -> Any:
        return self.model.base_model if self.calibrated else self.model


def load_model(spec: str, *, revision: Optional[str], token: Optional[str], pretrained: bool, num_classes: Optional[int]) -> LoadedModel:
    """Load ``spec``: a local folder, a timm architecture name, or a hub repo id (calibrated or not)."""
    import timm

    if os.path.isdir(spec):
        return _load_folder(Path(spec), spec, token=token)
    if timm.is_model(spec):
        options = {"num_classes": num_classes} if num_classes else {}
        try:
            model = timm.create_model(spec, pretrained=pretrained, **options)
        except Exception as error:  # noqa: BLE001 - a download or weights problem, explained below
            raise UserError(
                f"could not create the timm model {spec!r} with pretrained weights ({type(error).__name__}: {error}); "
                "the weights must be in the local hub cache when offline, or pass --no-pretrained."
            ) from error
        hub_id = model.pretrained_cfg.get("hf_hub_id") if pretrained else None  # where timm loaded the weights from
        return LoadedModel(model.eval(), None, spec, calibrated=False, hub_id=hub_id)
    if num_classes is not None:
        raise UserError(f"--num-classes applies to timm architecture names; {spec!r} is not one.")
    from . import _hub

    try:
        folder = _hub.resolve_folder(spec, revision=revision, token=token)
    except _hub.ArtifactError as error:
        raise UserError(f"unknown model {spec!r} (not a timm architecture name either): {error}") from error
    return dataclasses.replace(_load_folder(folder, spec, token=token), hub_id=spec)


def _load_folder(folder: Path, name: str, *, token: Optional[str]) -> LoadedModel:
    """A calibration, a timm or a transformers model folder, told apart by its JSON files."""
    from .modeling import CalibratedModel
    from .serialization import CALIBRATION_CONFIG

    if (folder / CALIBRATION_CONFIG).is_file():
        model = CalibratedModel.from_pretrained(folder, token=token)
        return LoadedModel(model, model.preprocessor, name, calibrated=True)
    config = _read_config(folder)
    if "architectures" in config or "model_type" in config:
        return _load_transformers(folder, name, config)
    if "architecture" in config:
        import timm

        return LoadedModel(timm.create_model(f"local-dir:{folder}", pretrained=True).eval(), None, name, calibrated=False)
    raise UserError(f"{name}: config.json names neither a transformers model ('architectures') nor a timm one ('architecture').")


def _read_config(folder: Path) -> Dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise UserError(f"{folder} holds no config.json: it is not a timm, transformers or hf_calibrate model folder.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"{path} is not valid JSON ({error}).") from error


def _load_transformers(folder: Path, name: str, config: Dict[str, Any]) -> LoadedModel:
    """An image or sequence classifier (by the config's ``architectures``) and its preprocessor."""
    from transformers import (
        AutoImageProcessor,
        AutoModelForImageClassification,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    architectures = config.get("architectures") or []
    if any(arch.endswith("ForImageClassification") for arch in architectures):
        model_class, preprocessor_class = AutoModelForImageClassification, AutoImageProcessor
    elif any(arch.endswith("ForSequenceClassification") for arch in architectures):
        model_class, preprocessor_class = AutoModelForSequenceClassification, AutoTokenizer
    else:
        raise UserError(
            f"{name} is a transformers {architectures or config.get('model_type')} model, not an image or sequence "
            "classifier (its config.json 'architectures' must end in ForImageClassification or ForSequenceClassification)."
        )
    model = model_class.from_pretrained(str(folder)).eval()
    try:
        preprocessor = preprocessor_class.from_pretrained(str(folder))
    except (OSError, ValueError):
        preprocessor = None  # prepare_data says what is missing if the data need it
    return LoadedModel(model, preprocessor, name, calibrated=False)


# ============================================================================ data


def load_splits(source: str, *, token: Optional[str]) -> Any:
    """All splits of ``source`` as a ``datasets.DatasetDict`` (a local folder or file, or a hub id)."""
    import datasets

    path = Path(source)
    try:
        if path.is_dir():
            return _folder_splits(path)
        if path.is_file():
            return _table_splits({path.stem: path})
        splits = datasets.load_dataset(source, token=token)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - any reader failure is a problem with the user's data
        where = "local dataset" if path.exists() else "dataset (not a local file or folder; offline, hub datasets load from the cache only)"
        raise UserError(f"could not read the {where} {source!r}: {type(error).__name__}: {error}") from error
    return splits if isinstance(splits, datasets.DatasetDict) else datasets.DatasetDict({"train": splits})


def _folder_splits(folder: Path) -> Any:
    """A ``save_to_disk`` folder, per-split table files, or image folders (per split, or one split of classes)."""
    import datasets

    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        loaded = datasets.load_from_disk(str(folder))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    tables = {entry.stem: entry for entry in sorted(folder.iterdir()) if entry.suffix.lower() in TABLE_BUILDERS}
    if tables:
        return _table_splits(tables)
    images = [entry for entry in folder.rglob("*") if entry.suffix.lower() in IMAGE_SUFFIXES]
    depths = {len(image.relative_to(folder).parts) for image in images}
    if depths == {2}:  # <class>/<image>: one split
        return datasets.load_dataset("imagefolder", data_dir=str(folder))
    if depths == {3}:  # <split>/<class>/<image>
        files: Dict[str, List[str]] = {}
        for image in sorted(images):
            files.setdefault(image.relative_to(folder).parts[0], []).append(str(image))
        return datasets.load_dataset("imagefolder", data_files=files)
    raise UserError(
        f"{folder} is not a dataset folder this command reads: expected <split>/<class>/<image> or <class>/<image> "
        "image folders, <split>.csv / <split>.jsonl files, or a datasets.save_to_disk folder."
    )


def _table_splits(files: Dict[str, Path]) -> Any:
    """CSV / JSON-lines / Parquet files, one split each, named after the file."""
    import datasets

    builders = {TABLE_BUILDERS.get(path.suffix.lower()) for path in files.values()}
    if None in builders or len(builders) > 1:
        raise UserError(f"cannot read {sorted(str(p) for p in files.values())} as one dataset: use files of one kind "
                        f"({', '.join(sorted(TABLE_BUILDERS))}).")
    builder = builders.pop()
    options = {"delimiter": "\t"} if all(path.suffix.lower() == ".tsv" for path in files.values()) else {}
    return datasets.load_dataset(builder, data_files={split: str(path) for split, path in files.items()}, **options)


def select_split(available: Sequence[str], requested: Optional[str], preferred: Sequence[str], flag: str) -> str:
    """``requested`` of the ``available`` split names, else the first ``preferred`` one present, else the only one."""
    if requested is not None:
        if requested not in available:
            raise UserError(f"the dataset has no split {requested!r}; its splits are {list(available)}.")
        return requested
    for name in preferred:
        if name in available:
            return name
    if len(available) == 1:
        return available[0]
    raise UserError(f"the dataset has the splits {list(available)}; choose one with {flag}.")


def fit_splits(args: argparse.Namespace, available: Sequence[str]) -> Dict[str, str]:
    """The split of each role of ``fit``: calibration, validation (when given) and evaluation — the one given,
    else a held-out split the fit does not use (:func:`hf_calibrate.reporting.held_out_split`), else none."""
    from .reporting import held_out_split

    chosen = {"calibration": select_split(available, args.split, ("calibration", "validation"), "--split")}
    if args.validation_split:
        chosen["validation"] = select_split(available, args.validation_split, (), "--validation-split")
    held_out = held_out_split(available, set(chosen.values()))
    if args.eval_split or held_out:
        chosen["evaluation"] = select_split(available, args.eval_split or held_out, (), "--eval-split")
    return chosen


def align_labels(data: Any, label_column: Optional[str], backbone: Any) -> Any:
    """``data`` with labels as the model's class indices: class names are matched by name.

    The matching is the library's own (:func:`hf_calibrate.data.align_labels`, which
    ``CalibratedModel.fit`` applies too); a missing label column is a UserError naming the flag.
    """
    from .data import align_labels as align_with_model

    return align_with_model(data, _label_column(data, label_column), backbone)


def _label_column(data: Any, given: Optional[str]) -> str:
    from .data import LABEL_KEYS

    columns = list(data.column_names)
    if given is not None:
        if given not in columns:
            raise UserError(f"the dataset has no label column {given!r}; its columns are {columns}.")
        return given
    found = next((name for name in LABEL_KEYS if name in columns), None)
    if found is None:
        raise UserError(f"the dataset has no label column (looked for {list(LABEL_KEYS)} among {columns}); "
                        "name it with --label-column.")
    return found


class LoadedData(NamedTuple):
    """The splits a command uses, by role (``"calibration"``, ``"validation"``, ``"evaluation"``; labels aligned to
    the model, roles given the same split share one object), their names by role, and every split of the dataset."""

    splits: Dict[str, Any]
    names: Dict[str, str]
    available: List[str]


def load_data(
    args: argparse.Namespace, backbone: Any, state: Any, label_column: Optional[str],
    choose_splits: Callable[[List[str]], Dict[str, str]],
) -> LoadedData:
    """The splits ``choose_splits`` picks (role → split name) from the dataset's split names, labels aligned."""
    with state.main_process_first():
        splits = load_splits(args.dataset, token=args.token)
        names = choose_splits(list(splits))
        aligned = {name: align_labels(splits[name], label_column, backbone) for name in set(names.values())}
        return LoadedData({role: aligned[name] for role, name in names.items()}, names, list(splits))


# ============================================================================ output


def check_writable(path: Path, flag: str, *, folder: bool) -> None:
    """Fail early, before any compute, when ``path`` (a folder or a file) cannot be written."""
    if path.exists() and path.is_dir() != folder:
        raise UserError(f"{flag} {path} exists and is {'not ' if folder else ''}a folder.")
    parent = path.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=parent).cleanup()  # saving writes a sibling, then renames it
    except OSError as error:
        raise UserError(f"cannot write {flag} {path}: {error.strerror or error} (in {parent}).") from error


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def metric_table(evaluation: Dict[str, Any]) -> str:
    """Before/after table of an evaluation, each value with its interval [low, high] when it has one, the paired
    change and its verdict (only one column for a plain model), and a line saying how the intervals were made."""
    from .reporting import METRIC_NAMES, bootstrap_note, change_text, shown_metrics, value_text

    sides = [side for side in ("uncalibrated", "calibrated") if side in evaluation]
    both, verdicts = len(sides) == 2, evaluation.get("verdicts") or {}
    header = ["metric", *sides] + (["change"] if both else []) + (["verdict"] if both and verdicts else [])
    rows = []
    for key in shown_metrics(evaluation, TABLE_METRICS):
        row = [METRIC_NAMES[key], *(value_text(evaluation, side, key) for side in sides)]
        row += ([change_text(evaluation, key)] if both else []) + ([verdicts.get(key, "")] if both and verdicts else [])
        rows.append(row)
    note = bootstrap_note(evaluation)
    return format_table(header, rows) + (f"\n{note}" if note else "")


def draw_diagram(evaluation: Dict[str, Any], path: Path, title: str) -> None:
    """The reliability diagram(s) of an evaluation as a PNG at ``path``, uncalibrated first."""
    from .plotting import compare_reliability_diagrams, reliability_diagram

    reliability = evaluation["reliability"]
    panels = {side: reliability[side] for side in ("uncalibrated", "calibrated") if side in reliability}
    if len(panels) == 1:
        reliability_diagram(next(iter(panels.values())), title=title, path=path)
    else:
        compare_reliability_diagrams(panels, title=title, path=path)


@contextlib.contextmanager
def fallback_reported_here() -> Iterator[None]:
    """Silence ``TemperatureScalingFallbackWarning`` inside: the commands print their own line about it."""
    from .modeling import TemperatureScalingFallbackWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TemperatureScalingFallbackWarning)
        yield


# ============================================================================ commands


def process_state() -> Any:
    """The ``Accelerator`` of this process (sets up the process group under torchrun / accelerate launch).

    Made as the fits make theirs, so that environment settings such as ``ACCELERATE_USE_CPU``
    apply (a bare ``PartialState()`` ignores them).
    """
    from accelerate import Accelerator

    return Accelerator()


def run_fit(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate fit``: load, fit, evaluate, print the table, save and/or push.

    The table is of the evaluation split (:func:`fit_splits`). Without one it is of the calibration
    split itself, labelled in-sample everywhere, and reuses the base logits the fit computed
    (:func:`hf_calibrate.modeling.fit_and_evaluate`): the base model runs over it once, not twice.
    """
    from .backbones import adapt
    from .modeling import fit_and_evaluate
    from .reporting import CLI_FALLBACK_ADVICE, FALLBACK_SAVED, evaluation_label, in_sample_warning, source_display_name

    if args.output is None and args.push_to_hub is None:
        raise UserError("nothing would keep the calibration: pass --output DIR and/or --push-to-hub REPO.")
    options = fit_options(args)
    if args.output is not None and state.is_main_process:
        check_writable(args.output, "--output", folder=True)
    with state.main_process_first():
        loaded = load_model(args.model, revision=args.revision, token=args.token, pretrained=args.pretrained, num_classes=args.num_classes)
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
    console.result(f"{args.method} calibration of {args.model}, evaluated on {evaluation_label(evaluation)}:")
    console.result(metric_table(evaluation))
    console.warn(in_sample_warning(evaluation, data.available))
    fallback = calibrated.fallback_note()
    console.warn(fallback and f"{fallback} {FALLBACK_SAVED} {CLI_FALLBACK_ADVICE}")
    save_and_push(calibrated, args, state, console, base_model_id=loaded.hub_id)


def save_and_push(calibrated: Any, args: argparse.Namespace, state: Any, console: Console, base_model_id: Optional[str]) -> None:
    """Write the calibrated model to ``--output`` and push it to ``--push-to-hub`` (main process only);
    ``base_model_id``: the base's hub repo, when known (the card's ``base_model``)."""
    if args.output is not None:
        calibrated.save_pretrained(args.output, is_main_process=state.is_main_process, repo_id=args.push_to_hub,
                                   base_model_id=base_model_id)
        console.note(f"saved the calibrated model, its model card and reliability diagram to {args.output}")
    if args.push_to_hub is not None and state.is_main_process:
        commit = calibrated.push_to_hub(args.push_to_hub, private=args.private or None, token=args.token,
                                        base_model_id=base_model_id)
        console.note(f"pushed to {args.push_to_hub}: {getattr(commit, 'commit_url', commit)}")
    state.wait_for_everyone()


def run_evaluate(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate evaluate``: metrics of a calibrated (before/after) or plain model."""
    from .backbones import adapt
    from .cards import diagram_title
    from .reporting import evaluation_label, in_sample_warning, source_display_name

    if args.diagram is not None and state.is_main_process:
        check_writable(args.diagram, "--diagram", folder=False)
    with state.main_process_first():
        loaded = load_model(args.model, revision=args.revision, token=args.token, pretrained=args.pretrained, num_classes=args.num_classes)
    if args.push_results and not loaded.calibrated:
        raise UserError(f"--push-results needs an hf_calibrate calibration; {args.model} is a plain model.")
    data = load_data(args, adapt(loaded.base), state, args.label_column,
                     lambda available: {"evaluation": select_split(available, args.split, ("test",), "--split")})
    options = {"preprocessor": loaded.preprocessor, **flag_options(args)}
    naming = dict(dataset_name=source_display_name(args.dataset), split=data.names["evaluation"], n_bins=args.n_bins,
                  bootstrap=args.bootstrap)
    evaluate = loaded.model.evaluate if loaded.calibrated else functools.partial(evaluate_plain_model, loaded.model)
    evaluation = evaluate(data.splits["evaluation"], **naming, **options)
    if args.json:
        console.result(json.dumps({"model": args.model, **evaluation}, indent=2))
    else:
        console.result(f"{args.model} on {evaluation_label(evaluation)}:")
        console.result(metric_table(evaluation))
    console.warn(in_sample_warning(evaluation, data.available))
    if args.diagram is not None and state.is_main_process:
        draw_diagram(evaluation, args.diagram, title=f"{source_display_name(args.model)}: {diagram_title(evaluation)}")
        console.note(f"wrote the reliability diagram to {args.diagram}")
    if args.push_results and state.is_main_process:
        from . import _hub

        commit = _hub.push_evaluation_results(args.push_results, evaluation, token=args.token)
        console.note(f"pushed the results to {args.push_results}: {getattr(commit, 'commit_url', commit)}")


def evaluate_plain_model(
    model: Any, data: Any, *, n_bins: int, dataset_name: str, split: str, bootstrap: int, **options: Any
) -> Dict[str, Any]:
    """Metrics of an uncalibrated model's own logits, shaped like :meth:`CalibratedModel.evaluate`'s ``uncalibrated`` side.

    The engine gathers every batch's logits on every process, so each process computes the
    same metrics without a further collective.
    """
    import torch

    from .backbones import adapt
    from .data import prepare_data
    from .fitting import Engine, EngineOptions
    from .evaluation import accumulators, bootstrap_settings, check_bootstrap, summarize_one

    bootstrap = check_bootstrap(bootstrap)
    engine = Engine(EngineOptions(**options))
    backbone = adapt(model)
    model.to(engine.device).eval()
    prepared = prepare_data(data, backbone, **engine.options.data_options())
    metrics = accumulators(backbone.num_classes, n_bins, bootstrap, engine.options.seed)[0]
    logits, labels = engine.scan(prepared, backbone.logits, num_classes=backbone.num_classes, description="evaluating")
    metrics.update(logits, labels, sample_index=torch.arange(len(labels)), from_logits=True)
    result = {"uncalibrated": summarize_one(metrics, sync=False),
              "reliability": {"uncalibrated": metrics.reliability(sync=False).to_dict()},
              "dataset": dataset_name, "split": split, "n_bins": n_bins}
    if bootstrap:
        result["bootstrap"] = bootstrap_settings(metrics)
    return result


def run_compare(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate compare``: fit each method, rank them on the held-out split, write the table and diagrams."""
    from . import comparison
    from .backbones import adapt
    from .modeling import CalibratedModel
    from .reporting import source_display_name

    if state.is_main_process:
        check_writable(args.output, "--output", folder=True)
    with state.main_process_first():
        loaded = load_model(args.model, revision=args.revision, token=args.token, pretrained=args.pretrained, num_classes=args.num_classes)
    if loaded.calibrated:
        raise UserError(f"{args.model} is already calibrated ({loaded.model.method}); compare calibrations of its base model.")
    data = load_data(args, adapt(loaded.model), state, args.label_column, lambda available: fit_splits(args, available))
    fitted_on = {name for role, name in data.names.items() if role != "evaluation"}
    if data.names.get("evaluation") in fitted_on:
        raise UserError(f"--eval-split {data.names['evaluation']!r} is a split the fits use, so the ranking would be in-sample "
                        "and favour the methods that fit it closest; rank on a split no fit uses.")
    if args.bootstrap == 0:
        raise UserError("compare ranks by paired bootstrap intervals: --bootstrap must be at least 100 (default 1000).")
    if "evaluation" not in data.splits:
        raise UserError(f"compare ranks methods on a split the fits do not use, and {args.dataset} has none besides "
                        f"{data.names['calibration']!r} (its splits: {data.available}); add one, or name it with --eval-split.")
    options = {"preprocessor": loaded.preprocessor, **flag_options(args)}
    models = {}
    with fallback_reported_here():
        for method in args.methods:
            console.note(f"fitting {method} on the split {data.names['calibration']!r}")
            models[method] = CalibratedModel.fit(loaded.model, data.splits["calibration"], method=method,
                                                 validation_data=data.splits.get("validation"), **options)
            fallback = models[method].fallback_note()
            console.warn(fallback and f"{method}: {fallback}")
    result = comparison.compare(models, data.splits["evaluation"], metric=args.metric, n_bins=args.n_bins,
                                bootstrap=args.bootstrap, dataset_name=source_display_name(args.dataset),
                                split=data.names["evaluation"], **engine_options(options))
    table = comparison.markdown_table(result)
    console.result(table)
    if state.is_main_process:
        comparison.write(result, table, args.output)
        console.note(f"wrote comparison.md, comparison.json and comparison.png to {args.output}")


# ---------------------------------------------------------------------------- demo


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """How much of a zoo model's data the demo uses, and its Neural Clamping schedule.

    Attributes:
        calibration, test: sizes of stratified subsets of the splits (None: the whole split).
        max_length: text models: tokens per article; the tokenizer is saved with it, so the
            calibrated model is used on inputs like those it was calibrated on.
        neural_clamping: Neural Clamping and engine options (a short schedule).
    """

    calibration: Optional[int]
    test: Optional[int]
    max_length: Optional[int]
    neural_clamping: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class DemoSpec:
    """One model of the demo: its zoo function (in :mod:`hf_calibrate.demo`), data name and configurations."""

    build: str
    dataset: str
    full: DemoConfig
    quick: DemoConfig


# Sized for about a minute on 2 CPU cores once the zoo is cached; MiniLM's Neural Clamping
# (a forward and an input-gradient backward through the transformer per sample and epoch)
# dominates, hence the subsets and the 64-token articles.
DEMO_MODELS: Dict[str, DemoSpec] = {
    "minilm": DemoSpec(
        build="bbc_minilm", dataset="BBC News",
        full=DemoConfig(calibration=300, test=300, max_length=64, neural_clamping={"epochs": 2, "batch_size": 16}),
        quick=DemoConfig(calibration=60, test=60, max_length=32, neural_clamping={"epochs": 1, "batch_size": 16}),
    ),
    "cnn": DemoSpec(
        build="digits_timm_cnn", dataset="scikit-learn digits",
        full=DemoConfig(calibration=None, test=None, max_length=None, neural_clamping={"epochs": 8, "batch_size": 64}),
        quick=DemoConfig(calibration=200, test=200, max_length=None, neural_clamping={"epochs": 2, "batch_size": 64}),
    ),
}
DEMO_METHODS = ("temperature", "neural_clamping")
#: ranking metrics of ``compare`` (those with intervals)
COMPARE_METRICS = ("accuracy", "ece", "ada_ece", "mce", "rms_ce", "nll", "brier")


def _method_list(text: str) -> List[str]:
    from .calibrators import CALIBRATORS

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CALIBRATORS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--methods must name distinct methods among {','.join(CALIBRATORS)}; got {text!r}")
    return names


def _demo_model_list(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DEMO_MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown demo model(s) {unknown or text!r}; choose from {','.join(DEMO_MODELS)}")
    return names


def _demo_subset(split: Any, size: Optional[int], seed: int = 0) -> Any:
    """A stratified subset of ``size`` rows (all rows when None or larger)."""
    if size is None or size >= len(split):
        return split
    return split.train_test_split(train_size=size, stratify_by_column="label", seed=seed)["train"]


def _demo_preprocessor(preprocessor: Any, max_length: Optional[int]) -> Any:
    """The zoo model's preprocessor; for text, a copy of the tokenizer that truncates at ``max_length``."""
    if max_length is None:
        return preprocessor
    tokenizer = copy.deepcopy(preprocessor)
    tokenizer.model_max_length = max_length
    return tokenizer


def run_demo(args: argparse.Namespace, state: Any, console: Console) -> None:
    """``hf-calibrate demo``: TS and Neural Clamping on the zoo models, one table, saved models."""
    from . import demo as zoo
    from .modeling import CalibratedModel
    from .reporting import FALLBACK_SAVED

    start = time.perf_counter()
    if state.is_main_process:
        check_writable(args.output, "--output", folder=True)
    rows, changes, settings = [], [], []
    for position, key in enumerate(args.models, 1):
        spec = DEMO_MODELS[key]
        config = spec.quick if args.quick else spec.full
        console.note(f"[{position}/{len(args.models)}] {key}: loading the zoo model (trained on the first run, then cached)")
        with state.main_process_first():
            model = getattr(zoo, spec.build)(cache_dir=args.cache_dir, progress=args.progress)
        calibration = _demo_subset(model.dataset["calibration"], config.calibration)
        test = _demo_subset(model.dataset["test"], config.test)
        preprocessor = _demo_preprocessor(model.preprocessor, config.max_length)
        settings.append(_demo_settings(model.name, config, calibration, test))
        for method in DEMO_METHODS:
            options = config.neural_clamping if method == "neural_clamping" else {}
            console.note(f"[{position}/{len(args.models)}] {key}: {method} on {len(calibration)} calibration samples")
            calibrated = CalibratedModel.fit(
                model.model, calibration, method=method, preprocessor=preprocessor, dataset_name=spec.dataset,
                split="calibration", **{**flag_options(args), **options},
            )
            fallback = calibrated.fallback_note()
            console.warn(fallback and f"{model.name}, {method}: {fallback} {FALLBACK_SAVED}")
            evaluation = calibrated.evaluate(test, dataset_name=spec.dataset, split="test", bootstrap=args.bootstrap,
                                             **flag_options(args))
            calibrated.save_pretrained(args.output / demo_folder(model.name, method), is_main_process=state.is_main_process)
            rows.append(_demo_row(model.name, method, evaluation))
            changes.append(_demo_change_row(model.name, method, evaluation))
    console.result(_demo_report(rows, changes if args.bootstrap else [], settings, args.quick))
    console.note(f"calibrated models with model cards and reliability diagrams: {args.output}/<model>-<method>/ "
                 f"(demo took {time.perf_counter() - start:.0f} s)")


def demo_folder(model: str, method: str) -> str:
    """The folder (and card title) of one demo calibration, e.g. ``bbc-minilm-l6-neural-clamping``."""
    return f"{model}-{method.replace('_', '-')}"


def _demo_settings(name: str, config: DemoConfig, calibration: Any, test: Any) -> str:
    tokens = f", articles truncated to {config.max_length} tokens" if config.max_length else ""
    schedule = ", ".join(f"{key}={value}" for key, value in config.neural_clamping.items())
    return f"  {name}: {len(calibration)} calibration / {len(test)} test samples{tokens}; Neural Clamping {schedule}"


def _demo_row(model: str, method: str, evaluation: Dict[str, Any]) -> List[str]:
    before, after = evaluation["uncalibrated"], evaluation["calibrated"]
    return [model, method, str(after["num_samples"]), *(f"{before[key]:.4f} → {after[key]:.4f}" for key in DEMO_METRICS)]


def _demo_change_row(model: str, method: str, evaluation: Dict[str, Any]) -> List[str]:
    from .reporting import change_text

    verdicts = evaluation.get("verdicts") or {}
    return [model, method, *(" ".join(filter(None, (change_text(evaluation, key), _short(verdicts.get(key)))))
                             for key in DEMO_CHANGES)]


def _short(verdict: Optional[str]) -> str:
    """A verdict as a table cell shows it."""
    return {"improved": "improved", "made worse": "worse"}.get(verdict, "no change" if verdict else "")


def _demo_report(rows: List[List[str]], changes: List[List[str]], settings: List[str], quick: bool) -> str:
    from .reporting import METRIC_NAMES

    header = ["model", "method", "test n", *(METRIC_NAMES[key] for key in DEMO_METRICS)]
    change_header = ["model", "method", *(f"Δ {METRIC_NAMES[key]} [95% CI]" for key in DEMO_CHANGES)]
    change_table = [
        "Change, calibrated − uncalibrated, with its paired 95% bootstrap interval; 'no change': the interval holds 0, "
        "so this test set cannot tell the change from noise:",
        format_table(change_header, changes),
        "",
    ] if changes else []
    return "\n".join([
        "",
        "Test-split metrics, uncalibrated → calibrated (lower is better except accuracy):",
        format_table(header, rows),
        "",
        *change_table,
        "The demo uses a short Neural Clamping schedule and data subsets to run in about a minute on a laptop CPU"
        + (" (--quick: even smaller; the numbers are noisy)" if quick else "") + ":",
        *settings,
        "The library's default is 500 SGD steps; 20 % of the calibration data select the epoch and fall back to "
        "temperature scaling when δ does not help there.",
    ])


# ============================================================================ entry point


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``hf-calibrate``; returns the exit status (0, 1 for errors, 2 for usage errors)."""
    args = build_parser().parse_args(argv)
    try:
        state = process_state()
        console = Console(state.is_main_process, json_output=getattr(args, "json", False))
        with _library_progress_bars(args.progress), fallback_reported_here():
            args.handler(args, state, console)
        from ._distributed import shut_down

        shut_down()
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as error:  # noqa: BLE001 - every failure ends in one line (or a traceback with --debug)
        if args.debug:
            raise
        sys.stderr.write(f"{PROG}: error: {_one_line(error)}\n")
        return EXIT_ERROR
    return 0


def _one_line(error: BaseException) -> str:
    """The error as one line; errors not caused by the input are marked as unexpected."""
    message = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, (UserError, *USER_ERRORS)):
        return message
    return f"unexpected {type(error).__name__}: {message} (run with --debug for the traceback)"


@contextlib.contextmanager
def _library_progress_bars(enabled: bool) -> Iterator[None]:
    """Switch the progress bars of datasets and transformers off for ``--no-progress``, and off a terminal,
    where each redraw would be a line of the log (restored after)."""
    import datasets
    from transformers.utils import logging as hf_logging

    from ._progress import redraws

    if enabled and redraws():
        yield
        return
    bars = (datasets.is_progress_bar_enabled(), hf_logging.is_progress_bar_enabled())
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            hf_logging.enable_progress_bar()


if __name__ == "__main__":
    sys.exit(main())
