"""Arguments → the library's inputs: fit and engine options, the splits by role, the process state."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from .._console import FLAG_OPTIONS, flag_options
from .._errors import UserError

if TYPE_CHECKING:
    from ..data.reading import LoadedData

__all__ = [
    "FLAG_OPTIONS", "engine_options", "fit_options", "fit_splits", "flag_options", "load_data", "per_method_options",
    "process_state",
]


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


def per_method_options(pairs: Sequence[Any], methods: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """compare's ``--option`` pairs as {method: its options}: ``METHOD.KEY=VALUE`` for that method only,
    ``KEY=VALUE`` for every method (engine options such as ``batch_size``). Each method's options are checked (name,
    type, range) as its fit checks them, before anything is fitted: a typo for the last method costs no earlier fit."""
    options: Dict[str, Dict[str, Any]] = {method: {} for method in methods}
    for key, value in pairs:
        method, dot, name = key.rpartition(".")
        targets = [method] if dot else list(methods)
        if dot and method not in options:
            raise UserError(f"--option {key}=...: {method!r} is not one of --methods ({','.join(methods)}); write "
                            f"METHOD.KEY=VALUE with one of them, or KEY=VALUE for every method.")
        for target in targets:
            if name in options[target]:
                raise UserError(f"--option {key}=... sets {name} of {target} twice.")
            options[target][name] = value
    for method, own in options.items():
        _check_method_options(method, own)
    return options


def _check_method_options(method: str, own: Dict[str, Any]) -> None:
    """The error ``fit`` would give ``method`` for its ``--option`` values, as a usage error, now."""
    from ..fitting.calibrate import resolve_method, split_options

    try:
        split_options(resolve_method(method), own)
    except (TypeError, ValueError) as error:
        raise UserError(f"--option for {method}: {error}") from None


def engine_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The options of ``options`` that every fit and evaluation takes (``EngineOptions`` fields)."""
    from ..fitting import EngineOptions

    names = {field.name for field in dataclasses.fields(EngineOptions)}
    return {name: value for name, value in options.items() if name in names}


def fit_splits(args: argparse.Namespace, available: Sequence[str]) -> Dict[str, str]:
    """The split of each role of ``fit``: calibration, validation (when given) and evaluation — the one given,
    else a held-out split the fit does not use (:func:`hf_calibrate.results.reporting.held_out_split`), else none."""
    from ..data.reading import select_split
    from ..results.reporting import held_out_split

    chosen = {"calibration": select_split(available, args.split, ("calibration", "validation"), "--split")}
    if args.validation_split:
        chosen["validation"] = select_split(available, args.validation_split, (), "--validation-split")
    held_out = held_out_split(available, set(chosen.values()))
    if args.eval_split or held_out:
        chosen["evaluation"] = select_split(available, args.eval_split or held_out, (), "--eval-split")
    return chosen


def load_data(
    args: argparse.Namespace, backbone: Any, state: Any, label_column: Optional[str],
    choose_splits: Callable[[List[str]], Dict[str, str]],
) -> LoadedData:
    """The splits of ``--dataset`` that ``choose_splits`` picks (role → split name), labels aligned; read by the main
    process first (it fills the ``datasets`` cache the others then read)."""
    from ..data.reading import read_labelled_splits

    with state.main_process_first():
        return read_labelled_splits(args.dataset, backbone, choose_splits, label_column=label_column, token=args.token)


def process_state() -> Any:
    """The ``Accelerator`` of this process (sets up the process group under torchrun / accelerate launch).

    Made as the fits make theirs, so that environment settings such as ``ACCELERATE_USE_CPU``
    apply (a bare ``PartialState()`` ignores them).
    """
    from accelerate import Accelerator

    return Accelerator()
