"""``docs/own-timm-model.md`` run as it is: a user's own timm model saved with ``timm.models.save_for_hf``, calibrated,
evaluated and compared through the real ``hf-calibrate`` entry point.

Every fenced ``python`` block of the page is executed and every ``hf-calibrate`` line of its ``bash`` blocks is run
with :func:`hf_calibrate.cli.main` (the console script's function, in this process: a fresh process per command
would cost its imports each time), in order, in one empty folder — so the page cannot drift from what works.
Its ``text`` block is a warning line the CLI prints for a folder that keeps timm's ``test_input_size``; that case is
run here too, from a model saved the way the page warns about. The data are the page's own toy images (300 PNGs of
40×48 pixels) and the model a randomly initialised ``resnet10t`` trained three epochs at 32×32: a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

import pytest

from hf_calibrate.cli import main
from hf_calibrate.cli.parser import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "own-timm-model.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", flags=re.M | re.S)
PROGRAM = "hf-calibrate"
CALIBRATED_SIZE = [3, 32, 32]  # the page's data_config input_size

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module


class Ran(NamedTuple):
    """One ``hf-calibrate`` command of the page and what it did."""

    argv: List[str]
    status: int
    stdout: str
    stderr: str


def doc_blocks(text: str) -> List[Tuple[str, str]]:
    """(language, code) of each fenced block of ``text``, in order."""
    return FENCE.findall(text)


def block_commands(code: str) -> List[List[str]]:
    """The command lines of a ``bash`` block (``\\`` continuations joined), each split as the shell splits it."""
    lines = [line for line in code.replace("\\\n", " ").splitlines() if line.strip()]
    return [shlex.split(line) for line in lines]


def run_command(argv: List[str]) -> Ran:
    """``hf-calibrate ARGS`` through :func:`main`, its output captured."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main([*argv[1:], "--no-progress"])
    return Ran(argv, status, stdout.getvalue(), stderr.getvalue())


def run_page(text: str) -> List[Ran]:
    """Every block of the page, in order, in the current folder; the commands it ran."""
    ran: List[Ran] = []
    for number, (language, code) in enumerate(doc_blocks(text)):
        if language == "python":
            exec(compile(code, f"{DOC.name}, block {number}", "exec"), {"__name__": f"doc_block_{number}"})  # noqa: S102
        elif language == "bash":
            ran += [run_command(argv) for argv in block_commands(code)]
    return ran


def assert_ok(ran: Ran) -> None:
    assert ran.status == 0, f"{shlex.join(ran.argv)} exited {ran.status}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"


@pytest.fixture(scope="module")
def page() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def page_run(page, tmp_path_factory, single_thread) -> Dict[str, object]:
    """The page, run in an empty folder: {"folder": it, "ran": the commands}; one torch thread (conftest.py), as a
    busy machine runs small models several times faster on one."""
    folder = tmp_path_factory.mktemp("own-timm-model")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        ran = run_page(page)
    return {"folder": folder, "ran": ran}


# ----------------------------------------------------------------------------- the page's commands


def test_the_page_runs_fit_evaluate_and_compare_and_each_succeeds(page_run):
    commands = [ran.argv[1] for ran in page_run["ran"]]
    assert commands == ["fit", "evaluate", "compare", "evaluate"], commands
    for ran in page_run["ran"]:
        assert_ok(ran)
    folder = page_run["folder"]
    for name in ("calibration_config.json", "calibration.safetensors", "config.json", "model.safetensors", "README.md"):
        assert (folder / "my-calibrated" / name).is_file(), name
    assert (folder / "my-comparison" / "comparison.json").is_file()


def test_every_option_the_page_gives_is_one_of_its_commands_options(page):
    """Cheap guard beside the run: an option renamed in the parser fails here with its name."""
    subcommands = next(action for action in build_parser()._actions if action.dest == "command").choices
    for language, code in doc_blocks(page):
        if language != "bash":
            continue
        for argv in block_commands(code):
            assert argv[0] == PROGRAM and argv[1] in subcommands, argv
            known = {flag for action in subcommands[argv[1]]._actions for flag in action.option_strings}
            assert {word for word in argv if word.startswith("--")} <= known, argv


def test_the_page_lists_every_preprocessing_key_the_calibration_reads(page):
    """The page's table of ``pretrained_cfg`` keys names each key the input contract takes from a timm config and the
    test-time keys it does not use."""
    from hf_calibrate.backbones.preprocessing import TIMM_KEYS, TIMM_TEST_TIME_KEYS

    table = re.search(r"\| `pretrained_cfg` key \|(.*?)\n\n", page, flags=re.S).group(1)
    listed = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?", table, flags=re.M))
    assert {key for pair in listed for key in pair if key} == {*TIMM_KEYS, *TIMM_TEST_TIME_KEYS.values()}


# ----------------------------------------------------------------------------- what the calibration holds


def test_the_calibration_preprocesses_as_the_folders_pretrained_cfg(page_run):
    """The input contract and the saved timm config are the data_config the model was saved with; a loaded
    calibration resolves to them, test-time size or not."""
    import timm.data

    from hf_calibrate import CalibratedModel

    folder = page_run["folder"]
    saved = json.loads((folder / "my-timm-model" / "config.json").read_text())["pretrained_cfg"]
    record = json.loads((folder / "my-calibrated" / "calibration_config.json").read_text())
    contract = record["input_contract"]
    assert saved["input_size"] == contract["input_size"] == CALIBRATED_SIZE
    for key in ("crop_pct", "interpolation", "mean", "std"):
        assert contract["preprocessing"][key] == saved[key], key
    calibrated = CalibratedModel.from_pretrained(folder / "my-calibrated")
    for use_test_size in (False, True):
        config = timm.data.resolve_data_config(model=calibrated.base_model, use_test_size=use_test_size)
        assert list(config["input_size"]) == CALIBRATED_SIZE and config["crop_pct"] == saved["crop_pct"]


def test_a_folder_saved_with_data_config_gets_no_test_time_warning(page_run):
    fit = page_run["ran"][0]
    assert "test_input_size" not in fit.stderr and "test_crop_pct" not in fit.stderr, fit.stderr


def test_a_folder_keeping_timms_test_time_settings_is_calibrated_at_input_size_and_says_so(page, page_run, tmp_path):
    """The page's ``text`` block: a model saved with ``pretrained_cfg_overlay`` keeps resnet10t's registry
    ``test_input_size`` 224 and ``test_crop_pct`` 0.95; fit says it uses input_size and crop_pct, names the fix, and the
    calibrated config drops the test-time settings."""
    import timm
    from timm.models import save_for_hf

    model = timm.create_model("resnet10t", pretrained=False, num_classes=3,
                              pretrained_cfg_overlay=dict(input_size=(3, 32, 32), crop_pct=1.0)).eval()
    assert tuple(model.pretrained_cfg["test_input_size"]) == (3, 224, 224)
    save_for_hf(model, str(tmp_path / "overlay-model"), model_config={"label_names": ["blue", "green", "red"]},
                safe_serialization=True)
    images = page_run["folder"] / "my-images"
    fit = run_command([PROGRAM, "fit", "--model", str(tmp_path / "overlay-model"), "--dataset", str(images), "--split",
                       "calibration", "--eval-split", "test", "--method", "temperature", "--bootstrap", "0",
                       "--output", str(tmp_path / "calibrated")])
    assert_ok(fit)
    documented = next(code for language, code in doc_blocks(page) if language == "text").strip().removesuffix("...")
    assert documented.strip() in fit.stderr, fit.stderr
    assert "data_config=dict(input_size=(3, 224, 224), crop_pct=0.95)" in fit.stderr
    assert "data_config=dict(input_size=(3, 32, 32), crop_pct=1.0)" in fit.stderr
    saved = json.loads((tmp_path / "calibrated" / "config.json").read_text())["pretrained_cfg"]
    assert saved["input_size"] == CALIBRATED_SIZE and saved["crop_pct"] == 1.0
    assert "test_input_size" not in saved and "test_crop_pct" not in saved
