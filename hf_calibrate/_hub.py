"""Hub plumbing, kept out of the model code: resolve a repo id to a local folder, push a folder,
push new evaluation results into a repo's model card.

Everything goes through the real ``huggingface_hub`` client, so offline mode
(``HF_HUB_OFFLINE=1``), caching, revisions and tokens behave as for any hub model.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .card_results import ResultsUpdate, card_location, stage_results
from .serialization import CALIBRATION_CONFIG, CARD_FILE, CARD_MARKER, ArtifactError, list_files, manifest_files
from .serialization import evaluated_model
from .serialization.files import DIAGRAM_FILE
from .serialization.loading import read_record
from .serialization.saving import update_results

# Files a calibrated repo needs; others (e.g. a user's notebooks) are not downloaded.
_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "README.md", "*.png", "base/*"]


def resolve_folder(
    name_or_path: str | os.PathLike,
    *,
    revision: Optional[str] = None,
    token: Optional[str | bool] = None,
    cache_dir: Optional[str | os.PathLike] = None,
    local_files_only: bool = False,
    force_download: bool = False,
    subfolder: Optional[str] = None,
) -> Path:
    """A local folder for ``name_or_path``: itself if it is a folder, else a hub snapshot."""
    if os.path.isdir(name_or_path):
        root = Path(name_or_path)
    else:
        try:
            root = Path(
                snapshot_download(
                    str(name_or_path), revision=revision, token=token, cache_dir=cache_dir,
                    local_files_only=local_files_only, force_download=force_download, allow_patterns=_ALLOW_PATTERNS,
                )
            )
        except (RepositoryNotFoundError, RevisionNotFoundError) as error:
            at = f" at revision {revision!r}" if revision else ""
            raise ArtifactError(
                f"could not find {str(name_or_path)!r}{at} on the hub or as a local folder ({type(error).__name__}); "
                "check the repo id (namespace/name) and the revision, and pass token=... for a private or gated repo."
            ) from None
        except LocalEntryNotFoundError as error:
            at = f" at revision {revision!r}" if revision else ""
            raise ArtifactError(
                f"{str(name_or_path)!r} is not a local folder, is not in the local hub cache{at}, and could not be "
                f"downloaded ({error}). Download it once while online (without HF_HUB_OFFLINE=1 or "
                "local_files_only=True), or pass the path of a saved folder."
            ) from None
        except HFValidationError:
            raise ArtifactError(
                f"{str(name_or_path)!r} is neither an existing local folder nor a valid hub repo id "
                "('namespace/name'); check the path."
            ) from None
    return root / subfolder if subfolder else root


def remote_card_is_users(api: HfApi, repo_id: str, revision: Optional[str], token: Any) -> bool:
    """True when the repo already holds a README.md that hf_calibrate did not generate."""
    try:
        path = api.hf_hub_download(repo_id, CARD_FILE, revision=revision, token=token)
    except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
        return False
    return CARD_MARKER not in Path(path).read_text(encoding="utf-8", errors="replace")


def push_folder(
    folder: Path,
    repo_id: str,
    *,
    private: Optional[bool] = None,
    revision: Optional[str] = None,
    commit_message: Optional[str] = None,
    token: Optional[str | bool] = None,
    overwrite_card: bool = False,
) -> Any:
    """Upload ``folder`` to ``repo_id`` (created if needed) as one commit; returns the CommitInfo.

    A README.md already in the repo that hf_calibrate did not write is kept unless
    ``overwrite_card``.
    """
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    ignore = [CARD_FILE] if not overwrite_card and remote_card_is_users(api, repo_id, revision, token) else None
    # Files of the calibration pushed before that this one no longer writes go in the same commit
    # (e.g. the base weights after a switch to a reference-only push, which would otherwise still
    # load through timm's "hf-hub:" or subfolder="base", or a tokenizer after a switch to an image
    # model). Only files the earlier push wrote (its manifest) are deleted, never a user's.
    stale = _stale_remote_files(api, repo_id, revision, token, set(list_files(Path(folder))))
    return api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), revision=revision,
        commit_message=commit_message or "Upload calibrated model (hf_calibrate)", ignore_patterns=ignore,
        delete_patterns=[glob.escape(name) for name in stale] or None,
    )


def _stale_remote_files(api: HfApi, repo_id: str, revision: Optional[str], token: Any, uploaded: set) -> List[str]:
    """Files the calibration already in ``repo_id`` wrote (its record's manifest) that are not ``uploaded`` now."""
    try:
        names = set(api.list_repo_files(repo_id, revision=revision, token=token))
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return []
    if CALIBRATION_CONFIG not in names:
        return []  # no calibration there: every file is the user's
    try:
        record = json.loads(Path(api.hf_hub_download(repo_id, CALIBRATION_CONFIG, revision=revision, token=token)).read_text("utf-8"))
    except (EntryNotFoundError, OSError, ValueError):
        record = None  # unreadable: nothing proves which files it wrote, so none is deleted
    return sorted(manifest_files(record) - uploaded - {CARD_FILE})


@dataclasses.dataclass(frozen=True)
class ResultsTarget:
    """Where new evaluation results go (:func:`results_target`): a local calibrated folder, or a hub repo at ``head``.

    Attributes:
        name: the folder or repo id as given.
        record: its calibration record, validated (whose results alone it takes:
            :func:`~.serialization.evaluated_model.check_results_owner`).
        card: its README.md.
        folder: the local folder (None: a hub repo).
        head: the hub commit the card is read from and committed on top of (None: a local folder).
        revision: the hub branch read and written (None: the default).
        files: the files of the hub repo at ``head`` (empty: a local folder).
    """

    name: str
    record: Dict[str, Any]
    card: str
    folder: Optional[Path] = None
    head: Optional[str] = None
    revision: Optional[str] = None
    files: FrozenSet[str] = frozenset()


def results_target(target: str | os.PathLike, *, token: Optional[str | bool] = None, revision: Optional[str] = None) -> ResultsTarget:
    """Check, before anything is evaluated, that ``target`` can take new results: a local folder holding a calibration
    and its model card, or a hub repo (checked for existence, a card and a calibration record). Raises
    :class:`ArtifactError` naming the fix."""
    name = os.fspath(target)
    folder = Path(name)
    if folder.is_dir():
        missing = [file for file in (CALIBRATION_CONFIG, CARD_FILE) if not (folder / file).is_file()]
        if missing:
            raise ArtifactError(f"the folder {name} has no {' or '.join(missing)}: it is not a saved calibration; save the "
                                "model there with CalibratedModel.save_pretrained first, or give its hub repo id.")
        card = (folder / CARD_FILE).read_text(encoding="utf-8", errors="replace")
        return ResultsTarget(name, read_record(folder), card, folder=folder)
    api = HfApi(token=token)
    try:
        head = api.model_info(name, revision=revision, files_metadata=False)
    except HFValidationError:
        raise ArtifactError(f"{name!r} is neither a local folder nor a hub repo id (user/name); give the folder the model "
                            "was saved to, or its repo id.") from None
    except OfflineModeIsEnabled:
        raise ArtifactError(f"{name!r} is not a local folder, and the hub cannot be reached in offline mode (HF_HUB_OFFLINE "
                            "is set): unset it to push to the hub, or give the folder the model was saved to.") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:
        raise ArtifactError(
            f"could not find {name!r}{f' at revision {revision!r}' if revision else ''} on the hub "
            f"({type(error).__name__}); push the model first (CalibratedModel.push_to_hub) or check the repo id."
        ) from None
    files = frozenset(sibling.rfilename for sibling in head.siblings or [])
    if CARD_FILE not in files:
        raise ArtifactError(f"{name!r} has no {CARD_FILE} to add results to; push the model with CalibratedModel.push_to_hub first.")
    card = Path(api.hf_hub_download(name, CARD_FILE, revision=head.sha)).read_text(encoding="utf-8", errors="replace")
    record = read_record(_download_config(api, name, head.sha).parent)
    return ResultsTarget(name, record, card, head=head.sha, revision=revision, files=files)


def push_evaluation_results(
    target: str | os.PathLike | ResultsTarget,
    evaluation: Dict[str, Any],
    *,
    token: Optional[str | bool] = None,
    revision: Optional[str] = None,
    commit_message: Optional[str] = None,
) -> ResultsUpdate:
    """Replace the results of a calibration's card with ``evaluation``, which must be results of that very calibration.

    Args:
        target: a hub repo holding a calibration (changed in one commit), a local folder the model was saved to
            (changed in place, crash-safely), or a checked :func:`results_target`.
        evaluation: a :meth:`CalibratedModel.evaluate` result (e.g. on another split), which names the model it was
            computed on (``model_identity``); :meth:`CalibratedModel.push_evaluation_results` also takes the
            ``evaluate`` evaluator's results converted by :func:`hf_calibrate.results.evaluator.as_evaluation`.
        token, revision: as for any hub call; ``revision`` is the branch read and written.
        commit_message: default "Update evaluation results (hf_calibrate)".

    The record's ``evaluation`` is replaced and the card regenerated from it, so its body, results table, reliability
    diagram and ``model-index`` tell one story (a diagram that no longer applies is removed); a README.md the user
    wrote keeps its body and gets the new ``model-index`` only. Results of another model are refused (an
    :class:`ArtifactError` naming both). A hub commit is made on top of the commit the card was read from, so a
    concurrent change to the repo makes it fail instead of being overwritten. Returns what was replaced
    (:class:`~hf_calibrate.card_results.ResultsUpdate`, with the hub's ``CommitInfo``).
    """
    identity = _identity(evaluation)
    checked = target if isinstance(target, ResultsTarget) and target.folder is None else results_target(
        target.name if isinstance(target, ResultsTarget) else target, token=token, revision=revision)
    evaluated_model.check_results_owner(identity, checked.record, checked.name)
    with tempfile.TemporaryDirectory(prefix="hf_calibrate_results_") as tmp:
        staged = Path(tmp)
        if checked.folder is None:
            update = stage_results(checked.record, evaluation, staged, card_text=checked.card, location=checked.name)
            return _commit_results(checked, update, staged, HfApi(token=token), commit_message)
        update = stage_results(checked.record, evaluation, staged, card_text=checked.card,
                               location=card_location(checked.card, checked.folder))
        removed = [name for name in update_results(checked.folder, staged) if name not in update.files]
        return dataclasses.replace(update, removed=tuple(removed))


def _commit_results(
    checked: ResultsTarget, update: ResultsUpdate, staged: Path, api: HfApi, commit_message: Optional[str]
) -> ResultsUpdate:
    """Commit the staged files of ``update`` to the hub repo ``checked`` on top of the commit they were made from,
    removing a diagram of the calibration's (in its manifest) that the new results do not have."""
    removed = [DIAGRAM_FILE] if DIAGRAM_FILE not in update.files and DIAGRAM_FILE in checked.files & manifest_files(
        checked.record) else []
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(staged / name)) for name in update.files]
    commit = api.create_commit(
        checked.name, [*operations, *(CommitOperationDelete(path_in_repo=name) for name in removed)],
        commit_message=commit_message or "Update evaluation results (hf_calibrate)", revision=checked.revision,
        parent_commit=checked.head,
    )
    return dataclasses.replace(update, removed=tuple(removed), commit=commit)


def _identity(evaluation: Dict[str, Any]) -> Dict[str, Any]:
    """The identity of the model ``evaluation`` was computed on; a ValueError naming the fix when it has none."""
    if not evaluation or "calibrated" not in evaluation or "uncalibrated" not in evaluation:
        raise ValueError(
            "evaluation must be a CalibratedModel.evaluate(...) result (with 'uncalibrated' and 'calibrated'), or evaluator "
            "results converted by hf_calibrate.results.evaluator.as_evaluation(...)."
        )
    if not evaluation.get(evaluated_model.IDENTITY_KEY):
        raise ValueError(
            f"the evaluation does not say which calibrated model it was computed on (it has no "
            f"'{evaluated_model.IDENTITY_KEY}', e.g. an as_evaluation(...) result), so nothing shows the results are the "
            "target's. Push a CalibratedModel.evaluate(...) result, or push with calibrated.push_evaluation_results(target, "
            "evaluation), calibrated being the model whose pipeline computed the results."
        )
    return evaluation[evaluated_model.IDENTITY_KEY]


def _download_config(api: HfApi, repo_id: str, revision: str) -> Path:
    """The repo's calibration_config.json, downloaded (an :class:`ArtifactError` when it has none)."""
    try:
        return Path(api.hf_hub_download(repo_id, CALIBRATION_CONFIG, revision=revision))
    except EntryNotFoundError:
        raise ArtifactError(
            f"{repo_id!r} has no {CALIBRATION_CONFIG}: it is not an hf_calibrate calibration, so it cannot take "
            "calibration results; push the calibrated model there with CalibratedModel.push_to_hub first."
        ) from None
