"""Warnings that point at the user's line, however deep in the library they are raised."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType
from typing import Any, Iterator, Set, Tuple, Type

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: libraries whose frames stand between a user's call and the calibrated model (their code is never the user's line)
_CALLING_LIBRARIES = frozenset({"torch", "transformers"})


def _is_library(frame: FrameType) -> bool:
    """Whether ``frame`` runs ``hf_calibrate``'s code, that of a library calling the model (torch's
    ``nn.Module.__call__`` between a user's ``model(x)`` and the calibrated model's ``forward``, a transformers
    pipeline's), or the ``warnings`` module's (that of a warning being shown, which :func:`relayed` says again as its
    own)."""
    name = frame.f_globals.get("__name__") or ""
    return (os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR) or name == warnings.__name__
            or name.split(".")[0] in _CALLING_LIBRARIES)


def user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost caller outside ``hf_calibrate`` (for ``warnings.warn``
    called by the function that calls this)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_library(frame):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category: Type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's code that called into the library."""
    warnings.warn(message, category, stacklevel=user_stacklevel())


@contextlib.contextmanager
def relayed(prefix: str, say: bool = True) -> Iterator[None]:
    """Say each warning raised inside at once, as ``prefix`` + its text at the user's line, once per (category, text);
    with ``say`` False (e.g. on the processes of a distributed fit but the main one), catch them and say nothing.

    Inside, every warning is caught (whatever the filters outside would do with it where it is raised); its relay is
    then shown, ignored or raised by the filters and display in force outside, as any warning of the user's line is.
    For a step that runs other fits, e.g. ``method="auto"``'s candidates: a long fit's time warning reaches the user
    before that fit runs, named, and a warning a fit repeats is said once.
    """
    outside: Tuple[list, Any] = (list(warnings.filters), warnings.showwarning)
    said: Set[Tuple[Type[Warning], str]] = set()

    def relay(message: Any, category: Type[Warning], *where: Any) -> None:
        if not say or (category, str(message)) in said:
            return
        said.add((category, str(message)))
        with warnings.catch_warnings():
            warnings.filters[:], warnings.showwarning = outside
            warn_user(f"{prefix}{message}", category)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = relay
        yield
