"""timm's test-time settings (``test_input_size``, ``test_crop_pct``): the library preprocesses with ``input_size`` and
``crop_pct``, as ``timm.data.resolve_data_config``'s default does, says so when the model's config recommends others,
and saves a timm config without them (``docs/own-timm-model.md``; the command-line run is
``tests/cli/test_own_timm_model.py``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import _tiny_models as tm
from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.backbones.preprocessing import MODEL_CONFIG_SOURCE, timm_export_config, unused_test_time_settings

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

SIZE = [3, tm.IMAGE_SIZE, tm.IMAGE_SIZE]


def contract(input_size, crop_pct, source=MODEL_CONFIG_SOURCE):
    return {"input_size": input_size, "preprocessing": {"source": source, "input_size": input_size, "crop_pct": crop_pct}}


def test_the_recommended_settings_are_read_from_pretrained_cfg_and_compared_with_those_used():
    backbone = adapt(tm.tiny_timm(0))  # resnet10t's registry config: test_input_size 3×224×224, test_crop_pct 0.95
    assert backbone.test_time_preprocessing() == {"input_size": [3, 224, 224], "crop_pct": 0.95}
    assert unused_test_time_settings(backbone, contract(SIZE, 1.0)) == {
        "input_size": ([3, 224, 224], SIZE), "crop_pct": (0.95, 1.0)}
    assert unused_test_time_settings(backbone, contract([3, 224, 224], 0.95)) == {}
    assert unused_test_time_settings(backbone, contract([1, 224, 224], 1.0)) == {"crop_pct": (0.95, 1.0)}  # H×W decide
    # no crop_pct in the config: timm crops at its default, 0.875, and a test_crop_pct of 0.875 is no different
    backbone.model.pretrained_cfg = {**backbone.model.pretrained_cfg, "test_crop_pct": 0.875}
    assert unused_test_time_settings(backbone, contract([3, 224, 224], None)) == {}
    assert unused_test_time_settings(backbone, contract([3, 224, 224], 1.0)) == {"crop_pct": (0.875, 1.0)}


def test_nothing_is_unused_when_the_library_did_not_preprocess_with_the_models_config():
    backbone = adapt(tm.tiny_timm(0))
    for source in ("inputs preprocessed by the user; other facts: the model's config (not verified)", "TimmWrapperImageProcessor"):
        assert unused_test_time_settings(backbone, contract(SIZE, 1.0, source)) == {}
    backbone.model.pretrained_cfg = {key: value for key, value in backbone.model.pretrained_cfg.items() if not key.startswith("test_")}
    assert backbone.test_time_preprocessing() == {}
    assert unused_test_time_settings(backbone, contract(SIZE, 1.0)) == {}


@pytest.fixture(scope="module")
def tensor_fit():
    """(a temperature fit of tiny_timm on tensors the user preprocessed, the warnings it gave)."""
    base = tm.tiny_timm(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrated = tm.fit(base, tm.image_data(base, 32), "temperature")
    return calibrated, [str(warning.message) for warning in caught]


def test_tensors_the_user_preprocessed_fit_without_the_test_time_warning(tensor_fit):
    assert not [message for message in tensor_fit[1] if "test_input_size" in message]


def test_raw_images_preprocessed_with_the_config_warn_once_naming_both_ways_out():
    import datasets

    base = tm.tiny_timm(0)
    images, labels = tm.pil_images(16, size=tm.IMAGE_SIZE), [index % tm.NUM_CLASSES for index in range(16)]
    rows = datasets.Dataset.from_dict({"image": images, "label": labels}).cast_column("image", datasets.Image())
    with pytest.warns(UserWarning, match=r"recommends test_input_size=3×224×224 and test_crop_pct=0\.95 .* images with "
                                         r"input_size=3×16×16 and crop_pct=1\.0\.") as caught:
        CalibratedModel.fit(base, rows, method="temperature", progress=False)
    said = [w for w in caught if "test_input_size" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    assert "data_config=dict(input_size=(3, 224, 224), crop_pct=0.95)" in str(said[0].message)
    assert "data_config=dict(input_size=(3, 16, 16), crop_pct=1.0)" in str(said[0].message)


def test_the_saved_timm_config_is_the_calibrated_size_and_crop_only():
    assert timm_export_config(contract(SIZE, 1.0)) == {"input_size": tuple(SIZE), "crop_pct": 1.0}
    assert timm_export_config({"input_size": SIZE, "preprocessing": {}}) == {"input_size": tuple(SIZE)}
    assert timm_export_config({"input_size": None}) is None and timm_export_config(None) is None


def test_a_saved_calibration_resolves_to_its_preprocessing_even_with_use_test_size(tensor_fit, tmp_path):
    import timm.data

    calibrated = tensor_fit[0]
    assert "test_input_size" in calibrated.base_model.pretrained_cfg  # the base keeps its own config
    calibrated.save_pretrained(tmp_path)
    loaded = CalibratedModel.from_pretrained(tmp_path).base_model
    assert "test_input_size" not in loaded.pretrained_cfg and "test_crop_pct" not in loaded.pretrained_cfg
    config = timm.data.resolve_data_config(model=loaded, use_test_size=True)
    assert list(config["input_size"]) == SIZE and config["crop_pct"] == 1.0
    assert torch.equal(loaded.fc.weight, calibrated.base_model.fc.weight)
