"""Registering ``CalibratedModel`` with the transformers Auto classes without importing transformers up front.

``pipeline(task, model="user/calibrated-repo")`` finds the model class through transformers'
Auto classes, so ``hf_calibrate``'s model type must be registered before a user's first
pipeline. Registering needs transformers and torch (seconds to import), which ``import
hf_calibrate`` must not pay (``hf-calibrate --help``). So :func:`register_when_transformers_loads`
registers at once when transformers is already imported, and otherwise the first time it is:
a one-shot finder on ``sys.meta_path`` wraps transformers' loader so that registration runs
right after the module has executed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Optional, Sequence

_TRANSFORMERS = "transformers"


def register_now() -> None:
    """Register through :func:`hf_calibrate.modeling.register_auto_classes` (imports transformers and torch)."""
    importlib.import_module(f"{__package__}.modeling").register_auto_classes()


def register_when_transformers_loads() -> None:
    """Register now if transformers is imported, else right after its import (once; a failure there only warns)."""
    if _TRANSFORMERS in sys.modules:
        register_now()
    elif not any(isinstance(finder, _AfterTransformers) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformers())


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds ``transformers`` with the other finders and hands back its spec with a registering loader."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None) -> Any:
        if fullname != _TRANSFORMERS:
            return None
        sys.meta_path.remove(self)  # one shot, and the search below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    """transformers' own loader, registering ``CalibratedModel`` once the module has executed."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            register_now()
        except Exception as error:  # the user's transformers import must not fail because of us
            warnings.warn(
                f"hf_calibrate could not register its model type with transformers ({error}); pipelines will not load "
                "calibrated repos by name. Call hf_calibrate.register_auto_classes() to see the full error.",
                stacklevel=2,
            )

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: the wrapped loader's
        return getattr(self._loader, name)
