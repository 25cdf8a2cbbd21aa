"""Progress bars that redraw in a terminal and write one line per stage in a log.

tqdm redraws a bar with ``\\r``; in a CI log, a batch job's output or a file each redraw becomes
a line of its own (a demo run from a fresh clone logged thousands). :func:`progress_bar` gives
tqdm's bar where it can redraw — a terminal (stderr is a TTY) or a notebook (``tqdm.auto``
chose its widget) — and elsewhere a :class:`StageLine`, which counts silently and writes one
line when its stage ends: ``<description>: <done>/<total> <unit> in <seconds> s``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, Optional

from tqdm.auto import tqdm


def redraws() -> bool:
    """Whether a bar can redraw in place here: a notebook widget, or stderr is a terminal."""
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):  # tqdm.auto picked its notebook widget
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class StageLine:
    """A stand-in for a tqdm bar off a terminal: counts quietly, writes one line when closed.

    Supports what the library uses of a bar: iteration, ``update``, ``set_postfix`` (the last
    values go on the line), ``close`` and ``with``.
    """

    def __init__(self, iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None, desc: str = "", unit: str = "it") -> None:
        self.iterable, self.desc, self.unit = iterable, desc, unit
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
        self.n, self.postfix, self.started, self.closed = 0, {}, time.perf_counter(), False

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable or ():
                yield item
                self.n += 1
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        postfix = "".join(f", {key}={value}" for key, value in self.postfix.items())
        print(f"{self.desc}: {done} {self.unit} in {time.perf_counter() - self.started:.1f} s{postfix}", file=sys.stderr, flush=True)

    def __enter__(self) -> "StageLine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress_bar(iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None, desc: str = "", enabled: bool = True,
                 unit: str = "it", leave: bool = True) -> Any:
    """tqdm's bar where it redraws (:func:`redraws`), a :class:`StageLine` elsewhere; nothing when not ``enabled``."""
    if not enabled:
        return tqdm(iterable, total=total, desc=desc, disable=True)
    if redraws():
        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave)
    return StageLine(iterable, total=total, desc=desc, unit=unit)
