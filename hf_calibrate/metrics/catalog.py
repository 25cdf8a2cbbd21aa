"""Every metric results show, described once: its key, titles, model-index type and direction.

The model card (its body and ``model-index``) and :mod:`hf_calibrate.results.reporting`'s titles, which the command
line and the comparison table show, read these entries instead of keeping their own lists (docs/design.md §2).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """What results say about one metric.

    Attributes:
        key: its key in a metrics dict (:func:`~hf_calibrate.metrics.calibration_report`, an evaluation's sides).
        title: its name in results (model card, command line, verdicts): ``"ECE"``.
        short_title: its name in narrow tables (the benchmarks'): ``"cw-ECE"``.
        card_type: its ``model-index`` metric type on the Hub (the card's metadata).
        higher_is_better: True for accuracy; False for the errors and scores, where lower is better.
        on_card: whether model cards (and their ``model-index``) show it, before and after calibration.
    """

    key: str
    title: str
    short_title: str
    card_type: str
    higher_is_better: bool = False
    on_card: bool = True


def _metric(key: str, title: str, short_title: str = "", higher_is_better: bool = False, on_card: bool = True) -> MetricInfo:
    return MetricInfo(key, title, short_title or title, key, higher_is_better, on_card)


#: every metric results show, in the order they show them
METRIC_CATALOG: Tuple[MetricInfo, ...] = (
    _metric("accuracy", "accuracy", "acc", higher_is_better=True),
    _metric("ece", "ECE"),
    _metric("ada_ece", "AdaECE"),
    _metric("smooth_ece", "smECE"),
    _metric("classwise_ece", "classwise ECE", "cw-ECE"),
    _metric("nll", "NLL"),
    _metric("brier", "Brier"),
    _metric("mce", "MCE"),
    _metric("rms_ce", "RMS CE", on_card=False),
)
#: the entries by key
METRIC_INFO: Dict[str, MetricInfo] = {info.key: info for info in METRIC_CATALOG}
#: the metrics a model card shows (before and after calibration) and its ``model-index`` holds, in order
CARD_METRICS: Tuple[MetricInfo, ...] = tuple(info for info in METRIC_CATALOG if info.on_card)
#: keys of the metrics where a larger value is better
HIGHER_IS_BETTER = frozenset(info.key for info in METRIC_CATALOG if info.higher_is_better)
