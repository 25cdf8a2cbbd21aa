"""Collectives over ``torch.distributed`` that are no-ops in a single process.

Accelerate and torchrun initialise the default process group; these helpers only use it.
"""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist


def world_size() -> int:
    """Number of processes in the default group (1 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def rank() -> int:
    """Rank of this process in the default group (0 when not distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` in place over all processes and return it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` in place with the copy held by process ``src``."""
    if world_size() > 1:
        dist.broadcast(tensor, src=src)
    return tensor


#: trailing dimensions a tensor gathered by :func:`all_gather_parts` may have
MAX_TRAILING_DIMS = 4


def all_gather_parts(values: torch.Tensor) -> List[torch.Tensor]:
    """Every process's ``values`` (first dimensions may differ), as a list in rank order.

    A process with no rows (first dimension 0) may hold them in any shape: it takes the
    trailing shape of the processes that have rows (e.g. an empty ``torch.empty(0)`` beside
    (n, C) logits elsewhere).
    """
    world = world_size()
    if world == 1:
        return [values]
    trailing = list(values.shape[1:])
    if len(trailing) > MAX_TRAILING_DIMS:
        raise ValueError(f"all_gather_parts takes at most {MAX_TRAILING_DIMS} trailing dimensions, got {len(trailing)}.")
    header = torch.tensor([values.shape[0], len(trailing), *trailing, *[0] * (MAX_TRAILING_DIMS - len(trailing))], device=values.device)
    headers = [torch.zeros_like(header) for _ in range(world)]
    dist.all_gather(headers, header)
    lengths = [int(h[0]) for h in headers]
    shapes = {tuple(int(d) for d in h[2 : 2 + int(h[1])]) for h in headers if int(h[0]) > 0}
    if len(shapes) > 1:
        raise RuntimeError(f"processes hold rows of different shapes {sorted(shapes)}; they cannot be gathered.")
    shape = shapes.pop() if shapes else tuple(trailing)
    padded = values.new_zeros((max(lengths), *shape))
    padded[: values.shape[0]] = values.reshape(values.shape[0], *shape)
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [part[:n] for part, n in zip(gathered, lengths)]


def all_gather_variable(values: torch.Tensor) -> torch.Tensor:
    """Concatenate, in rank order, tensors whose first dimension differs between processes."""
    return torch.cat(all_gather_parts(values))


def all_gather_text(text: str, device: torch.device) -> List[str]:
    """Every process's ``text``, in rank order (sent as UTF-8 bytes; no pickling)."""
    encoded = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8, device=device)
    return [bytes(part.cpu().tolist()).decode("utf-8") for part in all_gather_parts(encoded)]


def shut_down() -> None:
    """Leave the default process group cleanly (wait for every process, then destroy it).

    A process that exits with the gloo group still alive can abort in its C++ destructors
    ("terminate called without an active exception"); scripts launched with torchrun or
    ``accelerate launch`` call this before they return. A no-op when not distributed.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
