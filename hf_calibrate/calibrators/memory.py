"""A logit fit's peak memory, estimated from its size before anything is allocated, and refused when it cannot fit.

Each logit method declares its :class:`Footprint` (``Calibrator.footprint``): how many (N, C) arrays and how many
(C, C) arrays of its working dtype it holds at its peak. A full C×C map at C = 10,000 has 10⁸ weights and L-BFGS keeps
:data:`~.solvers.lbfgs.HISTORY_SIZE` pairs of such vectors besides the gradient, the best state and the line search's
copies, so a matrix fit of 50 rows needs tens of GB. ``Calibrator.fit_logits`` compares the estimate with the memory
free on the device the logits are on (:func:`check_fits`) and raises :class:`FitTooLargeError`, naming both and the
fix, before the fit allocates anything. The footprints are counted from each fit's code and checked against the
resident memory measured in benchmarks/results/fit_cost.md.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import psutil
import torch

from .._errors import UserError

#: what an estimate may use of the free memory: the rest is for everything else (the model, Python, rounding)
HEADROOM = 0.8
#: up to this many logits (or map weights: C ≥ 257 classes is always above) a logit fit works in float64; larger
#: problems use float32, as probmetrics does at every size. From 1,000 × 100 logits on, float32 fitted the linear maps in
#: 0.34–0.77 of float64's time (TS and binning: the same time) at held-out NLL within 3e-5 nats of it, either side
#: (benchmarks/results/fit_precision.md: at C = 10 and 100). Logits sharing a large offset (1e4) lose digits in float32: a matrix fit there stopped at a
#: higher fitted NLL (3.482 against 3.468), its held-out NLL within 4e-5.
FLOAT64_MAX_ELEMENTS = 1 << 16
#: (N, C) arrays of the working dtype that finding the rows' copies holds (:func:`.holdout.content_groups`: a float64
#: copy of the logits), counted in every estimate: a fit computes them when its caller has not
GROUPING_ROWS = 2
#: the way out of a refusal when the fit's C×C map is what does not fit
SMALLER_MAP = ("Use structured_vector, vector or temperature scaling (one scale and bias per class: megabytes), or fit "
               "on a machine with more memory.")


class FitTooLargeError(UserError, MemoryError):
    """A fit would need more memory than the device it runs on has free; the message gives both and the way out."""


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a logit fit holds at its peak, in arrays of its working dtype (:func:`work_dtype`).

    Attributes:
        rows: (N, C) arrays: the logits' working copy, features, probabilities, gradients.
        maps: (C, C) arrays (with their C biases): a full map, its gradient, L-BFGS's history and line search.
        advice: the way out said when the fit is refused.
        stacked: values held besides, at most, by the arrays of a joint fit of stacked problems (a cross-fitted check
            on small data: :mod:`.solvers.linear_maps`).
    """

    rows: float
    maps: float = 0.0
    advice: str = "Fit on fewer rows, or on a machine with more memory."
    stacked: int = 0

    def bytes(self, rows: int, classes: int) -> int:
        """Peak bytes of a fit on (rows, classes) logits, finding the rows' copies included (:data:`GROUPING_ROWS`)."""
        element_size = torch.finfo(work_dtype(rows, classes)).bits // 8
        row_arrays = self.rows + GROUPING_ROWS
        return int(element_size * (row_arrays * rows * classes + self.maps * (classes * classes + classes) + self.stacked))


def work_dtype(rows: int, classes: int) -> torch.dtype:
    """float64 while the logits and a C×C map are small (:data:`FLOAT64_MAX_ELEMENTS`), else float32."""
    return torch.float64 if max(rows * classes, classes * classes) <= FLOAT64_MAX_ELEMENTS else torch.float32


def free_bytes(device: torch.device) -> Optional[int]:
    """Bytes free for a new allocation on ``device``: an accelerator's free memory plus what torch's cache holds, the
    host's available memory for the CPU, None for other devices (not checked)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu":
        return int(psutil.virtual_memory().available)
    return None


def check_fits(footprint: Footprint, rows: int, classes: int, what: str, device: torch.device) -> None:
    """Raise :class:`FitTooLargeError` when ``footprint`` on (rows, classes) exceeds :data:`HEADROOM` of
    :func:`free_bytes` on ``device``; ``what`` names the fit in the message."""
    needed, free = footprint.bytes(rows, classes), free_bytes(device)
    if free is None or needed <= HEADROOM * free:
        return
    raise FitTooLargeError(f"{what} needs about {_in_words(needed)} of memory at its peak, and {device.type} has "
                           f"{_in_words(free)} free. {footprint.advice}")


def _in_words(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"
