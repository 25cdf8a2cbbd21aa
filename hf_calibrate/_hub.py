"""Hub plumbing, kept out of the model code: resolve a repo id to a local folder, push a folder.

Everything goes through the real ``huggingface_hub`` client, so offline mode
(``HF_HUB_OFFLINE=1``), caching, revisions and tokens behave as for any hub model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from .serialization import CARD_FILE, CARD_MARKER, ArtifactError

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
            raise ArtifactError(f"could not find {name_or_path!r}{f' at revision {revision}' if revision else ''} "
                                f"on the hub or as a local folder: {type(error).__name__}.") from None
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
    return api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), revision=revision,
        commit_message=commit_message or "Upload calibrated model (hf_calibrate)", ignore_patterns=ignore,
    )
