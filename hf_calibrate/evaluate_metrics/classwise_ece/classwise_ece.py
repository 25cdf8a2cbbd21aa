"""Classwise expected calibration error (static calibration error, SCE) as a Hugging Face
``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.classwise_calibration_error`; the math and
the input validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, classwise_calibration_error

_DESCRIPTION = """
Classwise expected calibration error (also called static calibration error, SCE): the
calibration of every class probability, not only the top one. For each class k, the N
probabilities p_k are put in B equal-width bins and each bin's mean p_k is compared with the
frequency of label k in that bin; the per-class ECEs are averaged over the C classes.
0 means every class probability is calibrated.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): (N, C) class probabilities, each row summing
        to 1 (logits with `from_logits=True`).
    references (`list` of `int`): (N,) true class indices in [0, C).
    n_bins (`int`, defaults to 15): number of equal-width bins B per class.
    from_logits (`bool`, defaults to `False`): apply softmax to `predictions` first.

Returns:
    classwise_ece (`float`): the classwise calibration error, in [0, 1]; lower is better.

Examples:
    >>> import evaluate
    >>> from hf_calibrate import evaluate_module_path
    >>> classwise_ece = evaluate.load(evaluate_module_path("classwise_ece"))
    >>> probs = [[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]]
    >>> results = classwise_ece.compute(predictions=probs, references=[0, 1, 1], n_bins=10)
    >>> round(results["classwise_ece"], 4)
    0.4167
"""

_CITATION = """
@inproceedings{nixon2019measuring,
  title     = {Measuring Calibration in Deep Learning},
  author    = {Nixon, Jeremy and Dusenberry, Michael W. and Zhang, Linchuan and Jerfel, Ghassen and Tran, Dustin},
  booktitle = {IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR) Workshops},
  year      = {2019}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ClasswiseEce(EvaluateInputChecks, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
            reference_urls=["https://arxiv.org/abs/1904.01685"],
        )

    def _compute(self, predictions, references, n_bins=15, from_logits=False):
        """The classwise ECE; the options are described above."""
        error = classwise_calibration_error(predictions, references, n_bins=n_bins, from_logits=from_logits)
        return {"classwise_ece": error}
