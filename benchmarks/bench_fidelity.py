"""Fidelity of our Neural Clamping, TST and V-TST against the authors' own code.

Both implementations run in one process on the same frozen zoo model (``hf_calibrate.demo``),
the same tensors and the same hyper-parameters; differences and their causes are itemised in
``docs/fidelity-review.md`` (N1–N6, V1–V8). The authors' code is called at run time from a
local copy — nothing of it is copied here, and nothing is fetched:

* ``HF_CALIBRATE_NCTOOLKIT``: a copy of https://github.com/yungchentang/NCToolkit (the folder
  holding the ``neural_clamping`` package), ``HF_CALIBRATE_NCTOOLKIT_COMMIT`` its commit;
* ``HF_CALIBRATE_TST_REFERENCE``: a copy of
  https://github.com/MJordahn/Decoupled-Layers-for-Calibrated-NNs (the folder holding ``src``),
  ``HF_CALIBRATE_TST_REFERENCE_COMMIT`` its commit.

A git checkout needs no ``*_COMMIT`` (``git rev-parse HEAD`` is read). A part whose copy is
missing prints what to set and is skipped.

Part A (``nc``): Neural Clamping, ours (``CalibratedModel.fit``, ``holdout_fraction=0``,
``delta_init="random"``) vs ``NCWrapper.train_NC`` on the digits CNN and ViT, per seed on the
calibration half of ``bench_quality``'s stratified halves; the authors' demo hyper-parameters
(focal γ = 1, λ = 0.01, SGD lr 0.01 momentum 0.9, batch 1000, T starting at 1). Both start from
the same δ₀ (ours, N(0, 0.001²)) and see the same batches: their ``DataLoader`` replays our
engine's seeded batches epoch by epoch. Only their ``.cuda()`` calls are patched (scoped).
Plus: their ``FocalLoss`` and ``ECE`` against ours on random logits, and an augmentation arm
(their CIFAR-100 recipe vs ours' ``augment=True``) on the CNN.

Part B (``heads``): TST / V-TST, ours vs their ``TST``/``VTST(bound_qzx_var=True)`` trained by
``lightning`` with their ``TS_Module``/``VTST_Module`` and ``ModelCheckpoint(monitor=
"valid_loss_epoch")``, on cached penultimate features of the digits CNN, ViT and MiniLM: the
calibration half split 80/20 (stratified, per seed) into train/validation for both, batch 256,
Adam 1e-4, Z = 128, the epochs of ours' default schedule for that size. Test-time V-TST with
M = 1 and M = 10 samples for both. Plus ours in the "paper protocol": the head trained on the
base's own training rows, validated on the calibration half.

Usage::

    HF_CALIBRATE_NCTOOLKIT=... HF_CALIBRATE_TST_REFERENCE=... python benchmarks/bench_fidelity.py
    python benchmarks/bench_fidelity.py --parts heads --seeds 1 --models digits_cnn
    python benchmarks/bench_fidelity.py --quick      # the CNN, 1 seed, tiny schedules; prints only
    python benchmarks/bench_fidelity.py --raw /tmp/fidelity.json     # also keep every number and per-epoch curve
    python benchmarks/bench_fidelity.py --render /tmp/fidelity.json  # rebuild the report from that file

Part A is ``_fidelity_nc.py``, part B ``_fidelity_heads.py``, the report's tables and notes
``_fidelity_report.py``; the schedules both sides share, the reference copies and the scoped
patches ``_fidelity_common.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import _report
from _fidelity_common import NC_DEMO, Reference, find_reference, import_decoupled, import_nctoolkit
from _fidelity_heads import run_heads
from _fidelity_nc import run_nc
from _fidelity_report import report_lines

NAME = "fidelity"
NC_MODELS = ("digits_cnn", "digits_vit")
HEAD_MODELS = ("digits_cnn", "digits_vit", "bbc_minilm")
@dataclasses.dataclass
class Results:
    """Both parts' measurements (None when not run), the reference code found per part, and the seeds."""

    nc: Optional[Dict[str, Any]]
    heads: Optional[Dict[str, Any]]
    references: Dict[str, Optional[Reference]]
    seeds: List[int]


def save_raw(path: Path, header: List[str], results: Results) -> None:
    """Every measured number and per-epoch curve, with the report header, as JSON (``--render`` rebuilds the report)."""
    refs = {part: dataclasses.asdict(ref) | {"path": str(ref.path)} if ref else None for part, ref in results.references.items()}
    path.write_text(json.dumps({"header": header, "references": refs, "nc": results.nc, "heads": results.heads}))
    print(f"wrote {path}", file=sys.stderr)


def render_raw(path: Path) -> str:
    """The report of a run saved with ``--raw``."""
    raw = json.loads(path.read_text())
    references = {part: Reference(**{**ref, "path": Path(ref["path"])}) if ref else None for part, ref in raw["references"].items()}
    return "\n".join(raw["header"] + report_lines(raw["nc"], raw["heads"], references))


def measure(args: argparse.Namespace) -> Results:
    """Run the parts asked for whose reference code is present."""
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    chosen = args.models.split(",") if args.models else (["digits_cnn"] if args.quick else None)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    references = {part: find_reference(part) if part in parts else None for part in ("nc", "heads")}
    nc = heads = None
    if references["nc"] is not None:
        models = [m for m in (chosen or NC_MODELS) if m in NC_MODELS]
        nc = run_nc(import_nctoolkit(references["nc"]), models, seeds, args.nc_epochs or (3 if args.quick else NC_DEMO["epochs"]))
    if references["heads"] is not None:
        models = [m for m in (chosen or HEAD_MODELS) if m in HEAD_MODELS]
        heads = run_heads(import_decoupled(references["heads"]), models, seeds, 5 if args.quick else None)
    return Results(nc, heads, references, seeds)


def report(session: _report.Session, results: Results) -> str:
    """The Markdown report; with ``--raw`` its header and every number are also saved as JSON."""
    header = session.header("Fidelity: our Neural Clamping, TST and V-TST against the authors' code",
                            ["torch", "timm", "transformers", "lightning", "torchmetrics"],
                            extra=f"Seeds: {len(results.seeds)} (bench_quality's stratified calibration / test halves per seed).")
    if session.args.raw:
        save_raw(session.args.raw, header, results)
    return "\n".join(header + report_lines(results.nc, results.heads, results.references))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Measure the parts asked for (or render a --raw file) and write the report."""
    parser = _report.parser(__doc__, default_repeats=1, quick_repeats=1)
    parser.add_argument("--parts", default="nc,heads", help="comma-separated subset of nc,heads")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 3; --quick 1)")
    parser.add_argument("--models", default=None, help="comma-separated zoo models (default: all of each part; --quick: digits_cnn)")
    parser.add_argument("--nc-epochs", type=int, default=None, help=f"Neural Clamping epochs (default {NC_DEMO['epochs']}, the demo's; --quick 3)")
    parser.add_argument("--raw", type=Path, default=None, help="also write every measured number and per-epoch curve to this JSON file")
    parser.add_argument("--render", type=Path, default=None, help="measure nothing: rebuild the report from a --raw file")
    args = _report.parse(parser, argv)
    session = _report.Session("bench_fidelity.py", args)
    if args.render:
        session.finish(render_raw(args.render), NAME)
        return 0
    results = measure(args)
    if results.nc is None and results.heads is None:
        print("nothing to compare: no reference code found (see the messages above)", file=sys.stderr)
        return 0
    session.finish(report(session, results), NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
