"""Negative log-likelihood (NLL, log loss) as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.negative_log_likelihood`; the math and the
input validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, negative_log_likelihood, interval_columns

_DESCRIPTION = """
Negative log-likelihood (NLL, cross-entropy, log loss): the mean over samples of
-log p(true class), in nats. A strictly proper scoring rule, so it rewards both accuracy and
calibration. The probability is clamped at >= 1e-12 before the log, so a confidently wrong
sample costs at most -log(1e-12) = 27.6 nats.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): (N, C) class probabilities, each row summing
        to 1 (logits with `from_logits=True`).
    references (`list` of `int`): (N,) true class indices in [0, C).
    from_logits (`bool`, defaults to `False`): apply softmax to `predictions` first.
    bootstrap (`int`, defaults to 0): number R of Poisson-bootstrap replicates of a 95 %
        confidence interval of the NLL (`hf_calibrate.metrics.bootstrap_intervals`); 0 gives
        no interval. R from 1 to 99 is refused; R = 1000 is a good choice.
    seed (`int`, defaults to 0): seed of the bootstrap weights; the same seed and inputs give
        the same interval.

Returns:
    nll (`float`): mean negative log-likelihood in nats, in [0, -log(1e-12) ≈ 27.63]; lower is better.
    nll_low, nll_high (`float`, only with `bootstrap` > 0; None on fewer than 30 samples, with `no_interval_reason` saying why): the ends of its 95 % bootstrap
        percentile interval.

Examples:
    >>> import evaluate
    >>> from hf_calibrate import evaluate_module_path
    >>> nll = evaluate.load(evaluate_module_path("nll"))
    >>> round(nll.compute(predictions=[[0.5, 0.5], [0.25, 0.75]], references=[0, 1])["nll"], 4)
    0.4904
    >>> round(nll.compute(predictions=[[0.0, 0.0]], references=[1], from_logits=True)["nll"], 4)
    0.6931
    >>> results = nll.compute(predictions=[[0.5, 0.5], [0.25, 0.75]] * 50, references=[0, 1] * 50, bootstrap=500)
    >>> {name: round(value, 4) for name, value in results.items()}
    {'nll': 0.4904, 'nll_low': 0.449, 'nll_high': 0.5292}
"""

_CITATION = """
@article{gneiting2007strictly,
  title   = {Strictly Proper Scoring Rules, Prediction, and Estimation},
  author  = {Gneiting, Tilmann and Raftery, Adrian E.},
  journal = {Journal of the American Statistical Association},
  volume  = {102},
  number  = {477},
  pages   = {359--378},
  year    = {2007}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Nll(EvaluateInputChecks, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
            reference_urls=["https://doi.org/10.1198/016214506000001437"],
        )

    def _compute(self, predictions, references, from_logits=False, bootstrap=0, seed=0):
        """The NLL and, with ``bootstrap`` > 0, its interval; every option is described above."""
        result = {"nll": negative_log_likelihood(predictions, references, from_logits=from_logits)}
        result.update(
            interval_columns(
                predictions, references, {"nll": "nll"}, replicates=bootstrap, seed=seed, from_logits=from_logits
            )
        )
        return result
