"""Start-up: ``import hf_calibrate`` and ``hf-calibrate --help`` import nothing heavy (issue 12, part 9).

Properties, not timings: what a fresh interpreter has imported afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("datasets", "evaluate", "matplotlib")


def _modules_after(code: str) -> set:
    """The top-level modules imported by ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{name.split('.')[0] for name in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_import_hf_calibrate_leaves_datasets_evaluate_and_matplotlib_out():
    assert not _modules_after("import hf_calibrate") & set(HEAVY)


def test_help_and_version_import_no_library():
    """The parser is built without torch, transformers or datasets: --help and --version answer at once."""
    code = ("import contextlib, io\nfrom hf_calibrate.cli import main\n"
            "for flag in ('--help', '--version'):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n        main([flag])")
    assert not _modules_after(code) & {"torch", "transformers", "timm", "accelerate", *HEAVY}


def test_every_public_name_is_still_importable_from_the_package():
    import hf_calibrate

    for name in hf_calibrate.__all__:
        assert getattr(hf_calibrate, name) is not None, name
    with pytest.raises(AttributeError):
        hf_calibrate.no_such_name  # noqa: B018


def test_import_after_transformers_registers_the_auto_classes():
    """A transformers user's ``pipeline(model="user/calibrated-repo")`` works after a bare ``import hf_calibrate``."""
    code = ("import transformers\nimport hf_calibrate\nfrom transformers import AutoConfig\n"
            "assert type(AutoConfig.for_model('hf_calibrate')).__name__ == 'CalibratedConfig'")
    assert "hf_calibrate" in _modules_after(code)
