"""Shared parts of ``bench_fidelity.py``: the schedules both sides run, the reference copies, scoped patches, helpers.

The authors' code is imported from a local copy (``find_reference``, ``on_sys_path``) for the
duration of the import only; ``cuda_is_a_no_op`` and ``feature_width`` patch it, scoped, while it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import os
import statistics
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

import bench_quality as quality

from hf_calibrate.metrics import calibration_report

NC_DEMO = dict(gamma=1.0, delta_weight=0.01, lr=0.01, momentum=0.9, batch_size=1000, epochs=100, init_scale=0.001)
HEAD_BATCH, LATENT, VALIDATION_SHARE = 256, 128, 0.2
CURVE_EPOCHS = (1, 10, 50, 100, 200, 400, 700, 1000)


@dataclasses.dataclass
class Reference:
    """One reference repository: where its copy is and which commit it is."""

    name: str
    url: str
    path: Path
    commit: str


REFERENCES = {
    "nc": ("NCToolkit", "https://github.com/yungchentang/NCToolkit", "HF_CALIBRATE_NCTOOLKIT",
           "cdbb0a04fc0a805283081ef4781e4e8942c80d7f", "neural_clamping"),
    "heads": ("Decoupled-Layers-for-Calibrated-NNs", "https://github.com/MJordahn/Decoupled-Layers-for-Calibrated-NNs",
              "HF_CALIBRATE_TST_REFERENCE", "9578eb6e960ca8ef50a97b10260798d250fe7f3c", "src"),
}


def find_reference(part: str) -> Optional[Reference]:
    """The reference copy named by the part's environment variable, or None (with a message saying what to set)."""
    name, url, variable, pinned, package = REFERENCES[part]
    value = os.environ.get(variable)
    path = Path(value) if value else None
    if path is None or not (path / package).is_dir():
        where = f"{variable}={value!r} has no {package}/ folder" if value else f"{variable} is not set"
        print(f"skipping part {part!r}: {where}. Set {variable} to a copy of {url} (the folder holding {package}/), e.g.\n"
              f"    git clone {url} /tmp/ref && git -C /tmp/ref checkout {pinned}\n"
              f"    {variable}=/tmp/ref {variable}_COMMIT={pinned} python benchmarks/bench_fidelity.py", file=sys.stderr)
        return None
    commit = os.environ.get(f"{variable}_COMMIT") or _git_head(path) or f"unknown (set {variable}_COMMIT)"
    return Reference(name, url, path, commit)


def _git_head(path: Path) -> Optional[str]:
    """``git rev-parse HEAD`` of a checkout, or None when ``path`` is not one."""
    if not (path / ".git").exists():
        return None
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


# ----------------------------------------------------------------------------- scoped patches


@contextlib.contextmanager
def cuda_is_a_no_op() -> Iterator[None]:
    """``.cuda()`` on modules and tensors returns them unchanged inside the block (their code calls it unconditionally)."""
    saved = nn.Module.cuda, torch.Tensor.cuda
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        nn.Module.cuda, torch.Tensor.cuda = saved


@contextlib.contextmanager
def global_rng(seed: Optional[int] = None) -> Iterator[None]:
    """Restore torch's, numpy's and Python's global random state after the block (seeding them first if ``seed``)."""
    import random

    numpy_state, python_state = np.random.get_state(), random.getstate()
    cudnn = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        try:
            yield
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = cudnn


@contextlib.contextmanager
def on_sys_path(path: Path, stubs: Sequence[str] = ()) -> Iterator[None]:
    """``path`` first on ``sys.path`` and empty stub modules for ``stubs`` while importing; both removed afterwards."""
    added = [name for name in stubs if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))
        for name in added:
            sys.modules.pop(name, None)


def import_nctoolkit(reference: Reference) -> types.SimpleNamespace:
    """Their ``NCWrapper`` and ``utils`` module."""
    with on_sys_path(reference.path):
        from neural_clamping import utils
        from neural_clamping.nc_wrapper import NCWrapper
    return types.SimpleNamespace(NCWrapper=NCWrapper, utils=utils)


def import_decoupled(reference: Reference) -> types.SimpleNamespace:
    """Their TST, VTST, lightning modules and ``ClassYEncoders`` (``foolbox``, imported at module top, is stubbed)."""
    with on_sys_path(reference.path, stubs=("foolbox", "foolbox.attacks")):
        sys.modules["foolbox"].attacks = sys.modules["foolbox.attacks"]
        for attribute in ("PyTorchModel", "accuracy", "samples"):
            setattr(sys.modules["foolbox"], attribute, None)
        from src.lightning_modules.Two_Stage import TS_Module, VTST_Module
        from src.models import ClassYEncoders
        from src.models.TST import TST
        from src.models.VTST import VTST
    return types.SimpleNamespace(TST=TST, VTST=VTST, TS_Module=TS_Module, VTST_Module=VTST_Module, encoders=ClassYEncoders)


@contextlib.contextmanager
def feature_width(encoders: Any, feature_dim: int) -> Iterator[None]:
    """Their heads take 64·WIDERESNET_WIDTH_WANG2023 inputs (WRN-28-10: 640); make that our feature width."""
    if feature_dim % 64:
        raise ValueError(f"their head's input width is a multiple of 64; these features have {feature_dim}")
    saved = encoders.WIDERESNET_WIDTH_WANG2023
    encoders.WIDERESNET_WIDTH_WANG2023 = feature_dim // 64
    try:
        yield
    finally:
        encoders.WIDERESNET_WIDTH_WANG2023 = saved


# ----------------------------------------------------------------------------- shared helpers


def zoo_pool(model_name: str) -> Tuple[Any, Any]:
    """The zoo model and its calibration ∪ test rows (bench_quality's pool)."""
    from datasets import concatenate_datasets

    demo = quality._zoo(model_name)
    return demo, concatenate_datasets([demo.dataset["calibration"], demo.dataset["test"]])


def metrics_of(probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """Accuracy, ECE (15 and 10 bins), NLL of (N, C) probabilities."""
    report = calibration_report(probs.double(), labels)
    ece10 = calibration_report(probs.double(), labels, n_bins=10)["ece"]
    return {"accuracy": report["accuracy"], "ece": report["ece"], "ece10": ece10, "nll": report["nll"]}


def mean_std(values: Sequence[float], digits: int = 4) -> str:
    """``mean ± std`` (just the value for one), ``–`` for none."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence their prints, lightning's info logging and its warnings about this small CPU setup."""
    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
