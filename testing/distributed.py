"""Run a feature gather on real gloo processes (``torch.multiprocessing`` spawn on loopback), for
tests of the data-parallel trainer. It lives here rather than in a test module so that a spawned
child imports only this light module (and ``pipelines``), not the test's fixtures and Dagster."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines.training.distributed import DistInfo, gather_features, gather_objects


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_probe(rank: int, world: int, port: int, out: str, rows: list, weights: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        info = DistInfo(rank, world, rank)
        x = torch.tensor(rows[rank], requires_grad=True)
        gathered = gather_features(x, info)
        (gathered * torch.tensor(weights)).sum().backward()
        seen = {
            "gathered": gathered.detach(),
            "grad": x.grad,
            "logits": x.detach() @ gathered.detach().T,  # this rank's rows against the global batch
            "objects": gather_objects({"rank": rank}, info),
        }
        torch.save(seen, f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def gather_on_ranks(rows: list, weights: list, out: Path) -> list[dict]:
    """Rank ``r`` gathers ``rows[r]`` (its local feature rows), back-propagates
    ``sum(gathered * weights)`` and reports what it gathered, its rows' gradient, its logits
    against the gathered rows and ``gather_objects`` of its rank; one dict per rank."""
    world = len(rows)
    mp.spawn(_gather_probe, args=(world, free_port(), str(out), rows, weights), nprocs=world, join=True)
    return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world)]
