"""Part B of ``bench_fidelity.py``: our TST / V-TST against the authors' ``TST`` / ``VTST`` trained by lightning.

Both train on the same cached penultimate features, train/validation split and schedule.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bench_quality as quality
from _fidelity_common import HEAD_BATCH, LATENT, VALIDATION_SHARE, feature_width, global_rng, metrics_of, quiet, zoo_pool
from _fidelity_nc import num_classes

from hf_calibrate import CalibratedModel
from hf_calibrate.backbones import adapt
from hf_calibrate.calibrators import heads as head_calibrators
from hf_calibrate.calibrators.heads import HeadOptions


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
    results: Dict[str, Any] = {"min_default_steps": head_calibrators.MIN_DEFAULT_STEPS, "models": {}}
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
