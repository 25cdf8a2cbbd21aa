"""Expected calibration error (ECE) as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.expected_calibration_error`; the math and
the input validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, expected_calibration_error

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

Returns:
    ece (`float`): the calibration error, in [0, 1]; lower is better.

Examples:
    >>> import evaluate
    >>> ece = evaluate.load("evaluate_metrics/ece")
    >>> probs = [[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]]
    >>> results = ece.compute(predictions=probs, references=[0, 1, 1], n_bins=10)
    >>> round(results["ece"], 4)
    0.4167
    >>> round(ece.compute(predictions=probs, references=[0, 1, 1], n_bins=10, norm="max")["ece"], 4)
    0.85
    >>> logits = [[2.0, 0.0], [0.0, 1.0]]
    >>> round(ece.compute(predictions=logits, references=[0, 0], from_logits=True)["ece"], 4)
    0.4251
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

    def _compute(self, predictions, references, **kwargs):
        """kwargs: ``n_bins``, ``binning``, ``norm``, ``from_logits`` (see above)."""
        return {"ece": expected_calibration_error(predictions, references, **kwargs)}
