"""New results into a saved calibration's card, telling one story: the record, the card and the diagram that replace
the old ones, staged into a folder (no network, no change to the calibration itself).

The record's ``evaluation`` is replaced, and the card is regenerated from that record, so its body, results table,
reliability diagram and ``model-index`` all describe the new results. A README.md the user wrote (without the
generated card's marker) keeps its body: only its ``model-index`` changes. ``_hub.push_evaluation_results`` commits
the staged files to a hub repo in one commit, or installs them into a local folder
(:func:`hf_calibrate.serialization.saving.update_results`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from huggingface_hub import ModelCard

from .results import cards, reporting
from .serialization.files import CALIBRATION_CONFIG, CARD_FILE, CARD_MARKER, DIAGRAM_FILE
from .serialization.identity import repo_id_problem
from .serialization.ownership import file_sha256
from .serialization.record import evaluation_record
from .serialization.saving import write_json
from .serialization.schema import seal_record, validate_record

#: the usage line of a generated card, naming where the model loads from (:func:`hf_calibrate.results.cards.render_card`)
_LOADING = re.compile(r'CalibratedModel\.from_pretrained\("([^"]+)"')


@dataclasses.dataclass(frozen=True)
class ResultsUpdate:
    """What putting new results into a calibration's card changed; ``str()`` says it in words.

    Attributes:
        before: the results the card showed, in words (None: it showed none).
        after: the new results, in words.
        files: the files written (relative names).
        users_card: the README.md is the user's own: its body was kept, only its model-index replaced.
        removed: the files removed (the diagram of results that had bins, when the new ones have none).
        commit: the hub commit (None: a local folder).
    """

    before: Optional[str]
    after: str
    files: Tuple[str, ...]
    users_card: bool
    removed: Tuple[str, ...] = ()
    commit: Any = None

    def __str__(self) -> str:
        said = (f"replaced the card's {self.before} with the {self.after}" if self.before
                else f"put the {self.after} into the card")
        kept = (f"; {CARD_FILE} is your own (it has no hf_calibrate marker), so its body was kept and only its "
                "model-index updated") if self.users_card else ""
        removed = f"; removed {', '.join(self.removed)}" if self.removed else ""
        commit = f" (commit {getattr(self.commit, 'commit_url', self.commit)})" if self.commit is not None else ""
        return f"{said}: {', '.join(self.files)}{removed}{kept}{commit}"


def stage_results(
    record: Dict[str, Any], evaluation: Dict[str, Any], staged: Path, *, card_text: str, location: str | os.PathLike
) -> ResultsUpdate:
    """Write into the folder ``staged`` what replaces the results of the calibration whose (validated) record is
    ``record`` and whose card is ``card_text``: the record with ``evaluation`` as its results (sealed, its manifest
    and digests following the diagram), the reliability diagram (when the evaluation has bins), and the card.

    ``location``: where the card says the model loads from (a hub repo id, or the folder as a ``Path``).
    """
    results = evaluation_record(evaluation)
    diagram = cards.write_diagram(staged, results, cards.method_title(record))
    new_record = _sealed(record, results, staged, diagram)
    users_card = CARD_MARKER not in card_text
    card = _users_card(card_text, new_record, location) if users_card else cards.render_card(
        new_record, repo_id=location, diagram=diagram)
    card.save(staged / CARD_FILE)
    write_json(staged / CALIBRATION_CONFIG, new_record)
    return ResultsUpdate(
        before=_results_words(record), after=str(_results_words(new_record)), users_card=users_card,
        files=(CARD_FILE, *([diagram] if diagram else []), CALIBRATION_CONFIG),
    )


def _sealed(record: Dict[str, Any], results: Dict[str, Any], staged: Path, diagram: Optional[str]) -> Dict[str, Any]:
    """``record`` with ``results`` as its evaluation, its manifest and digests listing the new diagram (or none),
    sealed and checked as loading will check it."""
    files = record["files"]
    manifest = sorted(set(files["manifest"]) - {DIAGRAM_FILE} | ({diagram} if diagram else set()))
    # the diagram's digest follows the new one; the card's is dropped (it is checked only during an interrupted save)
    digests = {name: digest for name, digest in files["sha256"].items() if name not in (DIAGRAM_FILE, CARD_FILE)}
    if diagram:
        digests[diagram] = file_sha256(staged / diagram)
    sealed = seal_record({**record, "evaluation": results, "files": {**files, "manifest": manifest, "sha256": digests}})
    validate_record(sealed, staged / CALIBRATION_CONFIG)
    return sealed


def _users_card(card_text: str, record: Dict[str, Any], location: str | os.PathLike) -> ModelCard:
    """The user's own card with the record's results as its model-index; its body and other metadata kept."""
    card = ModelCard(card_text)
    card.data.eval_results = cards.eval_results(cards.recorded_evaluation(record), record["base_model"]["task"]) or None
    if not card.data.model_name:
        card.data.model_name = cards.card_title(record, location)
    return card


def _results_words(record: Dict[str, Any]) -> Optional[str]:
    """The results a record's card shows, in words: ``"in-sample results on digits, calibration split, 450 samples"``."""
    evaluation = cards.recorded_evaluation(record)
    if evaluation is None:
        return None
    return f"{'in-sample ' if evaluation.get('in_sample') else ''}results on {reporting.evaluated_on(evaluation)}"


def card_location(card_text: str, folder: Path) -> str | Path:
    """Where the card of the local ``folder`` says the model loads from: the hub repo id its usage line names (the
    folder was saved with ``repo_id=...``), else the folder itself."""
    match = _LOADING.search(card_text)
    named = match.group(1) if match else None
    if named and "/" in named and not repo_id_problem(named) and not os.path.exists(named):
        return named
    return folder
