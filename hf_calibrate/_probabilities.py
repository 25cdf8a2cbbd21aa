"""Outputs that are probabilities, not logits (layer 0: torch only).

A model whose forward ends in a softmax returns (N, C) rows p that are non-negative and sum to 1.
Every method calibrates logits z through softmax(z); fed p, it would calibrate softmax(p), a
flattened copy of the model's probabilities. Their log is what to read instead: log p = z − logsumexp(z)
is the logits up to a per-row constant, which softmax ignores, so softmax(log p) = p exactly.

* :func:`are_softmax_rows`: whether rows read as a softmax's (non-negative, summing to 1 within
  :data:`PROBABILITY_SUM_TOLERANCE`);
* :func:`rows_not_softmax`: the positions of finite rows that do not (for a check of every batch);
* :func:`as_logits`: log p in float32 at least, with zeros read as that dtype's smallest normal number;
* :func:`at_floor`: the rows of such logits that hold that number: a probability that underflowed. A model
  sure of many rows gives them equal outputs, so equal rows holding it need not be copies of one input.
"""

from __future__ import annotations

from typing import List

import torch

#: the outputs of a base model whose forward ends in a softmax (the record's ``input_contract.outputs``)
PROBABILITIES = "probabilities"
#: the outputs of every other base model
LOGITS = "logits"

#: a row of non-negative values reads as probabilities when its sum is within this of 1, for any number of classes:
#: each value of a float16 (bfloat16) softmax is rounded within 2⁻¹¹ (2⁻⁸) of itself, so its row sums to 1 within
#: 2⁻¹¹ (2⁻⁸ ≈ 4e-3); real logits are negative somewhere, or sum to anything, and a sigmoid's rows rarely sum to 1
PROBABILITY_SUM_TOLERANCE = 1e-2


def rows_not_softmax(rows: torch.Tensor) -> List[int]:
    """Positions of the finite rows of (N, C) ``rows`` that are negative somewhere or do not sum to 1 within
    :data:`PROBABILITY_SUM_TOLERANCE` (a row holding NaN or ±inf is left to the checks of non-finite values)."""
    sums = rows.sum(dim=1, dtype=torch.float64)
    bad = torch.isfinite(rows).all(dim=1) & ((rows.amin(dim=1) < 0) | ((sums - 1).abs() > PROBABILITY_SUM_TOLERANCE))
    return bad.nonzero().squeeze(1).tolist()


def are_softmax_rows(rows: torch.Tensor) -> bool:
    """Whether (N, C) ``rows``, N ≥ 1 and C ≥ 2, all read as a softmax's output (:func:`rows_not_softmax` is empty).

    Example:
        >>> are_softmax_rows(torch.softmax(torch.randn(4, 3), dim=1)), are_softmax_rows(torch.randn(4, 3))
        (True, False)
    """
    return (rows.ndim == 2 and rows.shape[0] >= 1 and rows.shape[1] >= 2 and bool(torch.isfinite(rows).all())
            and not rows_not_softmax(rows))


def _log_floor(dtype: torch.dtype) -> torch.Tensor:
    """log of the smallest normal number of ``dtype``, as :func:`as_logits` computes it (≈ −87.3 in float32)."""
    return torch.log(torch.tensor(torch.finfo(dtype).tiny, dtype=dtype))


def as_logits(probabilities: torch.Tensor) -> torch.Tensor:
    """log p of (N, C) ``probabilities``, in float32 (float64 ones in float64): a float16 p is read exactly, not
    rounded up to float16's smallest normal number; a 0 reads as that dtype's smallest normal number (log ≈ −87.3),
    so that every result is finite and softmax of it gives ``probabilities`` back.

    Example:
        >>> p = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
        >>> torch.softmax(as_logits(p), dim=1)
        tensor([[0.2500, 0.7500],
                [1.0000, 0.0000]])
    """
    values = probabilities.to(torch.promote_types(probabilities.dtype, torch.float32))
    return torch.log(values.clamp_min(torch.finfo(values.dtype).tiny))


def at_floor(rows: torch.Tensor) -> torch.Tensor:
    """(N,) whether each row of (N, ...) float ``rows`` holds :func:`as_logits`' value for an underflowed probability
    (all False for other dtypes than float32 and float64)."""
    if rows.dtype not in (torch.float32, torch.float64):
        return torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
    return (rows.reshape(len(rows), -1) == _log_floor(rows.dtype).to(rows.device)).any(dim=1)
