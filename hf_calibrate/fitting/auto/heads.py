"""The head methods (TST, V-TST, MaC-Cal: :func:`.selection.head_candidates`) as candidates of ``method="auto"``, when named in
its ``candidates``.

A head is trained on the base's features, not its logits, so the head candidates cost one more pass of the base
model (their features, cached once for all of them) and K + 1 head fits each: its fit on all the calibration data,
as a fit of it by name makes it, which is the one kept if it wins, and one fit per fold on that fold's fitting rows,
which scores the rows it did not see. Each fold's fit is the by-name fit on fewer rows: it holds out its own ``holdout_fraction`` of them to
choose its epoch (and, with ``temperature=True``, its temperature). So every calibration row gets a held-out NLL from
a head that never saw it, on the same folds as the logit candidates, and the same 95 % rule applies.

Heads have per-class output weights, so like the per-class logit maps they are left out when classes are absent from
the calibration data. They take part only when asked: on the digits models one default head fit takes about a
minute on a CPU (``benchmarks/results/quality.md``), and auto fits K + 1 of them.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ...backbones import Backbone, ClassifierLayerError
from ...calibrators import Calibrator, calibrator_class
from ...calibrators.holdout import Fold
from ...data import CalibrationData
from .scoring import Scored, absent_classes_reason, candidate_warnings, default_options, score_folds
from ..runtime.engine import Engine
from ..families import create_calibrator
from ..heads import collect_features, fit_head_on_features

def score_heads(methods: Sequence[str], backbone: Backbone, data: CalibrationData, folds: Sequence[Fold], engine: Engine,
                labels: torch.Tensor, num_classes: int, classifier: Optional[str] = None) -> List[Scored]:
    """Every head method of ``methods`` fitted on all of ``data`` (``labels`` (N,) of ``num_classes`` classes) and
    cross-fitted on ``folds``, over features cached in one pass (:func:`score_head`), each head replacing the layer
    ``classifier`` (None: the one the base's config names, else its last C-output ``nn.Linear``). The pass's
    warnings (e.g. which of several such layers was taken) are shown only when a head is chosen; a layer the user
    named that cannot be replaced is the user's error, raised."""
    absent = {method: absent_classes_reason(method, num_classes, labels) for method in methods}
    if all(absent.values()):  # no head can take part: no pass for their features
        return [Scored(method, None, absent[method]) for method in methods]
    try:  # a model without a classifier layer, or a stream already read: the heads are left out, auto goes on
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cached = collect_features(backbone, data, engine, description="features (auto's head candidates)")
    except (ValueError, RuntimeError) as error:
        if classifier is not None and isinstance(error, ClassifierLayerError):
            raise
        return [Scored(method, None, str(error)) for method in methods]
    return [Scored(method, None, absent[method]) if absent[method]
            else score_head(method, backbone, data, cached, folds, engine, (classifier, list(caught)))
            for method in methods]


def score_head(method: str, backbone: Backbone, data: CalibrationData, cached: Tuple[torch.Tensor, torch.Tensor], folds: Sequence[Fold],
               engine: Engine, pass_facts: Tuple[Optional[str], List[warnings.WarningMessage]] = (None, [])) -> Scored:
    """One head candidate on the cached (features (N, d), labels (N,)): its fit on all of them, as a fit of it by name
    makes after its own pass, then its (N,) cross-fitted held-out NLL (nats) from one fit per fold. ``pass_facts``:
    the ``classifier`` option the heads take and the warnings of the pass that cached the features (the user's only
    when a head is chosen); the head's own fit's are said as they happen (:func:`.scoring.candidate_warnings`).
    Data a fit refuses leave it out with the reason."""
    start = time.perf_counter()
    classifier, pass_warnings = pass_facts
    options = dataclasses.replace(default_options(method, engine), classifier=classifier)
    try:
        with candidate_warnings(method, engine):
            calibrator, summary = fit_head_by_name(method, options, backbone, data, cached, engine)
        nll = cross_fitted_head_nll(method, options, backbone, data, cached, folds, engine)
    except ValueError as error:  # InsufficientDataError is one
        return Scored(method, None, str(error), time.perf_counter() - start)
    return Scored(method, nll, None, time.perf_counter() - start, (calibrator, summary, options, pass_warnings))


def fit_head_by_name(method: str, options: Any, backbone: Backbone, data: CalibrationData, cached: Tuple[torch.Tensor, torch.Tensor],
                     engine: Engine) -> Tuple[Calibrator, Dict[str, Any]]:
    """``method``'s head fitted on every cached row, as ``fit(method=method)`` fits it on ``data`` (the same
    features, split, seeds and summary) without that fit's own pass of the base model; the main process's head
    on every process."""
    calibrator = create_calibrator(backbone, data, calibrator_class(method), options, engine)
    summary = fit_head_on_features(backbone, calibrator, options, cached, torch.arange(len(cached[1])), engine)
    engine.broadcast_module(calibrator)
    return calibrator, {"trained_on": data.description, **summary}


def cross_fitted_head_nll(method: str, options: Any, backbone: Backbone, data: CalibrationData, cached: Tuple[torch.Tensor, torch.Tensor],
                          folds: Sequence[Fold], engine: Engine) -> torch.Tensor:
    """(N,) float64 per-row NLL (nats) of ``method``'s head with ``options``, each row scored by the head fitted on the
    folds that do not hold it (its own epoch and temperature chosen on a held-out share of those)."""
    features, labels = cached

    def held_out_nll(fit_rows: torch.Tensor, held_rows: torch.Tensor) -> torch.Tensor:
        calibrator = create_calibrator(backbone, data, calibrator_class(method), options, engine)
        fit_head_on_features(backbone, calibrator, options, cached, fit_rows.cpu(), engine)
        with torch.no_grad():
            held = features[held_rows.to(features.device)].to(engine.device)
            logits = calibrator(calibrator.head_module.eval()(held)).double()
        return torch.nn.functional.cross_entropy(logits, labels[held_rows.to(labels.device)].to(engine.device), reduction="none")

    return score_folds(folds, len(labels), held_out_nll)
