"""``main``: parse, run the command's handler, end every failure in one line (or a traceback with ``--debug``)."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, Optional, Sequence, Tuple

from .._errors import UserError
from .inputs import process_state
from .output import Console, fit_warnings_reported_here, library_noise_dropped, warnings_as_lines
from .parser import PROG, build_parser

EXIT_ERROR = 1
# Error types that describe a problem with the user's input, printed without "unexpected".
USER_ERRORS: Tuple[type, ...] = (ValueError, TypeError, OSError, ImportError, FloatingPointError)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``hf-calibrate``; returns the exit status (0, 1 for errors, 2 for usage errors)."""
    args = build_parser().parse_args(argv)
    try:
        state = process_state()
        console = Console(state.is_main_process, json_output=getattr(args, "json", False))
        with (_library_progress_bars(args.progress), library_noise_dropped(), fit_warnings_reported_here(),
              warnings_as_lines(console)):
            args.handler(args, state, console)
        from .._distributed import shut_down

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
    from .._progress import library_progress_bars, redraws

    with library_progress_bars(enabled and redraws()):
        yield
