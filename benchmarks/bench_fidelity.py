"""Fidelity of our Neural Clamping, TST and V-TST against the authors' own code (issue 14).

Both implementations run in one process on the same frozen zoo model (``hf_calibrate.demo``),
the same tensors and the same hyper-parameters; differences and their causes are itemised in
``docs/fidelity-review.md`` (N1–N6, V1–V8). The authors' code is called at run time from a
local copy — nothing of it is copied here, and nothing is fetched:

* ``HF_CALIBRATE_NCTOOLKIT``: a copy of https://github.com/yungchentang/NCToolkit (the folder
  holding the ``neural_clamping`` package), ``HF_CALIBRATE_NCTOOLKIT_COMMIT`` its commit;
* ``HF_CALIBRATE_TST_REFERENCE``: a copy of
  https://github.com/MJordahn/Decoupled-Layers-for-Calibrated-NNs (the folder holding ``src``),
  ``HF_CALIBRATE_TST_REFERENCE_COMMIT`` its commit.

A git checkout needs no ``*_COMMIT`` (``git rev-parse HEAD`` is read). A part whose copy is
missing prints what to set and is skipped.

Part A (``nc``): Neural Clamping, ours (``CalibratedModel.fit``, ``holdout_fraction=0``,
``delta_init="random"``) vs ``NCWrapper.train_NC`` on the digits CNN and ViT, per seed on the
calibration half of ``bench_quality``'s stratified halves; the authors' demo hyper-parameters
(focal γ = 1, λ = 0.01, SGD lr 0.01 momentum 0.9, batch 1000, T starting at 1). Both start from
the same δ₀ (ours, N(0, 0.001²)) and see the same batches: their ``DataLoader`` replays our
engine's seeded batches epoch by epoch. Only their ``.cuda()`` calls are patched (scoped).
Plus: their ``FocalLoss`` and ``ECE`` against ours on random logits, and an augmentation arm
(their CIFAR-100 recipe vs ours' ``augment=True``) on the CNN.

Part B (``heads``): TST / V-TST, ours vs their ``TST``/``VTST(bound_qzx_var=True)`` trained by
``lightning`` with their ``TS_Module``/``VTST_Module`` and ``ModelCheckpoint(monitor=
"valid_loss_epoch")``, on cached penultimate features of the digits CNN, ViT and MiniLM: the
calibration half split 80/20 (stratified, per seed) into train/validation for both, batch 256,
Adam 1e-4, Z = 128, the epochs of ours' default schedule for that size. Test-time V-TST with
M = 1 and M = 10 samples for both. Plus ours in the "paper protocol": the head trained on the
base's own training rows, validated on the calibration half.

Usage::

    HF_CALIBRATE_NCTOOLKIT=... HF_CALIBRATE_TST_REFERENCE=... python benchmarks/bench_fidelity.py
    python benchmarks/bench_fidelity.py --parts heads --seeds 1 --models digits_cnn
    python benchmarks/bench_fidelity.py --quick      # the CNN, 1 seed, tiny schedules; prints only
    python benchmarks/bench_fidelity.py --raw /tmp/fidelity.json     # also keep every number and per-epoch curve
    python benchmarks/bench_fidelity.py --render /tmp/fidelity.json  # rebuild the report from that file
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import _report
import bench_quality as quality

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.calibrators import heads as head_calibrators
from hf_calibrate.calibrators.heads import HeadOptions
from hf_calibrate.calibrators.neural_clamping import NeuralClamping, focal_loss
from hf_calibrate.fitting.engine import Engine, EngineOptions
from hf_calibrate.metrics import calibration_report

NAME = "fidelity"
NC_MODELS = ("digits_cnn", "digits_vit")
HEAD_MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
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


# ----------------------------------------------------------------------------- Part A: Neural Clamping


class LogitsOf(nn.Module):
    """A tensor → logits module for their wrapper: the timm model itself, or ``model(pixel_values=x).logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.transformers = hasattr(model, "config") and getattr(model, "main_input_name", None) == "pixel_values"

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels).logits if self.transformers else self.model(pixels)


def pixel_tensors(demo: Any, dataset: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """Our preprocessing's normalised ``pixel_values`` (N, 3, H, W) and labels of ``dataset``."""
    backbone = adapt(demo.model)
    pixels, labels = [], []
    for inputs, batch_labels in quality._batches(demo, backbone, dataset):
        pixels.append(inputs[backbone.input_key].float())
        labels.append(batch_labels)
    return torch.cat(pixels), torch.cat(labels)


def has_temperature_init() -> bool:
    """Whether ``NeuralClamping.Options`` has ``temperature_init`` yet (else ours starts at the TS optimum)."""
    return "temperature_init" in {field.name for field in dataclasses.fields(NeuralClamping.Options)}


class ReplayedBatches:
    """A ``batch_sampler`` giving their DataLoader our engine's seeded batches: epoch e on the e-th pass."""

    def __init__(self, seed: int, count: int, batch_size: int) -> None:
        self.engine = Engine(EngineOptions(seed=seed, batch_size=batch_size, progress=False))
        self.count, self.epoch = count, 0

    def __len__(self) -> int:
        return math.ceil(self.count / self.engine.options.batch_size)

    def __iter__(self) -> Iterator[List[int]]:
        self.epoch += 1
        return iter([batch.tolist() for batch in self.engine.global_batches(torch.arange(self.count), shuffle=True, epoch=self.epoch)])

    def initial_delta(self, shape: Sequence[int], scale: float) -> torch.Tensor:
        """Ours' ``delta_init="random"`` δ₀ (the same engine generator the fit draws it from)."""
        return torch.randn(tuple(shape), generator=self.engine.generator(0x5EED)) * scale


class TheirAugmentation(Dataset):
    """Their CIFAR-100 training recipe on our tensors: de-normalised to [0, 1], RandomCrop(H, padding=H/8) (black
    padding, as on their PIL images), RandomHorizontalFlip, Normalize, their Cutout(1, H/8)."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float], cutout: Any) -> None:
        from torchvision import transforms

        size = pixels.shape[-1]
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
        self.pixels, self.labels = pixels, labels
        self.transform = transforms.Compose([
            transforms.RandomCrop(size, padding=size // 8), transforms.RandomHorizontalFlip(),
            transforms.Normalize(mean, std), cutout(n_holes=1, length=size // 8),
        ])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.pixels[index] * self.std + self.mean), self.labels[index]


def image_mean_std(demo: Any) -> Tuple[List[float], List[float]]:
    """The normalisation of the model's preprocessing (timm data config or transformers image processor)."""
    if isinstance(demo.preprocessor, dict):
        return list(demo.preprocessor["mean"]), list(demo.preprocessor["std"])
    return list(demo.preprocessor.image_mean), list(demo.preprocessor.image_std)


def num_classes(model: nn.Module) -> int:
    """C: the outputs of the model's classifier layer."""
    return int(adapt(model).final_layer().out_features)


def fit_ours_nc(demo: Any, pixels: torch.Tensor, labels: torch.Tensor, seed: int, epochs: int, augment: bool) -> Dict[str, Any]:
    """Our NC fit in reference mode; returns δ, T (start and end), the per-epoch loss and T, seconds and the model."""
    options: Dict[str, Any] = dict(
        epochs=epochs, batch_size=NC_DEMO["batch_size"], lr=NC_DEMO["lr"], momentum=NC_DEMO["momentum"], gamma=NC_DEMO["gamma"],
        delta_weight=NC_DEMO["delta_weight"], delta_init="random", delta_init_scale=NC_DEMO["init_scale"], holdout_fraction=0.0,
        augment=augment,
    )
    if has_temperature_init():
        options["temperature_init"] = 1.0
    started = time.perf_counter()
    calibrated = CalibratedModel.fit(demo.model, TensorDataset(pixels, labels), method="neural_clamping", seed=seed, progress=False, **options)
    seconds = time.perf_counter() - started
    summary = calibrated.fit_summary
    return {
        "delta": calibrated.calibrator.delta.detach().clone(), "temperature": float(calibrated.calibrator.temperature),
        "temperature_start": 1.0 if has_temperature_init() else summary["temperature_scaling"]["temperature"],
        "loss": [record["loss"] for record in summary["history"]], "temperatures": [record["temperature"] for record in summary["history"]],
        "seconds": seconds, "model": calibrated,
    }


def fit_theirs_nc(nct: Any, demo: Any, pixels: torch.Tensor, labels: torch.Tensor, seed: int, epochs: int, augment: bool) -> Dict[str, Any]:
    """``NCWrapper.train_NC`` with the demo's settings, our δ₀ and our batches; returns what ``fit_ours_nc`` does."""
    batches = ReplayedBatches(seed, len(labels), NC_DEMO["batch_size"])
    dataset = TheirAugmentation(pixels, labels, *image_mean_std(demo), cutout=nct.utils.Cutout) if augment else TensorDataset(pixels, labels)
    model = LogitsOf(demo.model).eval()
    flags = [parameter.requires_grad for parameter in model.parameters()]
    model.requires_grad_(False)  # as ours: no parameter gradients (theirs computes and discards them; same results)
    started = time.perf_counter()
    try:
        with global_rng(), cuda_is_a_no_op(), quiet():
            nct.utils.seed(seed)  # their RNG: augmentation (δ₀ and the batch order are ours, set below)
            wrapper = nct.NCWrapper(model, num_classes=num_classes(demo.model), lambda_0=1, lambda_1=NC_DEMO["delta_weight"],
                                    image_size=tuple(pixels.shape[1:]), init_scale=NC_DEMO["init_scale"], init_temp=1.0)
            with torch.no_grad():
                wrapper.perturbation.copy_(batches.initial_delta(pixels.shape[1:], NC_DEMO["init_scale"]))
            result = wrapper.train_NC(DataLoader(dataset, batch_sampler=batches), epoch=epochs, lr=NC_DEMO["lr"],
                                      momentum=NC_DEMO["momentum"], focal_loss=True, gamma=NC_DEMO["gamma"])
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
    return {
        "delta": wrapper.perturbation.detach().clone(), "temperature": float(wrapper.temperature.detach()), "temperature_start": 1.0,
        "loss": [float(v) for v in result["loss"]], "temperatures": [float(v) for v in result["temp"]],
        "seconds": time.perf_counter() - started,
    }


def nc_test_probs(model: nn.Module, pixels: torch.Tensor, delta: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(f(x + δ) / T) over the test tensors, in float64: how both fits are scored."""
    forward = LogitsOf(model).eval()
    with torch.no_grad():
        logits = torch.cat([forward(pixels[start : start + 256] + delta) for start in range(0, len(pixels), 256)])
    return torch.softmax(logits.double() / temperature, dim=1)


def transfer_gap(calibrated: CalibratedModel, model: nn.Module, pixels: torch.Tensor, fit: Dict[str, Any]) -> float:
    """Max |probability| difference between our CalibratedModel and f(x + δ)/T computed here (checks the scoring path)."""
    with torch.no_grad():
        output = calibrated(pixels)
    direct = nc_test_probs(model, pixels, fit["delta"], fit["temperature"])
    return float((torch.softmax(getattr(output, "logits", output).double(), 1) - direct).abs().max())


def compare_nc(nct: Any, ours: Dict[str, Any], theirs: Dict[str, Any], demo: Any, test: Tuple[torch.Tensor, torch.Tensor]) -> Dict[str, Any]:
    """δ agreement, T, losses and test metrics of one seed's pair of fits (both scored the same way)."""
    pixels, labels = test
    a, b = ours["delta"].flatten().double(), theirs["delta"].flatten().double()
    row: Dict[str, Any] = {
        "delta_cosine": float(a @ b / (a.norm() * b.norm())), "delta_relative": float((a - b).norm() / b.norm()),
        "loss_max_gap": max(abs(x - y) for x, y in zip(ours["loss"], theirs["loss"])),
        "temperature_max_gap": max(abs(x - y) for x, y in zip(ours["temperatures"], theirs["temperatures"])),
        "transfer_gap": transfer_gap(ours["model"], demo.model, pixels[:64], ours),
        "curves": {side: {"loss": fit["loss"], "temperature": fit["temperatures"]} for side, fit in (("ours", ours), ("theirs", theirs))},
    }
    for side, fit in (("ours", ours), ("theirs", theirs)):
        probs = nc_test_probs(demo.model, pixels, fit["delta"], fit["temperature"])
        row[side] = {
            **metrics_of(probs, labels), "delta_norm": float(fit["delta"].norm()), "temperature": fit["temperature"],
            "temperature_start": fit["temperature_start"], "loss_first": fit["loss"][0], "loss_last": fit["loss"][-1],
            "seconds": fit["seconds"],
            "their_ece_metric_gap": abs(calibration_report(probs, labels)["ece"] - float(nct.utils.ECE(15)(probs.log().float(), labels))),
        }
    return row


def parity_checks(nct: Any, seed: int = 0) -> Dict[str, float]:
    """Their FocalLoss(γ=1) and ECE(15) vs ours on random logits, a quarter of them very confident."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.tensor([1.0, 4.0, 12.0, 40.0]).repeat_interleave(1000)[:, None]
    logits = torch.randn(4000, 10, generator=generator) * scales
    labels = torch.randint(0, 10, (4000,), generator=generator)
    p_true = torch.softmax(logits.double(), 1).gather(1, labels[:, None]).squeeze(1)
    inside = (p_true > 1e-7) & (p_true < 1 - 1e-7)
    theirs = nct.utils.FocalLoss(class_num=10, gamma=1)
    rows_gap = (focal_loss(logits, labels, 1.0, reduction="none") - torch.stack([theirs(logits[i : i + 1], labels[i : i + 1]) for i in range(4000)]))
    our_ece = calibration_report(torch.softmax(logits.double(), 1), labels)["ece"]
    return {
        "focal_mean_gap": abs(float(theirs(logits[inside], labels[inside])) - float(focal_loss(logits[inside], labels[inside], 1.0))),
        "focal_rows_gap_inside": float(rows_gap[inside].abs().max()),
        "focal_rows_gap_outside": float(rows_gap[~inside].abs().max()) if bool((~inside).any()) else 0.0,
        "rows_outside": int((~inside).sum()), "ece_gap": abs(float(nct.utils.ECE(15)(logits, labels)) - our_ece), "ece": our_ece,
    }


def run_nc(nct: Any, models: Sequence[str], seeds: Sequence[int], epochs: int) -> Dict[str, Any]:
    """Part A: per model and seed, ours vs theirs on the calibration half; the augmentation arm on the CNN (first seed)."""
    results: Dict[str, Any] = {"parity": parity_checks(nct), "epochs": epochs, "temperature_init": has_temperature_init(), "models": {}}
    for model_name in models:
        demo, pool = zoo_pool(model_name)
        pixels, labels = pixel_tensors(demo, pool)
        results["models"][model_name] = {"rows": len(pool), "runs": []}
        arms = [(seed, False) for seed in seeds] + ([(seeds[0], True)] if model_name == "digits_cnn" else [])
        for seed, augment in arms:
            calibration, test = (torch.as_tensor(rows) for rows in quality._stratified_halves(labels, seed))
            fit_data = (pixels[calibration], labels[calibration])
            ours = fit_ours_nc(demo, *fit_data, seed, epochs, augment)
            theirs = fit_theirs_nc(nct, demo, *fit_data, seed, epochs, augment)
            row = compare_nc(nct, ours, theirs, demo, (pixels[test], labels[test]))
            row.update(seed=seed, calibration_rows=len(calibration), test_rows=len(test))
            results["models"][model_name]["augment" if augment else "runs"] = row if augment else results["models"][model_name]["runs"] + [row]
            print(f"nc {model_name} seed {seed}{' augment' if augment else ''}: cosine {row['delta_cosine']:.4f}, T {ours['temperature']:.4f} / "
                  f"{theirs['temperature']:.4f}, {ours['seconds']:.0f} s / {theirs['seconds']:.0f} s", file=sys.stderr, flush=True)
    return results


# ----------------------------------------------------------------------------- Part B: TST / V-TST


def base_training_rows(demo: Any) -> Any:
    """The rows the base model was trained on (its ``train`` split, cut to ``train_examples`` as the zoo does)."""
    from hf_calibrate.demo.data import stratified_subset

    hparams, train = demo.recipe["hparams"], demo.dataset["train"]
    if hparams.get("train_examples") is None:
        return train
    return train.select(stratified_subset(train["label"], hparams["train_examples"], hparams["seed"]))


def validation_split(labels: torch.Tensor, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stratified 80/20 (train, validation) positions within the calibration half, the same for both implementations."""
    from sklearn.model_selection import train_test_split

    positions = np.arange(len(labels))
    train, validation = train_test_split(positions, test_size=VALIDATION_SHARE, stratify=labels.numpy(), random_state=seed)
    return torch.as_tensor(np.sort(train)), torch.as_tensor(np.sort(validation))


def fit_ours_head(head_layer: nn.Module, method: str, train: Tuple[torch.Tensor, ...], validation: Tuple[torch.Tensor, ...],
                  seed: int, epochs: Optional[int], samples: int = 10) -> Dict[str, Any]:
    """Our TST / V-TST through ``CalibratedModel.fit`` (epochs None: ours' default schedule)."""
    options: Dict[str, Any] = dict(latent_dim=LATENT, head_batch_size=HEAD_BATCH, epochs=epochs)
    if method == "vtst":
        options["samples"] = samples
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "still improving": reported from the summary instead
        calibrated = CalibratedModel.fit(head_layer, TensorDataset(*train), method=method, validation_data=TensorDataset(*validation),
                                         seed=seed, progress=False, **options)
    summary = calibrated.fit_summary
    return {
        "model": calibrated, "best_epoch": summary["best_epoch"], "epochs_run": summary["epochs_run"], "seconds": time.perf_counter() - started,
        "best_value": summary["best_validation_nll"], "curve": [record["nll"] for record in summary["history"]],
    }


def epoch_curve_callback(model: nn.Module, validation: Tuple[torch.Tensor, torch.Tensor], vtst: bool) -> Any:
    """A lightning callback recording, after each validation, their ``valid_loss_epoch`` and (V-TST) the predictive
    NLL of 10 fresh samples per input on the validation rows (under a forked RNG: their training draws are untouched)."""
    from lightning.pytorch.callbacks import Callback

    class EpochCurve(Callback):
        """The per-epoch validation values (the sanity check before training is skipped)."""

        def __init__(self) -> None:
            self.loss: List[float] = []
            self.predictive_nll: List[float] = []

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            """Record this epoch's ``valid_loss_epoch`` (and V-TST's predictive NLL)."""
            if trainer.sanity_checking:
                return
            self.loss.append(float(trainer.callback_metrics["valid_loss_epoch"]))
            if vtst:
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    probs = model.forward_multisample(validation[0], num_samples=10)
                self.predictive_nll.append(float(-probs.double().gather(1, validation[1][:, None]).log().mean()))

    return EpochCurve()


def fit_theirs_head(dec: Any, method: str, train: Tuple[torch.Tensor, ...], validation: Tuple[torch.Tensor, ...], seed: int,
                    epochs: int, classes: int) -> Dict[str, Any]:
    """Their TST / VTST(bound_qzx_var=True) with their lightning module, Trainer and ModelCheckpoint; best weights reloaded."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    vtst = method == "vtst"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, global_rng(), quiet():
        pl.seed_everything(seed, workers=True, verbose=False)
        with feature_width(dec.encoders, train[0].shape[1]):
            model = (dec.VTST(dataset="x", latent_dim=LATENT, num_classes=classes, separate_body=False, bound_qzx_var=True) if vtst
                     else dec.TST(dataset="x", latent_dim=LATENT, num_classes=classes, separate_body=False))
        module = (dec.VTST_Module if vtst else dec.TS_Module)(model, classes, device="cpu")
        checkpoint = ModelCheckpoint(dirpath=folder, monitor="valid_loss_epoch", mode="min", save_top_k=1)
        curve = epoch_curve_callback(model, validation, vtst)
        trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, callbacks=[checkpoint, curve],
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, DataLoader(TensorDataset(*train), batch_size=HEAD_BATCH), DataLoader(TensorDataset(*validation), batch_size=HEAD_BATCH))
        saved = torch.load(checkpoint.best_model_path, weights_only=False)
    model.load_state_dict({key[len("model."):]: value for key, value in saved["state_dict"].items() if key.startswith("model.")})
    model.eval()
    return {
        "model": model, "best_epoch": int(saved["epoch"]) + 1, "epochs_run": len(curve.loss), "best_value": float(checkpoint.best_model_score),
        "curve": curve.loss, "predictive_curve": curve.predictive_nll, "seconds": time.perf_counter() - started,
    }


def ours_head_probs(fit: Dict[str, Any], features: torch.Tensor) -> torch.Tensor:
    """Our calibrated head's predictive probabilities (V-TST: mean softmax over its stored noise, shared by all inputs)."""
    with torch.no_grad():
        return torch.softmax(fit["model"](features).double(), dim=1)


def theirs_head_probs(fit: Dict[str, Any], features: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    """Their prediction as ``01_eval_models.py`` makes it: softmax(model(x)) for M = 1, ``forward_multisample`` for M > 1
    (fresh noise per input, drawn after seeding with ``seed``)."""
    model = fit["model"]
    with torch.no_grad(), global_rng(seed):
        model.return_z = False
        probs = torch.softmax(model(features), dim=1) if samples == 1 else model.forward_multisample(features, num_samples=samples)
    return probs.double()


def head_row(fit: Dict[str, Any], probs: torch.Tensor, labels: torch.Tensor) -> Dict[str, Any]:
    """One table row: selection facts, test metrics and the curve."""
    return {**metrics_of(probs, labels), **{key: fit[key] for key in ("best_epoch", "epochs_run", "best_value", "seconds", "curve")},
            "predictive_curve": fit.get("predictive_curve", [])}


def head_seed(dec: Any, sets: Dict[str, Any], seed: int, epochs_override: Optional[int]) -> Dict[str, Dict[str, Any]]:
    """Every head row of one seed: TST and V-TST, ours and theirs, and ours in the paper protocol."""
    features, labels = sets["features"], sets["labels"]
    calibration, test = (torch.as_tensor(rows) for rows in quality._stratified_halves(labels, seed))
    train_pos, val_pos = validation_split(labels[calibration], seed)
    train, validation = (features[calibration[train_pos]], labels[calibration[train_pos]]), (features[calibration[val_pos]], labels[calibration[val_pos]])
    test_data = (features[test], labels[test])
    epochs = epochs_override or HeadOptions(head_batch_size=HEAD_BATCH).epochs_for(len(train_pos))
    rows: Dict[str, Dict[str, Any]] = {"uncalibrated": metrics_of(torch.softmax(sets["logits"][test].double(), 1), labels[test])}
    for method in ("tst", "vtst"):
        ours = fit_ours_head(sets["head_layer"], method, train, validation, seed, epochs)
        theirs = fit_theirs_head(dec, method, train, validation, seed, epochs, sets["classes"])
        paper = fit_ours_head(sets["head_layer"], method, sets["base_train"], (features[calibration], labels[calibration]), seed, epochs_override)
        name = method.upper().replace("V", "V-")
        suffix = " M=10" if method == "vtst" else ""
        rows[f"{name} ours{suffix}"] = head_row(ours, ours_head_probs(ours, test_data[0]), test_data[1])
        rows[f"{name} theirs{suffix}"] = head_row(theirs, theirs_head_probs(theirs, test_data[0], 10 if method == "vtst" else 1, seed), test_data[1])
        if method == "vtst":
            ours_one = fit_ours_head(sets["head_layer"], method, train, validation, seed, epochs, samples=1)
            rows[f"{name} ours M=1"] = head_row(ours_one, ours_head_probs(ours_one, test_data[0]), test_data[1])
            rows[f"{name} theirs M=1"] = head_row(theirs, theirs_head_probs(theirs, test_data[0], 1, seed), test_data[1])
        rows[f"{name} ours, paper protocol{suffix}"] = head_row(paper, ours_head_probs(paper, test_data[0]), test_data[1])
    for row in rows.values():
        row.setdefault("epochs_scheduled", epochs)
    return rows


def head_sets(model_name: str) -> Dict[str, Any]:
    """Cached penultimate features, logits and labels of the pool, the base's training rows' features, the head layer."""
    demo, pool = zoo_pool(model_name)
    features, logits, labels = quality._features_and_logits(demo, pool)
    train_features, _, train_labels = quality._features_and_logits(demo, base_training_rows(demo))
    return {
        "demo": demo, "features": features, "logits": logits, "labels": labels, "base_train": (train_features, train_labels),
        "head_layer": copy.deepcopy(adapt(demo.model).final_layer()).requires_grad_(False), "classes": num_classes(demo.model),
    }


def run_heads(dec: Any, models: Sequence[str], seeds: Sequence[int], epochs_override: Optional[int]) -> Dict[str, Any]:
    """Part B: per model and seed, every head row."""
    shared = getattr(head_calibrators.VariationalTwoStageHead(2, 64), "shared_hidden", True)  # no attribute: before V1
    results: Dict[str, Any] = {"min_default_steps": head_calibrators.MIN_DEFAULT_STEPS, "vtst_shared_hidden": shared, "models": {}}
    for model_name in models:
        sets = head_sets(model_name)
        runs = []
        for seed in seeds:
            started = time.perf_counter()
            runs.append(head_seed(dec, sets, seed, epochs_override))
            print(f"heads {model_name} seed {seed}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        results["models"][model_name] = {"rows": len(sets["labels"]), "feature_dim": int(sets["features"].shape[1]),
                                         "base_train_rows": len(sets["base_train"][1]), "runs": runs}
    return results


# ----------------------------------------------------------------------------- report

NC_QUANTITIES = (
    ("temperature_start", "T at the start"), ("temperature", "T at the end"), ("delta_norm", "‖δ‖₂ at the end"),
    ("loss_first", "training loss, epoch 1"), ("loss_last", "training loss, last epoch"), ("accuracy", "test accuracy"),
    ("ece", "test ECE (15 bins)"), ("ece10", "test ECE (10 bins)"), ("nll", "test NLL"), ("seconds", "fit seconds"),
)
NC_AGREEMENT = (
    ("delta_cosine", "cosine(δ_ours, δ_theirs)"), ("delta_relative", "‖δ_ours − δ_theirs‖ / ‖δ_theirs‖"),
    ("loss_max_gap", "max over epochs of |loss_ours − loss_theirs|"), ("temperature_max_gap", "max over epochs of |T_ours − T_theirs|"),
    ("transfer_gap", "our CalibratedModel vs f(x + δ)/T computed here: max |Δp| (64 test rows)"),
)
HEAD_COLUMNS = (("accuracy", "acc"), ("ece", "ECE 15"), ("ece10", "ECE 10"), ("nll", "NLL"))


def nc_model_lines(model_name: str, entry: Dict[str, Any]) -> List[str]:
    """Part A tables of one model: ours vs theirs (mean ± std over seeds), agreement, and the augmentation arm."""
    runs = entry["runs"]
    lines = [f"### {model_name}: {entry['rows']} rows, calibration halves of {runs[0]['calibration_rows']} and test halves of "
             f"{runs[0]['test_rows']} rows, {len(runs)} seed(s)", ""]
    lines += _report.table(["quantity", "ours", "theirs"], [
        [title, mean_std([r["ours"][key] for r in runs]), mean_std([r["theirs"][key] for r in runs])] for key, title in NC_QUANTITIES])
    lines += [""] + _report.table(["agreement", "mean ± std over seeds"], [[title, mean_std([r[key] for r in runs], 6)] for key, title in NC_AGREEMENT])
    augment = entry.get("augment")
    if augment:
        lines += ["", f"Augmentation arm (seed {augment['seed']}; theirs: their CIFAR-100 recipe on our de-normalised tensors, "
                  "black padding; ours: `augment=True`, padding 0 in normalised space; the random draws differ):", ""]
        rows = [[title, f"{augment['ours'][key]:.4f}", f"{augment['theirs'][key]:.4f}"] for key, title in NC_QUANTITIES]
        rows += [[title, f"{augment[key]:.6f}", ""] for key, title in NC_AGREEMENT[:4]]
        lines += _report.table(["quantity", "ours", "theirs"], rows)
    return lines + [""]


def nc_lines(results: Dict[str, Any]) -> List[str]:
    """Part A section."""
    parity, epochs = results["parity"], results["epochs"]
    start = ("T starts at 1 for both (`temperature_init=1.0`)" if results["temperature_init"] else
             "**`NeuralClamping.Options` has no `temperature_init` yet: ours starts at the TS optimum of the calibration half** "
             "(theirs at 1)")
    lines = [
        "## Part A — Neural Clamping vs `NCWrapper.train_NC`", "",
        f"Schedule: {epochs} epochs × 1 step (batch {NC_DEMO['batch_size']} ≥ the calibration half, so each step sees every row), "
        f"focal γ = {NC_DEMO['gamma']:g}, λ = {NC_DEMO['delta_weight']:g}, SGD lr {NC_DEMO['lr']:g} momentum {NC_DEMO['momentum']:g}. "
        f"Ours: `holdout_fraction=0`, `delta_init=\"random\"` (N(0, {NC_DEMO['init_scale']:g}²)); {start}. Theirs: their δ₀ is "
        "overwritten with ours and their DataLoader replays our engine's batches, so both see the same data in the same order. "
        f"Ours optimises log T, theirs T (N2). Both scored with `calibration_report` on softmax(f(x + δ)/T) over the test half.", "",
        f"Metric parity on 4,000 random logit rows (10 classes; {parity['rows_outside']} rows with p_y outside [1e-7, 1 − 1e-7]): "
        f"their `FocalLoss(gamma=1)` vs our `focal_loss`: mean over the rows inside their clamp |Δ| {parity['focal_mean_gap']:.2e}, "
        f"per row max |Δ| {parity['focal_rows_gap_inside']:.2e} inside it and {parity['focal_rows_gap_outside']:.2e} outside it "
        "(N5: theirs caps −log p_y at −log 1e-7 ≈ 16.1, ours is exact); their "
        f"`ECE(15)` vs ours: |Δ| {parity['ece_gap']:.2e} (ECE {parity['ece']:.4f}). On every test result below their `ECE(15)` "
        f"and ours differ by at most {max_their_ece_gap(results):.2e}.", "",
    ]
    for model_name, entry in results["models"].items():
        lines += nc_model_lines(model_name, entry)
    return lines


def max_their_ece_gap(results: Dict[str, Any]) -> float:
    """The largest |our ECE − their ECE| over every scored test result of Part A."""
    rows = [row for entry in results["models"].values() for row in entry["runs"] + ([entry["augment"]] if entry.get("augment") else [])]
    return max((row[side]["their_ece_metric_gap"] for row in rows for side in ("ours", "theirs")), default=float("nan"))


def head_model_lines(model_name: str, entry: Dict[str, Any]) -> List[str]:
    """Part B tables of one model: every row (mean ± std over seeds) and the validation curves."""
    runs = entry["runs"]
    names = list(runs[0])
    epochs = runs[0]["TST ours"]["epochs_scheduled"]
    lines = [f"### {model_name}: d = {entry['feature_dim']}, {entry['rows']} rows; {epochs} epochs for both; paper protocol: "
             f"{entry['base_train_rows']} base training rows", ""]
    header = ["row", "selected epoch / run", "best validation criterion"] + [title for _, title in HEAD_COLUMNS] + ["fit s"]
    table = []
    for name in names:
        cells = [mean_std([r[name][key] for r in runs]) for key, _ in HEAD_COLUMNS]
        if name == "uncalibrated":
            table.append([name, "–", "–", *cells, "–"])
            continue
        selected = f"{mean_std([r[name]['best_epoch'] for r in runs], 0)} / {mean_std([r[name]['epochs_run'] for r in runs], 0)}"
        table.append([name, selected, mean_std([r[name]["best_value"] for r in runs]), *cells, mean_std([r[name]["seconds"] for r in runs], 1)])
    lines += _report.table(header, table)
    return lines + [""] + curve_lines(runs, epochs) + [""]


def curve_lines(runs: List[Dict[str, Any]], epochs: int) -> List[str]:
    """Mean validation criterion over seeds at a few epochs, and where its minimum lies."""
    marks = [e for e in CURVE_EPOCHS if e <= epochs] + ([epochs] if epochs not in CURVE_EPOCHS else [])
    series = [("TST ours: predictive NLL", "TST ours", "curve"), ("TST theirs: CE", "TST theirs", "curve"),
              ("V-TST ours M=10: predictive NLL (stored noise)", "V-TST ours M=10", "curve"),
              ("V-TST theirs: CE of one sample + KL/Z", "V-TST theirs M=10", "curve"),
              ("V-TST theirs: predictive NLL, 10 fresh samples", "V-TST theirs M=10", "predictive_curve")]
    table = []
    for title, name, key in series:
        curves = [r[name][key] for r in runs if r[name][key]]
        if not curves:
            continue
        mean = np.mean(np.array([c[: min(map(len, curves))] for c in curves]), axis=0)
        table.append([title] + [f"{mean[e - 1]:.4f}" if e <= len(mean) else "–" for e in marks] + [f"{int(np.argmin(mean)) + 1}"])
    return ["Validation curves (mean over seeds) at epoch:", ""] + _report.table(["criterion"] + [str(e) for e in marks] + ["argmin"], table)


def heads_lines(results: Dict[str, Any]) -> List[str]:
    """Part B section."""
    lines = [
        "## Part B — TST / V-TST vs the official `TST` / `VTST` with `TS_Module` / `VTST_Module`", "",
        f"Cached penultimate features; per seed the calibration half is split 80/20 (stratified) into train / validation, the "
        f"same rows for both; Z = {LATENT}, batch {HEAD_BATCH}, Adam 1e-4, the epochs of ours' default schedule for the train "
        f"size for both (`HeadOptions.epochs_for` in this run: the paper's 40 epochs or at least {results['min_default_steps']:,} "
        "Adam steps, whichever is more). Theirs: `lightning.pytorch.Trainer` with `ModelCheckpoint(monitor="
        "\"valid_loss_epoch\")`, unshuffled train loader (V8), best checkpoint reloaded. Ours: `CalibratedModel.fit(..., "
        "validation_data=...)`, selecting on the validation predictive NLL (V2). \"Selected epoch\" is 1-based. \"Best "
        "validation criterion\": ours the predictive NLL, theirs `valid_loss_epoch` (TST: CE; V-TST: CE of one sample + KL/Z), "
        "so the two are not comparable for V-TST. V-TST M = 1 / 10: theirs draws fresh noise per input "
        "(`forward_multisample` for M = 10); ours stores M noise vectors at fit time (`samples=M`, a separate fit for each M, "
        "so the selected epochs can differ) and shares them across inputs (V5). Paper protocol: ours only, the head trained on "
        "the base's own training rows and validated on the whole calibration half (V6), ours' default epochs for that size. "
        "Base features are cached (eval mode), so their frozen-body batch-norm drift (review §2.1) does not enter.", "",
    ]
    for model_name, entry in results["models"].items():
        lines += head_model_lines(model_name, entry)
    return lines


def avg(runs: Sequence[Dict[str, Any]], *keys: str) -> float:
    """Mean over seeds of ``run[keys[0]][keys[1]]...``."""
    values = []
    for run in runs:
        for key in keys:
            run = run[key]
        values.append(run)
    return statistics.fmean(values)


def nc_differences(nc: Dict[str, Any], heads: Optional[Dict[str, Any]]) -> List[str]:
    """Part A items, with the measured means."""
    measured = []
    for name, entry in nc["models"].items():
        runs = entry["runs"]
        text = (f"{name}: T {avg(runs, 'ours', 'temperature'):.4f} (ours) vs {avg(runs, 'theirs', 'temperature'):.4f} (theirs), "
                f"δ cosine {avg(runs, 'delta_cosine'):.6f}, relative δ difference {avg(runs, 'delta_relative'):.4f}, test ECE "
                f"{avg(runs, 'ours', 'ece'):.4f} vs {avg(runs, 'theirs', 'ece'):.4f}, NLL {avg(runs, 'ours', 'nll'):.4f} vs "
                f"{avg(runs, 'theirs', 'nll'):.4f}")
        if heads is not None and name in heads["models"]:
            base = heads["models"][name]["runs"]
            text += f" (uncalibrated on the same test halves: ECE {avg(base, 'uncalibrated', 'ece'):.4f}, NLL {avg(base, 'uncalibrated', 'nll'):.4f})"
        measured.append(text)
    items = [
        "**N2 (log T vs T) is the one difference left in Part A.** Same δ₀, same batches, same loss up to N5; theirs steps on "
        "T, ours on log T, and with the same gradient ours' step in T is T² times theirs' (∂L/∂log T = T·∂L/∂T): ours moves T "
        "less than theirs while T < 1 and more once T > 1, and δ follows (its gradient carries 1/T). Measured: "
        + "; ".join(measured) + ". Wherever T stays near 1 the two fits are the same fit; where T grows the gap is N2's.",
        "**N5 (focal clamp).** Their focal loss clamps p_y to [1e-7, 1 − 1e-7] (`utils.py:641`); the parity line above shows "
        "the two agree to float precision inside the clamp and differ only for rows outside it, where theirs has no gradient.",
        "**N1 / N3 / N6.** Part A runs ours in reference mode (shared random δ₀, `holdout_fraction=0`, batch ≥ N, the demo's "
        "step count up to the epochs stated), so the library defaults (δ₀ = 0, 20 % hold-out with the TS fallback) do not enter "
        "it; the numbers above are what Neural Clamping itself does on these models, in either implementation.",
    ]
    augment = nc["models"].get("digits_cnn", {}).get("augment")
    if augment:
        items.append(
            f"**N4 (augmentation, 1 seed).** With augmentation T ends at {augment['ours']['temperature']:.4f} (ours) / "
            f"{augment['theirs']['temperature']:.4f} (theirs) and test ECE is {augment['ours']['ece']:.4f} / "
            f"{augment['theirs']['ece']:.4f}, against {avg(nc['models']['digits_cnn']['runs'], 'ours', 'ece'):.4f} without: the "
            "CIFAR recipe's horizontal flips are wrong for digits (a flipped 2, 3, 4, 7 or 9 is not that digit), so both fit a "
            "partly mislabelled task and raise T. Between the two, the padding colour differs (theirs black, the digits' "
            "background; ours the normalised mean, a grey frame) and so do the random draws; one seed cannot separate them.")
    return items


def per_model(heads: Dict[str, Any], describe: Any) -> str:
    """``describe(runs)`` for every model, joined."""
    return "; ".join(f"{name}: {describe(entry['runs'])}" for name, entry in heads["models"].items())


def pair(runs: Sequence[Dict[str, Any]], ours: str, theirs: str, key: str, digits: int = 4) -> str:
    """``a / b``: the seed means of ``key`` for two rows."""
    return f"{avg(runs, ours, key):.{digits}f} / {avg(runs, theirs, key):.{digits}f}"


def versus_base(runs: Sequence[Dict[str, Any]]) -> str:
    """Whether ours' and theirs' V-TST (M = 10) test ECE lie above or below the uncalibrated base's."""
    base = avg(runs, "uncalibrated", "ece")
    sides = ["above" if avg(runs, name, "ece") > base else "below" for name in ("V-TST ours M=10", "V-TST theirs M=10")]
    return f"both {sides[0]}" if sides[0] == sides[1] else f"ours {sides[0]}, theirs {sides[1]}"


def results_v1(heads: Dict[str, Any]) -> str:
    """How ours' V-TST encoder was laid out in the run."""
    if heads["vtst_shared_hidden"]:
        return "one hidden layer shared by μ and log σ² (V1 not applied)"
    return "two separate branches (`shared_hidden=False`), the same layers as theirs"


def head_differences(heads: Dict[str, Any]) -> List[str]:
    """Part B items, with the measured means (ours / theirs)."""
    def spread(runs: Sequence[Dict[str, Any]], name: str) -> str:
        """Selected epoch of row ``name``, mean ± std over seeds."""
        return mean_std([r[name]["best_epoch"] for r in runs], 0)

    return [
        "**TST: the same method in both.** Test ECE / NLL ours / theirs: " + per_model(heads, lambda runs: (
            f"ECE {pair(runs, 'TST ours', 'TST theirs', 'ece')}, NLL {pair(runs, 'TST ours', 'TST theirs', 'nll')}, selected "
            f"epoch {pair(runs, 'TST ours', 'TST theirs', 'best_epoch', 0)}")) + ". The validation curves nearly overlap, so V8 "
        "(their unshuffled loader) changes nothing visible. A selected epoch at the last one means still improving (V4).",
        "**V2 (V-TST selection).** Theirs monitors the validation CE of one fresh sample + KL/Z (`Two_Stage.py:123-138`, the "
        "draw at `VTST.py:128`): one draw per epoch, so where the curve is flat past its minimum the noise picks the epoch; "
        "ours the predictive NLL over 10 stored samples. Selected epoch ours vs theirs (mean ± std): " + per_model(heads, lambda runs: (
            f"{spread(runs, 'V-TST ours M=10')} vs {spread(runs, 'V-TST theirs M=10')}")) + ". The curve tables also give "
        "theirs' predictive NLL (10 fresh samples) per epoch: compare its argmin with ours'.",
        "**V-TST against the uncalibrated base (M = 10), ECE ours / theirs vs uncalibrated:** " + per_model(heads, lambda runs: (
            f"{pair(runs, 'V-TST ours M=10', 'V-TST theirs M=10', 'ece')} vs {avg(runs, 'uncalibrated', 'ece'):.4f} "
            f"({versus_base(runs)})")) + ". Where both are above the base, V-TST's loss of calibration on this protocol "
        "(docs/fidelity-review.md §2.2) is the method's, not our implementation's.",
        "**V5 (test-time noise), M = 1, accuracy and ECE ours / theirs:** " + per_model(heads, lambda runs: (
            f"acc {pair(runs, 'V-TST ours M=1', 'V-TST theirs M=1', 'accuracy')}, ECE {pair(runs, 'V-TST ours M=1', 'V-TST theirs M=1', 'ece')}")) +
        ". Theirs draws fresh noise per input; ours one stored vector shared by every input (deterministic, saved with the "
        "model), so its M = 1 error is one shift common to the whole test set; ours' M = 1 is also a separate fit "
        "(`samples=1`), selected on a 1-sample predictive NLL.",
        "**V6 (stage-2 data), ours only, ECE main / paper protocol:** " + per_model(heads, lambda runs: (
            f"TST {pair(runs, 'TST ours', 'TST ours, paper protocol', 'ece')}, V-TST "
            f"{pair(runs, 'V-TST ours M=10', 'V-TST ours, paper protocol M=10', 'ece')}")) + ". The paper protocol trains the "
        "head on the rows the base itself was fitted on and validates on the calibration half.",
        f"**V1 (V-TST encoder).** Ours' V-TST head in this run: {results_v1(heads)}; theirs has two separate μ / log σ² "
        "branches (Linear d→3Z, ReLU, Linear 3Z→Z each; Linear Z→C), PyTorch default initialisation in both; the initial "
        "weights themselves differ (different random streams).",
    ]


def report_lines(nc: Optional[Dict[str, Any]], heads: Optional[Dict[str, Any]], references: Dict[str, Optional[Reference]]) -> List[str]:
    """Reference table, both parts and the differences list."""
    lines = ["## Reference code", ""]
    lines += _report.table(["part", "repository", "commit"], [
        [part, f"[{ref.name}]({ref.url})" if ref else REFERENCES[part][1], f"`{ref.commit}`" if ref else "not run"]
        for part, ref in references.items()])
    lines.append("")
    if nc is not None:
        lines += nc_lines(nc)
    if heads is not None:
        lines += heads_lines(heads)
    items = (nc_differences(nc, heads) if nc is not None else []) + (head_differences(heads) if heads is not None else [])
    lines += ["## Differences explained (items of `docs/fidelity-review.md`)", ""] + [f"* {item}" for item in items] + [""]
    return lines


@dataclasses.dataclass
class Results:
    """Both parts' measurements (None when not run), the reference code found per part, and the seeds."""

    nc: Optional[Dict[str, Any]]
    heads: Optional[Dict[str, Any]]
    references: Dict[str, Optional[Reference]]
    seeds: List[int]


def save_raw(path: Path, header: List[str], results: Results) -> None:
    """Every measured number and per-epoch curve, with the report header, as JSON (``--render`` rebuilds the report)."""
    refs = {part: dataclasses.asdict(ref) | {"path": str(ref.path)} if ref else None for part, ref in results.references.items()}
    path.write_text(json.dumps({"header": header, "references": refs, "nc": results.nc, "heads": results.heads}))
    print(f"wrote {path}", file=sys.stderr)


def render_raw(path: Path) -> str:
    """The report of a run saved with ``--raw``."""
    raw = json.loads(path.read_text())
    references = {part: Reference(**{**ref, "path": Path(ref["path"])}) if ref else None for part, ref in raw["references"].items()}
    return "\n".join(raw["header"] + report_lines(raw["nc"], raw["heads"], references))


def measure(args: argparse.Namespace) -> Results:
    """Run the parts asked for whose reference code is present."""
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    chosen = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else None)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    references = {part: find_reference(part) if part in parts else None for part in ("nc", "heads")}
    nc = heads = None
    if references["nc"] is not None:
        models = [m for m in (chosen or NC_MODELS) if m in NC_MODELS]
        nc = run_nc(import_nctoolkit(references["nc"]), models, seeds, args.nc_epochs or (3 if args.quick else NC_DEMO["epochs"]))
    if references["heads"] is not None:
        models = [m for m in (chosen or HEAD_MODELS) if m in HEAD_MODELS]
        heads = run_heads(import_decoupled(references["heads"]), models, seeds, 5 if args.quick else None)
    return Results(nc, heads, references, seeds)


def report(session: _report.Session, results: Results) -> str:
    """The Markdown report; with ``--raw`` its header and every number are also saved as JSON."""
    header = session.header("Fidelity: our Neural Clamping, TST and V-TST against the authors' code",
                            ["torch", "timm", "transformers", "lightning", "torchmetrics"],
                            extra=f"Seeds: {len(results.seeds)} (bench_quality's stratified calibration / test halves per seed).")
    if session.args.raw:
        save_raw(session.args.raw, header, results)
    return "\n".join(header + report_lines(results.nc, results.heads, results.references))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure the parts asked for (or render a --raw file) and write the report."""
    parser = _report.parser(__doc__, default_repeats=1, quick_repeats=1)
    parser.add_argument("--parts", default="nc,heads", help="comma-separated subset of nc,heads")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 3; --quick 1)")
    parser.add_argument("--models", default=None, help="comma-separated zoo models (default: all of each part; --quick: digits_cnn)")
    parser.add_argument("--nc-epochs", type=int, default=None, help=f"Neural Clamping epochs (default {NC_DEMO['epochs']}, the demo's; --quick 3)")
    parser.add_argument("--raw", type=Path, default=None, help="also write every measured number and per-epoch curve to this JSON file")
    parser.add_argument("--render", type=Path, default=None, help="measure nothing: rebuild the report from a --raw file")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_fidelity.py", args)
    if args.render:
        session.finish(render_raw(args.render), NAME)
        return 0
    results = measure(args)
    if results.nc is None and results.heads is None:
        print("nothing to compare: no reference code found (see the messages above)", file=sys.stderr)
        return 0
    session.finish(report(session, results), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
