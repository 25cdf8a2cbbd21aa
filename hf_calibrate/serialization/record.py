"""The record of a calibrated model (``calibration_config.json``, docs/artifact.md): written from a model, read back into one.

:func:`calibration_record` is what a save writes (before :func:`~.saving.save_artifact` adds the
manifest and digests); :func:`save_model` is ``CalibratedModel.save_pretrained``'s work. Reading
goes the other way: :func:`load_parts` verifies a saved folder (:mod:`.loading`) and unpacks the
record into what a ``CalibratedModel`` is built from (:class:`SavedParts`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Tuple

from torch import nn

from ..backbones import Backbone, adapt
from ..backbones.preprocessing import fallback_contract
from ..calibrators import Calibrator
from .._probabilities import PROBABILITIES
from ..configuration import CalibratedConfig
from ..data.calibration_rows import CalibrationRows
from ..metrics import ReliabilityBins
from ..results import reporting
from ..version import __version__
from .files import BASE_FOLDER, CALIBRATION_CONFIG, CALIBRATION_WEIGHTS
from .identity import hub_reference, repo_id_problem
from .loading import check_complete, load_base, load_calibrator, load_preprocessor, read_record, verify_against_base
from .load_options import backbone_device
from .locks import reading
from .row_digests import ROW_DIGESTS_KEY, decode_row_digests, encode_row_digests
from .saving import save_artifact
from .schema import FORMAT_VERSION, PLAIN_FORMAT_VERSION, RESAVE, ArtifactError

#: what an evaluation names, kept in the record beside its metrics (see :mod:`hf_calibrate.results.reporting`)
EVALUATION_NAMES = ("dataset", "dataset_id", "split", "n_bins", "in_sample", "in_sample_rows", "calibration_dataset",
                    "calibration_split")
#: provenance keys the record keeps elsewhere than in its ``fit``
_NOT_IN_FIT = ("options", "base_fingerprint", "input_contract")


class SavedModel(Protocol):
    """What the record is written from (:class:`hf_calibrate.CalibratedModel` is one): the base with its adapter and
    the calibrator, the config, what the fit recorded (``fit_summary``, ``provenance``), the last evaluation, and the
    preprocessor saved beside it."""

    backbone: Backbone
    calibrator: Calibrator
    config: CalibratedConfig
    fit_summary: Dict[str, Any]
    provenance: Dict[str, Any]
    last_evaluation: Optional[Dict[str, Any]]
    preprocessor: Any
    calibration_rows: CalibrationRows

    @property
    def base_model(self) -> nn.Module: ...

    @property
    def method(self) -> str: ...



def calibration_record(
    model: SavedModel, *, base_weights: str = "included", base_model_id: Optional[str] = None,
    base_revision: Optional[str] = None, row_digests: bool = True,
) -> Dict[str, Any]:
    """The ``calibration_config.json`` contents for ``model`` (schema: :data:`.schema.RECORD_SCHEMA`), without the
    manifest and digests a save adds; ``base_weights``: ``"included"``, ``"reference"`` or ``"not_saved"``;
    ``row_digests``: keep the calibration rows' digests (:mod:`.row_digests`)."""
    backbone, calibrator = model.backbone, model.calibrator
    reference = hub_reference(model.base_model, backbone.library)
    delta = calibrator.input_perturbation
    delta_shape = list(delta.shape) if delta is not None else None
    contract = model.provenance.get("input_contract") or fallback_contract(backbone, delta_shape)
    fit = {key: value for key, value in model.provenance.items() if key not in _NOT_IN_FIT}
    fit["summary"] = {key: value for key, value in model.fit_summary.items() if key != "history"}
    rows = encode_row_digests(model.calibration_rows.kept()) if row_digests else None
    if rows:
        fit[ROW_DIGESTS_KEY] = rows
    return {
        # a reader of format 2 would read a softmax's probabilities as logits: such a record needs format 3
        "format_version": FORMAT_VERSION if contract.get("outputs") == PROBABILITIES else PLAIN_FORMAT_VERSION,
        "library_version": __version__,
        "method": model.method,
        "calibrator": calibrator.config(),
        "options": model.provenance.get("options", {}),
        "base_model": {
            "library": backbone.library,
            "task": model.config.base_task,
            "repo_id": base_model_id or reference["repo_id"],
            "revision": base_revision or reference["revision"],
            "num_labels": calibrator.num_classes,
            "id2label": {str(k): v for k, v in model.config.id2label.items()},
            "fingerprint": model.provenance.get("base_fingerprint"),
            "weights": base_weights,
            "classifier": backbone.classifier_name if calibrator.head is not None else None,
        },
        "input_contract": {**contract, "shape": delta_shape},
        "fit": fit,
        "evaluation": evaluation_record(model.last_evaluation),
        "files": {
            "weights": CALIBRATION_WEIGHTS,
            "base": BASE_FOLDER if base_weights == "included" and backbone.library == "transformers" else None,
        },
    }


def evaluation_record(evaluation: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The record's part of ``CalibratedModel.evaluate``'s result: what it names, the card's metrics with their
    intervals, the paired differences and verdicts, the bins (none for results of ``evaluate``'s evaluator)."""
    from ..results import cards  # huggingface_hub's card classes: imported when a record is written

    if not evaluation:
        return None
    named = {key: evaluation[key] for key in EVALUATION_NAMES if key in evaluation}
    return {**named, **cards.card_metrics(evaluation), "reliability": dict(evaluation.get("reliability") or {})}


def evaluation_from_record(record: Dict[str, Any], root: Optional[Path] = None) -> Optional[Dict[str, Any]]:
    """``CalibratedModel.evaluate``'s result from the ``evaluation`` of ``record`` (ArtifactError when malformed);
    an evaluation saved before the record named whether it was in-sample is completed from the record's ``fit``."""
    evaluation = record.get("evaluation")
    if not evaluation:
        return None
    try:
        for bins in (evaluation.get("reliability") or {}).values():
            ReliabilityBins.from_dict(bins)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, OverflowError) as error:
        file = (root or Path(".")) / CALIBRATION_CONFIG
        raise ArtifactError(
            f"{file}: key 'evaluation.reliability' is not a set of reliability bins ({type(error).__name__}: {error}); "
            f"{RESAVE}"
        ) from None
    return reporting.completed_evaluation(evaluation, record["fit"])


def save_model(
    model: SavedModel, target: Path, *, include_base: bool, base_model_id: Optional[str], base_revision: Optional[str],
    preprocessor: Any, overwrite_card: bool, repo_id: Optional[str | Path], row_digests: bool = True,
) -> Path:
    """Save ``model`` into ``target`` (``CalibratedModel.save_pretrained``'s arguments; ``repo_id`` None: the folder)."""
    if model.backbone.library == "torch":
        weights = "not_saved"
    elif include_base:
        weights = "included"
    else:
        weights = "reference"
    record = calibration_record(model, base_weights=weights, base_model_id=base_model_id, base_revision=base_revision,
                                row_digests=row_digests)
    if weights == "reference" and not record["base_model"]["repo_id"]:
        raise ValueError(
            "a reference-only save needs the base model's hub repo id; pass base_model_id=... (and "
            "base_revision=<commit>) or save with include_base=True."
        )
    problem = base_model_id is not None and repo_id_problem(base_model_id)
    if problem:
        raise ValueError(f"base_model_id={base_model_id!r} {problem}; pass the base's hub repo id, e.g. 'org/name'.")
    model.config.architectures = [type(model).__name__]
    # save_artifact hands `reliability` to cards.write_diagram, which draws the evaluation's bins and titles them
    # with what they were computed on; `repo_id` goes to cards.render_card: a str is a hub repo id, a Path the folder.
    return save_artifact(
        target, record=record, config_json=model.config.to_dict(), base_model=model.base_model,
        calibrator=model.calibrator, preprocessor=preprocessor if preprocessor is not None else model.preprocessor,
        reliability=record["evaluation"], repo_id=repo_id if repo_id is not None else target,
        overwrite_card=overwrite_card,
    )


@dataclasses.dataclass
class SavedParts:
    """A saved calibrated model unpacked and verified: what ``CalibratedModel`` is built from.

    Attributes:
        config: ``CalibratedConfig``'s keyword arguments.
        base: the base model (as passed, or built from the folder or its hub reference).
        calibrator: the calibrator, on the base's device.
        preprocessor: the saved tokenizer or image processor (or None).
        fit_summary, provenance, evaluation: ``CalibratedModel.fit_summary``, ``.provenance``, ``.last_evaluation``.
        kept_rows: the calibration rows' digests the record holds (:mod:`.row_digests`; [] when none).
    """

    config: Dict[str, Any]
    base: nn.Module
    calibrator: Calibrator
    preprocessor: Any
    fit_summary: Dict[str, Any]
    provenance: Dict[str, Any]
    evaluation: Optional[Dict[str, Any]]
    kept_rows: List[Any]


def load_parts(root: Path, base_model: Optional[nn.Module], hub_options: Dict[str, Any]) -> SavedParts:
    """The verified parts of the artifact in the local folder ``root`` (``base_model``: the base to use instead of the
    saved one; ``hub_options``: token, cache_dir, local_files_only for a reference-only base)."""
    record, calibrator, base, preprocessor = _load_verified(root, base_model, hub_options)
    base_info = record["base_model"]
    id2label = {int(k): v for k, v in base_info["id2label"].items()}
    config = dict(
        base_library=base_info["library"], base_task=base_info["task"], calibration_method=record["method"],
        id2label=id2label, label2id=label2id(base, id2label),
    )
    if calibrator.head is not None:  # the base layer the head replaces, as fitted
        calibrator.classifier = base_info.get("classifier")
    provenance = {key: value for key, value in record["fit"].items() if key not in ("summary", ROW_DIGESTS_KEY)}
    provenance.update(
        options=record.get("options", {}), base_fingerprint=base_info.get("fingerprint"), input_contract=record.get("input_contract")
    )
    return SavedParts(
        config=config, base=base, calibrator=calibrator.to(backbone_device(base)), preprocessor=preprocessor,
        fit_summary=dict(record["fit"].get("summary") or {}), provenance=provenance,
        evaluation=evaluation_from_record(record, root), kept_rows=decode_row_digests(record["fit"].get(ROW_DIGESTS_KEY)),
    )


def _load_verified(
    root: Path, base_model: Optional[nn.Module], hub_options: Dict[str, Any]
) -> Tuple[Dict[str, Any], Calibrator, nn.Module, Any]:
    """(record, calibrator, base, preprocessor) of the artifact in ``root``, each verified, under the folder's read lock."""
    with reading(root):
        record = read_record(root)
        check_complete(root, record)
        calibrator = load_calibrator(root, record)
        base = base_model if base_model is not None else load_base(root, record, **hub_options)
        backbone = adapt(base, num_classes=calibrator.num_classes)
        verify_against_base(root, record, backbone, calibrator, base_passed=base_model is not None)
        preprocessor = _load_preprocessor(root, record)
        return record, calibrator, base, preprocessor if preprocessor is not None else _timm_wrapper_processor(base, record)


def _load_preprocessor(root: Path, record: Dict[str, Any]) -> Any:
    """The saved tokenizer / image processor; files that transformers cannot read are an ArtifactError."""
    try:
        return load_preprocessor(root, record)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as error:
        raise ArtifactError(
            f"{root}: the saved preprocessor (tokenizer or image processor files) cannot be loaded "
            f"({type(error).__name__}: {str(error)[:300]}); {RESAVE}"
        ) from None


def _timm_wrapper_processor(base: nn.Module, record: Dict[str, Any]) -> Any:
    """The image processor of a transformers ``TimmWrapper`` base, rebuilt from its verified config and sized to the
    calibration's input contract; None for other bases. transformers saves none beside such a model
    (``TimmWrapperImageProcessor`` keeps its settings in the model's own ``config.json``, which is the calibrated
    model's here), so without this a loaded model could not preprocess raw images."""
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) != "timm_wrapper" or not isinstance(getattr(config, "pretrained_cfg", None), dict):
        return None
    from transformers import TimmWrapperImageProcessor

    from ..backbones.preprocessing import contract_preprocessor

    return contract_preprocessor(TimmWrapperImageProcessor(pretrained_cfg=config.pretrained_cfg), record.get("input_contract"))


def label2id(base: nn.Module, id2label: Dict[int, str]) -> Dict[str, int]:
    """The base's own ``label2id`` when it agrees with ``id2label``, else ``id2label`` inverted."""
    recorded = getattr(getattr(base, "config", None), "label2id", None)
    inverted = {label: index for index, label in id2label.items()}
    if isinstance(recorded, dict) and all(recorded.get(label) == index for label, index in inverted.items()):
        return {str(label): int(index) for label, index in recorded.items()}
    return inverted
