"""Each folder of ``hf_calibrate/evaluate_metrics/`` is a metric Space as it stands: pushed unchanged to a Hub (the
local test Hub of ``tests/hub_server.py``), it loads by its Hub name, ``evaluate.load("<namespace>/<name>")``, and
computes what the installed module computes.

evaluate fetches ``<name>.py`` from the Space ``<namespace>/<name>``, so a Space must be named after its module.
"""

from __future__ import annotations

import uuid

import evaluate
import evaluate.config
import pytest
from huggingface_hub import HfApi

from hf_calibrate import EVALUATE_MODULES, evaluate_module_path

PREDICTIONS = [[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]
REFERENCES = [0, 1, 1, 2]


@pytest.fixture
def evaluate_online(hf_home, hub_online, monkeypatch):
    """evaluate, online, fetches modules from the test Hub (its URL template is read at import), counting no loads."""
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", False)
    monkeypatch.setattr(evaluate.config, "HF_UPDATE_DOWNLOAD_COUNTS", False)
    monkeypatch.setattr(
        evaluate.config, "HUB_EVALUATE_URL", hub_online.endpoint + "/spaces/{path}/resolve/{revision}/{name}"
    )
    return hub_online


def push_space(hub, name: str) -> str:
    """Push the module folder ``name``, unchanged, as a new gradio Space ``<fresh namespace>/<name>``."""
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    repo_id = f"ns-{uuid.uuid4().hex[:8]}/{name}"
    api.create_repo(repo_id, repo_type="space", space_sdk="gradio")
    api.upload_folder(
        folder_path=evaluate_module_path(name), repo_id=repo_id, repo_type="space", ignore_patterns=["__pycache__/*"]
    )
    return repo_id


@pytest.mark.parametrize("name", EVALUATE_MODULES)
def test_a_pushed_module_folder_loads_by_its_hub_name(evaluate_online, name):
    repo_id = push_space(evaluate_online, name)
    files = set(HfApi(endpoint=evaluate_online.endpoint).list_repo_files(repo_id, repo_type="space"))
    assert files >= {f"{name}.py", "README.md", "app.py", "requirements.txt"}

    from_hub = evaluate.load(repo_id)
    installed = evaluate.load(evaluate_module_path(name))
    module = type(from_hub).__module__
    assert repo_id.replace("/", "--") in module, module  # the script fetched from the Space, not the installed copy
    assert from_hub.name == name
    result = from_hub.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert result == installed.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert evaluate_online.unhandled == []
