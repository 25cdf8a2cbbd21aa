"""The hold-out split rule: which samples a fit holds out to select on, from the fit's seed.

One rule for every fit that holds data out: the fitting engine's ``Engine.split_indices`` (Neural
Clamping, the head methods) and the λ selection of matrix scaling and Dirichlet calibration
(:mod:`.linear`), so the same seed and sample count hold out the same samples (docs/design.md §3.0).
"""

from __future__ import annotations

from typing import Tuple

import torch

#: salt of the hold-out split's generator (with the seed and the sample count)
HOLDOUT_SALT = 0xC0FFEE


def seeded_generator(seed: int, *salt: int) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and ``salt`` (the fitting engine's ``Engine.generator`` for its seed)."""
    generator = torch.Generator()
    generator.manual_seed(hash((seed, *salt)) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


def holdout_split(count: int, holdout_fraction: float, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded (fit, holdout) split of ``range(count)``: sorted int64 indices, ``round(holdout_fraction · count)`` held out.

    The holdout is empty for fraction 0. A positive fraction that would hold out no sample, or every
    sample, is a ValueError saying how many samples each part would get.
    """
    permutation = torch.randperm(count, generator=seeded_generator(seed, count, HOLDOUT_SALT))
    holdout = int(round(holdout_fraction * count))
    if holdout_fraction > 0 and (holdout < 1 or holdout >= count):
        raise ValueError(
            f"holdout_fraction={holdout_fraction} leaves {count - holdout} of {count} samples to fit and "
            f"{holdout} to select on; use more calibration data or holdout_fraction=0."
        )
    return permutation[holdout:].sort().values, permutation[:holdout].sort().values
