"""MkDocs hooks (mkdocs.yml ``hooks:``): one set of Markdown links that works on GitHub and in the built site.

The pages link to each other and to the benchmark tables by their paths in the repository (``design.md``,
``../benchmarks/results/fit_cost.md``), which GitHub follows as they are. MkDocs only knows the files under
``docs_dir``, and ``mkdocs build --strict`` fails on a link that leaves it. So:

* :func:`on_files` adds the benchmark tables (``benchmarks/README.md``, ``benchmarks/results/*``) and
  ``CONTRIBUTING.md`` to the site, at their repository paths (``benchmarks/results/fit_cost.md``);
* :func:`on_page_markdown` rewrites every relative link of every page from "relative to this file in the
  repository" to "relative to this page in the site", when its target is one of the site's files.

A link to anything else outside ``docs/`` is left as it is, so ``--strict`` still fails on it: a broken link
fails the build, wherever it points.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
#: repository paths (files, or folders whose files) served at the same path in the site
INCLUDED = ("CONTRIBUTING.md", "benchmarks/README.md", "benchmarks/results")
#: an inline Markdown link or image target: ``](target)`` or ``](target "title")``
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")


def _included_paths() -> list:
    """The repository paths of the files :data:`INCLUDED` names, in order."""
    paths = []
    for name in INCLUDED:
        path = ROOT / name
        paths.extend(sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path])
    return [path.relative_to(ROOT).as_posix() for path in paths]


def on_files(files, config):
    taken = {file.dest_uri: file.src_uri for file in files}
    for path in _included_paths():
        file = File(path, src_dir=str(ROOT), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"])
        if file.dest_uri in taken:  # e.g. docs/benchmarks.md and benchmarks/README.md are both benchmarks/index.html
            raise PluginError(f"{path} and docs/{taken[file.dest_uri]} would both be the site's {file.dest_uri}: rename the page")
        taken[file.dest_uri] = file.src_uri
        files.append(file)
    return files


def _site_path(repository_path: str, docs_dir: str, files) -> str | None:
    """Where the repository file ``repository_path`` is in the site (its path relative to ``docs_dir``), or None when
    it is not a file of the site."""
    if repository_path.startswith(docs_dir + "/"):
        site = repository_path[len(docs_dir) + 1:]
    elif any(repository_path == name or repository_path.startswith(name + "/") for name in INCLUDED):
        site = repository_path
    else:
        return None
    return site if files.get_file_from_path(site) is not None else None


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"]).resolve().relative_to(ROOT).as_posix()
    source = Path(page.file.abs_src_path).resolve().relative_to(ROOT).as_posix()
    here = posixpath.dirname(page.file.src_uri)

    def rewritten(match: re.Match) -> str:
        target = match.group(2)
        path, hash_, anchor = target.partition("#")
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
            return match.group(0)  # an anchor on this page, a URL, or an absolute path
        site = _site_path(posixpath.normpath(posixpath.join(posixpath.dirname(source), path)), docs_dir, files)
        if site is None:
            return match.group(0)  # not a file of the site: left for --strict to report
        return f"{match.group(1)}{posixpath.relpath(site, here or '.')}{hash_}{anchor}{match.group(3)}"

    return LINK.sub(rewritten, markdown)
