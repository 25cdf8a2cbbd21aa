"""Multiclass Brier score as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.brier_score`; the math and the input
validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, brier_score, interval_columns

_DESCRIPTION = """
Brier score: the mean over samples of the squared distance between the probability vector
and the one-hot label, sum_k (p_k - [y = k])^2. It is SUMMED over the C classes (Brier's
original definition), so it lies in [0, 2]; sklearn-style multiclass Brier scores divide by C.
A strictly proper scoring rule: it rewards both accuracy and calibration.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): (N, C) class probabilities, each row summing
        to 1 (logits with `from_logits=True`).
    references (`list` of `int`): (N,) true class indices in [0, C).
    from_logits (`bool`, defaults to `False`): apply softmax to `predictions` first.
    bootstrap (`int`, defaults to 0): number R of Poisson-bootstrap replicates of a 95 %
        confidence interval of the Brier score (`hf_calibrate.metrics.bootstrap_intervals`);
        0 gives no interval. R from 1 to 99 is refused; R = 1000 is a good choice.
    seed (`int`, defaults to 0): seed of the bootstrap weights; the same seed and inputs give
        the same interval.

Returns:
    brier (`float`): the Brier score summed over classes, in [0, 2]; lower is better.
    brier_low, brier_high (`float`, only with `bootstrap` > 0; None on fewer than 30 samples, with `no_interval_reason` saying why): the ends of its 95 % bootstrap
        percentile interval.

Examples:
    >>> import evaluate
    >>> from hf_calibrate import evaluate_module_path
    >>> brier = evaluate.load(evaluate_module_path("brier"))
    >>> brier.compute(predictions=[[0.5, 0.5], [0.25, 0.75]], references=[0, 1])
    {'brier': 0.3125}
    >>> brier.compute(predictions=[[0.0, 0.0]], references=[1], from_logits=True)
    {'brier': 0.5}
    >>> results = brier.compute(predictions=[[0.5, 0.5], [0.25, 0.75]] * 50, references=[0, 1] * 50, bootstrap=500)
    >>> {name: round(value, 4) for name, value in results.items()}
    {'brier': 0.3125, 'brier_low': 0.2742, 'brier_high': 0.3484}
"""

_CITATION = """
@article{brier1950verification,
  title   = {Verification of Forecasts Expressed in Terms of Probability},
  author  = {Brier, Glenn W.},
  journal = {Monthly Weather Review},
  volume  = {78},
  number  = {1},
  pages   = {1--3},
  year    = {1950}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Brier(EvaluateInputChecks, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
            reference_urls=["https://doi.org/10.1175/1520-0493(1950)078<0001:VOFEIT>2.0.CO;2"],
        )

    def _compute(self, predictions, references, from_logits=False, bootstrap=0, seed=0):
        """The Brier score and, with ``bootstrap`` > 0, its interval; every option is described above."""
        result = {"brier": brier_score(predictions, references, from_logits=from_logits)}
        result.update(
            interval_columns(
                predictions, references, {"brier": "brier"}, replicates=bootstrap, seed=seed, from_logits=from_logits
            )
        )
        return result
