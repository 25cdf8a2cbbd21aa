"""A Griffe extension (mkdocs.yml: the python handler's ``extensions``) for the API reference.

The package's docstrings are Google style with reStructuredText inline markup, as ``help()`` and Sphinx read them:
``:func:`name```, ``Example:`` before doctest lines, ``text::`` before a literal block. mkdocstrings reads them
as Markdown, where a role shows as ``:func:`` before the name, an ``Example:`` section is an admonition whose
``>>>`` lines become nested block quotes (and a ``[...][...]`` in them a broken cross-reference), and ``::``
stays. This extension rewrites each docstring before it is parsed, changing how it renders, never what it says:

* ``:role:`~.name``` → ``name`` in code (the role's target is often relative, so it is not made a link);
* ``Example:`` → ``Examples:``, Google style's section for doctests (rendered as Python console code);
* a line ending in ``::`` → ``:`` (the indented block after it is a Markdown code block already);
* the placeholder of ``CalibratedModel.fit``'s method list → the list, as ``help()`` shows it once the model is
  imported (:func:`hf_calibrate.fitting.method_docs.with_method_list`; Markdown would read the placeholder as an HTML
  tag and show nothing);
* an ``Args:`` entry naming several parameters (``dataset_name, split: ...``) → one entry per parameter, each with
  the whole description, so Griffe checks every name against the signature (a stale one still fails
  ``--strict``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|ref):`~?\.*([^`]+)`")
EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.M)
LITERAL = re.compile(r"(\S)::[ \t]*$", flags=re.M)
ARGS = re.compile(r"^(\s*)(?:Args|Arguments|Params|Parameters|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
SEVERAL = re.compile(r"^(\s+)(\*{0,2}\w+(?:,\s*\*{0,2}\w+)+):(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def one_entry_per_parameter(text: str) -> str:
    """``text`` with each Args entry that names several parameters repeated for each of them."""
    lines, out, i = text.splitlines(), [], 0
    section = None  # the indentation of the current Args header
    while i < len(lines):
        line = lines[i]
        header = ARGS.match(line)
        if header:
            section = len(header.group(1))
        elif line.strip() and section is not None and _indent(line) <= section:
            section = None
        several = SEVERAL.match(line) if section is not None else None
        if not several:
            out.append(line)
            i += 1
            continue
        end = i + 1  # the entry's continuation: blank lines and lines indented deeper than its name
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > len(several.group(1))):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():
            end -= 1
        for name in several.group(2).split(","):
            out.extend([f"{several.group(1)}{name.strip()}:{several.group(3)}", *lines[i + 1 : end]])
        i = end
    return "\n".join(out)


def with_methods(text: str) -> str:
    """``text`` with ``CalibratedModel.fit``'s method-list placeholder replaced by the registered methods."""
    from hf_calibrate.fitting.method_docs import METHODS_PLACEHOLDER, with_method_list

    if METHODS_PLACEHOLDER not in text:
        return text
    import inspect

    from hf_calibrate.modeling import CalibratedModel

    return with_method_list(text, inspect.signature(CalibratedModel.fit).parameters["method"].default)


def as_markdown(text: str) -> str:
    """``text``, a docstring, with its reStructuredText markup as Markdown (see the module docstring)."""
    text = LITERAL.sub(r"\1:", EXAMPLE.sub(r"\1Examples:", ROLE.sub(r"`\1`", with_methods(text))))
    return one_entry_per_parameter(text)


class RestInline(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`as_markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = as_markdown(obj.docstring.value)
