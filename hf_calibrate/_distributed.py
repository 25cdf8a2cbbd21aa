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


def all_gather_parts(values: torch.Tensor) -> List[torch.Tensor]:
    """Every process's ``values`` (first dimensions may differ), as a list in rank order."""
    world = world_size()
    if world == 1:
        return [values]
    length = torch.tensor([values.shape[0]], device=values.device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    longest = max(int(n) for n in lengths)
    padded = values.new_zeros((longest, *values.shape[1:]))
    padded[: values.shape[0]] = values
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [part[: int(n)] for part, n in zip(gathered, lengths)]


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
