"""Suite-wide settings: offline Hugging Face libraries, and the shared zoo of real models.

Nothing may be downloaded at test time. The environment is set here, before any test module
imports transformers, huggingface_hub, datasets or evaluate. Hub round trips run against the
local server of ``tests/hub_server.py`` (fixtures ``hub_server`` / ``hub_online``).

The zoo models (``hf_calibrate.demo``) are trained deterministically on the first run and
cached in ``$HF_CALIBRATE_CACHE`` (default ``~/.cache/hf_calibrate/zoo``).

Property tests (hypothesis) run under a profile chosen by ``$HYPOTHESIS_PROFILE``:

* ``ci`` (the default): ``derandomize=True`` — every run, on every machine, draws the same
  examples, so a pass or a failure reproduces; no example database is read or written.
* ``explore``: random draws, 20× the examples, and a local example database
  (``.hypothesis/``, ignored by git). Run it to look for new counterexamples
  (``HYPOTHESIS_PROFILE=explore python -m pytest tests/metrics/test_metrics_properties.py``);
  whatever it finds is committed as an ``@example`` of the test, so ``ci`` checks it for good.
"""

from __future__ import annotations

import os
import tempfile

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
    os.environ[_name] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A private HF_HOME: evaluate and datasets need a writable cache, and the user's stays untouched.
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="hf_calibrate_tests_hf_home_")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

#: Examples per property test under ``ci``; ``explore`` draws EXPLORE_FACTOR times more.
CI_EXAMPLES, EXPLORE_FACTOR = 50, 20
settings.register_profile(
    "ci", max_examples=CI_EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", max_examples=CI_EXAMPLES * EXPLORE_FACTOR, derandomize=False, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

pytest_plugins = ["hub_server"]


@pytest.fixture(scope="session")
def digits_cnn():
    """timm resnet10t trained on sklearn digits (train split), with its DatasetDict."""
    from hf_calibrate.demo import digits_timm_cnn

    return digits_timm_cnn(progress=False)


@pytest.fixture(scope="session")
def digits_vit():
    """A small transformers ViT trained from scratch on sklearn digits."""
    from hf_calibrate.demo import digits_vit as build

    return build(progress=False)


@pytest.fixture(scope="session")
def bbc_minilm():
    """The real pretrained all-MiniLM-L6-v2 with a classification head trained on BBC News."""
    from hf_calibrate.demo import bbc_minilm as build

    return build(progress=False)


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory):
    """An empty, writable HF_HOME with the hub unreachable, for the whole session, for tests that load the
    ``evaluate`` modules of ``evaluate_metrics/`` (``evaluate.load`` copies each into its modules cache).

    ``evaluate`` reads its cache paths at import time, so its config is patched as well as
    the environment. Session scope, shared by every test module that loads them, because the
    dynamic-module package ``evaluate_modules`` is imported once per process from the first cache
    directory put on ``sys.path``.
    """
    import sys

    import evaluate.config

    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as patch:
        for variable, value in {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}.items():
            patch.setenv(variable, value)
        patch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
        patch.setattr(evaluate.config, "HF_EVALUATE_CACHE", home / "evaluate")
        patch.setattr(evaluate.config, "HF_METRICS_CACHE", home / "metrics")
        patch.setattr(evaluate.config, "HF_MODULES_CACHE", home / "modules")
        patch.setattr(sys, "path", list(sys.path))  # evaluate appends its modules cache
        yield home
        for module_name in [name for name in sys.modules if name.startswith("evaluate_modules")]:
            del sys.modules[module_name]


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module of small tensors: intra-op threads gain nothing there, and on a busy
    machine every parallel region waits for a descheduled thread (~10 ms per op; a metrics module ran 5× slower).
    One thread also keeps float results identical between a test process and the fresh processes some tests start.

    Use with ``pytestmark = pytest.mark.usefixtures("single_thread")`` (the one copy of this fixture).
    """
    from _tiny_models import torch_threads

    with torch_threads(1):
        yield
