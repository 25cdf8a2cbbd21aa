"""Labelled data named by a string: a local folder or file, or a ``datasets`` hub id, as splits with labels the model's.

:func:`load_splits` reads every split of a source (a ``save_to_disk`` folder, per-split CSV /
JSON-lines / Parquet files, image folders, one table file, or a hub id — offline, from the local
cache); :func:`select_split` picks one by name or preference; :func:`align_split_labels` finds the
label column and matches class names to the model's labels (:func:`hf_calibrate.data.align_labels`).
:func:`read_labelled_splits` does all three for the splits a caller needs, by role.
Errors are :class:`~hf_calibrate._errors.UserError` in the wording of the command line, which reads
its ``--dataset`` with these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from .._errors import UserError
from ..backbones import Backbone
from .batches import LABEL_KEYS
from .labels import align_labels
from .rows import find_column

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
TABLE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_splits(source: str, *, token: Optional[str] = None) -> Any:
    """All splits of ``source`` as a ``datasets.DatasetDict`` (a local folder or file, or a hub id)."""
    import datasets

    path = Path(source)
    try:
        if path.is_dir():
            return _folder_splits(path)
        if path.is_file():
            return _table_splits({path.stem: path})
        splits = datasets.load_dataset(source, token=token)
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - any reader failure is a problem with the user's data
        where = "local dataset" if path.exists() else "dataset (not a local file or folder; offline, hub datasets load from the cache only)"
        raise UserError(f"could not read the {where} {source!r}: {type(error).__name__}: {error}") from error
    return splits if isinstance(splits, datasets.DatasetDict) else datasets.DatasetDict({"train": splits})


def _folder_splits(folder: Path) -> Any:
    """A ``save_to_disk`` folder, per-split table files, or image folders (per split, or one split of classes)."""
    import datasets

    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        loaded = datasets.load_from_disk(str(folder))
        return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    tables = {entry.stem: entry for entry in sorted(folder.iterdir()) if entry.suffix.lower() in TABLE_BUILDERS}
    if tables:
        return _table_splits(tables)
    images = [entry for entry in folder.rglob("*") if entry.suffix.lower() in IMAGE_SUFFIXES]
    depths = {len(image.relative_to(folder).parts) for image in images}
    if depths == {2}:  # <class>/<image>: one split
        return datasets.load_dataset("imagefolder", data_dir=str(folder))
    if depths == {3}:  # <split>/<class>/<image>
        files: Dict[str, List[str]] = {}
        for image in sorted(images):
            files.setdefault(image.relative_to(folder).parts[0], []).append(str(image))
        return datasets.load_dataset("imagefolder", data_files=files)
    raise UserError(
        f"{folder} is not a dataset folder this command reads: expected <split>/<class>/<image> or <class>/<image> "
        "image folders, <split>.csv / <split>.jsonl files, or a datasets.save_to_disk folder."
    )


def _table_splits(files: Dict[str, Path]) -> Any:
    """CSV / JSON-lines / Parquet files, one split each, named after the file."""
    import datasets

    builders = {TABLE_BUILDERS.get(path.suffix.lower()) for path in files.values()}
    if None in builders or len(builders) > 1:
        raise UserError(f"cannot read {sorted(str(p) for p in files.values())} as one dataset: use files of one kind "
                        f"({', '.join(sorted(TABLE_BUILDERS))}).")
    builder = builders.pop()
    options = {"delimiter": "\t"} if all(path.suffix.lower() == ".tsv" for path in files.values()) else {}
    return datasets.load_dataset(builder, data_files={split: str(path) for split, path in files.items()}, **options)


def select_split(available: Sequence[str], requested: Optional[str], preferred: Sequence[str], flag: str) -> str:
    """``requested`` of the ``available`` split names, else the first ``preferred`` one present, else the only one;
    ``flag`` names the option that chooses it (in the error when none can be picked)."""
    if requested is not None:
        if requested not in available:
            raise UserError(f"the dataset has no split {requested!r}; its splits are {list(available)}.")
        return requested
    for name in preferred:
        if name in available:
            return name
    if len(available) == 1:
        return available[0]
    raise UserError(f"the dataset has the splits {list(available)}; choose one with {flag}.")


def label_column_of(data: Any, given: Optional[str]) -> str:
    """The label column of the ``datasets.Dataset`` ``data``: ``given``, else the first of :data:`LABEL_KEYS` present
    (the library's own lookup, :func:`hf_calibrate.data.rows.find_column`, in the command line's words)."""
    columns = list(data.column_names)
    try:
        return find_column(columns, given, LABEL_KEYS, "label")
    except ValueError:
        if given is not None:
            raise UserError(f"the dataset has no label column {given!r}; its columns are {columns}.") from None
        raise UserError(f"the dataset has no label column (looked for {list(LABEL_KEYS)} among {columns}); "
                        "name it with --label-column.") from None


def align_split_labels(data: Any, label_column: Optional[str], backbone: Backbone) -> Any:
    """``data`` with labels as the model's class indices: class names are matched by name.

    The matching is the library's own (:func:`hf_calibrate.data.align_labels`, which
    ``CalibratedModel.fit`` applies too); a missing label column is a UserError naming the flag.
    """
    return align_labels(data, label_column_of(data, label_column), backbone)


class LoadedData(NamedTuple):
    """The splits a command uses, by role (``"calibration"``, ``"validation"``, ``"evaluation"``; labels aligned to
    the model, roles given the same split share one object), their names by role, and every split of the dataset."""

    splits: Dict[str, Any]
    names: Dict[str, str]
    available: List[str]


def read_labelled_splits(
    source: str, backbone: Backbone, choose_splits: Callable[[List[str]], Dict[str, str]], *,
    label_column: Optional[str] = None, token: Optional[str] = None,
) -> LoadedData:
    """The splits of ``source`` that ``choose_splits`` picks (split names → {role: split name}), labels aligned."""
    splits = load_splits(source, token=token)
    names = choose_splits(list(splits))
    aligned = {name: align_split_labels(splits[name], label_column, backbone) for name in set(names.values())}
    return LoadedData({role: aligned[name] for role, name in names.items()}, names, list(splits))
