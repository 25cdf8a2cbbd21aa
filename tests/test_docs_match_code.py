"""The public docs say what the code does, so they cannot drift apart.

* **Data forms.** ``docs/usage.md`` lists the forms calibration and evaluation data may take, between the markers
  ``<!-- data-forms: start -->`` and ``<!-- data-forms: end -->``, each form's lead phrase in bold (``**a list of
  batches**``). ``CalibratedModel.fit``'s and ``CalibratedModel.evaluate``'s docstrings must name every one of those
  phrases (compared without Markdown/reST backticks, case or line breaks), and every form has a tiny real example here
  that ``fit`` and ``evaluate`` take, giving the calibrator and the metrics of the same samples as a map-style
  ``TensorDataset`` — a form added to the page without an example, or an example of a form the page no longer
  lists, fails :func:`test_every_form_the_page_lists_has_an_example_here`.
* **Method names.** Every method the library defines (and ``auto``) is named by ``fit``'s docstring and by the README's
  "Which method to use" section.
* **One recommendation.** The README's and ``docs/choosing-a-method.md``'s "Which method?" name ``fit``'s default and
  the CLI's, and the fast choice ``fit``'s docstring and the CLI's help name.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import _tiny_models as tm
from hf_calibrate import CalibratedModel

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest.py: one torch thread for the module

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the page that lists the data forms (the README names them in short and links to it)
USAGE = ROOT / "docs" / "usage.md"
#: the pages whose "Which method?" paragraph recommends a method
RECOMMENDING = (README, ROOT / "docs" / "choosing-a-method.md")
START, END = "<!-- data-forms: start -->", "<!-- data-forms: end -->"
#: the list had six forms when this test was written; fewer means the parsing (or the list) broke
LEAST_FORMS = 6


def normalised(text: str) -> str:
    """``text`` as compared: no backticks or asterisks (Markdown and reST code and emphasis), lower case, one space
    between words."""
    return " ".join(re.sub(r"[`*]", "", text).lower().split())


def listed_data_forms(text: str) -> List[str]:
    """The bold lead phrases between the data-forms markers of ``text`` (docs/usage.md), normalised, in order."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"the page must hold {START!r} and {END!r} once each, around its list of data forms")
    listed = text[text.index(START) + len(START) : text.index(END)]
    return [normalised(phrase) for phrase in re.findall(r"\*\*(.+?)\*\*", listed, flags=re.S)]


def missing_forms(docstring: str, forms: List[str]) -> List[str]:
    """The forms of ``forms`` that ``docstring`` does not name."""
    said = normalised(docstring)
    return [form for form in forms if normalised(form) not in said]


@pytest.fixture(scope="module")
def forms() -> List[str]:
    return listed_data_forms(USAGE.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- the page's list, parsed


def test_the_usage_page_lists_the_data_forms_between_its_markers(forms):
    assert len(forms) >= LEAST_FORMS, forms
    assert len(set(forms)) == len(forms), forms
    assert "a dataloader" in forms and "a generator" in forms  # the first and the last of the list


def test_the_parser_reads_only_the_marked_list_and_refuses_a_page_without_it():
    text = f"**not a form** {START}**a `DataLoader`** of pairs; or **a\n  generator** (read once){END} **nor this**"
    assert listed_data_forms(text) == ["a dataloader", "a generator"]
    with pytest.raises(ValueError, match="data-forms: start"):
        listed_data_forms(text.replace(END, ""))


# ----------------------------------------------------------------------------- the docstrings name them


@pytest.mark.parametrize("function", [CalibratedModel.fit, CalibratedModel.evaluate], ids=["fit", "evaluate"])
def test_fit_and_evaluate_name_every_form_the_page_lists(function, forms):
    assert missing_forms(function.__doc__, forms) == [], f"{function.__qualname__}'s docstring does not name these forms"


def test_a_docstring_that_drops_a_form_is_reported(forms):
    """The check can fail: take each form out of ``fit``'s docstring in turn, and exactly that form is reported."""
    docstring = normalised(CalibratedModel.fit.__doc__)
    for form in forms:
        assert missing_forms(docstring.replace(form, "(left out)"), forms) == [form]
    assert missing_forms("Fit on a DataLoader or a datasets.Dataset.", forms) == [form for form in forms if form != "a dataloader"]


# ----------------------------------------------------------------------------- every form is taken


class Samples(IterableDataset):
    """A torch IterableDataset yielding one ``(input, label)`` sample at a time."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.inputs, self.labels = inputs, labels

    def __iter__(self):
        return zip(self.inputs, self.labels)


def _examples(x: torch.Tensor, y: torch.Tensor) -> Dict[str, Dict[str, Callable[[], Any]]]:
    """Listed form (normalised lead phrase) → {variant: a factory of the same 64 samples in that form} (a stream is read
    by one call, so each call builds it anew)."""
    import datasets

    pairs = [(x[i : i + 20], y[i : i + 20]) for i in range(0, len(y), 20)]  # 20, 20, 20, 4: uneven, as users' are
    dicts = [{"input": inputs, "labels": labels, "idx": torch.arange(len(labels))} for inputs, labels in pairs]
    rows = datasets.Dataset.from_dict({"input": x.tolist(), "label": y.tolist()})
    return {
        "a dataloader": {
            "of (inputs, labels) pairs": lambda: DataLoader(TensorDataset(x, y), batch_size=16),
            "of dicts": lambda: DataLoader([{"input": a, "labels": b} for a, b in zip(x, y)], batch_size=16),
            "over pre-made batches (batch_size=None)": lambda: DataLoader(pairs, batch_size=None),
            "over an IterableDataset": lambda: DataLoader(Samples(x, y), batch_size=16),
        },
        "a torch dataset or iterabledataset": {
            "Dataset": lambda: TensorDataset(x, y),
            "IterableDataset": lambda: Samples(x, y),
        },
        "a list of batches": {
            "of pairs": lambda: pairs,
            "of dicts with another field": lambda: dicts,
        },
        "a callable returning a new iterator of batches": {
            "callable": lambda: (lambda: iter(pairs)),
        },
        "a datasets.dataset or datasets.iterabledataset": {
            "datasets.Dataset": lambda: rows,
            "datasets.IterableDataset, 2 shards": lambda: rows.to_iterable_dataset(num_shards=2),
        },
        "a generator": {
            "generator": lambda: (batch for batch in pairs),
        },
    }


@pytest.fixture(scope="module")
def plain():
    """(plain classifier, its 64 samples as a TensorDataset, the temperature calibration of them, its evaluation)."""
    model = tm.plain_module()
    data = tm.plain_data(model)
    reference = CalibratedModel.fit(model, data, method="temperature", progress=False)
    return model, data, reference, reference.evaluate(data, progress=False, bootstrap=0, in_sample=True)


def test_every_form_the_page_lists_has_an_example_here(forms, plain):
    _, data, _, _ = plain
    assert sorted(_examples(*data.tensors)) == sorted(forms)


@pytest.mark.parametrize("form", sorted(_examples(torch.zeros(1, 6), torch.zeros(1, dtype=torch.long))))
def test_every_listed_form_is_fitted_and_evaluated_like_the_map_style_samples(form, plain):
    model, data, reference, want = plain
    for variant, make in _examples(*data.tensors)[form].items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what a fit says of 64 rows is not under test here
            calibrated = CalibratedModel.fit(model, make(), method="temperature", progress=False)
            got = calibrated.evaluate(make(), progress=False, bootstrap=0, in_sample=True)
        assert calibrated.fit_summary["fit_samples"] == len(data), variant
        assert torch.equal(calibrated.calibrator.temperature, reference.calibrator.temperature), variant
        assert got["calibrated"]["num_samples"] == len(data), variant
        for side in ("uncalibrated", "calibrated"):
            for metric in ("accuracy", "ece", "nll", "brier"):
                assert got[side][metric] == pytest.approx(want[side][metric], rel=1e-6, abs=1e-9), (variant, side, metric)


def test_a_generator_is_read_once_and_refused_by_neural_clamping_naming_the_fix(plain):
    """The page's words on the last form: fine for the one-pass methods, refused by Neural Clamping."""
    model, data, _, _ = plain
    x, y = data.tensors
    with pytest.raises(ValueError, match="callable that returns a new iterator"):
        CalibratedModel.fit(model, ((x[i : i + 20], y[i : i + 20]) for i in range(0, 64, 20)), method="neural_clamping",
                            progress=False)


def test_raw_image_rows_get_the_models_own_preprocessing():
    """docs/usage.md: a ``datasets.Dataset`` with a raw ``image`` column is preprocessed with the model's own
    preprocessing (timm's data config): the same calibrator as the images preprocessed by hand."""
    import datasets
    import timm.data

    model = tm.tiny_timm(0)
    images, labels = tm.pil_images(24, size=tm.IMAGE_SIZE), [i % tm.NUM_CLASSES for i in range(24)]
    rows = datasets.Dataset.from_dict({"image": images, "label": labels}).cast_column("image", datasets.Image())
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))
    pixels = torch.stack([transform(image.convert("RGB")) for image in rows["image"]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_rows = CalibratedModel.fit(model, rows, method="temperature", progress=False)
        by_hand = CalibratedModel.fit(model, TensorDataset(pixels, torch.tensor(labels)), method="temperature", progress=False)
    assert torch.equal(from_rows.calibrator.temperature, by_hand.calibrator.temperature)
    assert from_rows.evaluate(rows.to_iterable_dataset(), progress=False, bootstrap=0)["calibrated"]["num_samples"] == 24


# ----------------------------------------------------------------------------- method names


def _built_in_methods() -> List[str]:
    from hf_calibrate.calibrators import CALIBRATORS
    from hf_calibrate.fitting.auto.selection import AUTO

    return [name for name, cls in CALIBRATORS.items() if cls.__module__.startswith("hf_calibrate.")] + [AUTO]


def _section(text: str, heading: str) -> str:
    """The Markdown section of ``text`` under ``heading`` (a ``## `` line), up to the next heading of its level."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_fit_and_the_methods_page_name_every_method_and_the_readme_links_it():
    """``fit``'s docstring and docs/methods.md (both rendered from the registry) name every method, and the README's
    "Which method to use" points to that page, so a new method needs no README edit."""
    section = _section(README.read_text(encoding="utf-8"), "## Which method to use")
    page = (README.parent / "docs" / "methods.md").read_text(encoding="utf-8")
    methods = _built_in_methods()
    assert len(methods) >= 12, methods
    assert [name for name in methods if f'``"{name}"``' not in CalibratedModel.fit.__doc__] == []
    assert [name for name in methods if f"`{name}`" not in page] == []
    assert "docs/methods.md" in section


@pytest.mark.parametrize("page", RECOMMENDING, ids=[page.name for page in RECOMMENDING])
def test_the_readme_the_cli_and_fit_recommend_one_method(page):
    """One recommendation: the method the README's (and the docs') "Which method?" names is ``fit``'s default and
    the CLI's, and the fast alternative it names is what ``fit``'s docstring and the CLI's help call the fast choice."""
    import inspect

    from hf_calibrate.cli.parser import build_parser

    text = page.read_text(encoding="utf-8")
    recommended = re.search(r"\*\*Which method\? The default, [^(]*\(`(\w+)`\)\.\*\*", text)
    assert recommended, f"{page.name}'s 'Which method?' paragraph names no method"
    fit_default = inspect.signature(CalibratedModel.fit).parameters["method"].default
    cli = build_parser().parse_args(["fit", "--model", "m", "--dataset", "d", "--output", "o"])
    assert recommended.group(1) == fit_default == cli.method
    assert f'``"{fit_default}"`` (default, the recommended method' in CalibratedModel.fit.__doc__
    fast = re.search(r'`method="(\w+)"` is the fast choice', text)
    assert fast and f'``"{fast.group(1)}"``, the fast choice' in CalibratedModel.fit.__doc__
    commands = next(action for action in build_parser()._actions if action.choices and "fit" in action.choices)
    assert f"'{fast.group(1)}' is the fast choice" in " ".join(commands.choices["fit"].format_help().split())


# ----------------------------------------------------------------------------- the README's commands and links

#: the README's two commands, kept word for word: the demo (its install line) and the test suite (what .ci/run runs)
DEMO_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install -e ".[demo]" -c constraints.txt && .venv/bin/hf-calibrate demo'
TEST_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" -c constraints.txt && .venv/bin/python -m pytest'


def _bash_lines(text: str) -> List[str]:
    """Every line of the ``bash`` code blocks of Markdown ``text``."""
    return [line for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S) for line in block.splitlines()]


def test_the_readme_shows_the_demo_and_test_commands_and_ci_runs_the_test_command():
    commands = _bash_lines(README.read_text(encoding="utf-8"))
    assert DEMO_COMMAND in commands and TEST_COMMAND in commands
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_the_readmes_relative_links_name_files_of_the_repository():
    """The README is not a page of the docs site, so ``mkdocs build --strict`` does not check its links: this does."""
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    relative = [target for target in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]
    assert len(relative) >= 10, relative
    assert [target for target in relative if not (ROOT / target).exists()] == []
