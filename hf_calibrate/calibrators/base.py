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
* ``title``, ``description``, ``citation``: what model cards (and docs/methods.md) say about the method;
* ``auto_role``: whether ``method="auto"`` tries it (:class:`AutoRole`; a logit method is tried unless it says
  otherwise);
* :meth:`config` / :meth:`from_config`: the shapes and hyper-parameters needed to rebuild an
  empty instance, before its tensors are loaded from ``calibration.safetensors``.

How a class is fitted is decided by its *family*, the nearest base class the fitting package
has a fit for (:mod:`hf_calibrate.fitting.families`): a plain :class:`Calibrator` subclass is
fitted on cached logits through :meth:`Calibrator.fit_logits` (docs/design.md §3.0).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type

import torch
from torch import nn

from .fit_context import FitContext, fitting_in
from .memory import Footprint, check_fits
from .options import NoOptions
from ..metrics._checks import NonFiniteError, check_labels, describe_positions, nonfinite_rows


#: method name → calibrator class, in the order the classes were defined (filled by ``Calibrator.__init_subclass__``)
CALIBRATORS: Dict[str, Type["Calibrator"]] = {}


#: what a method says about itself (model cards): not inherited from a parent method
_METHOD_FACTS = ("title", "description", "citation", "preserves_argmax")


class AutoRole(enum.Enum):
    """Whether ``method="auto"`` tries a method (:attr:`Calibrator.auto_role`); how it scores one is its family's
    (:mod:`hf_calibrate.fitting.auto.selection`)."""

    #: among auto's candidates unless the user names others in ``candidates``
    DEFAULT = "default"
    #: a candidate only when named in ``candidates`` (a costly fit: the head methods train K + 1 heads each)
    NAMED = "named"
    #: never a candidate: fit it by name, and compare it with the others with ``hf-calibrate compare``
    NEVER = "never"


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What :meth:`Calibrator.create` may need to know of the base model beyond its number of classes, measured by the
    fit on the first calibration sample and by the method's family (:mod:`hf_calibrate.fitting.families`).

    Attributes:
        delta_shape: the shape of one model input (δ's shape), e.g. (3, 224, 224) for an image or (768,) for a
            text's word embedding; None where the fit did not measure it.
        delta_space: the input δ is added to: ``"pixel_values"``, ``"inputs_embeds"`` or ``"input"``
            (:attr:`~hf_calibrate.backbones.Backbone.delta_space`); None where not measured.
        feature_dim: d, the width of the penultimate features a new head reads (the head family measures it); None
            for the other families.
    """

    delta_shape: Optional[Tuple[int, ...]] = None
    delta_space: Optional[str] = None
    feature_dim: Optional[int] = None

    def need(self, name: str, method: str) -> Any:
        """The fact ``name``, or a ValueError saying that ``method``'s calibrator cannot be built without it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{method} needs the model's {name} to build its calibrator; fit it through "
                             "CalibratedModel.fit, whose method family measures it.")
        return value


#: no facts of the model: what a logit method's ``create`` gets when called without them
NO_FACTS = ModelFacts()


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
    #: what the default options need of the data beyond ``requirements`` (docs/methods.md's "least data"; "" when nothing)
    least_data_note: ClassVar[str] = ""
    #: True when fitting needs forward passes through the base model (not just cached logits); set by the family.
    needs_base_model: ClassVar[bool] = False
    #: True when fitting trains a new head on the base's penultimate features; set by the family.
    needs_features: ClassVar[bool] = False
    #: whether ``method="auto"`` tries the method (:class:`AutoRole`); a method that does not say is tried when it is
    #: fitted on the logits alone (auto scores any logit method), else never (auto scores a head or δ only by the paths
    #: its family has for the built-in ones)
    auto_role: ClassVar[AutoRole] = AutoRole.DEFAULT
    #: what a logit fit holds at its peak (:mod:`.memory`), checked against the free memory before it starts (None: not
    #: estimated; a method fitted through the base model)
    footprint: ClassVar[Optional[Footprint]] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that names its own ``method`` in :data:`CALIBRATORS`.

        A new method says nothing it does not say itself: what it does not set of ``title``,
        ``description``, ``citation`` and ``preserves_argmax`` is the base's default (no text, and
        predictions not promised unchanged), never its parent method's; an ``auto_role`` it does not
        set is :attr:`AutoRole.DEFAULT` for a logit method, else :attr:`AutoRole.NEVER`.
        """
        super().__init_subclass__(**kwargs)
        if "method" not in cls.__dict__:
            return
        for name in _METHOD_FACTS:
            if name not in cls.__dict__:
                setattr(cls, name, getattr(Calibrator, name))
        if "auto_role" not in cls.__dict__:
            cls.auto_role = AutoRole.DEFAULT if cls.fitted_on_logits() else AutoRole.NEVER
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
    def fitted_on_logits(cls) -> bool:
        """Whether the method is fitted and applied on the base's logits alone (no pass through the base, no head)."""
        return not (cls.needs_base_model or cls.needs_features)

    @classmethod
    def create(cls, num_classes: int, options: Any, facts: ModelFacts = NO_FACTS) -> "Calibrator":
        """An unfitted instance for ``options`` (an instance of ``cls.Options``); ``facts`` describe the model
        (:class:`ModelFacts`: δ's shape and space, a head's ``feature_dim``)."""
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
        bars, Ctrl-C) through :func:`.fit_context.fit_context`.
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
