"""CONTRIBUTING.md's recipe for a new calibration method works as written.

The guide says a method is one new file in ``hf_calibrate/calibrators/`` and shows one whole (the block after its
``<!-- method-example: <file> -->`` marker). This test takes that block verbatim, writes it as a module of the
calibrators package — into a temporary folder added to the package's ``__path__``, so the working tree is not
touched — and imports the package's modules the way ``import hf_calibrate.calibrators`` does. Nothing else is
edited. The method then fits a tiny timm model through ``CalibratedModel.fit``, predicts, saves, loads with
``from_pretrained``, shows in its model card, and is a method of the command line (``--method``, ``--option``,
``--help``, ``compare --methods``), and ``method="auto"`` tries it. Afterwards the method is unregistered and its module
forgotten, so the rest of the suite sees the built-in methods only (:func:`test_the_method_is_gone_after_the_test`).

What is derived from the registry is checked in a copy of the package with the guide's file added to its
``calibrators/`` folder, in a fresh process (:func:`test_a_copy_with_the_file_derives_the_tests_docs_and_auto`): the
method-parametrised tests collect the new method, the methods page's table and ``fit``'s docstring name it, ``auto``
tries it, and the committed docs/methods.md is reported stale, naming the command that regenerates it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Type

import pytest
import torch

import _tiny_models as tm
import hf_calibrate.calibrators as calibrators
from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import CALIBRATORS, Calibrator, InsufficientDataError, InvalidOptionError

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"
#: the tests parametrised by the registry's methods that the copy's new method must be collected by
METHOD_TESTS = ("tests/calibrators/test_calibrators.py", "tests/serialization/test_hub_roundtrip.py")


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


def test_auto_tries_the_method(toy, timm_base):
    """A logit method is among auto's default candidates, ranked after the built-in ones, and auto scores it."""
    from hf_calibrate.fitting.auto.selection import AutoOptions, default_candidates

    assert toy.method in default_candidates() and AutoOptions().methods()[-1] == toy.method
    model, data = timm_base
    chosen = CalibratedModel.fit(model, data, method="auto", candidates=[toy.method], progress=False)
    rows = {row["method"]: row for row in chosen.fit_summary["auto"]["candidates"]}
    assert rows[toy.method]["held_out_nll"] is not None and rows[toy.method]["excluded"] is None


def test_the_methods_page_is_the_one_the_registry_renders():
    """docs/methods.md is generated: a method added or changed without regenerating it fails here, naming the command."""
    from hf_calibrate.fitting import method_docs

    page = ROOT / method_docs.PAGE
    assert page.is_file() and page.read_text(encoding="utf-8") == method_docs.render_page(), method_docs.stale_message(page)


#: run in the copy: collect the method tests, then report what the registry derived (argv: the JSON file to write, the
#: repository's docs/methods.md, the test files)
COPY_CHECK = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import pytest

    class Collected:
        ids = []

        def pytest_collection_modifyitems(self, items):
            self.ids += [item.nodeid for item in items]

    code = pytest.main(["--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *sys.argv[3:]],
                       plugins=[Collected()])
    import hf_calibrate
    from hf_calibrate import CalibratedModel
    from hf_calibrate.fitting import method_docs
    from hf_calibrate.fitting.auto import selection as auto

    stale = io.StringIO()
    with contextlib.redirect_stderr(stale):
        page_check = method_docs.main(["--check", sys.argv[2]])
    json.dump({"package": hf_calibrate.__file__, "collected": int(code), "tests": Collected.ids,
               "table": method_docs.render_table(), "fit": CalibratedModel.fit.__doc__,
               "auto": list(auto.default_candidates()), "candidates": list(auto.default_logit_candidates()),
               "page_check": page_check, "stale": stale.getvalue()}, open(sys.argv[1], "w"))
    """
)


@pytest.fixture(scope="module")
def derived_in_a_copy(tmp_path_factory) -> Dict[str, Any]:
    """What a fresh process derives from the registry of a copy of the package holding the guide's file."""
    copy = tmp_path_factory.mktemp("copy")
    shutil.copytree(ROOT / "hf_calibrate", copy / "hf_calibrate", ignore=shutil.ignore_patterns("__pycache__"))
    file_name, source = guide_example()
    (copy / "hf_calibrate" / "calibrators" / file_name).write_text(source, encoding="utf-8")
    (copy / "check.py").write_text(COPY_CHECK, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(copy)}
    command = [sys.executable, str(copy / "check.py"), str(copy / "derived.json"), str(ROOT / "docs" / "methods.md"),
               *(str(ROOT / path) for path in METHOD_TESTS)]
    result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    derived = json.loads((copy / "derived.json").read_text(encoding="utf-8"))
    assert Path(derived["package"]).resolve().is_relative_to(copy.resolve()), derived["package"]  # the copy ran
    assert derived["collected"] == 0, result.stdout[-3000:]
    return derived


def test_a_copy_with_the_file_derives_the_tests_docs_and_auto(derived_in_a_copy):
    derived = derived_in_a_copy
    method = Path(guide_example()[0]).stem
    collected = [node for node in derived["tests"] if f"[{method}" in node or f"-{method}]" in node]
    for expected in (f"{METHOD_TESTS[0]}::test_labels_as_users_hold_them[{method}]",
                     f"{METHOD_TESTS[0]}::test_every_logit_method_lowers_ece_on_fresh_data[{method}]"):
        assert expected in collected, collected
    assert any(node.startswith(f"{METHOD_TESTS[1]}::test_fresh_process_reload_is_bit_identical[") for node in collected)
    assert f"| `{method}` | toy bias | logits | A per-class bias added to the logits. |" in derived["table"]
    assert f'``"{method}"`` (toy bias)' in derived["fit"]
    assert method in derived["auto"] and derived["candidates"][-1] == method  # tried, after the built-in methods
    assert derived["page_check"] == 1 and "python -m hf_calibrate.fitting.method_docs" in derived["stale"]
