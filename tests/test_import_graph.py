"""No import cycles in ``hf_calibrate``: neither between modules nor between its top-level parts.

The graph is read from the source with :mod:`ast`, not from ``sys.modules``: every ``import`` and
``from ... import`` statement in a file counts, wherever it stands (inside a function, under
``if TYPE_CHECKING:``, in a ``try``), so a cycle cannot be hidden by importing late.

How an import becomes edges (``M`` is the importing module):

* ``import a.b.c`` and ``from a.b.c import name``: an edge to ``a.b.c``, and, when ``name`` is
  itself a module of the package, to ``a.b.c.name`` instead (``from hf_calibrate import scoring``
  imports the module ``hf_calibrate.scoring``). Relative imports are resolved against ``M``'s
  package. Only modules of the package under test are nodes; everything else is ignored.
* A package's ``__init__`` is the node named like the package (``hf_calibrate.calibrators``).
  Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so the edge goes to
  those packages too, except to the packages that contain ``M`` (those are already running by the
  time ``M`` runs: ``calibrators/base.py`` importing ``calibrators/binning.py`` is no cycle with
  ``calibrators/__init__.py``). Naming a package itself (``from . import SomeClass`` in a module
  of that package, ``from hf_calibrate import CalibratedModel`` in any module) is an edge to its
  ``__init__``, and so a cycle with the re-exports the ``__init__`` imports.
* A package whose ``__init__`` defines a lazy re-export table, a module-level dict literal named
  ``_EXPORTS`` (name → its submodule, resolved by the package's ``__getattr__`` on first use), makes
  ``from package import name`` an edge to that submodule too: the name's module runs when it is
  imported, as if it were imported by name.
* Other dynamic imports (``importlib.import_module(...)``) are not statements and are not read.

Package level: each module is collapsed to the top-level part of ``hf_calibrate`` it lies in
(``hf_calibrate.x.y`` → ``hf_calibrate.x``; a top-level module is its own part, and
``hf_calibrate/__init__.py`` is the part ``hf_calibrate``); edges inside one part are dropped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "hf_calibrate"

Graph = dict[str, set[str]]


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file of the package (``__init__.py`` names the package)."""
    root = package_dir.name
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if any(not part.isidentifier() for part in parts):
            continue  # not importable as a module of the package (e.g. data files shipped as .py)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((root, *parts))] = path
    return modules


def _packages(modules: Mapping[str, Path]) -> set[str]:
    return {name for name, path in modules.items() if path.name == "__init__.py"}


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def _known_prefix(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package, if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def imported_modules(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of the package that importing ``module`` (from ``path``) runs, by its import statements."""
    is_package = path.name == "__init__.py"
    own_packages = set(_ancestors(module)) | ({module} if is_package else set())
    targets: set[str] = set()

    def add(name: str, explicit: bool) -> None:
        found = _known_prefix(name, modules)
        if found is None:
            return
        if explicit or found not in own_packages:
            targets.add(found)
        targets.update(parent for parent in _ancestors(found) if parent in modules and parent not in own_packages)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, explicit=False)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            if not source:
                continue
            lazy = lazy_exports(modules[source]) if source in modules else {}
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if alias.name != "*" and submodule in modules:
                    add(submodule, explicit=True)
                else:  # a name the module (or package __init__) defines: its code runs
                    add(source, explicit=True)
                if alias.name in lazy:  # a lazy re-export: its module runs too
                    add(f"{source}.{lazy[alias.name]}", explicit=True)
    targets.discard(module)
    return targets


def lazy_exports(path: Path) -> dict[str, str]:
    """A package ``__init__``'s lazy re-export table: its module-level ``_EXPORTS = {name: submodule}`` dict
    literal (empty for any other file, or a table that is not a literal of strings)."""
    if path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == "_EXPORTS" for target in targets) and node.value is not None:
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(name): str(module) for name, module in table.items()} if isinstance(table, dict) else {}
    return {}


def build_import_graph(package_dir: Path) -> Graph:
    """Module → the modules of the package it imports (see the module docstring for the rules)."""
    modules = module_files(package_dir)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def collapse_to_parts(graph: Mapping[str, Iterable[str]], root: str) -> Graph:
    """The graph between the top-level parts of package ``root`` (``root.x.y`` → ``root.x``)."""

    def part(name: str) -> str:
        return ".".join(name.split(".")[:2])

    parts: Graph = {part(name): set() for name in graph}
    for name, targets in graph.items():
        parts[part(name)].update(part(target) for target in targets if part(target) != part(name))
    assert all(name == root or name.startswith(f"{root}.") for name in parts)
    return parts


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one node only, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: Mapping[str, Iterable[str]], start: str) -> list[str]:
    """A shortest cycle through ``start`` (breadth first), as ``[start, ..., start]``; empty if none."""
    previous: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph.get(node, ())):
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if successor not in seen:
                    seen.add(successor)
                    previous[successor] = node
                    following.append(successor)
        frontier = following
    return []


def describe_cycles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One line per cycle (strongly connected component): a shortest cycle in it, and all its members."""
    lines = []
    for component in strongly_connected_components(graph):
        cycle = shortest_cycle({node: set(graph[node]) & set(component) for node in component}, component[0])
        line = " -> ".join(cycle)
        if len(component) > len(cycle) - 1:
            line += f"   (all {len(component)} in this cycle: {', '.join(component)})"
        lines.append(line)
    return lines


def assert_acyclic(graph: Mapping[str, Iterable[str]], what: str) -> None:
    """Fail, printing each cycle, when ``graph`` has one (``what``: whose graph it is, for the message)."""
    cycles = describe_cycles(graph)
    assert not cycles, f"import cycles between {what} (break them by moving code, not by importing later):\n" + "\n".join(cycles)


@pytest.fixture(scope="module")
def module_graph() -> Graph:
    return build_import_graph(PACKAGE_DIR)


def test_no_import_cycle_between_modules(module_graph):
    assert_acyclic(module_graph, "modules of hf_calibrate")


def test_no_import_cycle_between_top_level_parts(module_graph):
    assert_acyclic(collapse_to_parts(module_graph, PACKAGE_DIR.name), "the top-level parts of hf_calibrate")


def test_the_graph_covers_the_package(module_graph):
    # The builder reads the real package: the known edges are there (so a broken reader can't pass by finding nothing).
    assert "hf_calibrate.modeling" in module_graph
    assert "hf_calibrate.calibrators.base" in module_graph["hf_calibrate.calibrators"]
    assert any(targets for targets in module_graph.values())


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_guard_finds_cycles_in_a_synthetic_package(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "A = 1\n\ndef late():\n    from pkg.sub import b  # hidden in a function: still counts\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "import os\nfrom . import c\n",
    })
    graph = build_import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.d"] == {"pkg.c"}
    assert describe_cycles(graph) == ["pkg.a -> pkg.sub.b -> pkg.c -> pkg.a"]
    assert describe_cycles(collapse_to_parts(graph, "pkg")) == ["pkg.a -> pkg.sub -> pkg.c -> pkg.a"]
    with pytest.raises(AssertionError, match=r"between modules of pkg .*\n\s*pkg\.a -> pkg\.sub\.b -> pkg\.c -> pkg\.a"):
        assert_acyclic(graph, "modules of pkg")


def test_guard_counts_a_module_importing_its_own_package_reexports(tmp_path):
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/part/__init__.py": "from .base import Base\nfrom .head import Head\n",
        "pkg/part/base.py": "class Base: ...\n",
        "pkg/part/head.py": "from .base import Base  # fine: a sibling\nfrom . import Base as B  # the package's re-export: a cycle\n",
    })
    graph = build_import_graph(package)
    assert graph["pkg.part.head"] == {"pkg.part", "pkg.part.base"}
    assert describe_cycles(graph) == ["pkg.part -> pkg.part.head -> pkg.part"]
    del graph["pkg.part.head"], graph["pkg.part"]  # without the re-export import there is none
    assert describe_cycles(graph) == []


def test_guard_follows_a_lazy_reexport_to_its_module(tmp_path):
    """``from pkg import Model`` where ``pkg.__getattr__`` imports ``pkg.modeling`` on first use: inside a module that
    ``pkg.modeling`` imports, that is a cycle at import time, though the package's ``__init__`` imports nothing."""
    package = _write(tmp_path, {
        "pkg/__init__.py": "import importlib\n_EXPORTS = {'Model': 'modeling'}\n"
                           "def __getattr__(name):\n    return getattr(importlib.import_module('pkg.' + _EXPORTS[name]), name)\n",
        "pkg/modeling.py": "from .cards import card\nclass Model: ...\n",
        "pkg/cards.py": "from pkg import Model\ndef card(): ...\n",
    })
    graph = build_import_graph(package)
    assert graph["pkg.cards"] == {"pkg", "pkg.modeling"}
    assert describe_cycles(graph) == ["pkg.cards -> pkg.modeling -> pkg.cards"]
