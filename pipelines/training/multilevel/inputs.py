"""One step's inputs, read and put on the device before the forward pass: each level's batch
tokenized, the children of its parents, and in an ROI mode the regions with their boxes in the
parent's patch grid."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from pipelines.training import roi
from pipelines.training.multilevel.config import CHILD, NEGATIVE, REGION, ROI_REGION, MultilevelConfig
from pipelines.training.multilevel.data import TrainingData
from pipelines.training.multilevel.decoding import Decoded, box_in_parent, decode_roi
from pipelines.training.multilevel.model import Batch, RoiBatch, StepInputs
from pipelines.training.multilevel.readers import roi_parent_key


def to_batch(
    items: list, tokenizer: Callable, device: torch.device, negatives: bool = False, images: torch.Tensor | None = None
) -> Batch:
    """``items``' texts tokenized and their images stacked (unless ``images`` holds them already),
    on ``device``; with ``negatives`` each item's hard negatives too, padded to the longest list
    with a mask of the real ones."""
    tokens = tokenizer([d.text for d in items]).to(device)
    if images is None and hasattr(items[0], "image"):
        images = torch.stack([d.image for d in items])
    images = images.to(device, non_blocking=True) if images is not None else None
    batch = Batch(images, tokens)
    k = max((len(d.negatives) for d in items), default=0) if negatives else 0
    if k:
        texts = [d.negatives[j] if j < len(d.negatives) else "" for d in items for j in range(k)]
        batch.negatives = tokenizer(texts).to(device)
        batch.negative_mask = torch.tensor([[j < len(d.negatives) for j in range(k)] for d in items])
        batch.negative_mask = batch.negative_mask.to(device)
    return batch


def roi_batch(
    data: TrainingData, parents: list[Decoded], rng: random.Random, negatives: bool, tokenizer: Callable,
    grid: tuple[int, int],
) -> RoiBatch:  # fmt: skip
    """The regions of ``parents`` found in the ROI buffer, their boxes in the parent's grid;
    a region with a missing or out-of-frame box is skipped and logged."""
    c = data.config
    found = data.regions(parents, lambda k: roi_parent_key(k, c.roi_parent))
    regions, boxes, index = [], [], []
    for i, sample in found:
        try:
            region = decode_roi(sample, c, rng)
            boxes.append(roi.box_to_grid(box_in_parent(region, parents[i]), parents[i].size, grid))
        except Exception as exc:  # noqa: BLE001
            data.skip(REGION, str(sample.get("__key__")), str(exc))
            continue
        regions.append(region)
        index.append(i)
    data.linked[ROI_REGION] += len(regions)
    box_tensor = torch.tensor(boxes, dtype=torch.float32, device=data.device).reshape(-1, 4)
    parent_tensor = torch.tensor(index, dtype=torch.long, device=data.device)
    if not regions:
        return RoiBatch(box_tensor, parent_tensor, None)
    batch = to_batch(regions, tokenizer, data.device, negatives)
    return RoiBatch(box_tensor, parent_tensor, batch.tokens, batch.negatives, batch.negative_mask)


def step_inputs(
    data: TrainingData, levels: list[str], weights: dict[str, float], rng: random.Random, tokenizer: Callable,
    grid: tuple[int, int] | None,
) -> StepInputs:  # fmt: skip
    """Everything the step's tower passes need: each of ``levels``' batches, the children of
    its parents while their cross-level term is on, and the ROI regions of the ROI parent."""
    c: MultilevelConfig = data.config
    device = data.device
    out = StepInputs()
    for level in levels:
        if level not in data.feeds:
            continue  # regions in an ROI mode: read with their parent below
        batch, images = data.batch(level)
        out.levels[level] = to_batch(batch, tokenizer, device, level == REGION and weights[NEGATIVE] > 0, images)
        if level in CHILD and CHILD[level][0] in data.links and weights[CHILD[level][1]] > 0:
            children = data.children(level, batch, rng)
            tensors = to_batch([d for _, d in children], tokenizer, device) if children else None
            out.children[CHILD[level][1]] = (tensors, [i for i, _ in children])
            data.linked[CHILD[level][1]] += len(children)
        roi_active = weights[REGION] > 0 or weights[NEGATIVE] > 0
        if c.roi_mode and level == c.roi_parent and REGION in levels and roi_active:
            out.roi = roi_batch(data, batch, rng, weights[NEGATIVE] > 0, tokenizer, grid)
    return out
