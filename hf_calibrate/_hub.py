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
from pathlib import Path
from typing import Any, Dict, List, Optional

from huggingface_hub import HfApi, ModelCard, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .results import cards
from ._atomic import write_text_atomically
from .serialization import CALIBRATION_CONFIG, CARD_FILE, CARD_MARKER, ArtifactError, list_files, owned_files

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
        record = None  # unreadable: the names a calibration writes count as its own

    def listing(folder: str) -> List[str]:
        prefix = f"{folder}/"
        return [name[len(prefix):] for name in names if name.startswith(prefix) and "/" not in name[len(prefix):]]

    return sorted(owned_files(record, names.__contains__, listing) - uploaded - {CARD_FILE})


@dataclasses.dataclass(frozen=True)
class ResultsTarget:
    """Where new evaluation results go (:func:`results_target`): a local calibrated folder, or a hub repo at ``head``.

    Attributes:
        name: the folder or repo id as given.
        folder: the local folder (None: a hub repo).
        head: the hub commit the card is read from and committed on top of (None: a local folder).
        revision: the hub branch read and written (None: the default).
    """

    name: str
    folder: Optional[Path] = None
    head: Optional[str] = None
    revision: Optional[str] = None


def results_target(target: str | os.PathLike, *, token: Optional[str | bool] = None, revision: Optional[str] = None) -> ResultsTarget:
    """Check, before anything is evaluated, that ``target`` can take new results: a local folder holding a calibration
    and its model card, or a hub repo (checked for existence and a card). Raises :class:`ArtifactError` naming the fix."""
    name = os.fspath(target)
    folder = Path(name)
    if folder.is_dir():
        missing = [file for file in (CALIBRATION_CONFIG, CARD_FILE) if not (folder / file).is_file()]
        if missing:
            raise ArtifactError(f"the folder {name} has no {' or '.join(missing)}: it is not a saved calibration; save the "
                                "model there with CalibratedModel.save_pretrained first, or give its hub repo id.")
        return ResultsTarget(name, folder=folder)
    try:
        head = HfApi(token=token).model_info(name, revision=revision, files_metadata=False)
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
    if CARD_FILE not in {sibling.rfilename for sibling in head.siblings or []}:
        raise ArtifactError(f"{name!r} has no {CARD_FILE} to add results to; push the model with CalibratedModel.push_to_hub first.")
    return ResultsTarget(name, head=head.sha, revision=revision)


def push_evaluation_results(
    target: str | os.PathLike | ResultsTarget,
    evaluation: Dict[str, Any],
    *,
    token: Optional[str | bool] = None,
    revision: Optional[str] = None,
    commit_message: Optional[str] = None,
) -> Any:
    """Replace the ``model-index`` results of a calibration's model card with ``evaluation``.

    Args:
        target: a hub repo holding a calibration (its README.md is read and rewritten in one commit), a local folder
            the model was saved to (its README.md is rewritten in place, atomically), or a checked
            :func:`results_target`.
        evaluation: a :meth:`CalibratedModel.evaluate` result (e.g. on another split), or the ``evaluate``
            evaluator's results of the base's and the calibrated model's pipelines, converted by
            :func:`hf_calibrate.results.evaluator.as_evaluation`.
        token, revision: as for any hub call; ``revision`` is the branch read and written.
        commit_message: default "Update evaluation results (hf_calibrate)".

    The card's other metadata and its body are kept as they are (the body's results table
    still shows the numbers it was generated with, and so does ``calibration_config.json``,
    which is not touched). A hub commit is made on top of the commit the card was read from,
    so a concurrent change to the repo makes it fail instead of being overwritten. Returns the
    ``CommitInfo`` (a local folder: the card's path).
    """
    if not evaluation or "calibrated" not in evaluation or "uncalibrated" not in evaluation:
        raise ValueError(
            "evaluation must be a CalibratedModel.evaluate(...) result (with 'uncalibrated' and 'calibrated'), or evaluator "
            "results converted by hf_calibrate.results.evaluator.as_evaluation(...)."
        )
    checked = target if isinstance(target, ResultsTarget) else results_target(target, token=token, revision=revision)
    if checked.folder is not None:
        card = ModelCard.load(checked.folder / CARD_FILE)
        task = card.data.pipeline_tag or _config_task(checked.folder / CALIBRATION_CONFIG)
        _set_results(card, evaluation, task, checked.folder.resolve().name)
        write_text_atomically(checked.folder / CARD_FILE, str(card))
        return checked.folder / CARD_FILE
    api = HfApi(token=token)
    card = ModelCard.load(api.hf_hub_download(checked.name, CARD_FILE, revision=checked.head))
    task = card.data.pipeline_tag or _config_task(_download_config(api, checked.name, checked.head))
    _set_results(card, evaluation, task, checked.name.split("/")[-1])
    return api.upload_file(
        path_or_fileobj=str(card).encode("utf-8"), path_in_repo=CARD_FILE, repo_id=checked.name, revision=checked.revision,
        commit_message=commit_message or "Update evaluation results (hf_calibrate)", parent_commit=checked.head,
    )


def _set_results(card: ModelCard, evaluation: Dict[str, Any], task: str, model_name: str) -> None:
    card.data.eval_results = cards.eval_results(evaluation, task)
    if not card.data.model_name:
        card.data.model_name = model_name


def _download_config(api: HfApi, repo_id: str, revision: str) -> Path:
    """The repo's calibration_config.json, downloaded (an :class:`ArtifactError` when it has none)."""
    try:
        return Path(api.hf_hub_download(repo_id, CALIBRATION_CONFIG, revision=revision))
    except EntryNotFoundError:
        raise ArtifactError(
            f"{repo_id!r} has neither a pipeline_tag in its {CARD_FILE} nor a {CALIBRATION_CONFIG}; "
            "it is not an hf_calibrate calibration."
        ) from None


def _config_task(path: Path) -> str:
    """The base task recorded in a calibration_config.json."""
    return json.loads(Path(path).read_text(encoding="utf-8"))["base_model"]["task"]
