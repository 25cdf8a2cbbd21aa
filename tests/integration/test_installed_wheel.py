"""The package as a user installs it from a wheel, outside the checkout: its ``evaluate`` modules ship inside it and
load the documented way (``evaluate.load(hf_calibrate.evaluate_module_path(name))``), and every example their
docstrings and cards show runs there as written.

The wheel is built from a copy of the sources (so no build folder lands in the checkout) and installed without its
dependencies into a folder of its own, which a fresh process puts first on its path; the dependencies are this
environment's. The process runs in an empty folder, so nothing of the checkout is in reach.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_calibrate import EVALUATE_MODULES
from hf_calibrate.metrics import brier_score, expected_calibration_error, negative_log_likelihood

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBABILITIES = [[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]
REFERENCES = [0, 1, 1, 2]
SCRIPT = """
import json, sys
import evaluate
import hf_calibrate
assert hf_calibrate.__file__.startswith(sys.argv[1]), hf_calibrate.__file__
scores = {name: evaluate.load(hf_calibrate.evaluate_module_path(name)).compute(predictions=json.loads(sys.argv[2]),
                                                                            references=json.loads(sys.argv[3]))
          for name in hf_calibrate.EVALUATE_MODULES}
print(json.dumps(scores))
"""
# Each module's doctests (its inputs description and its card, code fences blanked so that they do not end an
# expected output), run as a user pastes them: fresh globals, doctest's default options.
DOCTEST_SCRIPT = """
import doctest, json, re, sys
from pathlib import Path
import evaluate
from hf_calibrate import EVALUATE_MODULES, evaluate_module_path

def run(text, name):
    report = []
    test = doctest.DocTestParser().get_doctest(text, {}, name, name, 0)
    result = doctest.DocTestRunner().run(test, out=report.append)
    return {"attempted": result.attempted, "failed": result.failed, "report": "".join(report)}

results = {}
for name in EVALUATE_MODULES:
    folder = Path(evaluate_module_path(name))
    assert folder.is_relative_to(sys.argv[1]), folder
    card = re.sub(r"^```.*$", "", (folder / "README.md").read_text(encoding="utf-8"), flags=re.M)
    results[name] = {"inputs_description": run(evaluate.load(str(folder)).inputs_description, name),
                     "card": run(card, f"{name}/README.md")}
print(json.dumps(results))
"""


def _run(*command: str, **options) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **options)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO_ROOT / "hf_calibrate", source / "hf_calibrate", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(source))
    [wheel] = (root / "dist").glob("hf_calibrate-*.whl")
    _run(sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(root / "site"), str(wheel))
    return root / "site"


def _user_environment(installed: Path, folder: Path) -> dict:
    """The environment of a process that runs in ``folder`` with the installed package first on its path."""
    paths = {"PYTHONPATH": str(installed), "HF_MODULES_CACHE": str(folder / "modules")}
    return {**os.environ, **paths, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def installed_doctests(installed, tmp_path_factory) -> dict:
    """``{module: {"inputs_description" | "card": {"attempted", "failed", "report"}}}`` in the installed package."""
    folder = tmp_path_factory.mktemp("user")
    environment = _user_environment(installed, folder)
    result = _run(sys.executable, "-c", DOCTEST_SCRIPT, str(installed), cwd=folder, env=environment)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_evaluate_module_loads_from_the_installed_wheel(installed, tmp_path):
    result = _run(sys.executable, "-c", SCRIPT, str(installed), json.dumps(PROBABILITIES), json.dumps(REFERENCES),
                  cwd=tmp_path, env=_user_environment(installed, tmp_path))
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(scores) == set(EVALUATE_MODULES)
    probabilities, labels = torch.tensor(PROBABILITIES, dtype=torch.float64), torch.tensor(REFERENCES)
    assert scores["ece"]["ece"] == pytest.approx(float(expected_calibration_error(probabilities, labels)))
    assert scores["nll"]["nll"] == pytest.approx(float(negative_log_likelihood(probabilities, labels)))
    assert scores["brier"]["brier"] == pytest.approx(float(brier_score(probabilities, labels)))


@pytest.mark.parametrize("source", ["inputs_description", "card"])
@pytest.mark.parametrize("name", EVALUATE_MODULES)
def test_every_documented_example_runs_in_the_installed_package(installed_doctests, name, source):
    outcome = installed_doctests[name][source]
    assert outcome["failed"] == 0, outcome["report"]
    assert outcome["attempted"] >= 3  # the examples were found, not skipped


def test_an_unknown_module_name_lists_the_modules():
    from hf_calibrate import evaluate_module_path

    with pytest.raises(ValueError, match="no evaluate module 'ace'; the modules are: ece, classwise_ece, nll, brier, calibration"):
        evaluate_module_path("ace")
