"""What ``method="auto"`` and a logit fit say must be what they did.

* the reason, the note, the table and the card word the rule the code applies, with the evidence of its last step
  (the paired difference of the compared candidates to the lowest-scoring one);
* a fit that interpolates its calibration data says so, with the l2 its cross-fitting chose;
* a candidate's warning inside auto reaches the user while auto runs, once, named.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Tuple

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hf_calibrate import CalibratedModel
from hf_calibrate.calibrators import MatrixScaling
from hf_calibrate.calibrators.solvers import lbfgs
from hf_calibrate.fitting.auto import selection as auto
from hf_calibrate.fitting.auto import scoring as auto_scoring
from hf_calibrate.fitting.auto.selection import auto_record, choose
from hf_calibrate.fitting.auto.scoring import Scored
from hf_calibrate.fitting.calibrate import CalibrationFitWarning
from hf_calibrate.results import cards
from hf_calibrate.results.reporting import auto_note, auto_table

ROWS = 400
#: the rule's last step, as the reason, the card and docs/choosing-a-method.md word it
FINAL_STEP = "the simplest whose held-out NLL is not shown worse than the lowest one's"


def _fixable_by_a_bias(rows: int = 60) -> Tuple[torch.Tensor, torch.Tensor]:
    """3-class logits a class bias makes wrong (class 2 on top of most rows) and a per-class map makes right, with
    margins that a weak pull lets it scale towards probability 1."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(rows) % 3
    logits = 3.0 * nn.functional.one_hot(labels, 3).float() + 0.3 * torch.randn(rows, 3, generator=generator)
    logits[:, 2] += 4.0
    return logits, labels


def _noise(seed: int) -> torch.Tensor:
    return 0.05 * torch.randn(ROWS, generator=torch.Generator().manual_seed(seed))


def _scored(best_is_simplest: bool) -> List[Scored]:
    """Held-out NLL of temperature, vector and matrix scaling: both maps beat temperature scaling; matrix scores lowest,
    tied with vector (``best_is_simplest`` False) or clearly below it (True)."""
    reference = 0.5 + _noise(0).abs()
    vector = reference - 0.100 + _noise(1)
    matrix = reference - (0.300 if best_is_simplest else 0.103) + _noise(2)
    return [Scored("temperature", reference.double()), Scored("vector", vector.double()), Scored("matrix", matrix.double())]


def _summary(scored: List[Scored]) -> Dict[str, Any]:
    """A fit summary holding auto's record of ``scored`` (its uncalibrated row from stand-in logits)."""
    return {"auto": auto_record(scored, choose(scored), torch.zeros(ROWS, 3), torch.zeros(ROWS, dtype=torch.long), 5)}


def _row(table: str, method: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {method} |"))


def test_a_simpler_candidate_kept_over_the_lowest_says_why_with_the_paired_difference():
    summary = _summary(_scored(best_is_simplest=False))
    record = summary["auto"]
    assert (record["chosen"], record.get("best")) == ("vector", "matrix")
    rows = {row["method"]: row for row in record["candidates"]}
    difference = rows["vector"]["versus_best"]
    assert difference["low"] <= 0 and rows["matrix"]["versus_best"] is None
    evidence = (f"vector minus matrix: {difference['point']:+.4f} nats per sample, 95 % interval "
                f"[{difference['low']:+.4f}, {difference['high']:+.4f}], not shown worse")
    note = auto_note(summary)
    assert FINAL_STEP in note and evidence in note and "the best of" not in note
    assert f"minus matrix: {difference['point']:+.4f} [" in _row(auto_table(summary), "vector")
    assert "not shown worse" in _row(auto_table(summary), "vector")
    assert "the lowest held-out NLL of those that beat temperature scaling" in _row(auto_table(summary), "matrix")


def test_the_lowest_chosen_over_simpler_ones_shows_them_shown_worse():
    summary = _summary(_scored(best_is_simplest=True))
    record = summary["auto"]
    assert (record["chosen"], record.get("best")) == ("matrix", "matrix")
    difference = {row["method"]: row for row in record["candidates"]}["vector"]["versus_best"]
    assert difference["low"] > 0
    note = auto_note(summary)
    assert "matrix has the lowest" in note and "the best of the" not in note
    assert f"vector minus matrix: {difference['point']:+.4f} nats per sample" in note and "shown worse" in note
    assert "shown worse, passed over" in _row(auto_table(summary), "vector")


def test_the_card_words_the_rule_and_shows_the_last_steps_evidence():
    logits, labels = _fixable_by_a_bias()
    model = CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method="auto", candidates=["temperature"],
                                progress=False)
    record = model.calibration_record()
    record["fit"]["summary"]["auto"] = _summary(_scored(best_is_simplest=False))["auto"]
    text = " ".join(cards.render_card(record).text.split())
    assert FINAL_STEP in text
    assert "vector minus matrix: +" in text and "not shown worse, and simpler" in text


# ----------------------------------------------------------------------------- interpolation


def _fit_warnings(method: str, logits: torch.Tensor, labels: torch.Tensor, **options: Any) -> Tuple[CalibratedModel, List[str]]:
    """The model of ``method`` fitted on the logits, and the CalibrationFitWarning lines its fit said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = CalibratedModel.fit(nn.Identity(), TensorDataset(logits, labels), method=method, progress=False, **options)
    return model, [str(w.message) for w in caught if issubclass(w.category, CalibrationFitWarning)]


def test_a_fit_that_interpolates_its_rows_says_so_with_the_l2_it_chose():
    grid = (1e2, 1e1, 1.0, 0.1, 1e-2, 1e-3, 1e-4)  # l2 chosen by cross-fitting along a path
    model, said = _fit_warnings("vector", *_fixable_by_a_bias(), l2=None, l2_grid=grid)
    lines = [line for line in said if line.startswith("vector fits its calibration data exactly (in-sample NLL ")]
    assert len(lines) == 1 and "all 60 rows correct" in lines[0] and "held-out results are what count" in lines[0]
    assert f"chose l2 = {model.fit_summary['l2']:g}, the weakest of its grid" in lines[0]
    assert lines[0] in model.fit_summary["warnings"]


def test_an_l2_given_is_not_called_chosen_and_a_fit_that_does_not_interpolate_says_nothing():
    _, said = _fit_warnings("vector", *_fixable_by_a_bias(), l2=1e-4)
    assert [line for line in said if "fits its calibration data exactly" in line and "l2 =" not in line]
    logits = 2.0 * torch.randn(200, 3, generator=torch.Generator().manual_seed(1))
    labels = torch.multinomial(torch.softmax(logits / 3, 1), 1, generator=torch.Generator().manual_seed(2)).squeeze(1)
    _, said = _fit_warnings("vector", logits, labels)
    assert not [line for line in said if "fits its calibration data exactly" in line]


# ----------------------------------------------------------------------------- candidates' warnings


def test_a_candidates_warnings_reach_the_user_during_auto_once_and_named(monkeypatch):
    """Matrix's time (every fit timed here) is said before it starts, once, for its K + 1 fits, named, at the caller's
    line; a warning each of its fits raises (on all the rows, then on each of 5 folds) is said once."""
    monkeypatch.setattr(lbfgs, "TIME_FROM_WORK", 0)
    monkeypatch.setattr(lbfgs, "WARN_AFTER_SECONDS", 0.0)
    defaults = auto_scoring.default_options
    monkeypatch.setattr(auto_scoring, "default_options", lambda method, engine: dataclasses.replace(
        defaults(method, engine), **({"l2": 1.0, "max_iter": 30} if method == "matrix" else {})))  # a quick matrix fit
    fit_logits = MatrixScaling._fit_logits

    def repeated(self: MatrixScaling, *args: Any) -> Dict[str, Any]:
        warnings.warn("matrix: said by each fit")
        return fit_logits(self, *args)

    monkeypatch.setattr(MatrixScaling, "_fit_logits", repeated)
    real, said_before_choosing = auto.choose, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(auto, "choose", lambda scored, groups=None: said_before_choosing.extend(caught) or real(scored, groups))
        CalibratedModel.fit(nn.Identity(), TensorDataset(*_fixable_by_a_bias()), method="auto", candidates=["matrix"], progress=False)
    named = "auto, candidate matrix (name the other candidates in candidates=[...] to leave it out): "
    timed = [w for w in caught if "L-BFGS fit(s)" in str(w.message)]
    assert len(timed) == 1 and timed[0] in said_before_choosing and timed[0].filename == __file__
    assert str(timed[0].message).startswith("auto, candidate matrix: about ") and "for its 6 fits (on all rows and on 5 folds" in str(timed[0].message)
    assert [str(w.message) for w in caught if "said by each fit" in str(w.message)] == [f"{named}matrix: said by each fit"]
