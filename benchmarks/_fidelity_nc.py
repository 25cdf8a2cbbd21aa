"""Part A of ``bench_fidelity.py``: our Neural Clamping against NCToolkit's ``NCWrapper.train_NC``.

Both start from the same δ₀ and see the same batches (their ``DataLoader`` replays our engine's
seeded batches); also their focal loss and ECE against ours, and an augmentation arm.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import bench_quality as quality
from _fidelity_common import NC_DEMO, cuda_is_a_no_op, global_rng, metrics_of, quiet, zoo_pool

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.calibrators.neural_clamping import NeuralClamping, focal_loss
from hf_calibrate.fitting.runtime.engine import Engine, EngineOptions
from hf_calibrate.metrics import calibration_report


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
