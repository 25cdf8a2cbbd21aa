"""The error of a problem with the user's input (layer 0: no imports of ours)."""

from __future__ import annotations


class UserError(ValueError):
    """A model, dataset or option the user named cannot be used as given; the message says what to change.

    The command line reports it as one ``hf-calibrate: error: ...`` line, without a traceback.
    """
