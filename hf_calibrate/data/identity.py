"""How data are named and recognised: the dataset behind a DataLoader, what stands for data when asking whether two
are the same, and the display name, split and fingerprint results give them.

A display name is given by the caller (the CLI gives the folder, file or hub id it read), else taken from the data: a
``datasets`` name, except the names of ``datasets``' file readers ("imagefolder", "csv", ...), which say only how the
files were read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

from torch.utils.data import DataLoader, IterableDataset

#: ``datasets`` builders that read local files: their name says how the data were read, not what they are
FILE_BUILDERS = frozenset({
    "arrow", "audiofolder", "csv", "generator", "imagefolder", "json", "pandas", "parquet", "sql", "text",
    "videofolder", "webdataset", "xml",
})


def data_source(data: Any) -> Any:
    """The dataset behind ``data``: a DataLoader's samples (its dataset, or the part its sampler reads:
    :func:`hf_calibrate.data.mapped.loader_dataset`), else ``data`` itself."""
    if isinstance(data, DataLoader) and not isinstance(data.dataset, IterableDataset):
        from .mapped import loader_dataset

        return loader_dataset(data)
    return data.dataset if isinstance(data, DataLoader) else data


def data_identity(data: Any) -> Any:
    """What stands for ``data`` when asking whether two data are the same: the dataset behind a DataLoader; for a
    list or tuple of batches (which cannot be weakly referenced) the first tensor of its first batch; else ``data``."""
    source = data_source(data)
    if isinstance(source, (list, tuple)) and source:
        first = source[0]
        values = first.values() if isinstance(first, Mapping) else first if isinstance(first, (list, tuple)) else (first,)
        return next((value for value in values if hasattr(value, "shape") and hasattr(value, "dtype")), source)  # a tensor or array
    return source


def is_datasets_object(data: Any) -> bool:
    """Whether ``data`` is an object of the ``datasets`` library (checked by its module, without importing it)."""
    return type(data).__module__.split(".")[0] == "datasets"


def source_display_name(source: str) -> str:
    """How results name a dataset given as a path or hub id: a local folder or file by its name, a hub id as it is."""
    path = Path(source)
    return Path(os.path.abspath(path)).name if path.exists() else source


def data_display_name(data: Any) -> str:
    """How results name ``data`` when the caller gives no name: its ``datasets`` name, else what kind of data it is."""
    source = data_source(data)
    name = getattr(getattr(source, "info", None), "dataset_name", None) if is_datasets_object(source) else None
    if name:
        return f"local {name} files" if name in FILE_BUILDERS else str(name)
    kind = type(source).__name__
    return f"datasets.{kind}" if is_datasets_object(source) else kind


def data_split(data: Any) -> Optional[str]:
    """The split a ``datasets.Dataset`` records (None for other data)."""
    source = data_source(data)
    split = getattr(source, "split", None) if is_datasets_object(source) else None
    return str(split) if split is not None else None


def data_fingerprint(data: Any) -> Optional[str]:
    """The fingerprint of a ``datasets.Dataset`` (the same rows through the same transforms give the same one)."""
    source = data_source(data)
    fingerprint = getattr(source, "_fingerprint", None) if is_datasets_object(source) else None
    return fingerprint if isinstance(fingerprint, str) else None
