"""The calibrator contract.

A calibrator is an ``nn.Module`` holding every fitted parameter of one method. It maps the
base model's (N, C) logits to calibrated (N, C) logits; a method that also perturbs the
input (Neural Clamping) exposes that perturbation as :attr:`Calibrator.input_perturbation`,
which the backbone adapter adds before the base model runs.

Each calibrator class declares
* ``method``: the name users pass to ``CalibratedModel.fit(..., method=...)``; defining a
  subclass with its own ``method`` registers it in :data:`CALIBRATORS` (nothing else to edit);
* ``Options``: a dataclass of its fit options, with defaults and docs;
* ``preserves_argmax``: whether predictions are guaranteed unchanged;
* ``title``, ``description``, ``citation``: what model cards say about the method;
* :meth:`config` / :meth:`from_config`: the shapes and hyper-parameters needed to rebuild an
  empty instance, before its tensors are loaded from ``calibration.safetensors``.

How a class is fitted is decided by its *family*, the nearest base class the fitting package
has a fit for (:mod:`hf_calibrate.fitting.families`): a plain :class:`Calibrator` subclass is
fitted on cached logits through :meth:`Calibrator.fit_logits` (docs/design.md §3.0).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import os
import typing
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Type

import numpy as np
import torch
from torch import nn

from .._errors import UserError
from .fit_context import FitContext, fit_context, fitting_in
from .memory import Footprint, check_fits
from ..metrics._checks import NonFiniteError, check_labels, describe_positions, nonfinite_rows


class InvalidOptionError(UserError, TypeError):
    """An option of the wrong type or outside its range (a :class:`~hf_calibrate._errors.UserError`, so a ValueError,
    and a TypeError)."""


@dataclasses.dataclass
class NoOptions:
    """This method has no fit options."""


#: method name → calibrator class, in the order the classes were defined (filled by ``Calibrator.__init_subclass__``)
CALIBRATORS: Dict[str, Type["Calibrator"]] = {}


#: what a method says about itself (model cards): not inherited from a parent method
_METHOD_FACTS = ("title", "description", "citation", "preserves_argmax")


class Calibrator(nn.Module):
    """Base class: subclasses implement ``forward`` and a fit (logit-space: :meth:`_fit_logits`)."""

    method: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    preserves_argmax: ClassVar[bool] = False
    #: the method's name in words, as model cards title it (default: ``method``)
    title: ClassVar[str] = ""
    #: what the method does, in a few sentences (model cards)
    description: ClassVar[str] = ""
    #: BibTeX entry of the method's paper ("" when there is none)
    citation: ClassVar[str] = ""
    #: True when fitting needs forward passes through the base model (not just cached logits); set by the family.
    needs_base_model: ClassVar[bool] = False
    #: True when fitting trains a new head on the base's penultimate features; set by the family.
    needs_features: ClassVar[bool] = False
    #: what a logit fit holds at its peak (:mod:`.memory`), checked against the free memory before it starts (None: not
    #: estimated; a method fitted through the base model)
    footprint: ClassVar[Optional[Footprint]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that names its own ``method`` in :data:`CALIBRATORS`.

        A new method says nothing it does not say itself: what it does not set of ``title``,
        ``description``, ``citation`` and ``preserves_argmax`` is the base's default (no text, and
        predictions not promised unchanged), never its parent method's.
        """
        super().__init_subclass__(**kwargs)
        if "method" not in cls.__dict__:
            return
        for name in _METHOD_FACTS:
            if name not in cls.__dict__:
                setattr(cls, name, getattr(Calibrator, name))
        known = CALIBRATORS.get(cls.method)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"method {cls.method!r} is already the method of {known.__module__}.{known.__qualname__}, and "
                f"{cls.__module__}.{cls.__qualname__} names it too. Give the new class another `method` name; if its module "
                "is a copy of a method's file left in hf_calibrate/calibrators/ (every module there is imported), remove "
                "or rename the copy.")
        CALIBRATORS[cls.method] = cls

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
        self.num_classes = int(num_classes)
        #: set by a fit or by loading a fitted state; an unfitted calibrator refuses to predict
        self.is_fitted = False

    @classmethod
    def create(cls, num_classes: int, options: Any, **facts: Any) -> "Calibrator":
        """An unfitted instance for ``options`` (an instance of ``cls.Options``); ``facts`` describe the model
        (``delta_shape``, ``delta_space``, and what the family adds, e.g. a head's ``feature_dim``)."""
        return cls(num_classes)

    @property
    def input_perturbation(self) -> Optional[torch.Tensor]:
        """δ added to the base model's input, or None for pure logit-space methods."""
        return None

    @property
    def head(self) -> Optional[nn.Module]:
        """A classifier head (features → logits) replacing the base's, or None."""
        return None

    def fit_logits(
        self, logits: torch.Tensor, labels: torch.Tensor, options: Any, context: Optional[FitContext] = None,
    ) -> Dict[str, Any]:
        """Fit on cached (N, C) logits and (N,) labels with ``options`` (an instance of ``self.Options``);
        return a summary for the fit history.

        The logits must be finite and the labels valid class indices (else a ValueError naming
        the rows), and the fit's :attr:`footprint` must fit in the memory free (else a
        :class:`~.memory.FitTooLargeError` naming both, before anything is allocated); subclasses
        implement :meth:`_fit_logits` and read ``context`` (progress
        bars, Ctrl-C) through :func:`fit_context`.
        """
        if type(self)._fit_logits is Calibrator._fit_logits:
            raise NotImplementedError(f"{self.method} is not fitted from cached logits.")
        labels = check_fit_logits(logits, labels, self.num_classes)
        if self.footprint is not None:
            rows, classes = logits.shape
            check_fits(self.footprint, rows, classes, f"{self.method} on {rows:,} x {classes:,} logits", logits.device)
        with fitting_in(context):
            return self._fit_logits(logits, labels, options)

    def _fit_logits(self, logits: torch.Tensor, labels: torch.Tensor, options: Any) -> Dict[str, Any]:
        """The fit itself, on logits and labels already checked by :meth:`fit_logits`."""
        raise NotImplementedError(f"{self.method} is not fitted from cached logits.")

    # ------------------------------------------------------------------ persistence
    def config(self) -> Dict[str, Any]:
        """JSON-able facts needed to rebuild an empty instance of the right shapes."""
        return {"num_classes": self.num_classes}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Calibrator":
        return cls(**config)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}"


def calibrator_class(method: str) -> Type[Calibrator]:
    """The calibrator class for a method name, or a ValueError listing the names."""
    try:
        return CALIBRATORS[method]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(CALIBRATORS)}.") from None


def check_fit_logits(logits: Any, labels: Any, num_classes: int) -> torch.Tensor:
    """Refuse logits a fit cannot use: not (N, C) floating point, or holding NaN/±inf; and bad labels.

    Returns the labels as an (N,) int64 tensor on the logits' device (any integer dtype, a numpy
    array or a list is accepted).
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        described = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point (N, C) tensor, got {described}.")
    if logits.shape[1] != num_classes:
        raise ValueError(f"this calibrator has {num_classes} classes but the logits have {logits.shape[1]} columns.")
    check_finite_logits(logits)
    return check_labels(labels, num_classes, logits.shape[0]).long().to(logits.device)


#: values per chunk of a one-pass reduction over logits: 1 MiB of float32 on a CPU, so that a
#: chunk's few elementwise steps run from cache and the pass reads the logits from memory about once
CHUNK_VALUES = {"cpu": 1 << 18, "other": 1 << 26}


def chunk_rows(logits: torch.Tensor) -> int:
    """Rows per chunk of a one-pass reduction over ``logits`` (N, C): :data:`CHUNK_VALUES` values."""
    key = "cpu" if logits.device.type == "cpu" else "other"
    return max(1, CHUNK_VALUES[key] // max(1, logits.shape[1]))


def check_finite_logits(logits: torch.Tensor, what: str = "logits") -> None:
    """Raise :class:`NonFiniteError` naming the rows of ``logits`` that hold NaN or ±inf."""
    rows = nonfinite_rows(logits)
    if rows:
        raise NonFiniteError(
            f"{what} of sample(s) {describe_positions(rows)} (row positions) are NaN or infinite; a calibration fitted "
            "on them would be meaningless. Remove these samples, or fix the model or inputs that produced them."
        )


# ----------------------------------------------------------------------------- options


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
