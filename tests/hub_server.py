"""A small Hugging Face Hub look-alike for tests, plus the pytest fixtures that use it.

The real ``huggingface_hub`` 2.4.0 client (and transformers / timm on top of it) talks to
this server unchanged, so hub round trips in the tests exercise the same client code paths
as against huggingface.co. The server runs in a background thread of the test process
(stdlib ``ThreadingHTTPServer`` on 127.0.0.1, random free port).

Endpoints implemented (``{type}`` is ``models``, ``datasets`` or ``spaces``; ``{repo}`` is
``namespace/name``; ``{rev}`` is a branch name or a full 40-hex commit sha, URL-quoted):

    GET       /api/whoami-v2                          fixed fake user
    GET       /api/agent-harnesses                    empty registry (client user-agent probe)
    POST      /api/validate-yaml                      accepts every card
    POST      /api/repos/create                       409 when the repo exists (exist_ok)
    GET       /api/{type}/{repo}                      repo info at ``main`` (sha, siblings, cardData)
    GET       /api/{type}/{repo}/revision/{rev}       repo info at a revision
    GET       /api/{type}/{repo}/tree/{rev}[/{path}]  ?recursive=..., cursor pagination (Link header)
    POST      /api/{type}/{repo}/paths-info/{rev}     form field ``paths`` (repeated)
    GET       /api/{type}/{repo}/commits/{rev}        history, newest first
    GET       /api/{type}/{repo}/refs                 branches (tags/converts/PRs always empty)
    POST      /api/{type}/{repo}/branch/{branch}      ``startingPoint`` optional, 409 when it exists
    POST      /api/{type}/{repo}/preupload/{rev}      every file "regular", never ignored
    POST      /api/{type}/{repo}/commit/{rev}         NDJSON: header, file, deletedFile, deletedFolder
    GET|HEAD  /[datasets/|spaces/]{repo}/resolve/{rev}/{path}
              200 with the bytes, ``X-Repo-Commit``, ``ETag`` (git blob sha1), ``Content-Length``

Errors look like the Hub's: a JSON ``{"error": ...}`` body plus ``X-Error-Code`` /
``X-Error-Message`` headers, so the client raises ``RepositoryNotFoundError`` (code
``RepoNotFound``), ``RevisionNotFoundError`` (``RevisionNotFound``) and
``EntryNotFoundError`` (``EntryNotFound``; resolve 404s also carry ``X-Repo-Commit`` so the
client caches the non-existence). Any other route answers 404 ``{"error": ...}`` and is
printed to stderr and recorded in ``HubServer.unhandled``. A malformed payload answers 400;
a bug in this server answers 500 and prints its traceback to stderr.

Simplified on purpose: no auth checks (any token is accepted, private repos behave like
public ones); storage in memory; no LFS and no Xet (preupload answers "regular" for every
file, whatever its size, so content always travels base64-encoded in the commit); no pull
requests (``create_pr`` answers 400), tags, ``Range`` requests or redirects; ``expand`` on
tree listings is ignored; short commit shas are not resolved. Every commit is an immutable
full snapshot keyed by a 40-hex sha, so pinned revisions keep resolving to old content; a
new repo starts with an "initial commit" holding a ``.gitattributes``, as on the Hub.

How huggingface_hub 2.4.0 reads its configuration (what ``HubServer.configure_client``
patches, so the fixtures work whether or not huggingface_hub was imported first):

* ``HF_ENDPOINT``, ``HF_HOME`` (and every path derived from it), ``HF_HUB_DISABLE_XET`` and
  ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` are read ONCE, at import, into module
  attributes of ``huggingface_hub.constants`` (``ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``,
  ``HF_URL_HOSTS``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ...). Setting the environment after
  the import changes nothing, so the attributes are patched (and restored) directly.
* The client reads those attributes at call time (``constants.ENDPOINT``,
  ``constants.is_offline_mode()`` which returns ``constants.HF_HUB_OFFLINE``), except for a
  few import-time copies: ``huggingface_hub.hf_api.api`` is a module-level ``HfApi`` whose
  ``endpoint`` was fixed at import and whose bound methods are the top-level functions
  (``huggingface_hub.create_repo``, ``model_info``, ``upload_folder`` ... also used by
  transformers), so ``api.endpoint`` is patched too; ``utils._cache_manager.HF_HUB_CACHE``
  is a ``from``-import copy. HfApi objects created elsewhere before the patch keep the old
  endpoint.
* Offline mode is a constant, not re-read from the environment: the request hook of the
  shared HTTP client raises ``OfflineModeIsEnabled`` when ``constants.HF_HUB_OFFLINE`` is
  true; transformers 5.x uses ``huggingface_hub.is_offline_mode`` (same constant).
* ``HF_TOKEN`` is read from the environment at every call (``utils._auth.get_token``), so
  setting the environment variable is enough.
The environment variables are set as well (and restored), for subprocesses and for code
that imports huggingface_hub later.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import pytest
import yaml

USER = "test-user"
TOKEN = "hf_testserverfaketoken0000000000000000"
DEFAULT_BRANCH = "main"
TREE_PAGE_SIZE = 1000  # what the Hub uses for non-expanded tree listings
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}

# A shortened version of the .gitattributes the Hub puts in the first commit of a repo.
INITIAL_GITATTRIBUTES = b"""*.bin filter=lfs diff=lfs merge=lfs -text
*.ckpt filter=lfs diff=lfs merge=lfs -text
*.h5 filter=lfs diff=lfs merge=lfs -text
*.onnx filter=lfs diff=lfs merge=lfs -text
*.pt filter=lfs diff=lfs merge=lfs -text
*.pth filter=lfs diff=lfs merge=lfs -text
*.safetensors filter=lfs diff=lfs merge=lfs -text
*.zip filter=lfs diff=lfs merge=lfs -text
"""


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as ``oid``/``blobId``/``ETag``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    """Current UTC time in the Hub's format, e.g. ``2024-05-01T12:00:00.123Z``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _is_true(value: str | None) -> bool:
    return value is not None and value.lower() in {"1", "true"}


class HubError(Exception):
    """Raised by route handlers; turned into a Hub-style error response."""

    def __init__(
        self, status: int, message: str, error_code: str | None = None, repo_commit: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_code = error_code
        self.repo_commit = repo_commit


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot of a repo: all its files at that commit."""

    oid: str
    parent: str | None
    title: str
    message: str
    date: str
    files: Mapping[str, bytes]


@dataclass
class Repo:
    repo_type: str  # "model", "dataset" or "space"
    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit:
        """Commit a branch name or full commit sha points to; RevisionNotFound otherwise."""
        oid = self.branches.get(revision, revision)
        if oid not in self.commits:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]

    def history(self, commit: Commit) -> list[Commit]:
        """``commit`` and its ancestors, newest first."""
        out = [commit]
        while out[-1].parent is not None:
            out.append(self.commits[out[-1].parent])
        return out


def _directories(files: Mapping[str, bytes]) -> set[str]:
    return {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}


def _entry(files: Mapping[str, bytes], path: str) -> dict[str, Any] | None:
    """Tree/paths-info entry for a file or directory at ``path``; None if absent."""
    if path in files:
        return {"type": "file", "oid": git_blob_sha1(files[path]), "size": len(files[path]), "path": path}
    prefix = path + "/"
    children = sorted((p, git_blob_sha1(b)) for p, b in files.items() if p.startswith(prefix))
    if not children:
        return None
    tree_oid = hashlib.sha1(json.dumps(children).encode()).hexdigest()
    return {"type": "directory", "oid": tree_oid, "size": 0, "path": path}


def _card_data(files: Mapping[str, bytes]) -> dict[str, Any] | None:
    """The YAML front matter of README.md, as the Hub exposes it in ``cardData``."""
    match = re.match(rb"^---\s*\n(.*?)\n---\s*\n", files.get("README.md", b""), re.DOTALL)
    if match is None:
        return None
    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else None


class HubStore:
    """Thread-safe in-memory storage of repos and their commits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: dict[tuple[str, str], Repo] = {}
        self._sequence = itertools.count()

    def get(self, repo_type: str, repo_id: str) -> Repo:
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def create(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                raise HubError(409, f"You already created this {repo_type} repo")
            repo = Repo(repo_type=repo_type, repo_id=repo_id, private=private, created_at=_now())
            initial = self._new_commit(None, "initial commit", "", {".gitattributes": INITIAL_GITATTRIBUTES})
            repo.commits[initial.oid] = initial
            repo.branches[DEFAULT_BRANCH] = initial.oid
            self._repos[(repo_type, repo_id)] = repo
        return repo

    def commit(
        self, repo: Repo, branch: str, header: Mapping[str, Any], operations: list[tuple[str, Mapping[str, Any]]]
    ) -> Commit:
        """Apply ``operations`` (NDJSON key, value) on top of ``branch`` and advance it."""
        with self._lock:
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            parent = repo.commits[repo.branches[branch]]
            expected_parent = header.get("parentCommit")
            if expected_parent is not None and expected_parent != parent.oid:
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(parent.files)
            for key, value in operations:
                path = value["path"]
                if key == "file":
                    files[path] = base64.b64decode(value["content"])
                elif key == "deletedFile":
                    if files.pop(path, None) is None:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    doomed = [p for p in files if p.startswith(prefix)]
                    if not doomed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in doomed:
                        del files[p]
                else:  # "lfsFile" cannot happen: preupload never answers "lfs"
                    raise HubError(400, f"Unsupported commit operation {key!r} (no LFS on this test server)")
            new = self._new_commit(parent.oid, header.get("summary", ""), header.get("description", ""), files)
            repo.commits[new.oid] = new
            repo.branches[branch] = new.oid
        return new

    def create_branch(self, repo: Repo, branch: str, starting_point: str | None) -> None:
        with self._lock:
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            repo.branches[branch] = repo.resolve(starting_point or DEFAULT_BRANCH).oid

    def _new_commit(self, parent: str | None, title: str, message: str, files: Mapping[str, bytes]) -> Commit:
        date = _now()
        tree = sorted((p, git_blob_sha1(b)) for p, b in files.items())
        seed = json.dumps([parent, title, message, date, next(self._sequence), tree]).encode()
        return Commit(hashlib.sha1(seed).hexdigest(), parent, title, message, date, files)


Route = tuple[str, re.Pattern[str], Callable[..., None]]
_API = r"^/api/(?P<kind>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"


class _Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request to a ``_route_*`` method (see the module docstring)."""

    server: _HTTPServer
    query: dict[str, list[str]]  # parsed query string of the current request
    body: bytes  # raw body of the current request

    # --- plumbing -------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # PUT and DELETE have no route: they are accepted only to be reported as unhandled.
    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the per-request access log; unknown routes are reported in ``_dispatch``."""

    def _dispatch(self, method: str) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        hub.record(method, self.path)
        try:
            for methods, pattern, handler in self.ROUTES:
                match = pattern.match(url.path)
                if match and method in methods.split("|"):
                    handler(self, **{k: unquote(v) if v is not None else None for k, v in match.groupdict().items()})
                    return
            hub.report_unhandled(method, self.path)
            raise HubError(404, f"Sorry, we can't find the page you are looking for ({method} {url.path}).")
        except HubError as error:
            self._send_error(error)
        except (KeyError, TypeError, ValueError) as error:  # malformed payload (ValueError covers bad JSON/base64)
            self._send_error(HubError(400, f"Bad request: {error!r}"))
        except Exception as error:
            traceback.print_exc()
            self._send_error(HubError(500, f"Test Hub server bug: {error!r}"))

    def _send_json(self, payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json; charset=utf-8", headers)

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message}
        if error.error_code is not None:
            headers["X-Error-Code"] = error.error_code
        if error.repo_commit is not None:
            headers["X-Repo-Commit"] = error.repo_commit
        self._send_json({"error": error.message}, error.status, headers)

    def _param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def _json_body(self) -> Any:
        return json.loads(self.body or b"{}")

    def _repo(self, kind: str | None, repo: str) -> Repo:
        return self.server.hub.store.get(REPO_TYPES[kind or "models"], repo)

    # --- account & misc -------------------------------------------------------------------

    def _route_whoami(self) -> None:
        self._send_json(
            {
                "type": "user",
                "id": "0" * 24,
                "name": USER,
                "fullname": "Test User",
                "email": f"{USER}@example.com",
                "emailVerified": True,
                "isPro": False,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "test-token", "role": "write"}},
            }
        )

    def _route_agent_harnesses(self) -> None:
        self._send_json({"standardEnvVars": [], "harnesses": {}})

    def _route_validate_yaml(self) -> None:
        self._send_json({"errors": [], "warnings": []})

    # --- repos ----------------------------------------------------------------------------

    def _route_create_repo(self) -> None:
        payload = self._json_body()
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        url = self.server.hub.repo_url(repo_type, repo_id)
        try:
            self.server.hub.store.create(repo_type, repo_id, private)
        except HubError as error:
            self._send_json({"error": error.message, "url": url}, error.status, {"X-Error-Message": error.message})
            return
        self._send_json({"url": url, "name": repo_id, "id": uuid.uuid4().hex[:24]})

    def _route_repo_info(self, kind: str, repo: str, rev: str | None = None) -> None:
        r = self._repo(kind, repo)
        commit = r.resolve(rev or DEFAULT_BRANCH)
        with_blobs = _is_true(self._param("blobs"))
        siblings = [
            {"rfilename": p, **({"size": len(b), "blobId": git_blob_sha1(b)} if with_blobs else {})}
            for p, b in sorted(commit.files.items())
        ]
        card = _card_data(commit.files)
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
            "id": repo,
            "author": repo.split("/")[0],
            "sha": commit.oid,
            "lastModified": commit.date,
            "createdAt": r.created_at,
            "private": r.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": list((card or {}).get("tags") or []),
            "siblings": siblings,
            "usedStorage": sum(len(b) for b in commit.files.values()),
        }
        if r.repo_type == "model":
            info["modelId"] = repo
        if card is not None:
            info["cardData"] = card
            for key in ("library_name", "pipeline_tag"):
                if key in card:
                    info[key] = card[key]
        self._send_json(info)

    def _route_tree(self, kind: str, repo: str, rev: str, path: str | None) -> None:
        commit = self._repo(kind, repo).resolve(rev)
        base = (path or "").strip("/")
        if base and (_entry(commit.files, base) or {}).get("type") != "directory":
            raise HubError(404, f"{base} does not exist on {rev}", "EntryNotFound")
        prefix = base + "/" if base else ""
        recursive = _is_true(self._param("recursive"))
        candidates = set(commit.files) | _directories(commit.files)
        paths = sorted(p for p in candidates if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :]))
        entries = [_entry(commit.files, p) for p in paths]
        start = int(self._param("cursor") or 0)
        page = entries[start : start + self.server.hub.tree_page_size]
        headers = {}
        if start + len(page) < len(entries):
            query = {k: v[0] for k, v in self.query.items()} | {"cursor": str(start + len(page))}
            headers["Link"] = f'<{self.server.hub.endpoint}{urlsplit(self.path).path}?{urlencode(query)}>; rel="next"'
        self._send_json(page, headers=headers)

    def _route_paths_info(self, kind: str, repo: str, rev: str) -> None:
        commit = self._repo(kind, repo).resolve(rev)
        form = parse_qs(self.body.decode())
        entries = [_entry(commit.files, p.strip("/")) for p in form.get("paths", [])]
        self._send_json([e for e in entries if e is not None])

    def _route_commits(self, kind: str, repo: str, rev: str) -> None:
        r = self._repo(kind, repo)
        self._send_json(
            [
                {
                    "id": c.oid,
                    "title": c.title,
                    "message": c.message,
                    "authors": [{"user": USER, "avatar": None}],
                    "date": c.date,
                }
                for c in r.history(r.resolve(rev))
            ]
        )

    def _route_refs(self, kind: str, repo: str) -> None:
        r = self._repo(kind, repo)
        branches = [
            {"name": name, "ref": f"refs/heads/{name}", "targetCommit": oid} for name, oid in sorted(r.branches.items())
        ]
        refs: dict[str, Any] = {"branches": branches, "tags": [], "converts": []}
        if _is_true(self._param("include_prs")):
            refs["pullRequests"] = []
        self._send_json(refs)

    def _route_create_branch(self, kind: str, repo: str, branch: str) -> None:
        r = self._repo(kind, repo)
        self.server.hub.store.create_branch(r, branch, self._json_body().get("startingPoint"))
        self._send_json({})

    # --- uploads --------------------------------------------------------------------------

    def _reject_pull_requests(self) -> None:
        if _is_true(self._param("create_pr")):
            raise HubError(400, "Pull requests are not supported by the test Hub server")

    def _route_preupload(self, kind: str, repo: str, rev: str) -> None:
        self._reject_pull_requests()
        commit = self._repo(kind, repo).resolve(rev)
        files = [
            {
                "path": f["path"],
                "uploadMode": "regular",
                "shouldIgnore": False,
                "oid": git_blob_sha1(commit.files[f["path"]]) if f["path"] in commit.files else None,
            }
            for f in self._json_body()["files"]
        ]
        self._send_json({"files": files, "commitOid": commit.oid})

    def _route_commit(self, kind: str, repo: str, rev: str) -> None:
        self._reject_pull_requests()
        r = self._repo(kind, repo)
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first line of the commit payload must be the header")
        commit = self.server.hub.store.commit(r, rev, lines[0]["value"], [(x["key"], x["value"]) for x in lines[1:]])
        commit_url = f"{self.server.hub.repo_url(r.repo_type, r.repo_id)}/commit/{commit.oid}"
        self._send_json({"success": True, "commitOid": commit.oid, "commitUrl": commit_url, "pullRequestUrl": None})

    # --- downloads ------------------------------------------------------------------------

    def _route_resolve(self, kind: str | None, repo: str, rev: str, path: str) -> None:
        commit = self._repo(kind, repo).resolve(rev)
        if path not in commit.files:
            raise HubError(404, "Entry not found", "EntryNotFound", repo_commit=commit.oid)
        data = commit.files[path]
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_sha1(data)}"'}
        self._send(200, data, "application/octet-stream", headers)

    ROUTES: list[Route] = [
        ("GET", re.compile(r"^/api/whoami-v2$"), _route_whoami),
        ("GET", re.compile(r"^/api/agent-harnesses$"), _route_agent_harnesses),
        ("POST", re.compile(r"^/api/validate-yaml$"), _route_validate_yaml),
        ("POST", re.compile(r"^/api/repos/create$"), _route_create_repo),
        ("GET", re.compile(_API + r"(?:/revision/(?P<rev>[^/]+))?$"), _route_repo_info),
        ("GET", re.compile(_API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$"), _route_tree),
        ("POST", re.compile(_API + r"/paths-info/(?P<rev>[^/]+)$"), _route_paths_info),
        ("GET", re.compile(_API + r"/commits/(?P<rev>[^/]+)$"), _route_commits),
        ("GET", re.compile(_API + r"/refs$"), _route_refs),
        ("POST", re.compile(_API + r"/branch/(?P<branch>[^/]+)$"), _route_create_branch),
        ("POST", re.compile(_API + r"/preupload/(?P<rev>[^/]+)$"), _route_preupload),
        ("POST", re.compile(_API + r"/commit/(?P<rev>[^/]+)$"), _route_commit),
        (
            "GET|HEAD",
            re.compile(r"^/(?:(?P<kind>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"),
            _route_resolve,
        ),
    ]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: HubServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub


class HubServer:
    """The test Hub: storage, the HTTP server thread, a request log and client configuration."""

    def __init__(self, home: Path) -> None:
        self.home = home  # HF_HOME used by the client while configured for this server
        self.store = HubStore()
        self.tree_page_size = TREE_PAGE_SIZE
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request received
        self.unhandled: list[tuple[str, str]] = []
        self._log_lock = threading.Lock()
        self._ids = itertools.count()
        self._http = _HTTPServer(self)
        self._thread = threading.Thread(target=self._http.serve_forever, name="test-hub-server", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.server_port}"

    @property
    def token(self) -> str:
        return TOKEN

    @property
    def user(self) -> str:
        return USER

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def record(self, method: str, path: str) -> None:
        with self._log_lock:
            self.requests.append((method, path))

    def report_unhandled(self, method: str, path: str) -> None:
        print(f"[test hub server] unhandled request: {method} {path}", file=sys.stderr, flush=True)
        with self._log_lock:
            self.unhandled.append((method, path))

    def repo_url(self, repo_type: str, repo_id: str) -> str:
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        return f"{self.endpoint}/{prefix}{repo_id}"

    def unique_repo_id(self, name: str) -> str:
        """``test-user/<name>-<n>-<random>``: a repo id no other test uses."""
        return f"{USER}/{name}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    @contextlib.contextmanager
    def configure_client(self, offline: bool = False) -> Iterator[HubServer]:
        """Point huggingface_hub at this server (endpoint, token, HF_HOME, no Xet) and set
        its offline mode; everything is restored on exit. Nesting is fine, e.g. a block with
        ``offline=True`` inside the ``hub_online`` fixture. See the module docstring for why
        constants are patched and not only the environment."""
        import huggingface_hub.constants as constants
        import huggingface_hub.hf_api as hf_api
        import huggingface_hub.utils._cache_manager as cache_manager

        home = str(self.home)
        hub_cache = os.path.join(home, "hub")
        flag = "1" if offline else "0"
        env = {
            "HF_ENDPOINT": self.endpoint,
            "HF_TOKEN": TOKEN,
            "HF_HOME": home,
            "HF_HUB_CACHE": hub_cache,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": flag,
            "TRANSFORMERS_OFFLINE": flag,
        }
        attributes: list[tuple[object, str, object]] = [
            (constants, "ENDPOINT", self.endpoint),
            (constants, "HUGGINGFACE_CO_URL_TEMPLATE", self.endpoint + "/{repo_id}/resolve/{revision}/{filename}"),
            (constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"}),
            (constants, "HF_HUB_DISABLE_XET", True),
            (constants, "HF_HUB_OFFLINE", offline),
            (constants, "HF_HOME", home),
            (constants, "HF_HUB_CACHE", hub_cache),
            (constants, "HUGGINGFACE_HUB_CACHE", hub_cache),
            (constants, "HF_ASSETS_CACHE", os.path.join(home, "assets")),
            (constants, "HF_TOKEN_PATH", os.path.join(home, "token")),
            (constants, "HF_STORED_TOKENS_PATH", os.path.join(home, "stored_tokens")),
            (constants, "AGENT_HARNESSES_PATH", os.path.join(home, ".agent_harnesses.json")),
            (constants, "HF_XET_CACHE", os.path.join(home, "xet")),
            (cache_manager, "HF_HUB_CACHE", hub_cache),
            (hf_api.api, "endpoint", self.endpoint),
        ]
        saved_env = {name: os.environ.get(name) for name in env}
        saved_attributes = [(obj, name, getattr(obj, name)) for obj, name, _ in attributes]
        os.environ.update(env)
        for obj, name, value in attributes:
            setattr(obj, name, value)
        try:
            yield self
        finally:
            for obj, name, value in reversed(saved_attributes):
                setattr(obj, name, value)
            for name, old in saved_env.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The test Hub, running for the whole session. It does not touch the client's
    configuration by itself: use ``hub_online`` or ``hub_server.configure_client(...)``."""
    server = HubServer(home=tmp_path_factory.mktemp("hf_home"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_online(hub_server: HubServer) -> Iterator[HubServer]:
    """For one test: huggingface_hub (and transformers/timm through it) talks to the test Hub,
    online. Offline mode, endpoint, token and HF_HOME are restored after the test."""
    with hub_server.configure_client(offline=False):
        yield hub_server
