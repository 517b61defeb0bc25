"""One optimisation step: its plan (levels, loss weights, text generator), the curriculum stage's
frozen groups, the weighted loss over the levels' terms with backward and update, and the metrics."""

from __future__ import annotations

import math
import random

import torch

from pipelines import launch
from pipelines.training.multilevel.config import PARAM_GROUPS, MultilevelConfig
from pipelines.training.multilevel.curriculum import curriculum_weights, levels_at, param_group, stage_at
from pipelines.training.multilevel.model import StepInputs, StepModel


def plan(step: int, config: MultilevelConfig, rank: int) -> tuple[list[str], dict[str, float], random.Random]:
    """Step ``step``'s levels, loss weights and text-sampling generator (seeded by step and rank:
    the same texts on a re-run)."""
    c = config
    levels = levels_at(step, c.schedule, c.schedule_every)
    weights = curriculum_weights(step, c.loss_weights, c.curriculum, c.steps, c.epoch_steps)
    rng = random.Random(c.seed * 1_000_003 + step + rank * 100_003)
    return levels, weights, rng


class CurriculumStage:
    """Freezes what the current curriculum stage does not train (its ``train`` groups, within what
    the config lets train at all). The optimizer holds every parameter that may train and skips
    those without a gradient, so a stage switch needs no new optimizer; DDP was built with every
    such parameter and finds the frozen ones unused (``build.wrap_ddp``)."""

    def __init__(self, core: StepModel, config: MultilevelConfig):
        self.core, self.config = core, config
        self.base_trainable = {name: p.requires_grad for name, p in core.named_parameters()}
        self.index: int | None = None

    def apply(self, step: int) -> None:
        c = self.config
        index = stage_at(step, c.curriculum, c.steps, c.epoch_steps)
        if index == self.index:
            return
        self.index = index
        groups = set(c.curriculum[index].get("train", PARAM_GROUPS)) if index is not None else set(PARAM_GROUPS)
        for name, param in self.core.named_parameters():
            param.requires_grad = self.base_trainable[name] and param_group(name) in groups
        if index is not None:
            name = c.curriculum[index].get("name", index)
            launch.log(f"curriculum stage {name} from step {step}: trains {sorted(groups)}")


def optimize(
    step_module: torch.nn.Module, core: StepModel, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler, config: MultilevelConfig, device: torch.device,
    inputs: StepInputs, weights: dict[str, float],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """Forward, backward and update: the loss is the anchor term plus each term times its weight.
    Returns the total and the weighted terms (without the anchor); a step whose terms are all
    off (no gradient) still advances the schedule."""
    step_module.train()
    autocast = torch.autocast(
        "cuda", dtype=torch.bfloat16, enabled=config.precision == "bf16" and device.type == "cuda"
    )
    with autocast:
        terms = step_module(inputs, weights)
        anchor = terms.pop("anchor")
        total = sum((weights[k] * v for k, v in terms.items()), anchor)
    optimizer.zero_grad(set_to_none=True)
    if total.requires_grad:
        total.backward()
        if config.grad_clip_norm:
            torch.nn.utils.clip_grad_norm_([p for p in core.parameters() if p.requires_grad], config.grad_clip_norm)
        optimizer.step()
    scheduler.step()
    return total, terms


def step_metrics(
    total: torch.Tensor, terms: dict[str, torch.Tensor], weights: dict[str, float], lr: float
) -> dict[str, float]:
    """The step's loss, lr, each term's value (``loss_<term>``) and each weight that is on (``w_<term>``)."""
    metrics = {"loss": float(total.detach()), "lr": lr}
    metrics |= {f"loss_{k}": float(v.detach()) for k, v in terms.items()}
    return metrics | {f"w_{k}": w for k, w in weights.items() if w}


def check_finite(step: int, metrics: dict[str, float]) -> None:
    """A non-finite loss stops the run at the step that made it, before it is checkpointed."""
    if not math.isfinite(metrics["loss"]):
        raise FloatingPointError(f"step {step}: loss is {metrics['loss']} ({metrics})")
