"""Negative log-likelihood (NLL, log loss) as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.negative_log_likelihood`; the math and the
input validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, negative_log_likelihood

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

Returns:
    nll (`float`): mean negative log-likelihood in nats, in [0, -log(1e-12) ≈ 27.63]; lower is better.

Examples:
    >>> import evaluate
    >>> nll = evaluate.load("evaluate_metrics/nll")
    >>> round(nll.compute(predictions=[[0.5, 0.5], [0.25, 0.75]], references=[0, 1])["nll"], 4)
    0.4904
    >>> round(nll.compute(predictions=[[0.0, 0.0]], references=[1], from_logits=True)["nll"], 4)
    0.6931
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

    def _compute(self, predictions, references, **kwargs):
        """kwargs: ``from_logits`` (see above)."""
        return {"nll": negative_log_likelihood(predictions, references, **kwargs)}
