"""The data a calibration was fitted on, recognised later: the very data objects (weakly referenced), their
``datasets`` fingerprints, and the content digests of their rows (:mod:`.lineage`), kept while the model lives and
saved with it, so that a loaded model knows its calibration rows too.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Collection, Dict, List, Optional, Protocol, Sequence, Tuple

from .identity import data_fingerprint, data_identity, data_source
from .lineage import NO_DIGESTS, KeptRows, holds_rows_of, keep_rows, shared_rows

#: (a weak reference to a data object's samples, or None; the content digests of their rows, or None)
FittedRows = Tuple[Optional[weakref.ref], Optional[KeptRows]]


def weakly_referable(source: Any) -> bool:
    """Whether a weak reference to ``source`` can be made (not to None, lists, tuples, ints, ...)."""
    if source is None:
        return False
    try:
        weakref.ref(source)
    except TypeError:
        return False
    return True


@dataclasses.dataclass
class CalibrationRows:
    """What a calibrated model knows of the data it was fitted on.

    Attributes:
        objects: weak references to the data objects the fit was given, and to what stands for each
            (:func:`.identity.data_identity`) where that is another object.
        fitted: per data object given, a weak reference to its samples and the content digests of their rows where
            they are ``datasets`` data or tensors (else None): its rows are still known once the object is gone.
        saved: the calibration rows' digests of a loaded model (its record's).
    """

    objects: List[weakref.ref] = dataclasses.field(default_factory=list)
    fitted: List[FittedRows] = dataclasses.field(default_factory=list)
    saved: List[KeptRows] = dataclasses.field(default_factory=list)

    @classmethod
    def of_fit(cls, sources: Sequence[Any], keep_digests: bool) -> "CalibrationRows":
        """The rows of the data a fit was given (None where a role was not given); the rows' digests only where
        ``keep_digests`` (the main process: the one that saves)."""
        given = [source for source in sources if source is not None]
        objects = [weakref.ref(identity) for source in given for identity in _identities(source) if weakly_referable(identity)]
        return cls(objects, [_fitted_rows(source, keep_digests) for source in given])

    def holds(self, data: Any, fingerprints: Collection[str]) -> Optional[bool]:
        """Whether ``data`` are, or hold, these rows (True, False, or None: unknown): the very data object, a
        ``datasets.Dataset`` with one of ``fingerprints``, or data holding at least one of their rows, by memory or
        by content (:func:`.lineage.holds_rows_of`)."""
        identity = data_identity(data)
        if any(reference() is identity or reference() is data for reference in self.objects):
            return True
        fingerprint = data_fingerprint(data)
        if fingerprint is not None and fingerprint in fingerprints:
            return True
        return holds_rows_of(data_source(data), self.sources())

    def sources(self) -> List[Any]:
        """The data objects the fit was given that are still alive, and the kept row digests of those that are gone
        (a loaded model: those its record holds)."""
        sources = []
        for reference, kept in self.fitted:
            alive = reference() if reference is not None else None
            sources.append(alive if alive is not None else kept if kept is not None else NO_DIGESTS)
        return sources + self.saved

    def kept(self) -> List[Optional[KeptRows]]:
        """The rows' content digests a save writes into the record (:mod:`hf_calibrate.serialization.row_digests`)."""
        return [kept for _, kept in self.fitted] + self.saved


def _fitted_rows(source: Any, keep_digests: bool) -> FittedRows:
    """(a weak reference to the samples of ``source``, or None; the content digests of their rows, or None)."""
    samples = data_identity(source)
    return (weakref.ref(samples) if weakly_referable(samples) else None, keep_rows(samples) if keep_digests else None)


def _identities(source: Any) -> List[Any]:
    """What stands for ``source``: the object given (a DataLoader whose sampler reads part of its dataset is known as
    itself) and what :func:`.identity.data_identity` makes of it, when that is another object."""
    identity = data_identity(source)
    return [source] if identity is source else [source, identity]


class FittedModel(Protocol):
    """What :func:`in_sample_rows` asks of a calibrated model (:class:`hf_calibrate.CalibratedModel` is one)."""

    calibration_rows: CalibrationRows

    def fitted_on(self, data: Any) -> Optional[bool]: ...


def in_sample_rows(model: FittedModel, data: Any, samples: int) -> Tuple[Optional[bool], Optional[Dict[str, int]]]:
    """(whether ``data`` hold rows ``model`` was fitted on, ``{"calibration": rows that are, "total": rows}``).

    True, False or None (unknown) as :meth:`CalibratedModel.fitted_on` says; the rows are counted for ``datasets``
    data and tensors (:func:`.lineage.shared_rows`: by memory and content, no model run), and the count decides where
    there is one (the very loader whose sampler drew other rows since holds none); they are all ``samples`` (the
    evaluation's) when the data are the very data or have their fingerprint and cannot be counted; no count (None)
    unless True.
    """
    fitted = model.fitted_on(data)
    if not fitted:
        return fitted, None
    counted = shared_rows(data_source(data), model.calibration_rows.sources())
    if counted is None:  # the very data object, or a dataset with a recorded fingerprint, whose rows cannot be counted
        return True, {"calibration": samples, "total": samples}
    if not counted.shared:  # the very loader, whose sampler drew other rows since
        return False, None
    return True, {"calibration": counted.shared, "total": counted.total}
