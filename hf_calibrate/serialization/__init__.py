"""The saved artifact: one folder = one hub repo. No network here except a reference-only base (see ``_hub``).

The layout, the record, the checks and the save protocol are described in ``docs/artifact.md``.
**Loading trusts nothing it has not checked** (:mod:`.loading`): the record
(``calibration_config.json``) against :data:`.schema.RECORD_SCHEMA` and its own SHA-256, the
calibrator's tensors against the names, shapes, dtypes, ranges and digest the record implies, then
δ, the labels and the weights fingerprint against the base. Every failure is an
:class:`ArtifactError` naming the file, the key and the fix. **Saving replaces only this library's
files, crash-safely** (:mod:`.saving`): the record lists every file the artifact wrote, and a
save stages the new artifact inside the folder, renames it into place (the record last) and replaces or deletes
only files whose SHA-256 a sealed record of the folder lists. **Loading writes nothing**: a folder a killed save
left torn is recognised by its manifest and digests and refused until the next save.
"""

from __future__ import annotations

from .files import BASE_FOLDER, CALIBRATION_CONFIG, CALIBRATION_WEIGHTS, CARD_FILE, CARD_MARKER, STAGING_PREFIX
from .identity import hub_reference, repo_id_problem, weights_fingerprint
from .loading import check_complete, load_base, load_calibrator, load_preprocessor, read_record, verify_against_base
from .locks import reading
from .ownership import file_sha256, manifest_files
from .saving import check_save_target, list_files, save_artifact, update_results
from .schema import FORMAT_VERSION, RECORD_SCHEMA, RESAVE, ArtifactError, seal_record

__all__ = [
    "ArtifactError",
    "BASE_FOLDER",
    "CALIBRATION_CONFIG",
    "CALIBRATION_WEIGHTS",
    "CARD_FILE",
    "CARD_MARKER",
    "FORMAT_VERSION",
    "RECORD_SCHEMA",
    "RESAVE",
    "STAGING_PREFIX",
    "check_complete",
    "check_save_target",
    "file_sha256",
    "hub_reference",
    "list_files",
    "load_base",
    "load_calibrator",
    "load_preprocessor",
    "manifest_files",
    "read_record",
    "reading",
    "repo_id_problem",
    "save_artifact",
    "seal_record",
    "update_results",
    "verify_against_base",
    "weights_fingerprint",
]
