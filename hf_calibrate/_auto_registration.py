"""Registering ``CalibratedModel`` with the transformers Auto classes without importing transformers up front.

``pipeline(task, model="user/calibrated-repo")`` finds the model class through transformers'
Auto classes, so ``hf_calibrate``'s model type must be registered before a user's first
pipeline. Registering needs transformers and torch (seconds to import), which ``import
hf_calibrate`` must not pay (``hf-calibrate --help``). So :func:`register_when_transformers_loads`
registers at once when transformers is already imported, and otherwise the first time it is:
a finder on ``sys.meta_path`` wraps transformers' loader so that registration runs right after
the module has executed (a mere ``importlib.util.find_spec("transformers")``, as availability
checks do, leaves the finder in place).

When it is this package's own import of a module that brings transformers in (configuration,
modeling, the evaluator, or a module importing them), registering then would import
half-initialised modules: it waits, and the last line of each such module finishes it once no
module of the package is still being imported (:func:`finish_pending`; modeling registers itself
anyway).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import warnings
from types import ModuleType
from typing import Any, Optional, Sequence

_TRANSFORMERS = "transformers"
_pending = False


def register_now() -> None:
    """Register through :func:`hf_calibrate.modeling.register_auto_classes` (imports transformers and torch)."""
    importlib.import_module(f"{__package__}.modeling").register_auto_classes()


def register_when_ready(finished: str = "") -> None:
    """Register, unless a module of this package (other than ``finished``, a module on its last line) is
    half-imported: then :func:`finish_pending` does, from the last line of the outermost one."""
    global _pending
    _pending = any(_initializing(name) for name in list(sys.modules) if name.startswith(f"{__package__}.") and name != finished)
    if not _pending:
        register_now()


def finish_pending(finished: str) -> None:
    """The last line of the module ``finished``: a registration that waited for it is done now if it can be."""
    if _pending:
        register_when_ready(finished)


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def register_when_transformers_loads() -> None:
    """Register now if transformers is imported, else right after its import (a failure there only warns)."""
    if _TRANSFORMERS in sys.modules:
        register_when_ready()
    elif not any(isinstance(finder, _AfterTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds ``transformers`` with the other finders and hands back its spec with a registering loader."""

    def __init__(self) -> None:
        self._searching = threading.local()  # set while this finder asks the others (which would ask it again)

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None) -> Any:
        if fullname != _TRANSFORMERS or getattr(self._searching, "active", False):
            return None
        self._searching.active = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.active = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader, self)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    """transformers' own loader, registering ``CalibratedModel`` once the module has executed."""

    def __init__(self, loader: Any, finder: _AfterTransformers) -> None:
        self._loader, self._finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        try:
            register_when_ready()
        except Exception as error:  # the user's transformers import must not fail because of us
            warnings.warn(
                f"hf_calibrate could not register its model type with transformers ({error}); pipelines will not load "
                "calibrated repos by name. Call hf_calibrate.register_auto_classes() to see the full error.",
                stacklevel=2,
            )

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: the wrapped loader's
        return getattr(self._loader, name)
