"""The modules that moved into :mod:`hf_calibrate.results` keep their old paths: importing ``hf_calibrate.reporting``
(``from hf_calibrate import reporting``, ``from hf_calibrate.reporting import X``) gives the very module
``hf_calibrate.results.reporting``, so monkeypatching either name changes both (docs/design.md §1)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import hf_calibrate

#: moved module → a public name it defines
MOVED = {
    "cards": "render_card",
    "comparison": "compare",
    "evaluation": "summarize",
    "evaluator": "calibration_evaluator",
    "plotting": "reliability_diagram",
    "reporting": "METRIC_NAMES",
}
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_every_old_path_imports_the_new_module(name, monkeypatch):
    new = importlib.import_module(f"hf_calibrate.results.{name}")
    old = importlib.import_module(f"hf_calibrate.{name}")
    assert old is new and sys.modules[f"hf_calibrate.{name}"] is new and new.__name__ == f"hf_calibrate.results.{name}"
    assert getattr(hf_calibrate, name) is new and getattr(hf_calibrate.results, name) is new
    namespace: dict = {}
    exec(f"from hf_calibrate import {name} as module\nfrom hf_calibrate.{name} import {MOVED[name]} as value", namespace)
    assert namespace["module"] is new and namespace["value"] is getattr(new, MOVED[name])
    monkeypatch.setattr(f"hf_calibrate.{name}.{MOVED[name]}", "patched")  # through the old path ...
    assert getattr(new, MOVED[name]) == "patched"  # ... is through the new one


def test_old_paths_imported_first_are_the_new_modules():
    """In a fresh interpreter, the old paths imported before anything of ``hf_calibrate.results``: still one module each,
    and the old name gives no second copy of it."""
    code = "\n".join([
        "import importlib, sys",
        f"names = {sorted(MOVED)!r}",
        "old = {name: importlib.import_module(f'hf_calibrate.{name}') for name in names}",
        "for name in names:",
        "    new = sys.modules[f'hf_calibrate.results.{name}']",
        "    assert old[name] is new and sys.modules[f'hf_calibrate.{name}'] is new, name",
        "    assert sum(module is new for module in list(sys.modules.values())) == 2, name",
        "assert not [n for n, m in sys.modules.items() if n.startswith('hf_calibrate.') and m.__name__ != n"
        " and n.split('.')[-1] not in names], 'an alias of another module'",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr


def test_old_paths_say_they_are_kept_for_users():
    for name in MOVED:
        source = (REPO_ROOT / "hf_calibrate" / f"{name}.py").read_text(encoding="utf-8")
        assert "kept for users" in source and f"hf_calibrate.results.{name}" in source
