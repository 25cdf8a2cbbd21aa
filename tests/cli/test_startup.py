"""Start-up: ``import hf_calibrate`` and ``hf-calibrate --help`` import nothing heavy (issue 12, part 9).

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


def test_transformers_imported_after_hf_calibrate_knows_the_model_type():
    """The README's order: ``import hf_calibrate`` first (nothing heavy yet), ``from transformers import pipeline``
    later: transformers' Auto classes know ``hf_calibrate`` from that import on, without touching the package again."""
    code = ("import sys\nimport hf_calibrate\nassert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
            "from transformers import AutoConfig, pipeline\n"
            "assert type(AutoConfig.for_model('hf_calibrate')).__name__ == 'CalibratedConfig'\n"
            "import hf_calibrate.modeling as modeling\n"
            "from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification\n"
            "config = modeling.CalibratedConfig()\n"
            "assert all(auto._model_mapping[type(config)] is modeling.CalibratedModel\n"
            "           for auto in (AutoModelForImageClassification, AutoModelForSequenceClassification))")
    assert "hf_calibrate" in _modules_after(code)


def test_a_failed_registration_warns_and_leaves_the_users_import_alone():
    """Registering runs inside the user's ``import transformers``: an error there is a warning, not a failed import."""
    code = ("import warnings\nimport hf_calibrate._auto_registration as hook\n"
            "def broken():\n    raise RuntimeError('no torch here')\n"
            "hook.register_now = broken\nhook.register_when_transformers_loads()\n"
            "with warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n"
            "    import transformers\n"
            "assert transformers.__version__ and any('no torch here' in str(w.message) for w in caught), caught")
    assert "transformers" in _modules_after(code)


def test_compares_ranking_choices_are_the_metrics_with_intervals():
    """The parser's spelled-out ``--metric`` choices (no torch at --help) are the evaluation's interval metrics."""
    from hf_calibrate.cli.metric_keys import COMPARE_METRICS
    from hf_calibrate.results.evaluation import INTERVAL_METRICS

    assert COMPARE_METRICS == INTERVAL_METRICS


def test_the_packages_modules_are_its_attributes():
    """``import hf_calibrate`` then ``hf_calibrate.results.comparison`` (or its old path ``hf_calibrate.comparison``) /
    ``hf_calibrate.modeling.X`` (the README names them), and ``dir()`` lists the lazily imported names."""
    code = ("import hf_calibrate\nassert hf_calibrate.results.comparison.compare and hf_calibrate.modeling.TemperatureScalingFallbackWarning\n"
            "assert hf_calibrate.comparison is hf_calibrate.results.comparison\n"
            "assert {'CalibratedModel', 'metrics'} <= set(dir(hf_calibrate))\n"
            "try:\n    hf_calibrate.no_such_module\nexcept AttributeError:\n    pass\nelse:\n    raise AssertionError")
    _modules_after(code)


@pytest.mark.parametrize("first", ["hf_calibrate.configuration", "hf_calibrate.modeling", "hf_calibrate.fitting.calibrate",
                                   "hf_calibrate.results.evaluator", "hf_calibrate.evaluator"])  # the last: its old path
@pytest.mark.parametrize("before", ["", "import importlib.util; importlib.util.find_spec('transformers')"])
def test_registration_whichever_module_brings_transformers_in(first, before):
    """When one of the package's own modules is what first imports transformers (registering then would import
    half-initialised modules), registration waits for it and still happens, without a warning; an availability
    check (``find_spec``, as accelerate's) before does not use up the import hook."""
    code = (f"import warnings\nwarnings.simplefilter('error')\n{before}\nimport {first}\n"
            "from transformers import AutoConfig\n"
            "assert type(AutoConfig.for_model('hf_calibrate')).__name__ == 'CalibratedConfig'")
    assert "transformers" in _modules_after(code)
