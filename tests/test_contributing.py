"""CONTRIBUTING.md's recipe for a new calibration method works as written (issue 30, item 4).

The guide says a method is one new file in ``hf_calibrate/calibrators/`` and shows one whole (the block after its
``<!-- method-example: <file> -->`` marker). This test takes that block verbatim, writes it as a module of the
calibrators package — into a temporary folder added to the package's ``__path__``, so the working tree is not
touched — and imports the package's modules the way ``import hf_calibrate.calibrators`` does. Nothing else is
edited. The method then fits a tiny timm model through ``CalibratedModel.fit``, predicts, saves, loads with
``from_pretrained``, shows in its model card, and is a method of the command line (``--method``, ``--option``,
``--help``, ``compare --methods``). Afterwards the method is unregistered and its module forgotten, so the rest of
the suite sees the built-in methods only (:func:`test_the_method_is_gone_after_the_test`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Iterator, Tuple, Type

import pytest
import torch

import _tiny_models as tm
import hf_calibrate.calibrators as calibrators
from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import CALIBRATORS, Calibrator, InsufficientDataError, InvalidOptionError

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

GUIDE = Path(__file__).resolve().parents[1] / "CONTRIBUTING.md"


def guide_example() -> Tuple[str, str]:
    """(the file name, the Python source) of CONTRIBUTING.md's example method."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(r"<!-- method-example: (\S+\.py) -->\s*```python\n(.*?)\n```", text, flags=re.S)
    assert found, "CONTRIBUTING.md has no '<!-- method-example: <file>.py -->' marker followed by a python block"
    return found.group(1), found.group(2)


@contextlib.contextmanager
def installed_method(folder: Path) -> Iterator[Type[Calibrator]]:
    """The guide's method as a new module of ``hf_calibrate.calibrators`` (written to ``folder``), registered as the
    package registers its modules; unregistered and forgotten on exit."""
    file_name, source = guide_example()
    (folder / file_name).write_text(source, encoding="utf-8")
    module_name = f"{calibrators.__name__}.{Path(file_name).stem}"
    before, path = dict(CALIBRATORS), calibrators.__path__
    calibrators.__path__ = [*path, str(folder)]  # the folder holds one module more, as the package's own would
    try:
        calibrators._import_method_modules()  # what importing the package runs
        added = [name for name in CALIBRATORS if name not in before]
        assert len(added) == 1, f"the guide's module registered {added}, not one method"
        yield CALIBRATORS[added[0]]
    finally:
        calibrators.__path__ = path
        for name in [name for name in CALIBRATORS if name not in before]:
            del CALIBRATORS[name]
        sys.modules.pop(module_name, None)
        if hasattr(calibrators, Path(file_name).stem):
            delattr(calibrators, Path(file_name).stem)


@pytest.fixture
def toy(tmp_path) -> Iterator[Type[Calibrator]]:
    folder = tmp_path / "package"
    folder.mkdir()
    with installed_method(folder) as cls:
        yield cls


@pytest.fixture(scope="module")
def timm_base():
    """A tiny timm CNN and 64 labelled 3×16×16 images it gets partly wrong."""
    model = tm.tiny_timm(0)
    return model, tm.image_data(model, 64, seed=1)


def test_one_new_module_registers_the_method_after_the_built_in_ones(toy):
    from hf_calibrate.fitting.families import FAMILIES, family_of

    assert toy.__module__ == "hf_calibrate.calibrators.toy_bias"
    assert list(CALIBRATORS)[-1] == toy.method == "toy_bias"  # after the built-in methods, which keep their order
    assert {"temperature", "neural_clamping", "tst"} < set(CALIBRATORS)
    assert family_of(toy) is FAMILIES[Calibrator]  # fitted on cached logits


def test_the_method_fits_predicts_saves_loads_and_shows_in_its_card(toy, timm_base, tmp_path):
    model, data = timm_base
    pixels = data.tensors[0][:8]
    calibrated = CalibratedModel.fit(model, data, method="toy_bias", smoothing=0.5, progress=False)
    assert isinstance(calibrated.calibrator, toy) and calibrated.method == "toy_bias"
    assert calibrated.fit_summary["fit_samples"] == 64 and calibrated.fit_summary["bias_norm"] > 0
    assert calibrated.provenance["options"] == {"smoothing": 0.5}
    with torch.no_grad():
        predicted = calibrated(pixels)
        torch.testing.assert_close(predicted, model(pixels) + calibrated.calibrator.bias)

    calibrated.save_pretrained(tmp_path / "saved")
    card = (tmp_path / "saved" / "README.md").read_text(encoding="utf-8")
    assert "## Calibration method: toy bias" in card and "A per-class bias added to the logits." in card
    assert "@misc{toy_bias" in card and "it may change a few predictions" in card
    loaded = CalibratedModel.from_pretrained(tmp_path / "saved")
    assert isinstance(loaded.calibrator, toy) and loaded.fit_summary["bias_norm"] == calibrated.fit_summary["bias_norm"]
    with torch.no_grad():
        assert torch.equal(loaded(pixels), predicted)


def test_its_options_and_requirements_are_checked_as_the_guide_says(toy, timm_base):
    model, data = timm_base
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['smooth'\] for method 'toy_bias'.*smoothing"):
        CalibratedModel.fit(model, data, method="toy_bias", smooth=0.5, progress=False)
    with pytest.raises(InvalidOptionError, match=r"option smoothing must be a positive number in \(0, 100\]"):
        CalibratedModel.fit(model, data, method="toy_bias", smoothing=0.0, progress=False)
    five = torch.utils.data.TensorDataset(*(tensor[:5] for tensor in data.tensors))
    with pytest.raises(InsufficientDataError, match="toy_bias needs at least 10 rows"):
        CalibratedModel.fit(model, five, method="toy_bias", progress=False)


def test_the_command_line_knows_the_method(toy, capsys):
    from hf_calibrate.cli.inputs import fit_options, per_method_options
    from hf_calibrate.cli.parser import build_parser

    parser = build_parser()
    args = parser.parse_args(["fit", "--model", "m", "--dataset", "d", "--method", "toy_bias", "--option", "smoothing=0.5"])
    assert args.method == "toy_bias" and fit_options(args) == {"smoothing": 0.5}
    compare = parser.parse_args(["compare", "--model", "m", "--dataset", "d", "--output", "o", "--methods",
                                 "temperature,toy_bias", "--option", "toy_bias.smoothing=0.5"])
    assert per_method_options(compare.option, compare.methods) == {"temperature": {}, "toy_bias": {"smoothing": 0.5}}
    with pytest.raises(SystemExit):
        parser.parse_args(["fit", "--help"])
    method_help = re.search(r"--method METHOD (.*?) --option", " ".join(capsys.readouterr().out.split())).group(1)
    assert "toy_bias" in method_help.split("one of ")[1].replace(",", " ").split()  # --method's help lists it


def test_the_method_is_gone_after_the_test(tmp_path):
    before = dict(CALIBRATORS)
    with installed_method(tmp_path) as cls:
        assert CALIBRATORS[cls.method] is cls and "hf_calibrate.calibrators.toy_bias" in sys.modules
    assert CALIBRATORS == before and "toy_bias" not in CALIBRATORS
    assert "hf_calibrate.calibrators.toy_bias" not in sys.modules and str(tmp_path) not in calibrators.__path__
    calibrators._import_method_modules()  # the package's own folder holds no such module
    assert CALIBRATORS == before
