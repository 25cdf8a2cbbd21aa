"""Test data written to disk as users keep it (image folders, artifacts of a format this version refuses), shared by
test modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional


def write_image_folder(root: Path, splits: Dict[str, object], class_names: Optional[List[str]] = None) -> Path:
    """Write ``datasets`` splits with ``image``/``label`` columns as ``root/<split>/<class>/<n>.png``."""
    for split, rows in splits.items():
        names = class_names or rows.features["label"].names
        for number, (image, label) in enumerate(zip(rows["image"], rows["label"])):
            folder = root / split / names[label]
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{number}.png")
    return root


def format_one_artifact(folder: Path) -> None:
    """Turn a saved artifact into a format-1 one, as development versions wrote before the first release: version 1,
    no manifest and no digests."""
    from hf_calibrate.serialization import CALIBRATION_CONFIG

    record = json.loads((folder / CALIBRATION_CONFIG).read_text())
    record["format_version"] = 1
    for key in ("manifest", "sha256"):
        record["files"].pop(key)
    record.pop("record_sha256")
    (folder / CALIBRATION_CONFIG).write_text(json.dumps(record))
