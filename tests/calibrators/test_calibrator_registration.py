"""A new method is one class: defining it registers it, and it fits, saves and loads like the built-in ones.

The toy method below is defined in this file only (no other file knows it): a per-class bias added
to the logits, fitted in closed form on cached logits, with one option. It is registered for the
duration of each test and removed afterwards, so the rest of the suite sees the ten built-in methods.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Type

import pytest
import torch
from torch import nn

import _tiny_models as tm
import hf_calibrate
from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import CALIBRATORS, Calibrator, HeadCalibrator, MatrixScaling, NeuralClamping, calibrator_class
from hf_calibrate.calibrators.options import check_fields, require
from hf_calibrate.fitting.families import FAMILIES, family_of


def _define_toy() -> Type[Calibrator]:
    class ToyBias(Calibrator):
        """Logits + b, with b the log of the smoothed class frequencies minus the mean log-softmax per class."""

        method = "toy"
        title = "toy bias"
        description = "A per-class bias added to the logits."

        @dataclasses.dataclass
        class Options:
            """Attributes: smoothing: pseudo-count added to every class (default 1.0)."""

            smoothing: float = 1.0

            def __post_init__(self) -> None:
                check_fields(self)
                require(self.smoothing > 0, "smoothing", self.smoothing, "a positive number")

        def __init__(self, num_classes: int) -> None:
            super().__init__(num_classes)
            self.bias = nn.Parameter(torch.zeros(num_classes), requires_grad=False)

        def forward(self, logits: torch.Tensor) -> torch.Tensor:
            return logits + self.bias.to(logits.dtype)

        def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: "ToyBias.Options") -> Dict[str, Any]:
            counts = torch.bincount(labels, minlength=self.num_classes).double() + options.smoothing
            predicted = torch.log_softmax(logits.double(), dim=1).exp().mean(0)
            with torch.no_grad():
                self.bias.copy_((counts / counts.sum()).log() - predicted.log())
            return {"bias_norm": float(self.bias.norm())}

    return ToyBias


@pytest.fixture
def toy() -> Iterator[Type[Calibrator]]:
    cls = _define_toy()
    try:
        yield cls
    finally:
        CALIBRATORS.pop("toy", None)


def test_defining_a_class_registers_its_method(toy):
    assert calibrator_class("toy") is toy
    assert list(CALIBRATORS)[-1] == "toy"  # after the built-in methods, which keep their order
    assert family_of(toy) is FAMILIES[Calibrator]  # a plain Calibrator subclass is fitted on cached logits


def test_built_in_classes_fall_in_their_families():
    assert family_of(calibrator_class("temperature")) is FAMILIES[Calibrator]
    assert family_of(calibrator_class("dirichlet")) is FAMILIES[Calibrator]
    assert family_of(calibrator_class("neural_clamping")) is FAMILIES[NeuralClamping]
    for method in ("tst", "vtst", "mac_cal"):
        assert family_of(calibrator_class(method)) is FAMILIES[HeadCalibrator]


def test_a_subclass_without_its_own_method_is_not_registered():
    before = dict(CALIBRATORS)

    class SlowerMatrixScaling(MatrixScaling):
        pass

    assert CALIBRATORS == before and calibrator_class("matrix") is MatrixScaling


def test_a_second_class_cannot_take_a_registered_name():
    with pytest.raises(ValueError, match="method 'temperature' is already the method of .*TemperatureScaling"):
        class AnotherTemperature(Calibrator):
            method = "temperature"
    assert calibrator_class("temperature").__name__ == "TemperatureScaling"


def test_a_stray_copy_of_a_method_file_is_named_with_the_fix(tmp_path):
    """Every module in calibrators/ is imported, so a copy of a method's file (``temperature copy.py`` is not a
    module name; ``temperature_old.py`` is) registers its method twice: the import error names the copy and the fix."""
    package = Path(hf_calibrate.__file__).parent
    shutil.copytree(package, tmp_path / "hf_calibrate", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(package / "calibrators" / "temperature.py", tmp_path / "hf_calibrate" / "calibrators" / "temperature_old.py")
    result = subprocess.run([sys.executable, "-c", "import hf_calibrate.calibrators"], capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert result.returncode != 0
    assert "hf_calibrate.calibrators.temperature_old.TemperatureScaling names it too" in result.stderr
    assert "remove or rename the copy" in result.stderr


def _fitted_toy(base: nn.Module, data: Any) -> CalibratedModel:
    return CalibratedModel.fit(base, data, method="toy", smoothing=0.5, progress=False)


def test_the_toy_method_fits(toy):
    base = tm.plain_module()
    data = tm.plain_data(base)
    calibrated = _fitted_toy(base, data)
    assert isinstance(calibrated.calibrator, toy) and calibrated.calibrator.is_fitted
    assert calibrated.fit_summary["fit_samples"] == len(data) and calibrated.fit_summary["bias_norm"] > 0
    assert calibrated.provenance["options"] == {"smoothing": 0.5}
    inputs = data.tensors[0]
    with torch.no_grad():
        torch.testing.assert_close(calibrated(inputs), base(inputs) + calibrated.calibrator.bias)


def test_the_toy_method_saves_and_loads(toy, tmp_path):
    base = tm.plain_module()
    data = tm.plain_data(base)
    calibrated = _fitted_toy(base, data)
    inputs = data.tensors[0]
    calibrated.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "## Calibration method: toy bias" in card and "A per-class bias added to the logits." in card
    loaded = CalibratedModel.from_pretrained(tmp_path, base_model=base)
    assert isinstance(loaded.calibrator, toy)
    with torch.no_grad():
        torch.testing.assert_close(loaded(inputs), calibrated(inputs), rtol=0, atol=0)


def test_unknown_options_of_the_toy_method_are_named(toy):
    base = tm.plain_module()
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['smooth'\] for method 'toy'\. Its options: smoothing;"):
        CalibratedModel.fit(base, tm.plain_data(base), method="toy", smooth=0.5, progress=False)


def test_a_new_method_built_on_another_says_only_what_it_sets():
    """A subclass naming its own method inherits the fit, not the parent's card text or its promise that
    predictions are unchanged (a shifted temperature scaling changes them)."""
    from hf_calibrate.calibrators import TemperatureScaling

    class ShiftedTemperature(TemperatureScaling):
        method = "shifted_temperature"
        description = "Temperature scaling plus a class bias."

    try:
        assert ShiftedTemperature.title == "" and ShiftedTemperature.citation == ""
        assert ShiftedTemperature.description == "Temperature scaling plus a class bias."
        assert not ShiftedTemperature.preserves_argmax
        assert TemperatureScaling.preserves_argmax and TemperatureScaling.title == "temperature scaling"
    finally:
        CALIBRATORS.pop("shifted_temperature", None)


def test_an_unknown_saved_method_names_the_fix(toy, tmp_path):
    """A folder saved with a method defined outside hf_calibrate, loaded where that class is not defined, says so."""
    from hf_calibrate.serialization.schema import ArtifactError

    base = tm.plain_module()
    _fitted_toy(base, tm.plain_data(base)).save_pretrained(tmp_path)
    CALIBRATORS.pop("toy")
    with pytest.raises(ArtifactError, match="module defining its class is imported"):
        CalibratedModel.from_pretrained(tmp_path, base_model=base)
