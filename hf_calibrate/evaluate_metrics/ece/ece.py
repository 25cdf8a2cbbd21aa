"""Expected calibration error (ECE) as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.expected_calibration_error`; the math and
the input validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, expected_calibration_error, interval_columns

# (binning, norm) -> the name of that error in hf_calibrate.metrics.bootstrap_intervals.
_INTERVAL_METRICS = {
    ("equal_width", "l1"): "ece",
    ("equal_mass", "l1"): "ada_ece",
    ("equal_width", "l2"): "rms_ce",
    ("equal_width", "max"): "mce",
}

_DESCRIPTION = """
Expected calibration error (ECE): how far a classifier's confidence (its top-class
probability) is from its accuracy. Confidences are put in B bins; ECE is the sample-weighted
mean over bins of |accuracy - mean confidence|. 0 means perfectly calibrated. Equal-width
bins by default; `binning="equal_mass"` gives the adaptive ECE (AdaECE), `norm="l2"` the
RMS calibration error and `norm="max"` the maximum calibration error (MCE).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): (N, C) class probabilities, each row summing
        to 1 (logits with `from_logits=True`).
    references (`list` of `int`): (N,) true class indices in [0, C).
    n_bins (`int`, defaults to 15): number of bins B.
    binning (`str`, defaults to `"equal_width"`): `"equal_width"` (bins (b/B, (b+1)/B]) or
        `"equal_mass"` (B bins of about N/B samples sorted by confidence; AdaECE).
    norm (`str`, defaults to `"l1"`): `"l1"` (ECE), `"l2"` (RMS calibration error) or
        `"max"` (MCE: the largest gap over non-empty bins).
    from_logits (`bool`, defaults to `False`): apply softmax to `predictions` first.
    bootstrap (`int`, defaults to 0): number R of Poisson-bootstrap replicates of a 95 %
        confidence interval of the error (`hf_calibrate.metrics.bootstrap_intervals`); 0 gives
        no interval. R from 1 to 99 is refused; R = 1000 is a good choice. Offered for `binning="equal_width"` with `norm`
        `"l1"` (ECE), `"l2"` (RMS) or `"max"` (MCE) and for `binning="equal_mass"` with
        `norm="l1"` (AdaECE).
    seed (`int`, defaults to 0): seed of the bootstrap weights; the same seed and inputs give
        the same interval.

Returns:
    ece (`float`): the calibration error, in [0, 1]; lower is better.
    ece_low, ece_high (`float`, only with `bootstrap` > 0; None on fewer than 30 samples, with `no_interval_reason` saying why): the ends of its 95 % bootstrap
        interval (percentile interval shifted by the bootstrap bias, low cut at 0).

Examples:
    >>> import evaluate
    >>> from hf_calibrate import evaluate_module_path
    >>> ece = evaluate.load(evaluate_module_path("ece"))
    >>> probs = [[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]]
    >>> results = ece.compute(predictions=probs, references=[0, 1, 1], n_bins=10)
    >>> round(results["ece"], 4)
    0.4167
    >>> round(ece.compute(predictions=probs, references=[0, 1, 1], n_bins=10, norm="max")["ece"], 4)
    0.85
    >>> logits = [[2.0, 0.0], [0.0, 1.0]]
    >>> round(ece.compute(predictions=logits, references=[0, 0], from_logits=True)["ece"], 4)
    0.4251
    >>> results = ece.compute(predictions=probs * 20, references=[0, 1, 1] * 20, n_bins=10, bootstrap=200)
    >>> {name: round(value, 4) for name, value in results.items()}
    {'ece': 0.4167, 'ece_low': 0.3365, 'ece_high': 0.4964}
"""

_CITATION = """
@inproceedings{guo2017calibration,
  title     = {On Calibration of Modern Neural Networks},
  author    = {Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle = {Proceedings of the 34th International Conference on Machine Learning},
  series    = {Proceedings of Machine Learning Research},
  volume    = {70},
  pages     = {1321--1330},
  year      = {2017}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Ece(EvaluateInputChecks, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
            reference_urls=["https://arxiv.org/abs/1706.04599"],
        )

    def _compute(
        self, predictions, references, n_bins=15, binning="equal_width", norm="l1", from_logits=False,
        bootstrap=0, seed=0,
    ):
        """The error and, with ``bootstrap`` > 0, its interval; every option is described above."""
        options = {"n_bins": n_bins, "from_logits": from_logits}
        result = {"ece": expected_calibration_error(predictions, references, binning=binning, norm=norm, **options)}
        names = {"ece": _interval_metric(binning, norm)} if bootstrap else {}
        result.update(interval_columns(predictions, references, names, replicates=bootstrap, seed=seed, **options))
        return result


def _interval_metric(binning, norm):
    """The bootstrap metric of (binning, norm), or a ValueError naming the supported combinations."""
    if (binning, norm) not in _INTERVAL_METRICS:
        supported = ", ".join(f"binning={b!r} with norm={n!r}" for b, n in _INTERVAL_METRICS)
        raise ValueError(
            f"bootstrap intervals are offered for {supported}; got binning={binning!r} with norm={norm!r}. "
            f"Use one of these combinations, or bootstrap=0 for the error without an interval."
        )
    return _INTERVAL_METRICS[binning, norm]
