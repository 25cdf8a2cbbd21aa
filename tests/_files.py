"""Test data written to disk as users keep it (image folders, artifacts of an older format), shared by test modules."""

from __future__ import annotations

import functools
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
    """Turn a saved artifact into what format 1 wrote (no manifest, no digests, no format-2 keys, version 1)."""
    from hf_calibrate.serialization import CALIBRATION_CONFIG
    from hf_calibrate.serialization.schema import RECORD_SCHEMA

    record = json.loads((folder / CALIBRATION_CONFIG).read_text())
    record["format_version"] = 1
    for path in (path for path, field in RECORD_SCHEMA.items() if field.since >= 2):  # every key format 2 added
        *parents, key = path.split(".")
        holder = functools.reduce(lambda part, name: part.get(name) or {}, parents, record)
        holder.pop(key, None)
    record.pop("record_sha256", None)
    record.pop("evaluation", None)
    (folder / CALIBRATION_CONFIG).write_text(json.dumps(record))
