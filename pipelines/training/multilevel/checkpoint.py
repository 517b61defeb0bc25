"""A run's checkpoints in the lake (``ckpt-<steps done>.pt``, through ``pipelines.launch``): what
one holds (weights, ROI processor, optimizer, lr schedule, every rank's data position, the
counts), the write (rank 0, between barriers, the older ones pruned) and the way back."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import asdict

import fsspec
import torch

from pipelines import launch
from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel.data import TrainingData
from pipelines.training.multilevel.model import StepModel


def checkpoint_state(
    step: int, core: StepModel, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    data: TrainingData, consumed_by_rank: list[dict[str, int]], loaders_by_rank: list[dict[str, dict]],
) -> dict:  # fmt: skip
    """What a checkpoint holds; its keys and their order are the checkpoint format."""
    return {
        "step": step,
        "state_dict": core.model.state_dict(),
        "roi_processor": None if core.roi_processor is None else core.roi_processor.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "consumed": consumed_by_rank[0],
        "consumed_by_rank": consumed_by_rank,
        "loaders_by_rank": loaders_by_rank,  # each level's loader position (per worker, batches used)
        "skipped": data.skipped,
        "linked": dict(data.linked),
        "config": asdict(data.config),
    }


def save_checkpoint(
    directory: str, step: int, position: tuple[dict[str, int], dict[str, dict]],
    state_of: Callable[[list[dict[str, int]], list[dict[str, dict]]], dict], info: DistInfo, keep_last_only: bool,
) -> str | None:  # fmt: skip
    """Rank 0 writes the checkpoint between two barriers: every rank has finished the step (and
    sent its data ``position``: consumed counts, loader state) before the write, and none reads
    the folder before it is whole. ``state_of(consumed_by_rank, loaders_by_rank)`` builds it.
    Returns its URL on rank 0, None on the others."""
    from pipelines.training.distributed import barrier, gather_objects

    positions = gather_objects(position, info)
    barrier(info)
    url = None
    if info.is_main:
        buffer = io.BytesIO()
        torch.save(state_of([p[0] for p in positions], [p[1] for p in positions]), buffer)
        url = launch.save_checkpoint(directory, step, buffer.getvalue(), "pt")
        if keep_last_only:
            launch.prune_checkpoints(directory, 1, upto=step)
    barrier(info)
    return url


def load_newest(directory: str, device: torch.device) -> dict | None:
    """The newest whole checkpoint in ``directory`` (every rank reads the same file); None when
    there is none (a first launch)."""
    newest = launch.latest_checkpoint(directory)
    if newest is None:
        return None
    with fsspec.open(newest, "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location=device, weights_only=False)


def restore(
    state: dict, core: StepModel, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    data: TrainingData,
) -> int:  # fmt: skip
    """Weights, optimizer, schedule and the counts back from ``state``; returns its step. A
    checkpoint from a run without the ROI processor leaves the processor as built."""
    core.model.load_state_dict(state["state_dict"])
    if core.roi_processor is not None and state.get("roi_processor") is not None:
        core.roi_processor.load_state_dict(state["roi_processor"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    data.skipped, data.linked = state["skipped"], {**data.linked, **state["linked"]}
    return state["step"]


def rank_position(state: dict, info: DistInfo) -> tuple[dict[str, int], dict[str, dict]]:
    """This rank's saved data position (consumed counts, loader state). A run resumed on a
    different number of ranks re-splits the data and restarts every rank at rank 0's position
    (logged); a checkpoint from before the per-rank positions or the loaders holds one count."""
    by_rank = state.get("consumed_by_rank") or [state["consumed"]]
    loaders = state.get("loaders_by_rank") or [{}] * len(by_rank)
    if len(by_rank) != info.world:
        launch.log(f"checkpoint from {len(by_rank)} rank(s), resumed on {info.world}: data restarts", "warning")
        by_rank, loaders = [by_rank[0]] * info.world, [loaders[0]] * info.world
    return by_rank[info.rank], loaders[info.rank]
