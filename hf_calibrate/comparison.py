"""Old path of :mod:`hf_calibrate.results.comparison`, kept for users: importing it gives that very module.

``import hf_calibrate.comparison``, ``from hf_calibrate import comparison`` and ``from hf_calibrate.comparison import ...`` keep working:
this module puts :mod:`hf_calibrate.results.comparison` in its own place in ``sys.modules``, so both names are one
object (monkeypatching either changes both). New code imports ``hf_calibrate.results.comparison``.
"""

import sys

from . import _auto_registration
from .results import comparison

sys.modules[__name__] = comparison
# Like every module of the package that may be the one that first imports transformers: a registration with
# transformers that waited for this import to end is done now.
_auto_registration.finish_pending(__name__)
