"""Start-up: ``import hf_calibrate`` and ``hf-calibrate --help`` import nothing heavy.

Properties, not timings: what a fresh interpreter has imported afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("datasets", "evaluate", "matplotlib")


def _modules_after(code: str) -> set:
    """The top-level modules imported by ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{name.split('.')[0] for name in sys.modules}})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_import_hf_calibrate_imports_nothing_heavy():
    """The package's names are imported when first used: ``import hf_calibrate`` brings in no library."""
    assert not _modules_after("import hf_calibrate") & {"torch", "transformers", "timm", "accelerate", *HEAVY}


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


@pytest.mark.parametrize("register, transformers_first", [("from hf_calibrate import CalibratedModel", False),
                                                          ("from hf_calibrate import CalibratedModel", True),
                                                          ("hf_calibrate.register_auto_classes()", False)])
def test_importing_the_model_registers_it_with_the_auto_classes(register, transformers_first):
    """Importing the model (or ``register_auto_classes()``) registers it, whichever of transformers and hf_calibrate is
    imported first: ``AutoConfig`` and the Auto model classes, which pipelines use, know the ``hf_calibrate`` type."""
    code = ("import warnings\nwarnings.simplefilter('error')\n" + ("import transformers\n" if transformers_first else "")
            + f"import hf_calibrate\n{register}\n"
            "from transformers import AutoConfig, AutoModelForImageClassification, AutoModelForSequenceClassification\n"
            "from hf_calibrate.modeling import CalibratedConfig, CalibratedModel\n"
            "assert type(AutoConfig.for_model('hf_calibrate')) is CalibratedConfig\n"
            "assert all(auto._model_mapping[CalibratedConfig] is CalibratedModel\n"
            "           for auto in (AutoModelForImageClassification, AutoModelForSequenceClassification))")
    assert "transformers" in _modules_after(code)


def test_compares_ranking_choices_are_the_metrics_with_intervals():
    """The parser's spelled-out ``--metric`` choices (no torch at --help) are the evaluation's interval metrics."""
    from hf_calibrate.cli.metric_keys import COMPARE_METRICS
    from hf_calibrate.results.evaluation import INTERVAL_METRICS

    assert COMPARE_METRICS == INTERVAL_METRICS


def test_the_packages_modules_are_its_attributes():
    """``import hf_calibrate`` then ``hf_calibrate.results.comparison`` / ``hf_calibrate.modeling.X`` (the docs
    names them), and ``dir()`` lists the lazily imported names."""
    code = ("import hf_calibrate\nassert hf_calibrate.results.comparison.compare and hf_calibrate.modeling.TemperatureScalingFallbackWarning\n"
            "assert {'CalibratedModel', 'metrics'} <= set(dir(hf_calibrate))\n"
            "try:\n    hf_calibrate.no_such_module\nexcept AttributeError:\n    pass\nelse:\n    raise AssertionError")
    _modules_after(code)
