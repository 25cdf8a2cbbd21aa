"""The ``hf-calibrate`` command line: ``fit``, ``evaluate``, ``compare`` and ``demo``.

A thin layer over the library: it turns arguments into a model (timm architecture name, hub repo
id or local folder: :mod:`hf_calibrate.model_loading`), ``datasets`` splits (hub id or local
folder/file: :mod:`hf_calibrate.data.reading`) and calls :meth:`CalibratedModel.fit`,
:meth:`~CalibratedModel.evaluate`, :meth:`~CalibratedModel.save_pretrained` and
:meth:`~CalibratedModel.push_to_hub`.

Every command runs unchanged under ``accelerate launch`` / ``torchrun``: all processes
compute, only the main process prints and writes. A problem with the user's input ends the
command with one ``hf-calibrate: error: ...`` line on stderr and a non-zero exit status
(``--debug`` shows the traceback instead).

Rooms: :mod:`.parser` (flags, help, examples), :mod:`.commands` (the handlers of fit, evaluate,
compare; the demo's is :mod:`hf_calibrate.demo.command`), :mod:`.inputs` (arguments → library
inputs), :mod:`.output` (console, tables, diagram), :mod:`.metric_keys`, :mod:`.entry` (``main``).
Nothing heavy is imported before a command runs, so ``--help`` and ``--version`` answer at once.
"""

from __future__ import annotations

from .._errors import UserError
from .commands import run_compare, run_evaluate, run_fit, save_and_push
from .entry import EXIT_ERROR, USER_ERRORS, main
from .inputs import FLAG_OPTIONS, engine_options, fit_options, fit_splits, flag_options, load_data, process_state
from .metric_keys import COMPARE_METRICS, DEMO_CHANGES, DEMO_METRICS, TABLE_METRICS
from .output import Console, check_writable, draw_diagram, fit_warnings_reported_here, format_table, metric_table
from .parser import EXIT_USAGE, PROG, ArgumentParser, build_parser, parse_option

__all__ = [
    "COMPARE_METRICS", "DEMO_CHANGES", "DEMO_METRICS", "EXIT_ERROR", "EXIT_USAGE", "FLAG_OPTIONS", "PROG", "TABLE_METRICS",
    "USER_ERRORS", "ArgumentParser", "Console", "UserError", "build_parser", "check_writable", "draw_diagram",
    "engine_options", "fit_options", "fit_splits", "fit_warnings_reported_here", "flag_options", "format_table", "load_data",
    "main", "metric_table", "parse_option", "process_state", "run_compare", "run_evaluate", "run_fit", "save_and_push",
]
