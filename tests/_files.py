"""Test data written to disk as users keep it (image folders), shared by test modules."""

from __future__ import annotations

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
