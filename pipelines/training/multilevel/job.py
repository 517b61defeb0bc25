"""Multi-level CLIP training on the release's figure, panel and region subsets, as a launched job.

The entry point (``launch.main``), the process group, training to the end and the export."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import torch

from pipelines import launch
from pipelines.training import clip, memory
from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel.budget import check_memory
from pipelines.training.multilevel.config import MultilevelConfig
from pipelines.training.multilevel.data import heldout_counts
from pipelines.training.multilevel.trainer import Trainer


def train(config: MultilevelConfig, info: DistInfo | None = None) -> dict:
    """Train (or resume) to ``config.steps``, checkpointing to the lake; export; the report (rank 0
    exports; every rank returns the report, with each rank's sample counts)."""
    from pipelines.training.distributed import barrier, gather_objects

    config.validate()
    gpu_bytes = memory.job_gpu_bytes(config.gpu_memory_gb, config.device)
    if gpu_bytes is not None:  # before any weights or data are read: a step that cannot fit fails now
        found = check_memory(config, gpu_bytes)
        if found is not None:
            launch.log(f"memory per GPU of the largest step ({found[0].label}): about {found[1].describe()}")
    trainer = Trainer(config, info)
    info = trainer.info
    resumed = trainer.resume()
    trainer.wrap()
    if resumed is not None:
        launch.log(f"resumed from step {resumed} ({trainer.ckpt_dir})")
    first, metrics = trainer.step, {}
    excluded = heldout_counts(config) if info.is_main else {}
    if config.heldout is not None and info.is_main:
        launch.log(f"held-out split {config.heldout}: samples of held-out articles excluded per level {excluded}")
    launch.log(
        f"multi-level training {config.preset or 'custom'}: steps {first}..{config.steps} on {info.world} rank(s), "
        f"{trainer.params}"
    )
    try:
        while trainer.step < config.steps:
            metrics = trainer.train_step()
            if trainer.step % config.log_every == 0 or trainer.step == config.steps:
                launch.report_progress(trainer.step, metrics)
            if trainer.step % config.checkpoint_every == 0 or trainer.step == config.steps:
                trainer.save()
    finally:
        trainer.close()
    by_rank = gather_objects({"consumed": trainer.data.consumed(), "linked": trainer.data.linked}, info)
    model_dir = None
    if info.is_main:
        model_dir = _export(config, trainer)
    barrier(info)
    return {
        "preset": config.preset,
        "model": config.model,
        "region_features": config.region_features,
        "ranks": info.world,
        "steps": trainer.step,
        "resumed_from_step": resumed,
        "first_step": first,
        "final_loss": metrics.get("loss"),
        **trainer.last_terms,
        "skipped_samples": trainer.data.skipped,
        "heldout": config.heldout,
        # each level's samples of held-out articles, dropped by every reader (counted from the sidecars)
        "heldout_samples_excluded": json.dumps(excluded),
        "linked_children": json.dumps({k: sum(r["linked"][k] for r in by_rank) for k in trainer.data.linked}),
        "consumed": json.dumps(trainer.data.consumed()),
        "samples_by_rank": json.dumps([sum(r["consumed"].values()) for r in by_rank]),
        "logit_columns": json.dumps(trainer.core.columns),
        "trainable_params": trainer.params["trainable"],
        "frozen_params": trainer.params["frozen"],
        "checkpoint": launch.latest_checkpoint(trainer.ckpt_dir),
        "model_dir": model_dir,
    }


def _export(config: MultilevelConfig, trainer: Trainer) -> str:
    """The CLIP weights as an OpenCLIP model folder (WiSE-FT with the base); the ROI processor is
    a training-time head and stays in the checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        final = Path(tmp, "final.pt")
        torch.save({"state_dict": {k: v.cpu() for k, v in trainer.model.state_dict().items()}}, final)
        return clip.export_wise_ft(config, final, f"{config.run_dir.rstrip('/')}/model")


@contextlib.contextmanager
def process_group(config: MultilevelConfig):
    """torchrun's process group, joined with the trainer's backend before the Pipes session asks
    for the rank, and left after it closes."""
    from pipelines.training.distributed import init_from_env, shutdown

    info = init_from_env(config.device)
    try:
        yield info
    finally:
        shutdown(info)


def run(config: MultilevelConfig, job: launch.LaunchInfo) -> dict | None:
    """Every rank trains; rank 0 alone reports (``pipelines.launch`` is silent on the others)."""
    from pipelines.training.distributed import init_from_env

    info = init_from_env(config.device)  # joined in process_group already: this rank's place
    report = train(config, info)
    launch.report_final(launch.flat_metadata(report), config.run_dir)
    return report if info.is_main else None


def main(argv: list[str] | None = None) -> dict | None:
    return launch.main(MultilevelConfig, run, argv, description=__doc__.splitlines()[0], setup=process_group)
