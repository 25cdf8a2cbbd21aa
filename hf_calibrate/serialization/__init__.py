"""The saved artifact: one folder = one hub repo. No network here except a reference-only base (see ``_hub``).

The layout, the record, the checks and the save protocol are described in ``docs/artifact.md``.
**Loading trusts nothing it has not checked** (:mod:`.loading`): the record
(``calibration_config.json``) against :data:`.schema.RECORD_SCHEMA` and its own SHA-256, the
calibrator's tensors against the names, shapes, dtypes, ranges and digest the record implies, then
δ, the labels and the weights fingerprint against the base. Every failure is an
:class:`ArtifactError` naming the file, the key and the fix. **Saving replaces only this library's
files, crash-atomically** (:mod:`.saving`): the record lists every file the artifact wrote, and a
save stages the new artifact inside the folder and commits it with a journal that the next save or
load rolls forward, so the folder always loads as the complete old or the complete new artifact.
"""

from __future__ import annotations

from .files import BASE_FOLDER, CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, CARD_FILE, CARD_MARKER, JOURNAL_FILE
from .identity import hub_reference, repo_id_problem, weights_fingerprint
from .loading import load_base, load_calibrator, load_preprocessor, read_record, verify_against_base
from .saving import file_sha256, list_files, owned_files, reading, recover_legacy_save, save_artifact
from .schema import FORMAT_VERSION, RECORD_SCHEMA, RESAVE, ArtifactError, UnverifiedArtifactWarning, seal_record

__all__ = [
    "ArtifactError",
    "BASE_FOLDER",
    "CALIBRATION_CONFIG",
    "CALIBRATION_WEIGHTS",
    "CARD_FILE",
    "CARD_MARKER",
    "FORMAT_VERSION",
    "JOURNAL_FILE",
    "RECORD_SCHEMA",
    "RESAVE",
    "UnverifiedArtifactWarning",
    "file_sha256",
    "hub_reference",
    "list_files",
    "load_base",
    "load_calibrator",
    "load_preprocessor",
    "owned_files",
    "read_record",
    "reading",
    "recover_legacy_save",
    "repo_id_problem",
    "save_artifact",
    "seal_record",
    "verify_against_base",
    "weights_fingerprint",
]
