"""Hub round trips of calibrated models: the real ``huggingface_hub`` client against the local test Hub.

Every calibrator method is pushed at least once, spread over the three kinds of base (timm,
transformers vision, transformers text), then reloaded in a *fresh Python process* that knows
nothing but the repo id and the hub settings; its logits must be bit-identical to the
in-memory model's. The other tests cover pinned revisions, offline reloads from the cache,
one commit per push, reference-only repos (base pinned to a commit of its own repo), loading
the uncalibrated base with timm / transformers directly, and a user's README on the hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import timm
import torch
from huggingface_hub import HfApi, hf_hub_download
from safetensors.torch import load_file, save_file
from torch.utils.data import TensorDataset
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

import _tiny_models as tm
from hf_calibrate import CALIBRATORS, CalibratedModel
from hf_calibrate.serialization import CARD_MARKER

#: the base kinds a method goes through when it is not the default: Neural Clamping's δ lives in each kind's own input
#: space (pixels, ViT pixel values, BERT embeddings)
KINDS_OF = {"neural_clamping": tm.KINDS}
# (base kind, method): every registered method (a new one too, with no edit here), through the kinds KINDS_OF names,
# else one kind in turn by registration order, so that every base kind has several methods.
CASES = [(kind, method) for index, method in enumerate(CALIBRATORS)
         for kind in KINDS_OF.get(method, (tm.KINDS[index % len(tm.KINDS)],))]
# reference-only repos: the base lives in its own repo, pinned by commit
REFERENCE_CASES = [("timm", "neural_clamping"), ("vit", "temperature")]

RELOAD_SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys
    import torch
    from safetensors.torch import load_file, save_file

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was loaded while loading a calibration")

    # Loading a calibration must never unpickle anything.
    torch.load = pickle.load = pickle.loads = refuse

    import hf_calibrate
    from hf_calibrate import CalibratedModel

    torch.set_num_threads(1)
    manifest = json.load(open(sys.argv[1]))
    inputs = load_file(manifest["inputs"])
    outputs = {}
    for key, repo_id in manifest["repos"].items():
        model = CalibratedModel.from_pretrained(repo_id)
        batch = {name.split("/", 1)[1]: value for name, value in inputs.items() if name.split("/", 1)[0] == key}
        with torch.no_grad():
            output = model(**batch)
        outputs[key] = getattr(output, "logits", output).contiguous()
    save_file(outputs, manifest["outputs"])
    """
)


def _key(kind: str, method: str, reference: bool = False) -> str:
    return f"{kind}-{method}{'-ref' if reference else ''}"


def _logit_case(kind: str) -> Tuple[str, str]:
    """The first case of CASES through base ``kind`` whose method is fitted on the logits alone."""
    return next((case, method) for case, method in CASES if case == kind and CALIBRATORS[method].fitted_on_logits())


pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


@pytest.fixture(scope="module")
def bases() -> Dict[str, Tuple[Any, Any, Any]]:
    """kind → (base model, calibration data, preprocessor)."""
    return {kind: tm.make_base(kind, seed=index) for index, kind in enumerate(tm.KINDS)}


@pytest.fixture(scope="module")
def pushed(bases, hub_server, tmp_path_factory) -> Dict[str, Any]:
    """Fit and push every case, then reload all of them in one fresh process.

    Returns ``{"repos": key → repo id, "models": key → calibrated model, "inputs": key → batch,
    "expected": key → in-memory logits, "reloaded": key → fresh-process logits,
    "base_repos": kind → (repo id, pinned commit), "downloads": key → resolve requests seen}``.
    """
    work = tmp_path_factory.mktemp("roundtrip")
    repos, models, inputs, expected, base_repos = {}, {}, {}, {}, {}
    with hub_server.configure_client(offline=False):
        for index, (kind, method) in enumerate(CASES):
            base, data, preprocessor = bases[kind]
            calibrated = tm.fit(base, data, method, preprocessor=preprocessor)
            tm.enlarge_delta(calibrated, seed=index)
            key = _key(kind, method)
            repos[key] = hub_server.unique_repo_id(key)
            calibrated.push_to_hub(repos[key])
            models[key], inputs[key] = calibrated, tm.batch_of(data, 8)
            expected[key] = tm.logits_of(calibrated, inputs[key])
        for kind, method in REFERENCE_CASES:
            base, data, preprocessor = bases[kind]
            base_repo = hub_server.unique_repo_id(f"{kind}-base")
            _push_base(kind, base, base_repo)
            pinned = HfApi().list_repo_commits(base_repo)[0].commit_id
            # move the base repo's main on, so only the pinned commit has the right weights
            _push_base(kind, tm.make_base(kind, seed=99)[0], base_repo)
            calibrated = tm.fit(base, data, method, preprocessor=preprocessor)
            tm.enlarge_delta(calibrated, seed=7)
            key = _key(kind, method, reference=True)
            repos[key] = hub_server.unique_repo_id(key)
            calibrated.push_to_hub(repos[key], include_base=False, base_model_id=base_repo, base_revision=pinned)
            models[key], inputs[key], base_repos[kind] = calibrated, tm.batch_of(data, 8), (base_repo, pinned)
            expected[key] = tm.logits_of(calibrated, inputs[key])

        save_file({f"{key}/{name}": value.contiguous() for key, batch in inputs.items() for name, value in batch.items()},
                  str(work / "inputs.safetensors"))
        manifest = {"inputs": str(work / "inputs.safetensors"), "outputs": str(work / "outputs.safetensors"), "repos": repos}
        (work / "manifest.json").write_text(json.dumps(manifest))
        (work / "reload.py").write_text(RELOAD_SCRIPT)
        seen = len(hub_server.requests)
        # The fresh process gets the environment configure_client exported (HF_ENDPOINT, HF_HOME,
        # HF_HUB_CACHE, HF_TOKEN, HF_HUB_DISABLE_XET, HF_HUB_OFFLINE=0).
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        result = subprocess.run([sys.executable, str(work / "reload.py"), str(work / "manifest.json")],
                                env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        requests = hub_server.requests[seen:]
    downloads = {key: [path for method, path in requests if f"/{repo}/resolve/" in path] for key, repo in repos.items()}
    return {"repos": repos, "models": models, "inputs": inputs, "expected": expected, "base_repos": base_repos,
            "reloaded": load_file(str(work / "outputs.safetensors")), "downloads": downloads}


def _push_base(kind: str, model: Any, repo_id: str) -> None:
    """Push an uncalibrated base the way its library does (timm's push_to_hf_hub / transformers')."""
    if kind == "timm":
        from timm.models import push_to_hf_hub

        push_to_hf_hub(model, repo_id)
    else:
        model.push_to_hub(repo_id)


ALL_KEYS = [_key(*case) for case in CASES] + [_key(*case, reference=True) for case in REFERENCE_CASES]


@pytest.mark.parametrize("key", ALL_KEYS)
def test_fresh_process_reload_is_bit_identical(pushed, key):
    reloaded, expected = pushed["reloaded"][key], pushed["expected"][key]
    assert reloaded.shape == expected.shape == (8, tm.NUM_CLASSES)
    assert torch.equal(reloaded, expected)


def test_every_method_and_base_kind_went_through_the_hub():
    """CASES holds every registered method, and every base kind at least three times."""
    assert set(CALIBRATORS) <= {method for _, method in CASES}
    assert all(sum(kind == case for case, _ in CASES) >= 3 for kind in tm.KINDS)


@pytest.mark.parametrize("key", ALL_KEYS)
def test_fresh_process_downloaded_the_calibration(pushed, key):
    downloaded = pushed["downloads"][key]
    assert any(path.endswith("/calibration.safetensors") for path in downloaded), downloaded


def test_calibration_matters_for_the_compared_logits(pushed):
    """The comparisons above would catch a lost calibrator: calibrated ≠ base logits."""
    for key, model in pushed["models"].items():
        with torch.no_grad():
            base_logits = model.backbone.logits(pushed["inputs"][key])  # the base alone
        assert not torch.allclose(base_logits, pushed["expected"][key]), key


def test_push_is_one_commit(hub_online, bases):
    base, data, _ = bases["timm"]
    repo_id = hub_online.unique_repo_id("one-commit")
    api = HfApi()
    first = tm.fit(base, data, "temperature").push_to_hub(repo_id, commit_message="first calibration")
    history = api.list_repo_commits(repo_id)
    assert [commit.title for commit in history] == ["first calibration", "initial commit"]
    assert history[0].commit_id == first.oid
    second = tm.fit(base, data, "histogram").push_to_hub(repo_id)
    history = api.list_repo_commits(repo_id)
    assert len(history) == 3 and history[0].commit_id == second.oid


def test_revision_pinning(hub_online, bases):
    base, data, _ = bases["timm"]
    repo_id = hub_online.unique_repo_id("pinning")
    sharp = tm.fit(base, data, "temperature")  # labels follow sharpened predictions: T well below 1
    pixels, _ = data.tensors
    random_labels = torch.randint(0, tm.NUM_CLASSES, (len(pixels),), generator=torch.Generator().manual_seed(5))
    flat = tm.fit(base, TensorDataset(pixels, random_labels), "temperature")  # labels unrelated to logits: T > 1
    assert sharp.calibrator.temperature.item() < 0.5 < 1.0 < flat.calibrator.temperature.item()
    first = sharp.push_to_hub(repo_id).oid
    flat.push_to_hub(repo_id)
    x = tm.batch_of(data, 8)
    pinned = CalibratedModel.from_pretrained(repo_id, revision=first)
    latest = CalibratedModel.from_pretrained(repo_id, revision="main")
    default = CalibratedModel.from_pretrained(repo_id)
    assert torch.equal(tm.logits_of(pinned, x), tm.logits_of(sharp, x))
    assert torch.equal(tm.logits_of(latest, x), tm.logits_of(flat, x))
    assert torch.equal(tm.logits_of(default, x), tm.logits_of(flat, x))
    assert not torch.equal(tm.logits_of(pinned, x), tm.logits_of(latest, x))


def test_push_to_a_branch_leaves_main_alone(hub_online, bases):
    base, data, _ = bases["timm"]
    repo_id = hub_online.unique_repo_id("branch")
    main_model = tm.fit(base, data, "temperature")
    main_model.push_to_hub(repo_id)
    dev_model = tm.fit(base, data, "histogram")
    dev_model.push_to_hub(repo_id, revision="dev")
    x = tm.batch_of(data, 8)
    assert CalibratedModel.from_pretrained(repo_id).method == "temperature"
    on_dev = CalibratedModel.from_pretrained(repo_id, revision="dev")
    assert on_dev.method == "histogram"
    assert torch.equal(tm.logits_of(on_dev, x), tm.logits_of(dev_model, x))


@pytest.mark.parametrize("key", [_key("bert", "neural_clamping"), _key("timm", "neural_clamping", reference=True)])
def test_offline_reload_from_cache_makes_no_request(pushed, hub_online, key):
    repo_id = pushed["repos"][key]
    CalibratedModel.from_pretrained(repo_id)  # online: fills the cache (base repo too, if referenced)
    with hub_online.configure_client(offline=True):
        seen = len(hub_online.requests)
        offline = CalibratedModel.from_pretrained(repo_id)
        assert hub_online.requests[seen:] == []
    assert torch.equal(tm.logits_of(offline, pushed["inputs"][key]), pushed["expected"][key])
    if key.startswith("bert"):
        assert offline.preprocessor is not None  # the tokenizer came from the cache too


@pytest.mark.parametrize("kind", [kind for kind, _ in REFERENCE_CASES])
def test_reference_only_repo_loads_the_pinned_base(pushed, bases, hub_online, kind):
    key = _key(kind, dict(REFERENCE_CASES)[kind], reference=True)
    repo_id = pushed["repos"][key]
    base_repo, pinned = pushed["base_repos"][kind]
    files = HfApi().list_repo_files(repo_id)
    assert "model.safetensors" not in files and not any(name.startswith("base/") for name in files), files
    record = json.loads(Path(hf_hub_download(repo_id, "calibration_config.json")).read_text())
    assert record["base_model"]["weights"] == "reference"
    assert (record["base_model"]["repo_id"], record["base_model"]["revision"]) == (base_repo, pinned)
    loaded = CalibratedModel.from_pretrained(repo_id)
    assert tm.state_dicts_equal(loaded.base_model, bases[kind][0])
    # main of the base repo has other weights: loading the calibration against it must fail loudly
    latest = (timm.create_model(f"hf-hub:{base_repo}", pretrained=True) if kind == "timm"
              else AutoModelForImageClassification.from_pretrained(base_repo))
    assert not tm.state_dicts_equal(latest, bases[kind][0])


def test_timm_loads_the_uncalibrated_base_from_a_calibration_repo(pushed, bases, hub_online):
    key = _key("timm", "neural_clamping")
    plain = timm.create_model(f"hf-hub:{pushed['repos'][key]}", pretrained=True).eval()
    original = bases["timm"][0]
    assert tm.state_dicts_equal(plain, original)
    x = pushed["inputs"][key]["pixel_values"]
    with torch.no_grad():
        assert torch.equal(plain(x), original(x))
    assert plain.pretrained_cfg["input_size"] == original.pretrained_cfg["input_size"]


@pytest.mark.parametrize(
    "key, auto",
    [(_key(*_logit_case("vit")), AutoModelForImageClassification), (_key(*_logit_case("bert")), AutoModelForSequenceClassification)],
)
def test_transformers_loads_the_uncalibrated_base_from_the_base_subfolder(pushed, bases, hub_online, key, auto):
    plain = auto.from_pretrained(pushed["repos"][key], subfolder="base")
    assert not isinstance(plain, CalibratedModel)
    assert tm.state_dicts_equal(plain, bases[key.split("-")[0]][0])


def test_auto_classes_load_the_calibrated_model(pushed, hub_online):
    kind, method = _logit_case("vit")
    key = _key(kind, method)
    model = AutoModelForImageClassification.from_pretrained(pushed["repos"][key])
    assert isinstance(model, CalibratedModel) and model.method == method
    assert torch.equal(tm.logits_of(model, pushed["inputs"][key]), pushed["expected"][key])


def test_users_readme_on_the_hub_is_kept_unless_overwrite_card(hub_online, bases):
    base, data, _ = bases["timm"]
    repo_id = hub_online.unique_repo_id("user-card")
    api = HfApi()
    api.create_repo(repo_id)
    user_card = b"---\nlicense: mit\n---\n# My own card\n\nWritten by hand.\n"
    api.upload_file(path_or_fileobj=user_card, path_in_repo="README.md", repo_id=repo_id)
    calibrated = tm.fit(base, data, "temperature")
    before = len(api.list_repo_commits(repo_id))
    calibrated.push_to_hub(repo_id)
    assert len(api.list_repo_commits(repo_id)) == before + 1
    assert Path(hf_hub_download(repo_id, "README.md")).read_bytes() == user_card
    assert "calibration_config.json" in api.list_repo_files(repo_id)
    calibrated.push_to_hub(repo_id, overwrite_card=True)
    card = Path(hf_hub_download(repo_id, "README.md")).read_text()
    assert CARD_MARKER in card and "My own card" not in card
    # once the card is hf_calibrate's own, later pushes refresh it without being asked
    tm.fit(base, data, "histogram").push_to_hub(repo_id)
    assert "histogram binning" in Path(hf_hub_download(repo_id, "README.md")).read_text()


def test_switching_to_reference_only_removes_the_stale_base_weights(hub_online, bases):
    """A re-push without the base must not leave the old base files loadable from the repo."""
    base, data, preprocessor = bases["vit"]
    base_repo = hub_online.unique_repo_id("vit-base")
    pinned = base.push_to_hub(base_repo).oid
    repo_id = hub_online.unique_repo_id("switch")
    calibrated = tm.fit(base, data, "temperature", preprocessor=preprocessor)
    calibrated.push_to_hub(repo_id)
    assert any(name.startswith("base/") for name in HfApi().list_repo_files(repo_id))
    calibrated.push_to_hub(repo_id, include_base=False, base_model_id=base_repo, base_revision=pinned)
    files = HfApi().list_repo_files(repo_id)
    assert not any(name.startswith("base/") for name in files), files
    assert "preprocessor_config.json" in files
    reloaded = CalibratedModel.from_pretrained(repo_id)
    x = tm.batch_of(data, 8)
    assert torch.equal(tm.logits_of(reloaded, x), tm.logits_of(calibrated, x))
