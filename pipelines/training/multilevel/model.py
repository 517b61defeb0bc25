"""The model side of a step: which parameters train, the lr schedule, a step's inputs and the one
``forward`` (:class:`StepModel`) that DistributedDataParallel wraps."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch.nn import functional

from pipelines.training import roi
from pipelines.training.distributed import DistInfo
from pipelines.training.multilevel.config import CHILD, NEGATIVE, REGION, MultilevelConfig
from pipelines.training.multilevel.losses import (
    clip_loss,
    cross_level_loss,
    negative_sigmoid_loss,
    negative_softmax_loss,
)


def set_trainable(model: torch.nn.Module, config: MultilevelConfig) -> dict[str, int]:
    """Freeze what the recipe keeps fixed: the text tower (``freeze_text``) and every vision block
    but the last ``unfreeze_last_blocks`` (the head after them trains, the embeddings do not)."""
    for name, param in model.named_parameters():
        if name == "logit_scale":
            param.requires_grad = config.train_logit_scale
        elif not name.startswith("visual."):
            param.requires_grad = not config.freeze_text
    if config.unfreeze_last_blocks is not None:
        blocks = getattr(getattr(model.visual, "transformer", None), "resblocks", None)
        if blocks is None:
            raise ValueError(f"{config.model}: unfreeze_last_blocks needs an OpenCLIP ViT (visual.transformer)")
        first = len(blocks) - config.unfreeze_last_blocks
        block = re.compile(r"^visual\.transformer\.resblocks\.(\d+)\.")
        for name, param in model.visual.named_parameters(prefix="visual"):
            m = block.match(name)
            if m:
                param.requires_grad = int(m.group(1)) >= first
            else:  # the stem before the blocks stays frozen, the head after them trains
                param.requires_grad = not name.startswith(
                    ("visual.conv1", "visual.class_embedding", "visual.positional_embedding", "visual.ln_pre")
                )
    counts = {"trainable": 0, "frozen": 0}
    for param in model.parameters():
        counts["trainable" if param.requires_grad else "frozen"] += param.numel()
    return counts


def lr_factor(step: int, warmup: int, steps: int) -> float:
    """Linear warm-up then cosine decay to 0 (Panel2Patch's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@dataclass
class Batch:
    """A batch ready for the towers (on the device): images, text tokens, and for regions their
    hard negatives' tokens ``(n * K, ctx)`` with the mask of real ones ``(n, K)``."""

    images: torch.Tensor
    tokens: torch.Tensor
    negatives: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None


@dataclass
class RoiBatch:
    """The regions of a step's parents: boxes in patch-grid cells, each box's parent row, and
    their texts; ``tokens`` is None when this rank found no region for its parents."""

    boxes: torch.Tensor
    parents: torch.Tensor
    tokens: torch.Tensor | None
    negatives: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None


@dataclass
class StepInputs:
    levels: dict[str, Batch] = field(default_factory=dict)
    children: dict[str, tuple[Batch | None, list[int]]] = field(default_factory=dict)  # term -> (children, parent)
    roi: RoiBatch | None = None


class StepModel(torch.nn.Module):
    """The CLIP model plus the ROI processor, with the whole step's loss terms as ``forward``: DDP
    synchronises gradients through the wrapped module's ``forward``, so every tower pass of a step
    (levels, children, negatives, ROIs) runs inside one call."""

    def __init__(self, model: torch.nn.Module, config: MultilevelConfig, info: DistInfo):
        super().__init__()
        self.model, self.config, self.info = model, config, info
        self.roi_processor: roi.RoiProcessor | None = None
        self.columns: dict[str, int] = {}  # each term's latest logit columns: the global batch when gathered
        self.grid: tuple[int, int] | None = None  # the ROI modes' patch grid (columns, rows)
        if config.roi_mode:
            visual = model.visual
            if getattr(visual, "proj", None) is None or not hasattr(visual, "grid_size"):
                raise ValueError(f"{config.model}: region_features roi_* needs an OpenCLIP ViT with a projection")
            rows, columns = visual.grid_size
            self.grid = (columns, rows)
            if config.region_features == "roi_processor":
                self.roi_processor = roi.RoiProcessor(visual.proj.shape[0], config.roi_heads)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        if not self.config.gather_across_ranks:
            return x
        from pipelines.training.distributed import gather_features

        return gather_features(x, self.info)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return functional.normalize(self.model.encode_image(images), dim=-1)

    def encode_texts(self, tokens: torch.Tensor) -> torch.Tensor:
        return functional.normalize(self.model.encode_text(tokens), dim=-1)

    def encode_with_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled embedding and the patch tokens (after ``ln_post``) of one tower pass."""
        visual = self.model.visual
        visual.output_tokens = True
        try:
            pooled, tokens = visual(images)
        finally:
            visual.output_tokens = False
        return functional.normalize(pooled, dim=-1), tokens

    def roi_embeddings(self, tokens: torch.Tensor, batch: RoiBatch) -> torch.Tensor:
        vectors = roi.roi_pool(
            roi.token_grid(tokens, self.grid), batch.boxes, batch.parents, self.config.roi_output_size
        )
        if self.roi_processor is not None:
            vectors = self.roi_processor(vectors, tokens[batch.parents])
        return functional.normalize(vectors @ self.model.visual.proj, dim=-1)

    def forward(self, inputs: StepInputs, weights: dict[str, float]) -> dict[str, torch.Tensor]:
        """The step's loss terms by name, plus ``anchor``: zero times every embedding and the logit
        scale, so each rank's total reaches the same parameters whatever terms its data produced."""
        scale = self.model.logit_scale.exp()
        terms: dict[str, torch.Tensor] = {}
        anchors: list[torch.Tensor] = []
        for level, batch in inputs.levels.items():
            roi_here = inputs.roi is not None and level == self.config.roi_parent
            img, tokens = (
                self.encode_with_tokens(batch.images) if roi_here else (self.encode_images(batch.images), None)
            )
            txt = self.encode_texts(batch.tokens)
            anchors += [img, txt]
            if weights[level] > 0:
                every_txt = self.gather(txt)
                terms[level] = clip_loss(self.gather(img), every_txt, scale)
                self.columns[level] = every_txt.shape[0]
            if batch.negatives is not None:
                terms[NEGATIVE] = self._negative(img, txt, batch.negatives, batch.negative_mask, scale)
            if level in CHILD and CHILD[level][1] in inputs.children:
                term = CHILD[level][1]
                found = self._cross_level(img, txt, *inputs.children[term], scale, anchors)
                if found is not None:
                    terms[term] = found
            if roi_here:
                terms |= self._roi_terms(tokens, inputs.roi, weights, scale, anchors)
        terms["anchor"] = sum((a.sum() for a in anchors), scale) * 0.0
        return terms

    def _cross_level(self, img, txt, children: Batch | None, groups: list[int], scale, anchors) -> torch.Tensor | None:
        if children is None:  # none here; the other ranks' rows still join the gathered loss
            child_img = child_txt = img[:0]
        else:
            child_img, child_txt = self.encode_images(children.images), self.encode_texts(children.tokens)
            anchors += [child_img, child_txt]
        return cross_level_loss(img, txt, child_img, child_txt, groups, scale, self.gather)

    def _roi_terms(self, tokens, batch: RoiBatch, weights, scale, anchors) -> dict[str, torch.Tensor]:
        if batch.tokens is None:
            dim = self.model.visual.proj.shape[1]
            emb = txt = tokens.new_zeros((0, dim))
        else:
            emb, txt = self.roi_embeddings(tokens, batch), self.encode_texts(batch.tokens)
            anchors += [emb, txt]
        out: dict[str, torch.Tensor] = {}
        every_emb, every_txt = self.gather(emb), self.gather(txt)
        if weights[REGION] > 0 and every_emb.shape[0] > 0:
            out[REGION] = clip_loss(every_emb, every_txt, scale)
            self.columns[REGION] = every_txt.shape[0]
        if batch.negatives is not None and batch.tokens is not None:
            out[NEGATIVE] = self._negative(emb, txt, batch.negatives, batch.negative_mask, scale)
        return out

    def _negative(self, img, txt, negatives: torch.Tensor, mask: torch.Tensor, scale) -> torch.Tensor:
        """Each region's hard negatives, against its own positive (local to the rank)."""
        neg = self.encode_texts(negatives).view(img.shape[0], mask.shape[1], -1)
        if self.config.negative_loss == "softmax":
            return negative_softmax_loss(img, txt, neg, mask, scale)
        return negative_sigmoid_loss(img, txt, neg, mask, self.config.negative_temperature)
