"""Data-parallel helpers for the multi-level trainer: the process group from torchrun's launch
protocol, a feature gather that keeps the local slice's gradient, and each rank's share of data.

The launcher (``resources/launcher.py``) runs a job with more than one GPU under
``python -m torch.distributed.run --standalone --nproc-per-node=<gpus>``; torchrun sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous variables that ``init_process_group`` reads
(``env://``). This module is plain Python (no Dagster) and reads the launch protocol only through
``torch.distributed``, like ``pipelines.launch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``world`` 1 means a plain single-process run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def backend_for(device: str) -> str:
    """NCCL moves CUDA tensors only and gloo CPU tensors only, so the backend follows the
    trainer's device, not whether the machine happens to have a GPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_from_env(device: str) -> DistInfo:
    """Join torchrun's process group (once) and return this rank; a process not launched by
    torchrun, or a group of one, is a plain run. Initialised here, before ``pipelines.launch``
    asks for the rank, so the backend matches the trainer's device."""
    if not (dist.is_available() and dist.is_torchelastic_launched()):
        return DistInfo()
    local_rank = dist.get_node_local_rank(fallback_rank=0)  # torchrun's LOCAL_RANK
    if not dist.is_initialized():
        backend = backend_for(device)
        if backend == "nccl":  # NCCL's collectives (barriers included) run on the current device
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def rank_device(device: str, info: DistInfo) -> str:
    """One GPU per rank: ``cuda`` becomes ``cuda:<local rank>``; an explicit index or CPU stays."""
    if info.distributed and device == "cuda":
        return f"cuda:{info.local_rank}"
    return device


def gather_features(x: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's rows of ``x`` concatenated in rank order, the local slice carrying its
    gradient (OpenCLIP's ``gather_features`` without ``gather_with_grad``): each rank's loss sees
    the global batch while back-propagating only into its own encoder pass, and DDP's gradient
    average then combines the ranks. Row counts may differ between ranks (the cross-level and ROI
    terms pair a varying number of items), so rows are padded to the largest count for the
    collective and cut back after."""
    if not info.distributed:
        return x
    counts = [torch.zeros((), dtype=torch.long, device=x.device) for _ in range(info.world)]
    dist.all_gather(counts, torch.tensor(x.shape[0], dtype=torch.long, device=x.device))
    sizes = [int(c) for c in counts]
    longest = max(sizes)
    padded = x.detach()
    if x.shape[0] < longest:
        padded = torch.cat([padded, padded.new_zeros((longest - x.shape[0], *x.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in range(info.world)]
    dist.all_gather(parts, padded.contiguous())
    pieces = [part[:n] for part, n in zip(parts, sizes, strict=True)]
    pieces[info.rank] = x
    return torch.cat(pieces)


def gather_objects(value: Any, info: DistInfo) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order; ``[value]`` on a plain run."""
    if not info.distributed:
        return [value]
    out: list[Any] = [None] * info.world
    dist.all_gather_object(out, value)
    return out


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def share(items: list[Any], info: DistInfo) -> list[Any]:
    """This rank's disjoint share of ``items`` (every ``world``-th from ``rank``): shards when
    there are at least as many shards as ranks, samples otherwise (see ``LevelReader``)."""
    return items[info.rank :: info.world]
