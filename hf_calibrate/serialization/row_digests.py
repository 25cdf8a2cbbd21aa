"""The calibration rows' digests in the record (``fit.calibration_rows``, docs/artifact.md), so that a loaded model
knows which rows it was fitted on.

A fit on ``datasets`` data or a torch ``TensorDataset`` keeps a 16-byte content digest of each calibration row
(:class:`hf_calibrate.data.lineage.KeptRows`); a save writes them into the record, one entry per data object the fit
read (calibration, validation, temperature data)::

    [{"columns": [[name, Arrow type as text], ...], "digests": base64 of N × 16 bytes}, ...]

and :meth:`CalibratedModel.evaluate` of the loaded model counts the evaluated rows among them, as the fitted model
does. They are written when every data object the fit read has them, up to :data:`MAX_SAVED_ROWS` rows (about 21
bytes each); otherwise none are, and a loaded model says that whether data are calibration data is not known. Anyone holding a row can tell whether it was a calibration
row: ``save_pretrained(..., row_digests=False)`` leaves them out.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Optional, Sequence

#: the record's key (in ``fit``) that holds them
ROW_DIGESTS_KEY = "calibration_rows"
#: the most calibration rows whose digests a record holds (16 bytes each, ~21 in base64)
MAX_SAVED_ROWS = 250_000
DIGEST_BYTES = 16
_MAX_ENTRIES, _MAX_COLUMNS, _MAX_TEXT = 8, 4096, 1024


def encode_row_digests(kept: Sequence[Any]) -> Optional[List[Dict[str, Any]]]:
    """The record's ``fit.calibration_rows`` for ``kept`` (:class:`~hf_calibrate.data.lineage.KeptRows`, one per data
    object the fit read), or None when some data object has none (None entries: the loaded model could otherwise take
    its rows for held-out ones), when there are none, or more than :data:`MAX_SAVED_ROWS` rows in all."""
    entries = list(kept)
    if not entries or any(rows is None for rows in entries) or sum(len(rows.digests) for rows in entries) > MAX_SAVED_ROWS:
        return None
    return [{"columns": [[name, kind] for name, kind in rows.types],
             "digests": base64.b64encode(rows.digests.tobytes()).decode("ascii")} for rows in entries]


def decode_row_digests(value: Optional[List[Dict[str, Any]]]) -> List[Any]:
    """The :class:`~hf_calibrate.data.lineage.KeptRows` of a record's ``fit.calibration_rows`` (checked by
    :func:`row_digests_problem` when the record was read); [] when it has none."""
    import numpy as np

    from ..data.lineage import KeptRows  # pyarrow: imported when a record holds digests

    return [KeptRows(tuple((name, kind) for name, kind in entry["columns"]),
                     np.frombuffer(base64.b64decode(entry["digests"]), dtype=f"S{DIGEST_BYTES}").copy())
            for entry in value or []]


def row_digests_problem(value: Any) -> Optional[str]:
    """Why ``value`` is not a record's ``fit.calibration_rows``, or None."""
    shape = (f"must be a list of at most {_MAX_ENTRIES} objects {{'columns': [[name, type], ...], 'digests': base64 of "
             f"16-byte digests}}, {MAX_SAVED_ROWS} digests in all")
    if not isinstance(value, list) or len(value) > _MAX_ENTRIES:
        return shape
    rows = 0
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"columns", "digests"} or not _columns(entry["columns"]):
            return shape
        size = _decoded_size(entry["digests"])
        if size is None or size % DIGEST_BYTES:
            return shape
        rows += size // DIGEST_BYTES
    return None if rows <= MAX_SAVED_ROWS else shape


def _columns(value: Any) -> bool:
    return isinstance(value, list) and 0 < len(value) <= _MAX_COLUMNS and all(
        isinstance(pair, list) and len(pair) == 2
        and all(isinstance(text, str) and 0 < len(text) <= _MAX_TEXT for text in pair) for pair in value)


def _decoded_size(text: Any) -> Optional[int]:
    """The byte length of base64 ``text`` (None when it is not base64 or longer than the record may hold)."""
    if not isinstance(text, str) or len(text) > 4 * (MAX_SAVED_ROWS * DIGEST_BYTES // 3 + 1):
        return None
    try:
        return len(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return None
