"""Saving, loading and pushing a calibrated model: the public surface over the artifact (docs/artifact.md).

As huggingface_hub's ``ModelHubMixin``, the public methods (``save_pretrained``, ``from_pretrained``,
``push_to_hub``, ``push_evaluation_results``) check their arguments and do the hub's part; the
artifact's format is :mod:`hf_calibrate.serialization.record`, and the model class builds itself from
a verified folder through its ``_from_parts`` hook.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from torch import nn

from . import _hub
from .serialization import record as saved_record
from .serialization.evaluated_model import IDENTITY_KEY, model_identity
from .serialization.load_options import TRANSFORMERS_LOAD_KWARGS, TRANSFORMERS_SAVE_KWARGS, load_device, load_dtype


class CalibratedHubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` of ``CalibratedModel`` (which provides ``_from_parts``)."""

    def calibration_record(
        self, *, base_weights: str = "included", base_model_id: Optional[str] = None, base_revision: Optional[str] = None
    ) -> Dict[str, Any]:
        """The ``calibration_config.json`` contents for this model (:func:`hf_calibrate.serialization.record.calibration_record`)."""
        return saved_record.calibration_record(self, base_weights=base_weights, base_model_id=base_model_id, base_revision=base_revision)

    def save_pretrained(
        self, save_directory: str | os.PathLike, *, include_base: bool = True, base_model_id: Optional[str] = None,
        base_revision: Optional[str] = None, preprocessor: Any = None, overwrite_card: bool = False,
        repo_id: Optional[str] = None, row_digests: bool = True, is_main_process: bool = True, **transformers_kwargs: Any,
    ) -> Optional[Path]:
        """Save the artifact (docs/artifact.md) into ``save_directory``, crash-safely.

        Replaces or deletes only files an earlier save provably wrote (their SHA-256 in the folder's sealed record);
        a user's other files, folders and links are kept, nothing is written through a link, and replacing a file
        that is not provably the library's is a ``FileExistsError`` naming it.

        Args:
            include_base: save the base model's own files (default). With False the repo is reference-only: it
                names the base repo and commit (``base_model_id`` / ``base_revision``, default: what the base
                model records) and loads it from there.
            preprocessor: image processor or tokenizer to save beside it (default: the one given to :meth:`fit`),
                so pipelines find it.
            overwrite_card: replace a ``README.md`` in the folder that hf_calibrate did not write.
            repo_id: the hub id the card's title and usage snippet show (default: the title is this folder's name and
                the snippet a placeholder, ``"<user>/<folder name>"``, never the folder's path).
            row_digests: keep a 16-byte digest of each calibration row (``datasets`` data, tensors) in the record (up to
                250,000 rows), so that the loaded model tells when data it evaluates are calibration rows. Anyone who
                holds a row can then tell whether it was one: pass False for private data.
            is_main_process: only the main process writes (as in transformers).
            **transformers_kwargs: accepted for compatibility with ``Trainer`` and ``PreTrainedModel.push_to_hub``
                (``state_dict``, ``safe_serialization``, ``max_shard_size``, ...); the calibration always saves
                in safetensors.
        """
        unknown = set(transformers_kwargs) - TRANSFORMERS_SAVE_KWARGS
        if unknown:
            raise TypeError(f"save_pretrained() got unexpected keyword argument(s) {sorted(unknown)}.")
        if not is_main_process:
            return None
        return saved_record.save_model(
            self, Path(save_directory), include_base=include_base, base_model_id=base_model_id, base_revision=base_revision,
            preprocessor=preprocessor, overwrite_card=overwrite_card, repo_id=repo_id, row_digests=row_digests,
        )

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, revision: Optional[str] = None,
        token: Optional[str | bool] = None, cache_dir: Optional[str | os.PathLike] = None, local_files_only: bool = False,
        force_download: bool = False, subfolder: Optional[str] = None, base_model: Optional[nn.Module] = None,
        dtype: Any = None, torch_dtype: Any = None, device_map: Any = None, **kwargs: Any,
    ) -> Any:
        """Load a calibrated model from a folder or a hub repo id (``revision`` pins a commit).

        Verifies the artifact (record schema and digest, tensors, δ, labels, base fingerprint; an
        :class:`~hf_calibrate.serialization.ArtifactError` names the file, key and fix). Loading writes nothing: a
        folder left torn by an interrupted save is refused (naming its files) until it is saved again. ``base_model`` supplies the base of a plain-module calibration
        (or overrides the saved one; its fingerprint must match).

        ``dtype`` (``torch_dtype`` is its older name): None or ``"auto"`` keep the dtype the base was saved and
        fitted in (the one its fingerprint verifies); a floating ``torch.dtype`` or its name (``"bfloat16"``)
        casts the base after verification. The calibrator stays float32. ``device_map``: one device for the
        whole model (``"cpu"``, ``"cuda:0"``, ``0``, ``{"": "cuda:0"}``; ``"auto"``: the first accelerator,
        else the CPU); a map splitting the model is refused. Works offline from the cache
        (``HF_HUB_OFFLINE=1``); also reached by ``AutoModelFor...from_pretrained`` and ``pipeline(task, model=...)``.
        """
        if model_args:
            raise TypeError("CalibratedModel.from_pretrained takes no positional model arguments.")
        unknown = set(kwargs) - TRANSFORMERS_LOAD_KWARGS
        if unknown:
            raise TypeError(f"from_pretrained() got unexpected keyword argument(s) {sorted(unknown)}.")
        target_dtype, device = load_dtype(dtype, torch_dtype), load_device(device_map)
        hub_options = dict(token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        root = _hub.resolve_folder(
            pretrained_model_name_or_path, revision=revision, force_download=force_download, subfolder=subfolder, **hub_options
        )
        model = cls._from_parts(saved_record.load_parts(root, base_model, hub_options))
        if target_dtype is not None:
            model.base_model.to(target_dtype)
        return model.to(device).eval() if device is not None else model.eval()

    def push_to_hub(
        self, repo_id: str, *, private: Optional[bool] = None, revision: Optional[str] = None,
        commit_message: Optional[str] = None, token: Optional[str | bool] = None, include_base: bool = True,
        base_model_id: Optional[str] = None, base_revision: Optional[str] = None, preprocessor: Any = None,
        overwrite_card: bool = False, row_digests: bool = True,
    ) -> Any:
        """Save and upload to ``repo_id`` (created if missing) as one commit; returns the ``CommitInfo``.

        ``revision`` names the branch (created if missing). A README.md already on the hub that hf_calibrate
        did not write is kept unless ``overwrite_card``. ``row_digests`` as for :meth:`save_pretrained` (pass False
        for private calibration data).
        """
        with tempfile.TemporaryDirectory(prefix="hf_calibrate_push_") as tmp:
            folder = self.save_pretrained(
                Path(tmp) / "repo", include_base=include_base, base_model_id=base_model_id, base_revision=base_revision,
                preprocessor=preprocessor, overwrite_card=True, repo_id=repo_id, row_digests=row_digests,
            )
            return _hub.push_folder(
                folder, repo_id, private=private, revision=revision, commit_message=commit_message, token=token,
                overwrite_card=overwrite_card,
            )

    def push_evaluation_results(
        self, repo_id: str | os.PathLike, evaluation: Optional[Dict[str, Any]] = None, *, token: Optional[str | bool] = None,
        revision: Optional[str] = None, commit_message: Optional[str] = None,
    ) -> Any:
        """Replace the results of the card of ``repo_id`` (one commit), or of a local folder the model was saved to, with
        ``evaluation`` (default: ``last_evaluation``): the card's body, results table and ``model-index``, its reliability
        diagram and the record's ``evaluation`` change together (a README.md of your own keeps its body).

        The results must be this model's, and ``repo_id`` must hold this model: results of another calibration are
        refused (an :class:`~hf_calibrate.serialization.ArtifactError` naming both). An evaluation that does not name its
        model (an :func:`~hf_calibrate.results.evaluator.as_evaluation` result) is taken to be this model's. Returns
        what was replaced (:class:`~hf_calibrate.card_results.ResultsUpdate`; ``str()`` says it in words).
        """
        evaluation = evaluation if evaluation is not None else self.last_evaluation
        if not evaluation:
            raise ValueError("nothing to push: run calibrated.evaluate(test_data) first, or pass evaluation=....")
        if not evaluation.get(IDENTITY_KEY):
            evaluation = {**evaluation, IDENTITY_KEY: model_identity(self)}
        return _hub.push_evaluation_results(repo_id, evaluation, token=token, revision=revision, commit_message=commit_message)
