"""The test Hub server is faithful enough: the REAL huggingface_hub client, transformers'
``push_to_hub``/``from_pretrained`` and timm's ``push_to_hf_hub``/``hf-hub:`` loading all
round-trip through it, pinned revisions resolve, and errors map to the client's exceptions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    create_repo,
    hf_hub_download,
    snapshot_download,
    upload_file,
    upload_folder,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors.torch import save_file

if TYPE_CHECKING:
    from hub_server import HubServer

# Registers the `hub_server` / `hub_online` fixtures (a conftest.py may register them instead).


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A model-like folder: text files, a subfolder and a binary safetensors file."""
    root = tmp_path / "upload"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden": 4}')
    (root / "README.md").write_text("---\nlicense: mit\ntags:\n- calibration\n---\n# Test card\n")
    (root / "sub" / "notes.txt").write_text("subfolder file")
    (root / "sub" / "deeper" / "blob.bin").write_bytes(bytes(range(256)) * 8)
    save_file({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, str(root / "model.safetensors"))
    return root


def test_upload_folder_then_download(hub_online: HubServer, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub_online, "tree_page_size", 2)  # force the client through tree pagination
    repo_id = hub_online.unique_repo_id("folder")
    url = create_repo(repo_id)
    assert url.repo_id == repo_id and url.startswith(hub_online.endpoint)

    commit = upload_folder(repo_id=repo_id, folder_path=folder, commit_message="add files")
    assert len(commit.oid) == 40

    snapshot = Path(snapshot_download(repo_id))
    downloaded = _tree(snapshot)
    assert snapshot.name == commit.oid
    assert downloaded.pop(".gitattributes").startswith(b"*.bin filter=lfs")  # from the initial commit
    assert downloaded == _tree(folder)
    tree_calls = [path for _, path in hub_online.requests if f"/api/models/{repo_id}/tree/" in path]
    assert len(tree_calls) > 1  # the Link-header pagination was followed

    single = hf_hub_download(repo_id, "sub/deeper/blob.bin")
    assert Path(single).read_bytes() == (folder / "sub" / "deeper" / "blob.bin").read_bytes()

    info = HfApi().model_info(repo_id)
    assert info.sha == commit.oid
    assert {s.rfilename for s in info.siblings or []} == {".gitattributes", *downloaded}
    assert info.card_data is not None and info.card_data["license"] == "mit"


def test_every_commit_stays_resolvable(hub_online: HubServer, tmp_path: Path) -> None:
    api = HfApi()
    repo_id = hub_online.unique_repo_id("history")
    api.create_repo(repo_id)
    first = upload_file(path_or_fileobj=b"v1", path_in_repo="weights.txt", repo_id=repo_id).oid
    second = upload_file(path_or_fileobj=b"v2", path_in_repo="weights.txt", repo_id=repo_id).oid
    assert first != second

    assert Path(hf_hub_download(repo_id, "weights.txt", revision=first)).read_bytes() == b"v1"
    assert Path(hf_hub_download(repo_id, "weights.txt")).read_bytes() == b"v2"
    assert _tree(Path(snapshot_download(repo_id, revision=first)))["weights.txt"] == b"v1"
    assert api.model_info(repo_id, revision=first).sha == first
    assert api.model_info(repo_id).sha == second
    commits = [c.commit_id for c in api.list_repo_commits(repo_id)]
    assert commits[:2] == [second, first] and len(commits) == 3  # + the initial commit

    # A branch forked from the first commit evolves independently of main.
    api.create_branch(repo_id, branch="dev", revision=first)
    api.create_commit(
        repo_id,
        operations=[CommitOperationAdd("extra.txt", b"dev only"), CommitOperationDelete("weights.txt")],
        commit_message="dev work",
        revision="dev",
    )
    assert set(api.list_repo_files(repo_id, revision="dev")) == {".gitattributes", "extra.txt"}
    assert set(api.list_repo_files(repo_id)) == {".gitattributes", "weights.txt"}
    assert {b.name for b in api.list_repo_refs(repo_id).branches} == {"main", "dev"}

    # Unchanged content is detected through the preupload oids: no empty commit is created.
    assert upload_file(path_or_fileobj=b"v2", path_in_repo="weights.txt", repo_id=repo_id).oid == second


def test_errors_map_to_client_exceptions(hub_online: HubServer) -> None:
    api = HfApi()
    repo_id = hub_online.unique_repo_id("errors")
    api.create_repo(repo_id)
    upload_file(path_or_fileobj=b"x", path_in_repo="present.txt", repo_id=repo_id)

    with pytest.raises(RepositoryNotFoundError):
        api.model_info(hub_online.unique_repo_id("missing"))
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(hub_online.unique_repo_id("missing"), "config.json")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "absent.txt")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(repo_id, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id, "present.txt", revision="0" * 40)
    with pytest.raises(HfHubHTTPError) as conflict:
        api.create_repo(repo_id)
    assert conflict.value.response.status_code == 409
    assert api.create_repo(repo_id, exist_ok=True).repo_id == repo_id
    assert not api.file_exists(repo_id, "absent.txt") and api.file_exists(repo_id, "present.txt")


def test_offline_reload_uses_the_cache_only(hub_online: HubServer, folder: Path) -> None:
    repo_id = hub_online.unique_repo_id("offline")
    create_repo(repo_id)
    upload_folder(repo_id=repo_id, folder_path=folder)
    snapshot = snapshot_download(repo_id)
    single = hf_hub_download(repo_id, "config.json")

    requests_before = len(hub_online.requests)
    with hub_online.configure_client(offline=True):
        assert constants.is_offline_mode()
        assert snapshot_download(repo_id) == snapshot
        assert hf_hub_download(repo_id, "config.json") == single
        with pytest.raises(LocalEntryNotFoundError):
            snapshot_download(hub_online.unique_repo_id("never-downloaded"))
    assert len(hub_online.requests) == requests_before  # the server was never contacted
    assert not constants.is_offline_mode()


def test_configure_client_restores_everything(hub_server: HubServer) -> None:
    import huggingface_hub.hf_api as hf_api

    before = (constants.ENDPOINT, constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, hf_api.api.endpoint)
    with hub_server.configure_client(offline=False):
        assert constants.ENDPOINT == hf_api.api.endpoint == hub_server.endpoint
        assert constants.HF_HUB_CACHE.startswith(str(hub_server.home))
        assert constants.HF_HUB_DISABLE_XET and not constants.is_offline_mode()
        assert HfApi().whoami()["name"] == hub_server.user
    after = (constants.ENDPOINT, constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, hf_api.api.endpoint)
    assert after == before


def test_unknown_route_is_a_logged_404(hub_online: HubServer, capfd: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub.utils import get_session

    response = get_session().get(f"{hub_online.endpoint}/api/not-a-route")
    assert response.status_code == 404 and "error" in response.json()
    assert ("GET", "/api/not-a-route") in hub_online.unhandled
    assert "unhandled request: GET /api/not-a-route" in capfd.readouterr().err


def test_transformers_push_to_hub_round_trip(hub_online: HubServer) -> None:
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    repo_id = hub_online.unique_repo_id("tiny-bert")
    unhandled_before = len(hub_online.unhandled)

    model.push_to_hub(repo_id)
    reloaded = AutoModelForSequenceClassification.from_pretrained(repo_id)

    assert isinstance(reloaded, BertForSequenceClassification)
    _assert_same_weights(model, reloaded)
    assert hub_online.unhandled[unhandled_before:] == []


def test_timm_push_to_hf_hub_round_trip(hub_online: HubServer) -> None:
    import timm
    from timm.models import push_to_hf_hub

    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False, num_classes=3).eval()
    repo_id = hub_online.unique_repo_id("tiny-resnet")
    unhandled_before = len(hub_online.unhandled)

    push_to_hf_hub(model, repo_id)
    reloaded = timm.create_model(f"hf-hub:{repo_id}", pretrained=True).eval()

    _assert_same_weights(model, reloaded)
    assert hub_online.unhandled[unhandled_before:] == []
