"""The networks of a run: OpenCLIP from the config's weights with the recipe's trainable
parameters, the one-``forward`` :class:`StepModel`, the optimizer and lr schedule, and DDP."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipelines.training import clip, roi
from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel.config import MultilevelConfig
from pipelines.training.multilevel.model import StepModel, lr_factor, set_trainable


@dataclass
class Networks:
    model: torch.nn.Module  # the OpenCLIP model: what a checkpoint's ``state_dict`` and the export hold
    core: StepModel  # the model, the ROI processor and the losses, on the device
    preprocess: Callable  # the image transform of a level's own batches and of the children
    parent_preprocess: Callable  # the ROI parent's: squashed to the tower's square in an ROI mode
    tokenizer: Callable
    params: dict[str, int]  # trainable and frozen parameter counts


def build_networks(config: MultilevelConfig, info: DistInfo, device: torch.device) -> Networks:
    """The weights are checked before anything is built (one line when they cannot be had);
    seeded by the caller, so every rank starts from the same initial weights (the ROI processor's
    included)."""
    import open_clip

    clip.hf_text.enable_hf_text_towers()  # a BMC-LongCLIP export starts a run too
    clip.check_weights(config.model, config.pretrained)
    tag = clip.resolve_pretrained(config.model, config.pretrained)
    model, preprocess, _ = open_clip.create_model_and_transforms(config.model, pretrained=tag)
    if config.temperature_init is not None:
        with torch.no_grad():
            model.logit_scale.fill_(math.log(1.0 / config.temperature_init))
    tokenizer = open_clip.get_tokenizer(config.model)
    params = set_trainable(model, config)
    core = StepModel(model, config, info).to(device)
    parent_preprocess = roi.squash_transform(preprocess, model.visual.image_size) if config.roi_mode else preprocess
    if core.roi_processor is not None:
        params["trainable"] += sum(p.numel() for p in core.roi_processor.parameters())
    return Networks(core.model, core, preprocess, parent_preprocess, tokenizer, params)


def build_optimizer(
    core: torch.nn.Module, config: MultilevelConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over every parameter that may train, warm-up then cosine (:func:`lr_factor`). A
    curriculum stage freezes groups by ``requires_grad`` alone: the optimizer skips parameters
    without a gradient, so a stage switch needs no new optimizer."""
    trainable = [p for p in core.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=(config.beta1, config.beta2), weight_decay=config.wd)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config.warmup, config.steps))
    return optimizer, scheduler


def wrap_ddp(core: StepModel, config: MultilevelConfig, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """DDP after the weights are final (loaded from a checkpoint on every rank); ``core`` itself
    on one process. The anchor term reaches every tower parameter each step; only the ROI
    processor sits unused (before the region stage, or on a rank whose parents found no region)
    and the groups a curriculum stage freezes (``train``), so only then does DDP search the graph
    for unused parameters."""
    if not info.distributed:
        return core
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    staged = any("train" in stage for stage in config.curriculum)
    return DistributedDataParallel(
        core, device_ids=ids, find_unused_parameters=core.roi_processor is not None or staged
    )
