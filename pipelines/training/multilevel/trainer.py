"""The trainer: one run's pieces put together and stepped. The networks and optimizer come from
``build``, what the run reads and its data position from ``data``, a step's inputs from
``inputs``, the update and the curriculum's frozen groups from ``step``, and checkpoints and
resume (weights, optimizer, schedule and every reader's data position) from ``checkpoint``."""

from __future__ import annotations

import random

import torch

from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel import checkpoint
from pipelines.training.multilevel.build import build_networks, build_optimizer, wrap_ddp
from pipelines.training.multilevel.config import MultilevelConfig
from pipelines.training.multilevel.data import TrainingData
from pipelines.training.multilevel.inputs import step_inputs
from pipelines.training.multilevel.model import StepInputs
from pipelines.training.multilevel.step import CurriculumStage, check_finite, optimize, plan, step_metrics


class Trainer:
    """``resume`` (or start), ``wrap``, then ``train_step`` and ``save`` until ``config.steps``;
    ``close`` at the end. ``data`` holds what was read (positions, skipped and linked counts)."""

    def __init__(self, config: MultilevelConfig, info: DistInfo | None = None):
        from pipelines.training.distributed import rank_device

        self.config, self.info = config, info or DistInfo()
        torch.manual_seed(config.seed)  # the same initial weights on every rank
        self.device = torch.device(rank_device(config.device, self.info))  # no silent CPU fallback on a GPU job
        net = build_networks(config, self.info, self.device)
        self.model, self.core, self.tokenizer, self.params = net.model, net.core, net.tokenizer, net.params
        self.optimizer, self.scheduler = build_optimizer(self.core, config)
        self.step_module: torch.nn.Module = self.core  # the DDP wrapper once ``wrap``ped
        self.stage = CurriculumStage(self.core, config)
        self.data = TrainingData(config, self.info, self.device, net.preprocess, net.parent_preprocess)
        self.ckpt_dir = config.checkpoint_dir or f"{config.run_dir.rstrip('/')}/checkpoints"
        self.step = 0
        self.last_terms: dict[str, float] = {}  # each loss term's latest value in this run

    def wrap(self) -> None:
        """DDP on a distributed run, after ``resume`` has made the weights final on every rank."""
        self.step_module = wrap_ddp(self.core, self.config, self.info, self.device)

    def apply_stage(self) -> None:
        self.stage.apply(self.step)

    def resume(self) -> int | None:
        """Load the newest lake checkpoint (every rank the same file) and open the readers at this
        rank's saved data position; returns its step (None on a first launch). The children
        waiting in the link buffers are not saved: they are re-read as the run goes on."""
        state = checkpoint.load_newest(self.ckpt_dir, self.device) if self.config.resume else None
        if state is None:
            self.data.open({})
            return None
        self.step = checkpoint.restore(state, self.core, self.optimizer, self.scheduler, self.data)
        self.data.open(*checkpoint.rank_position(state, self.info))
        return self.step

    def save(self) -> str | None:
        def state_of(consumed_by_rank: list, loaders_by_rank: list) -> dict:
            return checkpoint.checkpoint_state(
                self.step, self.core, self.optimizer, self.scheduler, self.data, consumed_by_rank, loaders_by_rank
            )

        position = (self.data.consumed(), self.data.loader_state())
        keep_last = self.config.keep_last_checkpoint_only
        return checkpoint.save_checkpoint(self.ckpt_dir, self.step, position, state_of, self.info, keep_last)

    def close(self) -> None:
        self.data.close()

    def plan(self) -> tuple[list[str], dict[str, float], random.Random]:
        """The current step's levels, loss weights and text-sampling generator."""
        return plan(self.step, self.config, self.info.rank)

    def inputs(self, levels: list[str], weights: dict[str, float], rng: random.Random) -> StepInputs:
        """Everything the step's tower passes need, read and decoded before the forward pass."""
        return step_inputs(self.data, levels, weights, rng, self.tokenizer, self.core.grid)

    def train_step(self) -> dict[str, float]:
        levels, weights, rng = self.plan()
        return self.compute(self.inputs(levels, weights, rng), weights)

    def compute(self, inputs: StepInputs, weights: dict[str, float]) -> dict[str, float]:
        """Forward, backward and update on inputs already read (split from the reading so the
        training benchmark can time the two apart)."""
        self.apply_stage()
        total, terms = optimize(
            self.step_module, self.core, self.optimizer, self.scheduler, self.config, self.device, inputs, weights
        )
        self.step += 1
        metrics = step_metrics(total, terms, weights, self.scheduler.get_last_lr()[0])
        self.last_terms |= {k: v for k, v in metrics.items() if k.startswith("loss_")}
        check_finite(self.step, metrics)
        return metrics
