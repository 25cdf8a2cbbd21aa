"""Bad input to ``CalibratedModel.fit`` / calling a calibrated model: clear errors, nothing lost."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedConfig, CalibratedModel
from hf_calibrate.calibrators import TemperatureScaling
from hf_calibrate.serialization import weights_fingerprint


@pytest.fixture()
def cnn():
    torch.manual_seed(0)
    return timm.create_model("resnet10t", pretrained=False, num_classes=3, pretrained_cfg_overlay=dict(input_size=(3, 16, 16)))


@pytest.fixture()
def data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(40, 3, 16, 16, generator=generator), torch.randint(0, 3, (40,), generator=generator))


def test_empty_calibration_data(cnn):
    with pytest.raises(ValueError, match="empty"):
        CalibratedModel.fit(cnn, TensorDataset(torch.zeros(0, 3, 16, 16), torch.zeros(0, dtype=torch.long)), method="temperature", progress=False)


def test_labels_outside_the_models_labels(cnn):
    bad = TensorDataset(torch.randn(8, 3, 16, 16), torch.tensor([0, 1, 2, 3, 0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"^the calibration data's labels do not match the model \(sample\(s\) 3\): label 3 is "
                                         r"outside the valid range \[0, 2\]"):
        CalibratedModel.fit(cnn, bad, method="temperature", progress=False)


def test_a_bad_sample_is_named_by_its_position_not_by_the_fits_batch(cnn):
    """A NaN at sample 37 of a DataLoader(batch_size=25) lies in the user's batch 1; the fit batches by its own
    indices, so naming "its" batch (0) would point at the wrong rows: the sample's position is named, with the user's
    batch and row."""
    from torch.utils.data import DataLoader

    generator = torch.Generator().manual_seed(0)
    pixels, labels = torch.randn(60, 3, 16, 16, generator=generator), torch.randint(0, 3, (60,), generator=generator)
    pixels[37, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError) as error:
        CalibratedModel.fit(cnn, DataLoader(TensorDataset(pixels, labels), batch_size=25), method="temperature", progress=False)
    message = str(error.value)
    assert "sample(s) 37 (batch 1, row 12, counted from 0) of the calibration data, DataLoader(TensorDataset, 60 samples) " in message
    assert "batch 0" not in message


def test_evaluation_errors_do_not_call_the_data_calibration_data(cnn, data):
    """evaluate's data are not calibration data: its label and emptiness errors name the evaluation data."""
    calibrated = CalibratedModel.fit(cnn, data, method="temperature", progress=False)
    bad = TensorDataset(torch.randn(8, 3, 16, 16), torch.tensor([0, 1, 2, 7, 0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"^the evaluation data's labels do not match the model \(sample\(s\) 3\): label 7 is outside") as error:
        calibrated.evaluate(bad, bootstrap=0, progress=False)
    with pytest.raises(ValueError, match=r"^the evaluation data \(TensorDataset\) hold no samples") as empty:
        calibrated.evaluate(TensorDataset(torch.zeros(0, 3, 16, 16), torch.zeros(0, dtype=torch.long)), progress=False)
    assert "calibration" not in str(error.value) + str(empty.value)


def test_float_labels_are_refused(cnn):
    bad = TensorDataset(torch.randn(8, 3, 16, 16), torch.zeros(8))
    with pytest.raises(ValueError, match="integer class indices"):
        CalibratedModel.fit(cnn, bad, method="temperature", progress=False)


def test_model_output_not_n_by_c(data):
    class Flat(nn.Module):
        def forward(self, x):
            return x.flatten()

    with pytest.raises(ValueError, match=r"expected logits of shape \(batch, num_classes\)"):
        CalibratedModel.fit(Flat(), data, method="temperature", progress=False)


def test_a_one_shot_generator_is_refused_by_neural_clamping_with_the_fix(cnn, data):
    """Neural Clamping reads its data every epoch: a generator would silently give one epoch, so it is refused."""
    batches = (data[i : i + 8] for i in range(0, len(data), 8))
    with pytest.raises(ValueError, match="can be read only once: a generator.*callable that returns a new iterator"):
        CalibratedModel.fit(cnn, batches, method="neural_clamping", epochs=1, progress=False)


def test_unknown_method_and_option(cnn, data):
    with pytest.raises(ValueError, match="unknown method 'platt'"):
        CalibratedModel.fit(cnn, data, method="platt")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['epoch'\].*epochs"):
        CalibratedModel.fit(cnn, data, method="neural_clamping", epoch=3)
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        CalibratedModel.fit(cnn, data, method="temperature", mixed_precision="fp8")
    with pytest.raises(ValueError, match="fp16' needs a GPU"):
        CalibratedModel.fit(cnn, data, method="temperature", mixed_precision="fp16", progress=False)


def test_delta_shape_mismatch_names_the_expected_shape(cnn, data):
    calibrated = CalibratedModel.fit(cnn, data, method="neural_clamping", epochs=1, batch_size=20, progress=False)
    with pytest.raises(ValueError, match=r"δ has shape \(3, 16, 16\) but this input has per-sample shape \(3, 24, 24\)"):
        calibrated(torch.randn(2, 3, 24, 24))


def test_unfitted_calibrator_refuses_to_predict(cnn):
    config = CalibratedConfig(base_library="timm", calibration_method="temperature")
    model = CalibratedModel(config, cnn, TemperatureScaling(3))
    with pytest.raises(RuntimeError, match="has not been fitted"):
        model(torch.randn(1, 3, 16, 16))


def test_inputs_on_another_device(cnn, data):
    calibrated = CalibratedModel.fit(cnn, data, method="temperature", progress=False)
    with pytest.raises(ValueError, match="is on meta but the calibrated model is on cpu"):
        calibrated(torch.empty(1, 3, 16, 16, device="meta"))


def test_nan_loss_aborts_and_leaves_the_model_as_it_was(cnn, data, monkeypatch):
    """A loss that turns NaN mid-fit (forced here: lr=1e30, which drove it there before, is now refused as an option)."""
    import hf_calibrate.fitting.clamping.neural_clamping as nc_fitting

    real_focal_loss = nc_fitting.focal_loss
    monkeypatch.setattr(nc_fitting, "focal_loss", lambda *args, **kwargs: real_focal_loss(*args, **kwargs) * float("nan"))
    cnn.train()
    cnn.fc.weight.requires_grad_(True)
    flags = [p.requires_grad for p in cnn.parameters()]
    before = weights_fingerprint(cnn)
    with pytest.raises(FloatingPointError, match="loss became (nan|inf).*Lower lr.*left unchanged"):
        CalibratedModel.fit(cnn, data, method="neural_clamping", epochs=3, batch_size=20, holdout_fraction=0, progress=False)
    assert weights_fingerprint(cnn) == before
    assert [p.requires_grad for p in cnn.parameters()] == flags
    assert cnn.training  # its mode is restored too


def test_fit_freezes_without_copying(cnn, data):
    calibrated = CalibratedModel.fit(cnn, data, method="temperature", progress=False)
    assert calibrated.base_model is cnn
    assert not any(p.requires_grad for p in cnn.parameters()) and not cnn.training
    calibrated.train()
    assert not calibrated.base_model.training  # the base stays in eval mode


def test_too_little_calibration_data_is_refused_before_fitting_with_the_fix(cnn, data):
    """One row, or rows of a single class, cannot determine per-class parameters: refused, naming the count and the fix."""
    with pytest.raises(ValueError, match=r"vector needs at least 10 rows in the calibration data, which have 1 .*Calibrate on more"):
        CalibratedModel.fit(cnn, TensorDataset(data.tensors[0][:1], data.tensors[1][:1]), method="vector", progress=False)
    one_class = TensorDataset(data.tensors[0], torch.zeros(40, dtype=torch.long))
    with pytest.raises(ValueError, match="dirichlet needs at least 2 distinct classes in the calibration data, which have 1"):
        CalibratedModel.fit(cnn, one_class, method="dirichlet", progress=False)


def test_fit_warnings_point_at_the_users_line_and_are_kept_in_the_summary_and_the_record(cnn, data, tmp_path):
    """One input with a huge pixel: the rows are named before fitting, the temperature's bound after; each is one
    CalibrationFitWarning at this file's line, a line of fit_summary["warnings"], and saved with the record."""
    import warnings

    from hf_calibrate.fitting.calibrate import CalibrationFitWarning

    pixels = data.tensors[0].clone()
    pixels[3, 0, 0, 0] = 1e6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibrated = CalibratedModel.fit(cnn, TensorDataset(pixels, data.tensors[1]), method="temperature", progress=False)
    said = [w for w in caught if issubclass(w.category, CalibrationFitWarning)]
    assert said and all(w.filename == __file__ for w in said)
    assert [str(w.message) for w in said] == calibrated.fit_summary["warnings"]
    assert any(line.startswith("calibration sample(s) 3 (row positions)") for line in calibrated.fit_summary["warnings"])
    calibrated.save_pretrained(tmp_path / "saved")
    assert CalibratedModel.from_pretrained(tmp_path / "saved").fit_summary["warnings"] == calibrated.fit_summary["warnings"]
