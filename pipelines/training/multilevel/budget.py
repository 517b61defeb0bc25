"""The GPU memory of a multi-level step, checked before the job reads any data.

A multi-level step is not one CLIP batch: each level of its schedule slot sends ``batch_size``
images and texts through the towers, a cross-level term its children (``max_children``, else
``batch_size``), the region level its hard-negative texts (``max_negatives`` per region: the
estimate cannot know the data, so it counts the cap), and an ROI mode its regions' texts and ROI
processor rows instead of region crops. :func:`step_loads` lists that for every slot of the
schedule in every curriculum stage (its loss weights decide which passes run, its ``train`` groups
which towers save activations), and :func:`check_memory` prices the largest with
:func:`pipelines.training.memory.estimate_step`; ``docs/training-memory.md`` has the numbers.
"""

from __future__ import annotations

from pipelines.training import clip, memory
from pipelines.training.multilevel.config import (
    CHILD,
    LEVELS,
    NEGATIVE,
    PARAM_GROUPS,
    REGION,
    WEIGHT_KEYS,
    MultilevelConfig,
)
from pipelines.training.multilevel.curriculum import curriculum_weights, stage_spans

PRECISION = {"fp32": "fp32", "bf16": "amp_bf16"}  # the trainer's precision -> memory's (bf16 is autocast)


def stages(config: MultilevelConfig) -> list[tuple[str, dict[str, float], set[str]]]:
    """Each curriculum stage that runs a step: its name, the loss weights that are on anywhere in
    it (a ramp moves between its ends) and the parameter groups it trains; without a curriculum,
    the run's own weights and every group."""
    c = config
    if not c.curriculum:
        return [("", dict(c.loss_weights), set(PARAM_GROUPS))]
    out = []
    for index, (first, last) in enumerate(stage_spans(c.curriculum, c.steps, c.epoch_steps)):
        if last < first:
            continue
        ends = [
            curriculum_weights(step, c.loss_weights, c.curriculum, c.steps, c.epoch_steps) for step in (first, last)
        ]
        weights = {k: max(w[k] for w in ends) for k in WEIGHT_KEYS}
        stage = c.curriculum[index]
        out.append((str(stage.get("name", index)), weights, set(stage.get("train", PARAM_GROUPS))))
    return out


def step_load(
    config: MultilevelConfig, slot: list[str], weights: dict[str, float], groups: set[str], batch_size: int,
    vision_layers: int, world: int = 1, label: str = "",
) -> memory.StepLoad:  # fmt: skip
    """What a step of ``slot`` encodes (as ``inputs.step_inputs`` and ``StepModel.forward`` do):
    every level's batch, whatever its weight (the anchor term reaches every embedding); the
    children while their cross-level term is on; the region level's hard negatives while the
    negative term is; in an ROI mode the regions of the ROI parent (texts, negatives, processor
    rows) and no region crops. Logits: each contrastive term's rows x the gathered columns."""
    c, b = config, batch_size
    kids = c.max_children or b
    images = texts = rois = logits = 0
    for level in slot:
        if level == REGION and c.roi_mode:
            continue  # read with its parent, below
        images, texts, logits = images + b, texts + b, logits + 2 * b * b * world
        if level == REGION and weights[NEGATIVE] > 0:
            texts += b * c.max_negatives
        if level in CHILD and weights[CHILD[level][1]] > 0 and c.data_of(CHILD[level][0]):
            images, texts, logits = images + kids, texts + kids, logits + 2 * 2 * b * b * world  # images and texts
        roi_on = weights[REGION] > 0 or weights[NEGATIVE] > 0
        if c.roi_mode and level == c.roi_parent and REGION in slot and roi_on:
            texts += kids * (1 + (c.max_negatives if weights[NEGATIVE] > 0 else 0))
            rois += kids if c.region_features == "roi_processor" else 0
            logits += 2 * kids * kids * world
    text_trains = not c.freeze_text and "text" in groups
    layers = vision_layers if "vision" in groups else 0
    return memory.StepLoad(images, texts, rois, logits, layers, text_trains, label)


def step_loads(config: MultilevelConfig, batch_size: int, arch: memory.Architecture) -> list[memory.StepLoad]:
    """Every (curriculum stage, schedule slot) step the run takes, at ``batch_size`` per level."""
    c = config
    layers = arch.vision.layers if c.unfreeze_last_blocks is None else min(c.unfreeze_last_blocks, arch.vision.layers)
    world = max(c.gpus, 1) if c.gather_across_ranks else 1
    out = []
    for name, weights, groups in stages(c):
        for slot in c.schedule:
            label = f"levels {'+'.join(lv for lv in LEVELS if lv in slot)}" + (f", stage {name}" if name else "")
            out.append(step_load(c, slot, weights, groups, batch_size, layers, world, label))
    return out


def trainable_params(config: MultilevelConfig, arch: memory.Architecture) -> int:
    """What the optimizer holds (``model.set_trainable`` plus the ROI processor): its states stay
    allocated through every curriculum stage once a stage has trained them."""
    c = config
    vision = None if c.unfreeze_last_blocks is None else min(c.unfreeze_last_blocks, arch.vision.layers)
    count = memory.trainable_params(arch, vision, not c.freeze_text) + int(c.train_logit_scale)
    if c.region_features == "roi_processor":
        w = arch.vision.width
        count += 4 * w * w + 8 * w  # two LayerNorms (4w), attention in/out projections (4w² + 4w)
    return count


def check_memory(config: MultilevelConfig, gpu_bytes: float) -> tuple[memory.StepLoad, memory.MemoryEstimate] | None:
    """The largest step's estimate on a GPU of ``gpu_bytes`` (None when the model's config is not
    at hand); a batch that cannot fit is a ValueError naming ``batch_size`` (and ``precision: bf16``)."""
    model_cfg = clip.model_cfg_of(config.model)
    if model_cfg is None or "hf_model_name" in model_cfg["text_cfg"]:
        return None  # an hf-hub: model or a Hugging Face text tower: not counted here
    arch = memory.open_clip_architecture(config.model, model_cfg)
    lighter = {"precision: bf16": PRECISION["bf16"]} if config.precision == "fp32" else {}
    return memory.check_step(
        arch,
        lambda b: step_loads(config, b, arch),
        config.batch_size,
        gpu_bytes,
        trainable_params(config, arch),
        PRECISION[config.precision],
        max(config.gpus, 1),
        lighter=lighter,
    )
