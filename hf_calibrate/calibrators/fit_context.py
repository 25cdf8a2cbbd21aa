"""The context a logit fit runs in: how it reports (progress, Ctrl-C, time warnings) and what its caller knows of the
rows (their content groups). ``Calibrator.fit_logits`` sets it (:func:`fitting_in`); a fit reads it with
:func:`fit_context`, so the fits' signatures carry only their data and options."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Optional

import torch
from tqdm.auto import tqdm


def _no_progress(total: int, description: str) -> tqdm:
    return tqdm(total=total, desc=description, disable=True)


@dataclasses.dataclass(frozen=True)
class FitContext:
    """How a logit fit reports on itself; the fitting engine passes one to :meth:`Calibrator.fit_logits`.

    Attributes:
        progress: ``(total, description) -> bar`` for a progress bar with ``update`` and
            ``set_postfix`` (the engine's: tqdm's in a terminal, a line per stage in a log, on the
            main process only; ``hf_calibrate._progress``); the default shows none.
        interruptible: whether Ctrl-C (KeyboardInterrupt) during a long iterative fit stops it
            early and keeps the best state so far (the engine allows it in one process only:
            processes interrupted at different iterations would disagree). Default False.
        announce: whether a fit that may take long says so first, with a time bound (a
            warning; the engine: on the main process only). Default True.
        groups: the (N,) content ids of the rows to be fitted (:func:`.holdout.content_groups`: a row and its copies
            share one), when the caller has them; None (default): the fit computes them (0.5 s at 25,000 × 1,000).
    """

    progress: Callable[[int, str], Any] = _no_progress
    interruptible: bool = False
    announce: bool = True
    groups: Optional[torch.Tensor] = None


_FIT_CONTEXT: contextvars.ContextVar[FitContext] = contextvars.ContextVar("fit_context", default=FitContext())


def fit_context() -> FitContext:
    """The :class:`FitContext` of the logit fit running now (defaults outside one)."""
    return _FIT_CONTEXT.get()


@contextlib.contextmanager
def fitting_in(context: Optional[FitContext]) -> Iterator[None]:
    """Run the block in ``context`` (None: the defaults), restoring the one before on exit."""
    token = _FIT_CONTEXT.set(context or FitContext())
    try:
        yield
    finally:
        _FIT_CONTEXT.reset(token)
