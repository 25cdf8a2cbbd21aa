"""evaluate's own test of metric modules (``tests/test_metric_common.py`` of evaluate 0.4.6, vendored unchanged in
``evaluate_upstream/``) passes on every module of ``hf_calibrate/evaluate_metrics/``.

For each folder ``metrics/<name>/`` in its working directory, that test loads the module through evaluate's loader,
refuses a ``_compute`` that takes ``**kwargs``, and runs ``doctest.testmod`` on the module with ``evaluate.load``
patched to load ``metrics/<argument>`` (so an absolute path, as ``evaluate_module_path`` gives, loads as it is).
It runs once, in a fresh pytest process, on a temporary copy of that layout; two broken copies of ``nll`` ride along
as controls, to show that the harness does refuse ``**kwargs`` and an example that loads a checkout-only path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from hf_calibrate import EVALUATE_MODULES, evaluate_module_path

REPO_ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).with_name("evaluate_upstream")
# SHA-256 of the vendored files as taken from evaluate v0.4.6 (evaluate_upstream/README.md): they stay unchanged.
UPSTREAM_SHA256 = {
    "test_metric_common.py": "f9d762cf0febc9ebaa6388fba0f8f979741db8957d11d648734a8b8f8a962610",
    "utils.py": "ac119b68ff99e6e92ca11e0112813c0aff2e1ac7b68c4cddefdcb8b7ad7a8f7f",
}
TEST_FILE = "tests/test_metric_common.py"
# evaluate's test of its own seqeval metric, which this layout does not have.
DESELECTED = f"{TEST_FILE}::test_seqeval_raises_when_incorrect_scheme"
# Control modules: nll with its options in **kwargs, and nll with the example path of a checkout.
CONTROLS = {
    "nll_var_kwargs": ("from_logits=False, bootstrap=0, seed=0)", "bootstrap=0, seed=0, **kwargs)"),
    "nll_checkout_example": ('evaluate.load(evaluate_module_path("nll"))', 'evaluate.load("evaluate_metrics/nll")'),
}


def _build_layout(root: Path) -> None:
    """``root/metrics/<name>/`` for each module and control, ``root/tests/`` with evaluate's test files."""
    for name in EVALUATE_MODULES:
        shutil.copytree(
            evaluate_module_path(name), root / "metrics" / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    for control, (old, new) in CONTROLS.items():
        source = (root / "metrics" / "nll" / "nll.py").read_text(encoding="utf-8")
        assert source.count(old) == 1, f"the control {control} no longer applies: nll.py has no {old!r}"
        (root / "metrics" / control).mkdir()
        (root / "metrics" / control / f"{control}.py").write_text(source.replace(old, new), encoding="utf-8")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").touch()
    for name in ("test_metric_common.py", "utils.py"):
        shutil.copy(UPSTREAM / name, root / "tests" / name)


def _outcomes(report: Path) -> dict[str, str]:
    """``{module name: "passed", or "failure" / "error" / "skipped", its message and traceback}`` of the report."""
    prefix = "test_load_metric_"
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        if not case.get("name", "").startswith(prefix):
            continue
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if problem is None else f"{problem.tag}: {problem.get('message', '')}\n{problem.text}"
        outcomes[case.get("name")[len(prefix):]] = outcome
    return outcomes


@pytest.fixture(scope="module")
def upstream_outcomes(tmp_path_factory) -> tuple[dict[str, str], str]:
    if importlib.util.find_spec("absl") is None:
        pytest.fail("evaluate's module test imports absl.testing: pip install 'absl-py>=2.1,<3' (in the test extra)")
    root = tmp_path_factory.mktemp("evaluate_layout")
    _build_layout(root)
    env = {key: value for key, value in os.environ.items() if key not in ("RUN_SLOW", "RUN_LOCAL", "PYTEST_ADDOPTS")}
    env.update(HF_HOME=str(root / "hf_home"), HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    # hf_calibrate from this checkout, whose evaluate_module_path the examples call, whatever the working directory.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "pytest", TEST_FILE, "--deselect", DESELECTED, "-p", "no:cacheprovider",
        "-p", "no:randomly", "-q", f"--junitxml={root / 'report.xml'}",
    ]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    if not (root / "report.xml").is_file():
        pytest.fail(f"evaluate's module test wrote no report:\n{output}")
    return _outcomes(root / "report.xml"), output


def test_the_vendored_files_are_evaluates_unchanged():
    digests = {name: hashlib.sha256((UPSTREAM / name).read_bytes()).hexdigest() for name in UPSTREAM_SHA256}
    assert digests == UPSTREAM_SHA256


@pytest.mark.parametrize("name", EVALUATE_MODULES)
def test_evaluate_metric_common_passes(name, upstream_outcomes):
    outcomes, output = upstream_outcomes
    assert outcomes.get(name) == "passed", output


def test_the_harness_refuses_var_kwargs_and_checkout_paths(upstream_outcomes):
    outcomes, output = upstream_outcomes
    var_kwargs, checkout_example = outcomes["nll_var_kwargs"], outcomes["nll_checkout_example"]
    assert var_kwargs.startswith("failure: AssertionError") and "# no **kwargs" in var_kwargs, output
    assert checkout_example.startswith("failure: FileNotFoundError: Couldn't find a module script"), output
    assert "metrics/evaluate_metrics/nll/nll.py" in checkout_example, output
    assert set(outcomes) == set(EVALUATE_MODULES) | set(CONTROLS), output  # nothing else ran, nothing was lost
