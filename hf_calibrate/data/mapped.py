"""Map-style calibration data: indexable samples plus a collate into batches.

The fit batches by index with its own sampler (so data can be split, shuffled and sharded):
a ``DataLoader``'s ``dataset`` and ``collate_fn`` are reused, a map-style torch ``Dataset`` is
collated as the transformers convention or ``(input, label)`` pairs, and a ``datasets.Dataset``'s
rows become model inputs through :mod:`hf_calibrate.data.rows`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler, Subset
from torch.utils.data._utils.collate import default_collate

from .._errors import UserError
from ..backbones import Backbone, Inputs
from ..metrics._checks import describe_positions
from .batches import Batch, collate_rows, in_batches, pad_token_id, sample_collate, split_batch, tensor_bytes
from .labels import align_labels, data_class_names
from .random_state import preserved_random_state
from .rows import RowOptions, label_column, raw_row_converter, row_converter

# Preprocessed items are kept in memory for later epochs up to this many bytes.
DEFAULT_CACHE_BYTES = 2 << 30
#: each loader's samples as :func:`loader_dataset` drew them, with what they were drawn from, while the loader lives
_DRAWN: "weakref.WeakKeyDictionary[DataLoader, Tuple[Tuple[int, int, int], Any]]" = weakref.WeakKeyDictionary()


@dataclass
class PreparedData:
    """Indexable calibration data: ``dataset[i]`` is one item, ``collate(items)`` one batch.

    ``role`` names the data in messages (``"calibration data"``, ``"evaluation data"``, ...); ``user_batch`` is set when
    the user's ``DataLoader`` hands the samples over in order, in batches of that many, so that a message can name the
    user's batch of a sample (the fit makes batches of its own).
    """

    dataset: Any
    collate: Callable[[List[Any]], Batch]
    description: str
    name: Optional[str] = None  # dataset name and split, when the data records them
    split: Optional[str] = None
    preprocessed_here: bool = False  # the library turned raw images or texts into inputs (else: the user did)
    shuffle_block: Optional[int] = None  # shuffled batches permute all the samples at once (streams: within blocks)
    token_vocabularies: Dict[str, int] = field(default_factory=dict)  # token id input → the ids the model embeds for it
    class_names: Optional[List[str]] = None  # the data's class names by index, when the model records none
    role: str = "data"
    user_batch: Optional[int] = None

    def __len__(self) -> int:
        return len(self.dataset)

    def describe_samples(self, positions: Sequence[int]) -> str:
        """The samples at ``positions`` (dataset indices) for a message, with the user's batches when they are known."""
        if self.user_batch is None:
            return describe_positions(positions)
        return in_batches(positions, lambda position: divmod(position, self.user_batch))

    def first_inputs(self, count: int = 1) -> Inputs:
        """The model inputs of the first ``count`` samples (all, when there are fewer), as one batch."""
        return self.collate([self.dataset[index] for index in range(min(count, len(self.dataset)))])[0]

    def local_share(self, batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
        """This process's share of a global ``batch`` of indices: every ``world``-th one from ``rank``."""
        return batch[rank::world]

    def loader(self, index_batches: Sequence[Sequence[int]], num_workers: int = 0) -> DataLoader:
        """A DataLoader that yields one collated batch per list of indices.

        Its own generator seeds the worker processes, so iterating it draws nothing from
        torch's global generator (a fit leaves the user's random state as it found it).
        """
        index_lists = [indices.tolist() if isinstance(indices, torch.Tensor) else list(indices) for indices in index_batches]
        return DataLoader(self.dataset, batch_sampler=index_lists, collate_fn=self.collate, num_workers=num_workers,
                          generator=torch.Generator().manual_seed(0))


class CachedItems(Dataset):
    """``fn(source[i])`` memoised in memory until ``max_bytes`` of tensors are held."""

    def __init__(self, source: Any, fn: Callable[[Any], Any], max_bytes: int) -> None:
        self.source, self.fn, self.max_bytes = source, fn, max_bytes
        self._items: Dict[int, Any] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        if index in self._items:
            return self._items[index]
        item = self.fn(self.source[index])
        size = tensor_bytes(item)
        if self._bytes + size <= self.max_bytes:
            self._items[index] = item
            self._bytes += size
        return item


def datasets_rows(data: Any, backbone: Backbone, options: RowOptions, cache_bytes: int) -> PreparedData:
    """A ``datasets.Dataset`` whose labels are matched to the model's and whose rows become model inputs."""
    columns = list(data.column_names)
    column = label_column(columns, options)
    class_names = data_class_names(data, column, backbone)
    data = align_labels(data, column, backbone)
    to_item, preprocessed_here = row_converter(columns, backbone, options)
    pad_id = pad_token_id(backbone)
    name = getattr(data.info, "dataset_name", None) or None
    split = str(data.split) if data.split is not None else None
    return PreparedData(
        CachedItems(data, to_item, cache_bytes),
        lambda items: split_batch(collate_rows(items, pad_id), backbone),
        f"{name or 'datasets.Dataset'}{f' ({split})' if split else ''}, {len(data)} rows",
        name=name,
        split=split,
        preprocessed_here=preprocessed_here,
        class_names=class_names,
    )


def loader_dataset(loader: DataLoader) -> Any:
    """The samples a ``DataLoader`` over a map-style dataset yields, as a map-style dataset: its dataset when it yields
    every sample once (in order or shuffled), else a ``Subset`` of the indices it yields, in index order (a
    ``SubsetRandomSampler``'s part, a ``BatchSampler`` over part of the indices, one draw of a ``WeightedRandomSampler``
    without replacement, a custom sampler's). ``drop_last`` is not applied: every sample is used. A sampler that draws
    with replacement, or yields a sample twice, is refused, naming the fix (calibration reads each sample once).

    A sampler is drawn once per loader object (kept while the loader lives), with the user's random state restored
    after it (:func:`.random_state.preserved_random_state`): the rows a fit reads are the rows it names and digests,
    and a later evaluation of the same loader reads them again."""
    key = (len(loader.dataset), id(loader.sampler), id(loader.batch_sampler))
    drawn = _DRAWN.get(loader)
    if drawn is None or drawn[0] != key:
        drawn = (key, _loader_samples(loader))
        _DRAWN[loader] = drawn
    return drawn[1]


def _loader_samples(loader: DataLoader) -> Any:
    """:func:`loader_dataset`, drawn now."""
    batches = loader.batch_sampler
    sampler = batches.sampler if isinstance(batches, BatchSampler) else loader.sampler if batches is None else None
    named = type(sampler if sampler is not None else batches).__name__
    if getattr(sampler, "replacement", False):
        raise UserError(f"a DataLoader whose {named} draws samples with replacement: calibration reads "
                        "each sample once. Pass a DataLoader without that sampler, or a Subset of the samples to use.")
    if _reads_every_sample_once(sampler, len(loader.dataset)):
        return loader.dataset
    with preserved_random_state(loader, sampler, batches):
        indices = _drawn_indices(sampler if sampler is not None else batches, named)
    if len(set(indices)) < len(indices):
        raise UserError(f"a DataLoader whose {named} yields some samples more than once ({len(indices)} draws of "
                        f"{len(set(indices))} samples): calibration reads each sample once. Pass a sampler that "
                        "yields each sample once, or a Subset of the samples to use.")
    if len(indices) == len(loader.dataset):
        return loader.dataset
    return Subset(loader.dataset, sorted(indices))


def _reads_every_sample_once(sampler: Any, samples: int) -> bool:
    """Whether ``sampler`` is known to yield each of the ``samples`` indices once without iterating it."""
    if isinstance(sampler, SequentialSampler):
        return len(sampler) == samples
    return isinstance(sampler, RandomSampler) and not sampler.replacement and len(sampler) == samples


def _drawn_indices(drawn: Iterable[Any], named: str) -> List[int]:
    """The indices one pass of ``drawn`` (a sampler, or a batch sampler of index lists, tensors or ranges) yields,
    flattened; one yielding more items than its ``len()`` says is refused (it may never end)."""
    limit = len(drawn) if hasattr(drawn, "__len__") else None
    indices: List[int] = []
    for count, item in enumerate(drawn, start=1):
        if limit is not None and count > limit:
            raise UserError(f"a DataLoader whose {named} yields more than the {limit} items its len() says: it may never "
                            "end. Pass a sampler that yields each sample once, or a Subset of the samples to use.")
        values = item.reshape(-1).tolist() if isinstance(item, (torch.Tensor, np.ndarray)) else item
        indices.extend(int(index) for index in (values if isinstance(values, Iterable) else [values]))
    return indices


def loader_samples(loader: DataLoader, backbone: Backbone) -> PreparedData:
    """A ``DataLoader`` over a map-style dataset of samples (:func:`loader_dataset`): its samples and collate (ours
    when it does not batch), batched by our own indices."""
    dataset = loader_dataset(loader)
    description = f"DataLoader({type(loader.dataset).__name__}, {len(dataset)} samples)"
    if loader.batch_size is None and loader.batch_sampler is None:  # its collate_fn only converts single samples
        return PreparedData(dataset, sample_collate(backbone), description)
    collate = loader.collate_fn or default_collate
    size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)  # the user's batches, for messages
    in_order = loader.batch_size is not None and isinstance(loader.sampler, SequentialSampler) and not loader.drop_last
    return PreparedData(dataset, lambda items: split_batch(collate(items), backbone, size), description,
                        user_batch=size if in_order else None)


def map_style_samples(data: Any, backbone: Backbone, options: RowOptions, cache_bytes: int) -> PreparedData:
    """A map-style torch ``Dataset`` (or sequence) of samples: dicts or ``(input, label)`` pairs, optionally ``preprocess``-ed,
    or dict rows of raw images or texts preprocessed with the model's own preprocessing."""
    description = f"{type(data).__name__}({len(data)} samples)"
    raw = raw_row_converter(data[0], backbone, options) if len(data) else None
    if raw is not None:
        pad_id = pad_token_id(backbone)
        return PreparedData(CachedItems(data, raw, cache_bytes), lambda items: split_batch(collate_rows(items, pad_id), backbone),
                            description, preprocessed_here=True)
    if options.preprocess is not None:
        data = CachedItems(data, options.preprocess, cache_bytes)
    return PreparedData(data, sample_collate(backbone, options.label_column), description)
