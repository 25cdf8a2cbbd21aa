"""Warnings that point at the user's line, however deep in the library they are raised."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Type

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost caller outside ``hf_calibrate`` (for ``warnings.warn``
    called by the function that calls this)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category: Type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's code that called into the library."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
