"""Fit options: each method's options dataclass declares every field's type and, for a number, its range
(:func:`ranged`); :func:`parse_options` builds one from user values, naming an unknown option, a wrong type or a value
out of range (:class:`InvalidOptionError`) with what is allowed.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import os
import typing
from typing import Any, Dict, Mapping

import numpy as np

from .._errors import UserError


class InvalidOptionError(UserError, TypeError):
    """An option of the wrong type or outside its range (a :class:`~hf_calibrate._errors.UserError`, so a ValueError,
    and a TypeError)."""


@dataclasses.dataclass
class NoOptions:
    """This method has no fit options."""


@functools.lru_cache(maxsize=None)
def _field_hints(options_class: type) -> Dict[str, Any]:
    """Resolved type hints of the fields of an options dataclass."""
    hints = typing.get_type_hints(options_class)
    return {field.name: hints.get(field.name, Any) for field in dataclasses.fields(options_class)}


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option may take: ``low`` to ``high``, each end included unless it is open.

    An options dataclass declares one per field with :func:`ranged`; :func:`check_option_types` checks every value
    (each item of a list) against it, where every option is checked.
    """

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self, integer: bool) -> str:
        """``"a positive number in (0, 1]"``, ``"a number in [0.001, 1000]"``, or ``"an integer from 1 to 10000"`` for an
        integer option."""
        if integer:
            return f"an integer from {self.low:g} to {self.high:g}"
        sign = ("positive " if self.low_open else "non-negative ") if self.low == 0 else ""
        return f"a {sign}number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


#: the metadata key of a field's :class:`Range`
RANGE = "range"
#: the largest magnitude a float option may have when its class declares no :class:`Range` for it (a method defined
#: outside this library): beyond it a fit's arithmetic overflows (lr=1e308 made torch raise an overflow RuntimeError)
MAX_FLOAT_OPTION = 1e6
_UNDECLARED_FLOAT = Range(-MAX_FLOAT_OPTION, MAX_FLOAT_OPTION)


#: the learning rates of the gradient fits (Neural Clamping's SGD, the heads' Adam): a step of more moves the
#: parameters past anything a fit can use (Neural Clamping's SGD at lr=1e6 ended at T = inf)
LEARNING_RATE = Range(0.0, 1.0, low_open=True)
#: a share of the calibration data held out for selection
HELD_OUT_SHARE = Range(0.0, 1.0, high_open=True)


def ranged(default: Any, allowed: Range) -> Any:
    """A dataclass field with ``default`` whose values (each item of a list) must lie in ``allowed``."""
    return dataclasses.field(default=default, metadata={RANGE: allowed})


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (the kinds of hint option dataclasses use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if hint is float:
        return _is_real(value) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list, collections.abc.Sequence):
        element = args[0] if args else Any
        return isinstance(value, (tuple, list, np.ndarray)) and all(_matches(item, element) for item in value)
    if origin is collections.abc.Callable:
        return callable(value)
    if hint is not Any and origin is None and isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    """Words for a type hint: ``Optional[int]`` → ``an integer or None``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        described = " or ".join(_describe(arg) for arg in args if arg is not type(None))
        return f"{described}, or None" if type(None) in args else described
    if origin in (tuple, list, collections.abc.Sequence):
        return f"a list whose items are each {_describe(args[0]) if args else 'a value'}"
    if origin is collections.abc.Callable:
        return "a callable"
    words = {
        type(None): "None", bool: "True or False", int: "an integer (not a bool)",
        float: "a finite number",
        str: "a string", os.PathLike: "a path",
    }
    return words.get(hint, getattr(hint, "__name__", str(hint)))


def _string_hint(name: str, value: Any, hint: Any) -> str:
    """``" Write lr=0.1, not lr='0.1'."`` when a number was passed as a string."""
    if not isinstance(value, str):
        return ""
    if _matches([value], hint):
        return f" Write {name}=[{value!r}], not {name}={value!r}."
    for kind in (int, float):
        try:
            parsed = kind(value)
        except ValueError:
            continue
        if _matches(parsed, hint):
            return f" Write {name}={parsed!r}, not {name}={value!r}."
    return ""


def check_option_types(options_class: type, values: Mapping[str, Any]) -> None:
    """Refuse option values whose type does not match the field's declared type, or that lie outside its :class:`Range`.

    ``True`` is not an integer, ``'0.1'`` is not a number, ``nan`` is not a finite number, ``lr=1e308`` is not a
    learning rate. Raises :class:`InvalidOptionError` naming the option, the value given and what is allowed (for a
    range: the range, and the fix).
    """
    hints = _field_hints(options_class)
    for name, value in values.items():
        hint = hints.get(name, Any)
        if not _matches(value, hint):
            raise InvalidOptionError(
                f"option {name} must be {_describe(hint)}, got {value!r} ({type(value).__name__})."
                + _string_hint(name, value, hint)
            )
        _check_range(options_class, name, value)


def _mentions_float(hint: Any) -> bool:
    return hint is float or any(_mentions_float(arg) for arg in typing.get_args(hint))


@functools.lru_cache(maxsize=None)
def _field_ranges(options_class: type) -> Dict[str, Range]:
    """Each numeric field's :class:`Range`: declared with :func:`ranged`, else (a float field) ±:data:`MAX_FLOAT_OPTION`."""
    hints = _field_hints(options_class)
    ranges = {field.name: field.metadata.get(RANGE) for field in dataclasses.fields(options_class)}
    return {name: found or _UNDECLARED_FLOAT for name, found in ranges.items() if found or _mentions_float(hints[name])}


def _check_range(options_class: type, name: str, value: Any) -> None:
    """Refuse a numeric ``value`` (or an item of a list) of option ``name`` outside its :class:`Range`, naming the
    option, the value, the range and the fix."""
    allowed = _field_ranges(options_class).get(name)
    listed = isinstance(value, (tuple, list, np.ndarray))
    numbers = [item for item in (value if listed else [value]) if _is_real(item)]
    if allowed is None or all(number in allowed for number in numbers):
        return
    field = next(field for field in dataclasses.fields(options_class) if field.name == name)
    shown = list(field.default) if isinstance(field.default, tuple) else field.default
    default = "" if shown in (None, dataclasses.MISSING) else f" ({shown!r})"
    described = allowed.describe(integer=not _mentions_float(_field_hints(options_class)[name]))
    raise InvalidOptionError(
        f"option {name} must be {described}{' (each value of the list)' if listed else ''}, got {value!r}: a fit cannot "
        f"use values beyond that. Pass a value in that range, or leave {name} out for its default{default}."
    )


def _plain(value: Any) -> Any:
    """numpy scalars as the Python scalars they hold (options are saved as JSON)."""
    return value.item() if isinstance(value, np.generic) else value


def check_fields(options: Any) -> None:
    """:func:`check_option_types` on every field of an options dataclass instance (for ``__post_init__``);
    numpy scalars become Python scalars."""
    values = {field.name: _plain(getattr(options, field.name)) for field in dataclasses.fields(options)}
    check_option_types(type(options), values)
    for name, value in values.items():
        setattr(options, name, value)


def require(condition: bool, name: str, value: Any, allowed: str) -> None:
    """Raise :class:`InvalidOptionError` ``"option {name} must be {allowed}, got {value!r}."`` unless ``condition``."""
    if not condition:
        raise InvalidOptionError(f"option {name} must be {allowed}, got {value!r}.")


def parse_options(options_class: type, options: Mapping[str, Any], method: str) -> Any:
    """Build ``options_class(**options)``; unknown names get an error listing the valid ones.

    Every value's type is checked against the field's declared type before the dataclass runs
    its own range checks, so a wrong type never surfaces as an operator error.
    """
    valid = {field.name for field in dataclasses.fields(options_class)}
    unknown = sorted(set(options) - valid)
    if unknown:
        listed = ", ".join(sorted(valid)) or "none"
        raise TypeError(f"unknown option(s) {unknown} for method {method!r}; its options are: {listed}.")
    values = {name: _plain(value) for name, value in options.items()}
    check_option_types(options_class, values)
    return options_class(**values)


def options_to_dict(options: Any) -> Dict[str, Any]:
    """JSON-able view of an options dataclass (sequences become lists)."""
    result = {}
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        result[field.name] = list(value) if isinstance(value, tuple) else value
    return result
