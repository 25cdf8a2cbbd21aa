"""What the command line and its ``demo`` command (:mod:`hf_calibrate.demo.command`) share: the console, plain-text
tables, the early check of an output path, the flags every command has, as options, and other libraries' log
messages dropped.

It lies below both :mod:`hf_calibrate.cli` and :mod:`hf_calibrate.demo` (the CLI's parser imports the demo's
command), so neither imports the other for them; the CLI's :mod:`~hf_calibrate.cli.output` and
:mod:`~hf_calibrate.cli.inputs` give the same names. Imports nothing heavy.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

from ._errors import UserError

#: EngineOptions fields with a command-line flag of the same name
FLAG_OPTIONS = ("batch_size", "seed", "mixed_precision", "image_column", "text_column", "label_column", "max_length")


class Console:
    """Output of the main process only: results on stdout, notes on stderr when stdout holds JSON."""

    def __init__(self, is_main: bool, json_output: bool = False) -> None:
        self.is_main = is_main
        self.json_output = json_output

    def result(self, text: str) -> None:
        """A line of the command's result (stdout)."""
        if self.is_main:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """A line about the run (stdout; stderr when stdout holds JSON)."""
        if self.is_main:
            print(text, file=sys.stderr if self.json_output else sys.stdout, flush=True)

    def warn(self, text: Optional[str]) -> None:
        """A ``warning: ...`` line on stderr, something the user should act on (nothing when ``text`` is None)."""
        if self.is_main and text is not None:
            print(f"warning: {text}", file=sys.stderr, flush=True)


def check_writable(path: Path, flag: str, *, folder: bool, replaceable: Optional[Callable[[Path], None]] = None) -> None:
    """Fail early, before any compute, when ``path`` (a folder or a file) cannot be written.

    ``replaceable(path)``: the writer's own check, raising FileExistsError when what is at ``path`` (or in it) holds
    something the command would replace but cannot prove it wrote (:mod:`hf_calibrate._output_files`); its message
    becomes the error's.
    """
    if path.exists() and path.is_dir() != folder:
        raise UserError(f"{flag} {path} exists and is {'not ' if folder else ''}a folder.")
    if path.is_symlink() and not path.exists():
        raise UserError(f"{flag} {path} is a symbolic link to {os.readlink(path)}, which does not exist; name another path.")
    try:
        if replaceable is not None:
            replaceable(path)
    except FileExistsError as error:
        raise UserError(f"{flag}: {error}") from None
    parent = path.absolute().parent
    dangling = next((folder for folder in (parent, *parent.parents) if folder.is_symlink() and not folder.exists()), None)
    if dangling is not None:
        raise UserError(f"{flag} {path}: {dangling} is a symbolic link to {os.readlink(dangling)}, which does not exist; "
                        "name another path.")
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


def flag_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Engine and data options set by flags (``--batch-size``, ``--label-column``, ...), left out when not given."""
    options = {name: getattr(args, name, None) for name in FLAG_OPTIONS}
    options = {name: value for name, value in options.items() if value is not None}
    if not args.progress:
        options["progress"] = False
    return options


class _DropMessages(logging.Filter):
    """Logging filter that drops records whose message contains one of ``markers``."""

    def __init__(self, *markers: str) -> None:
        super().__init__()
        self.markers = markers

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(marker in message for marker in self.markers)


@contextlib.contextmanager
def messages_dropped(logger: str, *markers: str) -> Iterator[None]:
    """Inside, the records of the ``logging`` logger named ``logger`` whose message contains one of ``markers`` are
    dropped (a filter of that logger: records of its children are not); removed after."""
    drop = _DropMessages(*markers)
    logging.getLogger(logger).addFilter(drop)
    try:
        yield
    finally:
        logging.getLogger(logger).removeFilter(drop)
