"""Every calibration metric of hf_calibrate at once, as a Hugging Face ``evaluate`` metric.

A thin wrapper over :func:`hf_calibrate.metrics.calibration_report`; the math and the input
validation live there.
"""

import datasets
import evaluate

from hf_calibrate.metrics import EvaluateInputChecks, calibration_report, interval_columns
from hf_calibrate.metrics.intervals import DEFAULT_METRICS

_DESCRIPTION = """
The full calibration report of a classifier in one pass: accuracy, expected calibration
error (ECE, equal-width bins), adaptive ECE (AdaECE, equal-mass bins), maximum calibration
error (MCE), RMS calibration error, classwise ECE, negative log-likelihood (NLL) and the
Brier score (summed over classes), plus the number of samples.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): (N, C) class probabilities, each row summing
        to 1 (logits with `from_logits=True`).
    references (`list` of `int`): (N,) true class indices in [0, C).
    n_bins (`int`, defaults to 15): number of bins B of every binned metric.
    from_logits (`bool`, defaults to `False`): apply softmax to `predictions` first.
    bootstrap (`int`, defaults to 0): number R of Poisson-bootstrap replicates of a 95 %
        confidence interval of each metric below but `classwise_ece` and `num_samples`
        (`hf_calibrate.metrics.bootstrap_intervals`); 0 gives no interval. R from 1 to 99 is refused; R = 1000 is a good choice.
    seed (`int`, defaults to 0): seed of the bootstrap weights; the same seed and inputs give
        the same interval.

Returns:
    accuracy (`float`): fraction of argmax predictions equal to the label, in [0, 1].
    ece (`float`): expected calibration error, equal-width bins, in [0, 1].
    ada_ece (`float`): adaptive ECE, equal-mass bins, in [0, 1].
    mce (`float`): maximum calibration error over non-empty equal-width bins, in [0, 1].
    rms_ce (`float`): root-mean-square calibration error, equal-width bins, in [0, 1].
    classwise_ece (`float`): classwise ECE averaged over classes, in [0, 1].
    nll (`float`): mean negative log-likelihood in nats, in [0, -log(1e-12) ≈ 27.63].
    brier (`float`): Brier score summed over classes, in [0, 2].
    num_samples (`int`): N.
    <metric>_low, <metric>_high (`float`, only with `bootstrap` > 0; None on fewer than 30 samples, with `no_interval_reason` saying why): the ends of the 95 %
        bootstrap interval of accuracy, ece, ada_ece, mce, rms_ce, nll and brier (percentile
        intervals for accuracy, NLL and Brier; for the calibration errors shifted by the
        bootstrap bias, low cut at 0).
    Lower is better for every metric but accuracy.

Examples:
    >>> import evaluate
    >>> from hf_calibrate import evaluate_module_path
    >>> calibration = evaluate.load(evaluate_module_path("calibration"))
    >>> probs = [[0.95, 0.05], [0.85, 0.15], [0.35, 0.65]]
    >>> results = calibration.compute(predictions=probs, references=[0, 1, 1], n_bins=10)
    >>> {name: round(value, 4) for name, value in sorted(results.items())}  # doctest: +NORMALIZE_WHITESPACE
    {'accuracy': 0.6667, 'ada_ece': 0.4167, 'brier': 0.565, 'classwise_ece': 0.4167, 'ece': 0.4167,
     'mce': 0.85, 'nll': 0.7931, 'num_samples': 3, 'rms_ce': 0.5315}
    >>> results = calibration.compute(predictions=probs * 20, references=[0, 1, 1] * 20, n_bins=10, bootstrap=200)
    >>> round(results["ece"], 4), round(results["ece_low"], 4), round(results["ece_high"], 4)
    (0.4167, 0.3365, 0.4964)
    >>> sorted(name for name in results if name.endswith("_low"))
    ['accuracy_low', 'ada_ece_low', 'brier_low', 'ece_low', 'mce_low', 'nll_low', 'rms_ce_low']
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
@inproceedings{nixon2019measuring,
  title     = {Measuring Calibration in Deep Learning},
  author    = {Nixon, Jeremy and Dusenberry, Michael W. and Zhang, Linchuan and Jerfel, Ghassen and Tran, Dustin},
  booktitle = {IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR) Workshops},
  year      = {2019}
}
@inproceedings{mukhoti2020calibrating,
  title     = {Calibrating Deep Neural Networks using Focal Loss},
  author    = {Mukhoti, Jishnu and Kulharia, Viveka and Sanyal, Amartya and Golodetz, Stuart and
               Torr, Philip H. S. and Dokania, Puneet K.},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {33},
  year      = {2020}
}
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
class Calibration(EvaluateInputChecks, evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
            ),
            reference_urls=["https://arxiv.org/abs/1706.04599", "https://arxiv.org/abs/1904.01685"],
        )

    def _compute(self, predictions, references, n_bins=15, from_logits=False, bootstrap=0, seed=0):
        """The report and, with ``bootstrap`` > 0, its intervals; every option is described above."""
        options = {"n_bins": n_bins, "from_logits": from_logits}
        result = calibration_report(predictions, references, **options)
        names = {name: name for name in result if name in DEFAULT_METRICS}
        result.update(interval_columns(predictions, references, names, replicates=bootstrap, seed=seed, **options))
        return result
