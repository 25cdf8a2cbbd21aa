"""Progress bars that redraw in a terminal and write a line per stage in a log.

tqdm redraws a bar with ``\\r``; in a CI log, a batch job's output or a file each redraw becomes
a line of its own (a demo run from a fresh clone logged thousands). :func:`progress_bar` gives
tqdm's bar where it can redraw — a terminal (stderr is a TTY), a notebook or an IPython kernel —
and elsewhere a :class:`StageLine`, which writes ``<description>: <done>/<total> <unit> in
<seconds> s`` when its stage ends and, while it runs, ``..., <seconds> s so far`` at most every
:data:`HEARTBEAT_SECONDS` (a silent job looks hung, and CI services kill jobs silent for ~10 min).
A transient stage (``leave=False``, e.g. a held-out check inside a fit) writes its line only if
it took :data:`HEARTBEAT_SECONDS` or more. ``TQDM_DISABLE`` set to a true value turns every bar off.
:func:`library_progress_bars` switches the bars of ``datasets`` and ``transformers`` off where ours are.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Iterable, Iterator, Optional

from tqdm.auto import tqdm

#: seconds between the interim lines of a running stage, and the least a transient stage must take to be logged
HEARTBEAT_SECONDS = 60.0


def redraws() -> bool:
    """Whether a bar can redraw in place here: a notebook widget, an IPython kernel, or stderr is a terminal."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__) or "ipykernel" in sys.modules:
        return True  # tqdm.auto picked its widget, or a kernel's console that handles \r
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, one without isatty, or a closed one
        return False


def _disabled_by_environment() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no")


class StageLine:
    """A stand-in for a tqdm bar off a terminal: counts quietly and writes a line when the stage ends.

    Supports what the library uses of a bar: iteration, ``update``, ``set_postfix(**values)``
    (the last values go on the line), ``close`` and ``with``.
    """

    def __init__(self, iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None, desc: str = "", unit: str = "it",
                 leave: bool = True) -> None:
        self.iterable, self.desc, self.unit, self.leave = iterable, desc, unit, leave
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
        self.n, self.postfix, self.closed = 0, {}, False
        self.started = self.last_line = time.perf_counter()

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.update()
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last_line >= HEARTBEAT_SECONDS:
            self.last_line = now
            self._write(f"{now - self.started:.0f} s so far")

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        elapsed = time.perf_counter() - self.started
        if self.leave or elapsed >= HEARTBEAT_SECONDS:
            self._write(f"in {elapsed:.1f} s")

    def _write(self, when: str) -> None:
        if sys.stderr is None:  # pythonw, some daemons: nowhere to log, and stdout may carry results
            return
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        postfix = "".join(f", {key}={value}" for key, value in self.postfix.items())
        print(f"{self.desc}: {done} {self.unit} {when}{postfix}", file=sys.stderr, flush=True)

    def __enter__(self) -> "StageLine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress_bar(iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None, desc: str = "", enabled: bool = True,
                 unit: str = "it", leave: bool = True) -> Any:
    """tqdm's bar where it redraws (:func:`redraws`), a :class:`StageLine` elsewhere; nothing when not
    ``enabled`` or when ``TQDM_DISABLE`` is set."""
    if not enabled or _disabled_by_environment():
        return tqdm(iterable, total=total, desc=desc, disable=True)
    if redraws():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave)
    return StageLine(iterable, total=total, desc=desc, unit=unit, leave=leave)


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """The progress bars of ``datasets`` (``Dataset.map``'s, e.g. matching labels to the model's) and ``transformers``
    as the user set them when ``enabled``; off inside otherwise, and set back as they were after."""
    if enabled:
        yield
        return
    import datasets
    from transformers.utils import logging as hf_logging

    bars = (datasets.is_progress_bar_enabled(), hf_logging.is_progress_bar_enabled())
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars[0]:
            datasets.enable_progress_bars()
        if bars[1]:
            hf_logging.enable_progress_bar()
