"""Where the Hugging Face ``evaluate`` modules of this library are, once installed: one documented way to load them.

The modules (``ece``, ``classwise_ece``, ``nll``, ``brier``, ``calibration``) ship inside the package
(``hf_calibrate/evaluate_metrics/<name>/``; a checkout also has them at its top level, ``evaluate_metrics/``),
each a folder ready to push as a Hugging Face metric Space (module, README card, ``app.py``, ``requirements.txt``)::

    import evaluate
    from hf_calibrate import evaluate_module_path

    ece = evaluate.load(evaluate_module_path("ece"))

Every docstring and card example loads its module this way: it runs for whoever installed the package, and under
evaluate's own module test, whose patched ``evaluate.load`` loads an absolute path as it is. Each ``_compute``
takes every option as an explicit keyword parameter (that test refuses ``**kwargs``). A folder pushed as a Space
must be named after its module: ``evaluate.load("<namespace>/ece")`` fetches ``ece.py`` from the Space
``<namespace>/ece``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

#: the modules shipped, each ``evaluate_metrics/<name>/<name>.py``
EVALUATE_MODULES: Tuple[str, ...] = ("ece", "classwise_ece", "nll", "brier", "calibration")


def evaluate_module_path(name: str) -> str:
    """The folder of the installed ``evaluate`` module ``name`` (one of :data:`EVALUATE_MODULES`), for
    ``evaluate.load(...)``; an unknown name is a ValueError listing the modules.

    Example:
        >>> from pathlib import Path
        >>> Path(evaluate_module_path("ece"), "ece.py").is_file()
        True
    """
    if name not in EVALUATE_MODULES:
        raise ValueError(f"no evaluate module {name!r}; the modules are: {', '.join(EVALUATE_MODULES)}.")
    return str(Path(__file__).with_name("evaluate_metrics") / name)
