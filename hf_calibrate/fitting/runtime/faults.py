"""Bad data found on one process, raised on every process.

Under several processes each one sees only its share of a global batch. An error raised
where a bad sample is found would stop that process alone: the others would wait in the
next collective until the launcher killed them with a bare "connection closed by peer".
So a fault is *noted* where it is found (:meth:`FaultLedger.note`), the offending values are
made harmless (:func:`neutralise`) so the process reaches the batch's synchronisation point,
and there every process raises the same error (:meth:`FaultLedger.raise_agreed`), naming the
samples of all processes. In one process this is the same error, one batch step later.

The engine calls :meth:`FaultLedger.raise_agreed` where it already synchronises (gathering
outputs, summing gradients); a loop that consumes batches without either calls it itself.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Type

import torch

from ... import _distributed
from ...backbones import Inputs, outside_vocabulary
from ...data import CalibrationData
from ...metrics._checks import NonFiniteError, describe_positions, nonfinite_rows

SAMPLES = "{samples}"  # stands for the sample positions in a fault's message
ERRORS: Sequence[Type[ValueError]] = (NonFiniteError, ValueError)  # what a fault may raise, by code


@dataclasses.dataclass
class _Fault:
    error: Type[ValueError]
    message: str  # may hold SAMPLES
    positions: List[int]
    describe: Callable[[Sequence[int]], str]  # the positions in words (the data's: with the user's batches)


class FaultLedger:
    """The first fault this process found since the last synchronisation point."""

    def __init__(self) -> None:
        self._fault: Optional[_Fault] = None

    def note(self, error: Type[ValueError], message: str, positions: Sequence[int] = (),
             describe: Callable[[Sequence[int]], str] = describe_positions) -> None:
        """Remember a fault; later faults with the same message add their positions, others are dropped.
        ``describe`` puts the positions in words (:meth:`~hf_calibrate.data.PreparedData.describe_samples`)."""
        if self._fault is None:
            self._fault = _Fault(error, message, [], describe)
        if self._fault.message == message:
            self._fault.positions.extend(int(p) for p in positions)

    def renumber(self, index_of: Callable[[int], int]) -> None:
        """Replace the noted positions by ``index_of(position)`` (a stream's first pass notes its own running positions)."""
        if self._fault is not None:
            self._fault.positions = [index_of(position) for position in self._fault.positions]

    def raise_agreed(self, device: torch.device) -> None:
        """Collective: raise the first-ranked process's fault on every process, if any process has one.

        Every process must call this at the same point of every global batch.
        """
        fault, self._fault = self._fault, None
        code = torch.tensor([0 if fault is None else 1 + ERRORS.index(fault.error)], device=device)
        codes = [int(c) for c in _distributed.all_gather_parts(code)]
        if not any(codes):
            return
        messages = _distributed.all_gather_text(fault.message if fault else "", device)
        held = torch.tensor(fault.positions if fault else [], dtype=torch.int64, device=device)
        positions = _distributed.all_gather_parts(held)
        first = next(rank for rank, value in enumerate(codes) if value)
        samples = sorted({int(p) for rank, part in enumerate(positions) if messages[rank] == messages[first] for p in part})
        words = fault.describe(samples) if _distributed.rank() == first else ""  # the first faulty process's words, for all
        raise ERRORS[codes[first] - 1](messages[first].replace(SAMPLES, _distributed.all_gather_text(words, device)[first]))

    def raise_local(self) -> None:
        """Raise a fault that no synchronisation point raised (a loop that never called :meth:`raise_agreed`)."""
        fault, self._fault = self._fault, None
        if fault is not None:
            raise fault.error(fault.message.replace(SAMPLES, fault.describe(sorted(set(fault.positions)))))


def neutralise(values: torch.Tensor) -> torch.Tensor:
    """``values`` with NaN and ±inf replaced by 0, so a doomed batch still runs to its synchronisation point."""
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)


def note_bad_inputs(ledger: FaultLedger, data: CalibrationData, inputs: Inputs, positions: Sequence[int]) -> Inputs:
    """Note floating inputs holding NaN or ±inf, and token ids outside the model's vocabulary or token types
    (``data.token_vocabularies``); return the inputs neutralised, so that the batch runs to its synchronisation point.

    ``positions`` are the dataset indices of the micro-batch's rows.
    """
    checked = dict(inputs)
    for key, value in inputs.items():
        rows = nonfinite_rows(value) if isinstance(value, torch.Tensor) else []
        if rows:
            ledger.note(NonFiniteError, nonfinite_inputs_message(data, key), [positions[row] for row in rows], data.describe_samples)
            checked[key] = neutralise(value)
    for key, vocabulary in data.token_vocabularies.items():
        ids = checked.get(key)
        outside = (ids < 0) | (ids >= vocabulary) if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None
        rows = outside.flatten(1).any(1).nonzero().flatten().tolist() if outside is not None and outside.ndim >= 2 else []
        if rows:
            ledger.note(ValueError, _token_ids_message(data, key, vocabulary), [positions[row] for row in rows], data.describe_samples)
            checked[key] = ids.masked_fill(outside, 0)
    return checked


def _where(data: CalibrationData) -> str:
    """The data bad samples are in, and how they are counted: their positions in the user's data (and the user's
    batches, when the data come in batches), never the fit's own batches, which the user never saw."""
    return f"the {data.role}, {data.description} (positions in that data, counted from 0 in the order the data give them)"


def nonfinite_inputs_message(data: CalibrationData, key: str) -> str:
    return (
        f"input {key!r} holds NaN or infinite values in sample(s) {SAMPLES} of {_where(data)}. Calibrating or evaluating "
        "on them would give wrong confidences; remove or impute these samples (or fix the preprocessing that produced them)."
    )


def _token_ids_message(data: CalibrationData, key: str, vocabulary: int) -> str:
    return f"input {key!r} holds token ids in sample(s) {SAMPLES} of {_where(data)} {outside_vocabulary(key, vocabulary)}"


def nonfinite_outputs_message(data: CalibrationData, what: str) -> str:
    source = "the calibrated model" if what.startswith("calibrated") else "the base model"
    return (
        f"{source} returned NaN or infinite {what} for sample(s) {SAMPLES} of {_where(data)}, although their inputs are "
        "finite. Remove these samples, or fix the model (under mixed precision, try mixed_precision='no')."
    )


def check_finite_outputs(data: CalibrationData, rows: torch.Tensor, positions: torch.Tensor, what: str) -> None:
    """Raise :class:`NonFiniteError` when gathered model outputs (``what``: logits, features) hold NaN or ±inf.

    ``rows`` are the same on every process (gathered), so every process raises alike.
    """
    bad = nonfinite_rows(rows)
    if bad:
        samples = data.describe_samples(positions.cpu()[bad].tolist())
        raise NonFiniteError(nonfinite_outputs_message(data, what).replace(SAMPLES, samples))


def note_nonfinite_outputs(ledger: FaultLedger, data: CalibrationData, rows: torch.Tensor, positions: Sequence[int], what: str) -> bool:
    """Note one process's model outputs holding NaN or ±inf; True when there were some."""
    bad = nonfinite_rows(rows)
    if bad:
        ledger.note(NonFiniteError, nonfinite_outputs_message(data, what), [positions[row] for row in bad], data.describe_samples)
    return bool(bad)
