"""Reading the user's data without moving their random state.

Drawing a sampler's indices, or the first batch of a loader, draws from torch's global generator (a ``DataLoader``
iterator's base seed, a ``RandomSampler`` without a generator), from a sampler's or loader's own ``generator``, or
(custom samplers) from Python's ``random`` or numpy's global generator. :func:`preserved_random_state` puts them all
back, so that the user's next epoch draws what it would have drawn.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator, List

import numpy as np
import torch


@contextlib.contextmanager
def preserved_random_state(*holders: Any) -> Iterator[None]:
    """Restore, on exit, torch's global CPU generator, Python's and numpy's global generators, and the ``generator`` of
    each of ``holders`` (a loader, sampler or batch sampler and the sampler it wraps) that has a torch one."""
    generators = _own_generators(holders)
    states = [generator.get_state() for generator in generators]
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        for generator, state in zip(generators, states):
            generator.set_state(state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _own_generators(holders: Any) -> List[torch.Generator]:
    found: List[torch.Generator] = []
    for holder in holders:
        for owner in (holder, getattr(holder, "sampler", None)):
            generator = getattr(owner, "generator", None)
            if isinstance(generator, torch.Generator) and all(generator is not seen for seen in found):
                found.append(generator)
    return found
