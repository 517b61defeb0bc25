"""Multi-level CLIP training on the release's figure, panel and region subsets, as a launched job.

    python -m pipelines.training.multilevel --config config.json

One trainer, two recipes (``preset`` in the config; every knob is a :class:`MultilevelConfig` field):

* ``zoom-in`` — Panel2Patch (``shared/papers/000_1cf676911784e115.txt``). Key design 3: intra-level
  CLIP losses at each level and cross-level message passing, where the children's embeddings are
  average-pooled into a summary and aligned with their parent's by a CLIP loss, for images and
  for texts separately: L_inter^{M<->P} = L_CLIP({v^M_i}, {mean_j v^P_ij}) + L_CLIP({t^M_i},
  {mean_j t^P_ij}), and the same for panel <-> region. Key design 4: each step activates one
  granularity in a rotating M -> P -> R cycle (:func:`levels_at`). "Loss & Training": one of the
  region's two texts is sampled (the caption clause ``.txt`` or the VLM ``description``), the
  text tower and the early vision blocks are frozen and the last 5 vision blocks are trained,
  AdamW (wd 0.05, betas 0.9/0.95), cosine lr 1e-5 with 1,000 warm-up steps.
* ``region-aware`` — RegionMed-CLIP (``shared/papers/002_027be0657a295389.txt``): global and ROI
  alignment in every step, plus hard-negative mining with each region's ``neg.txt`` ("ROI
  Processor: Region Alignment and Hard Negative Mining", eqs. 4-6), and the progressive
  curriculum ("Progressive Multi-Stage Training" and "Implementation": warm-up 2 epochs, global
  alignment 8, region refinement 8, joint fine-tuning 8), each stage a loss-weight override
  (:func:`curriculum_weights`) and the parameter groups it trains (``train``: vision, text,
  roi_processor; :meth:`Trainer.apply_stage`), lengths in ``epochs``, ``steps`` or ``fraction``. The
  equations themselves are lost in our copy of the paper; the text keeps "sigma is the sigmoid
  function and tau a temperature" and "the loss penalizes high similarity between positive and
  negative pairs", so the default negative loss is the logistic pairwise form
  -log sigma((s(r, t+) - s(r, t-)) / tau) (:func:`negative_sigmoid_loss`); the NegCLIP form, the
  negatives as extra logits in the region's softmax (:func:`negative_softmax_loss`), is the
  other choice.

Region features (``region_features``): ``crop`` (default) sends the region crops through the image
tower; ``roi_pool`` pools the parent image's patch tokens inside the region's box (Panel2Patch's
ROI pooling) and ``roi_processor`` adds RegionMed-CLIP's ROI processor, an attention layer from
the ROI to the parent's tokens (``pipelines/training/roi.py``, which says what the papers leave
open). In the ROI modes a region is read with its parent (``roi_parent``: the figure, whose pixel
frame the release's region ``box`` is in, or the panel) in the same step, through a buffer keyed
by the parent's key like the cross-level children; its crop is not decoded. The processor's
weights train only while a region term is on (the curriculum's region stage) and are checkpointed
beside the CLIP weights; the export holds the CLIP weights alone.

Data: each level reads its WebDataset subset(s) with ``webdataset`` (a release folder with
``sizes.json``, or a brace pattern of tars). The cross-level terms need a parent's children in
the same step; the subsets are shuffled independently, so a second reader per child level
fills a bounded buffer keyed by parent key (keys extend the figure key: ``<fig>_p003``,
``<fig>_p003_r01``), and a step pairs its parents with the children found there. Each level's
own batches are decoded and transformed by ``workers`` DataLoader processes per level
(``pipelines/training/loader.py``: shares, order, resume; ``prefetch_factor`` batches ready per
worker, pinned on CUDA); the children and ROI regions are read raw in the training process and
a child is decoded there, by ``workers`` threads, once its parent is in the step (only the
children that are used).
Memory is bounded by ``batch_size`` x (``workers`` x ``prefetch_factor`` + 1) decoded samples
per level + ``link_buffer`` raw samples.

Checkpoints go to the lake every ``checkpoint_every`` steps through ``pipelines.launch``
(``ckpt-<steps done>.pt``: weights, optimizer, lr schedule, how many samples each reader
consumed and each loader worker's position), so a preempted run resumes at the saved step and
data position: exactly with the same ``workers`` (0 included), approximately with another count.
The final weights are exported to ``<run_dir>/model`` with
:func:`pipelines.training.clip.export_wise_ft`.

Multi-GPU: the launcher runs the module under torchrun when the job has more than one GPU; every
rank joins the process group (NCCL on CUDA, gloo on CPU), wraps the model in
DistributedDataParallel (the whole step is one ``forward``, :class:`StepModel`), reads its own
disjoint share of each subset (:class:`LevelReader`), and with ``gather_across_ranks`` (default)
computes the contrastive terms over every rank's features (OpenCLIP's ``gather_features``: the
logits have the global batch, ``batch_size`` x ranks, as columns). ``batch_size`` is per rank.
Rank 0 alone writes checkpoints (between barriers), the export and the report; every rank loads
the same checkpoint on resume and continues from its own saved data position. The hard-negative
terms stay per rank (each region against its own negatives).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import random
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import torch
from torch.nn import functional

from pipelines import launch
from pipelines.training import clip, roi
from pipelines.training.distributed import DistInfo
from pipelines.training.loader import LevelDataset, LevelFeed, reader_share, resume_positions, samples

FIGURE, PANEL, REGION = "figure", "panel", "region"
LEVELS = (FIGURE, PANEL, REGION)
FIGURE_PANEL, PANEL_REGION, NEGATIVE = "figure_panel", "panel_region", "negative"
ROI_REGION = "roi_region"  # regions read with their parent in the ROI modes
WEIGHT_KEYS = (FIGURE, PANEL, REGION, FIGURE_PANEL, PANEL_REGION, NEGATIVE)
CHILD = {FIGURE: (PANEL, FIGURE_PANEL), PANEL: (REGION, PANEL_REGION)}  # parent level -> (child level, term)
PARENT_SUFFIX = {PANEL: re.compile(r"^(.+)_p\d{3}$"), REGION: re.compile(r"^(.+_p\d{3})_r\d{2}$")}
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
REGION_FEATURES = ("crop", "roi_pool", "roi_processor")
PARAM_GROUPS = ("vision", "text", "roi_processor")  # what a curriculum stage's "train" may name
FIGURE_OF_REGION = re.compile(r"^(.+)_p\d{3}_r\d{2}$")

PRESETS: dict[str, dict[str, Any]] = {
    "zoom-in": {  # Panel2Patch, "Loss & Training"
        "schedule": [[FIGURE], [PANEL], [REGION]],
        "loss_weights": {FIGURE: 1.0, PANEL: 1.0, REGION: 1.0, FIGURE_PANEL: 1.0, PANEL_REGION: 1.0, NEGATIVE: 0.0},
        "model": "ViT-L-14",  # "The model uses a ViT-L/14 encoder initialized from BMC-CLIP"
        "pretrained": clip.BMC_CLIP,
        "unfreeze_last_blocks": 5,
        "freeze_text": True,
        "lr": 1e-5,
        "warmup": 1000,
        "wd": 0.05,
        "region_description_prob": 0.5,
    },
    "region-aware": {  # RegionMed-CLIP, "Progressive Multi-Stage Training" and "Implementation"
        "schedule": [[FIGURE, REGION]],
        "loss_weights": {FIGURE: 1.0, PANEL: 0.0, REGION: 1.0, FIGURE_PANEL: 0.0, PANEL_REGION: 0.0, NEGATIVE: 1.0},
        # "Training proceeds in four stages: warmup (2 epochs ...), global alignment (8), region
        # refinement (8), and joint fine-tuning (8)". Epochs are shares of ``steps`` unless
        # ``epoch_steps`` is set. Warm-up and global: the global term alone, both towers.
        # Region refinement "activates the ROI processor, introducing region-caption and negative
        # caption pairs": the region and hard-negative terms alone, training the ROI processor and
        # the image tower the region features come from, the text tower held (ours: the paper only
        # implies that not every module trains before "all modules are jointly fine-tuned").
        # Joint: every term, every module.
        "curriculum": [
            {"name": "warmup", "epochs": 2, "weights": {REGION: 0.0, NEGATIVE: 0.0}, "train": ["vision", "text"]},
            {"name": "global", "epochs": 8, "weights": {REGION: 0.0, NEGATIVE: 0.0}, "train": ["vision", "text"]},
            {"name": "region", "epochs": 8, "weights": {FIGURE: 0.0}, "train": ["vision", "roi_processor"]},
            {"name": "joint", "epochs": 8, "weights": {}, "train": list(PARAM_GROUPS)},
        ],
        "unfreeze_last_blocks": None,
        "freeze_text": False,
        "temperature_init": 0.07,
        "negative_temperature": 0.07,
        "wd": 0.02,
        "grad_clip_norm": 0.5,
        "region_description_prob": 0.0,
    },
}


@dataclass
class MultilevelConfig(launch.JobConfig):
    """One multi-level run. ``*_data``: WebDataset subsets (release folders or tar brace patterns);
    a level no schedule slot names may stay empty."""

    run_dir: str
    preset: str | None = None  # "zoom-in" or "region-aware": defaults under the given fields
    figure_data: list[str] = field(default_factory=list)
    panel_data: list[str] = field(default_factory=list)
    region_data: list[str] = field(default_factory=list)
    model: str = "ViT-L-14"  # an OpenCLIP name, hf-hub:org/repo or local-dir:/path
    # a tag, a weights file or hf-hub:<org>/<repo>/<file>; ignored for local-dir:. BIOMEDICA's base
    # by default; zoom-in starts from BMC-CLIP (clip.BMC_CLIP) as Panel2Patch does
    pretrained: str = clip.COMMONPOOL
    allow_random_init: bool = False  # a run without trained weights is refused unless this says so
    steps: int = 10000
    batch_size: int = 256
    schedule: list[list[str]] = field(default_factory=lambda: [[FIGURE], [PANEL], [REGION]])
    schedule_every: int = 1  # steps per schedule slot (steps per epoch: one level per epoch)
    loss_weights: dict[str, float] = field(default_factory=lambda: {k: 1.0 for k in WEIGHT_KEYS})
    curriculum: list[dict] = field(default_factory=list)  # [{"steps"|"fraction", "weights", "ramp_steps"|...}]
    region_description_prob: float = 0.5  # chance a region's text is its VLM description (when it has one)
    negative_loss: str = "sigmoid"  # "sigmoid" (pairwise logistic) or "softmax" (extra logits)
    negative_temperature: float = 0.07
    max_negatives: int = 5  # hard negatives per region (neg.txt lines)
    link_buffer: int = 4096  # child samples held while waiting for their parent
    link_pull: int | None = None  # child samples read per cross-level step; None: batch_size
    max_children: int | None = None  # children encoded per cross-level term; None: batch_size
    unfreeze_last_blocks: int | None = 5  # None: the whole vision tower trains
    freeze_text: bool = True
    train_logit_scale: bool = False
    temperature_init: float | None = None  # None: the model's own logit scale
    lr: float = 1e-5
    warmup: int = 1000
    wd: float = 0.05
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip_norm: float | None = 1.0
    precision: str = "fp32"  # or "bf16" (autocast on CUDA)
    device: str = "cuda"
    seed: int = 0
    checkpoint_every: int = 500
    keep_last_checkpoint_only: bool = True
    log_every: int = 50
    resume: bool = True
    wise_ft_alpha: float = 1.0  # the export: 1 keeps the trained weights, < 1 interpolates with the base
    checkpoint_dir: str | None = None  # None: <run_dir>/checkpoints
    gpus: int = 1
    shard_name: str = clip.SHARD_NAME
    gather_across_ranks: bool = True  # contrastive terms over the global batch (all ranks' features)
    region_features: str = "crop"  # "crop" (region crops through the tower), "roi_pool" or "roi_processor"
    roi_parent: str = FIGURE  # whose patch tokens the ROI modes pool: figure (boxes as released) or panel
    roi_heads: int = 8  # the ROI processor's attention heads (RegionMed-CLIP: 8)
    roi_output_size: int = 2  # RoIAlign bins per side, averaged into one vector
    workers: int | None = None  # DataLoader workers per level; None: 4 on CUDA, 0 (in process) on CPU
    prefetch_factor: int = 2  # decoded batches each worker holds ready
    pin_memory: bool | None = None  # None: on CUDA
    persistent_workers: bool = True
    epoch_steps: int | None = None  # steps per epoch, for curriculum stages given in epochs; None: shares of steps

    JOB = "multi-level training"
    LAUNCH_FIELDS = {"run_dir": "run_dir", "checkpoint_dir": "checkpoint_dir", "gpus": "gpus"}

    @classmethod
    def coerce(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The preset's values under the config's own; schedule slots as lists of levels."""
        preset = data.get("preset")
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
        merged = {**PRESETS.get(preset, {}), **data}
        merged["schedule"] = [[slot] if isinstance(slot, str) else list(slot) for slot in merged.get("schedule", [])]
        return merged

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MultilevelConfig:
        config = super().from_dict(data)
        config.loss_weights = {**{k: 0.0 for k in WEIGHT_KEYS}, **config.loss_weights}
        return config

    def data_of(self, level: str) -> list[str]:
        return {FIGURE: self.figure_data, PANEL: self.panel_data, REGION: self.region_data}[level]

    def validate(self) -> None:
        if not self.schedule or any(not slot for slot in self.schedule):
            raise ValueError("schedule needs at least one slot, each naming at least one level")
        for level in {lv for slot in self.schedule for lv in slot}:
            if level not in LEVELS:
                raise ValueError(f"unknown level {level!r} in schedule; known: {LEVELS}")
            if not self.data_of(level):
                raise ValueError(f"the schedule trains {level} but {level}_data names no subset")
        bad = sorted(set(self.loss_weights) - set(WEIGHT_KEYS))
        if bad:
            raise ValueError(f"unknown loss weights {bad}; known: {WEIGHT_KEYS}")
        for stage in self.curriculum:
            if sum(k in stage for k in ("steps", "fraction", "epochs")) != 1:
                raise ValueError(f"a curriculum stage needs exactly one of steps, fraction or epochs: {stage}")
            bad = sorted(set(stage.get("train", PARAM_GROUPS)) - set(PARAM_GROUPS))
            if bad or "train" in stage and not stage["train"]:
                raise ValueError(f"a curriculum stage's train lists groups of {PARAM_GROUPS}, got {stage['train']}")
        if self.negative_loss not in ("sigmoid", "softmax"):
            raise ValueError(f"negative_loss must be sigmoid or softmax, got {self.negative_loss!r}")
        if not 0.0 <= self.region_description_prob <= 1.0 or not 0.0 <= self.wise_ft_alpha <= 1.0:
            raise ValueError("region_description_prob and wise_ft_alpha must be in [0, 1]")
        self._validate_roi()
        if (self.workers is not None and self.workers < 0) or self.prefetch_factor < 1:
            raise ValueError("workers must be at least 0 and prefetch_factor at least 1")
        if self.epoch_steps is not None and self.epoch_steps < 1:
            raise ValueError("epoch_steps must be at least 1 (or unset: stage epochs as shares of steps)")
        if self.steps < 1 or self.batch_size < 1 or self.schedule_every < 1 or self.checkpoint_every < 1:
            raise ValueError("steps, batch_size, schedule_every and checkpoint_every must be at least 1")
        self._validate_start()

    def _validate_start(self) -> None:
        """Both recipes fine-tune trained weights (the zoom-in one trains 5 vision blocks and
        nothing else): from a random initialisation they learn nothing worth exporting, so that
        needs ``allow_random_init``, and a random text tower is never frozen."""
        if clip.starts_from_weights(self.model, self.pretrained):
            return
        where = f"{self.model} with pretrained={self.pretrained!r}"
        if self.model.startswith(clip.LOCAL_DIR):
            where = f"{self.model} (a folder without {clip.EXPORT_WEIGHTS})"
        if not self.allow_random_init:
            raise ValueError(
                f"{where} starts from random weights; set pretrained (e.g. {clip.COMMONPOOL}, or {clip.BMC_CLIP} "
                "as Panel2Patch), a local-dir: model with weights, or allow_random_init: true"
            )
        if self.freeze_text:
            raise ValueError(
                f"{where} starts from random weights and freeze_text would keep its random text tower fixed: "
                "set freeze_text: false (or start from trained weights)"
            )

    @property
    def roi_mode(self) -> bool:
        return self.region_features != "crop"

    def _validate_roi(self) -> None:
        if self.region_features not in REGION_FEATURES:
            raise ValueError(f"region_features must be one of {REGION_FEATURES}, got {self.region_features!r}")
        if not self.roi_mode:
            return
        if self.roi_parent not in (FIGURE, PANEL):
            raise ValueError(f"roi_parent must be figure or panel, got {self.roi_parent!r}")
        for slot in self.schedule:
            if REGION in slot and self.roi_parent not in slot:
                raise ValueError(
                    f"region_features {self.region_features}: a schedule slot training region must also train "
                    f"its roi_parent {self.roi_parent} (the ROI features come from the parent's tokens): {slot}"
                )
        if self.roi_output_size < 1 or self.roi_heads < 1:
            raise ValueError("roi_output_size and roi_heads must be at least 1")


# ----------------------------------------------------------------------------------- schedules


def levels_at(step: int, schedule: list[list[str]], every: int = 1) -> list[str]:
    """The levels step ``step`` (0-based) trains: slot ``(step // every) mod len(schedule)``."""
    return list(schedule[(step // every) % len(schedule)])


def _epoch_lengths(curriculum: list[dict], steps: int, epoch_steps: int | None) -> dict[int, int]:
    """Steps of the stages given in ``epochs``: ``epochs * epoch_steps``, or without
    ``epoch_steps`` their share of the run's ``steps`` by epochs (the paper's 2 / 8 / 8 / 8 as
    shares of 26), rounded at the cumulative boundaries so the lengths add up to ``steps``."""
    indexed = [(i, float(stage["epochs"])) for i, stage in enumerate(curriculum) if "epochs" in stage]
    if epoch_steps is not None:
        return {i: round(epochs * epoch_steps) for i, epochs in indexed}
    total = sum(epochs for _, epochs in indexed) or 1.0
    out, done, start = {}, 0.0, 0
    for i, epochs in indexed:
        done += epochs
        end = round(steps * done / total)
        out[i], start = end - start, end
    return out


def _stage_lengths(curriculum: list[dict], steps: int, epoch_steps: int | None = None) -> list[tuple[int, int]]:
    """(length, ramp) in steps for each stage; fractions are of the run's ``steps``."""
    by_epochs = _epoch_lengths(curriculum, steps, epoch_steps)
    out = []
    for index, stage in enumerate(curriculum):
        if index in by_epochs:
            length = by_epochs[index]
        else:
            length = int(stage["steps"]) if "steps" in stage else round(stage["fraction"] * steps)
        ramp = int(stage.get("ramp_steps", round(stage.get("ramp_fraction", 0.0) * steps)))
        out.append((length, ramp))
    return out


def stage_at(step: int, curriculum: list[dict], steps: int, epoch_steps: int | None = None) -> int | None:
    """The index of the curriculum stage ``step`` falls in (the last one past the end); None
    without a curriculum."""
    start = 0
    for index, (length, _) in enumerate(_stage_lengths(curriculum, steps, epoch_steps)):
        start += length
        if step < start:
            return index
    return len(curriculum) - 1 if curriculum else None


def param_group(name: str) -> str:
    """A :class:`StepModel` parameter's curriculum group: ``vision`` (the image tower),
    ``roi_processor``, or ``text`` (the text tower, its projection and the logit scale)."""
    if name.startswith("model.visual."):
        return "vision"
    if name.startswith("roi_processor."):
        return "roi_processor"
    return "text"


def curriculum_weights(
    step: int, base: dict[str, float], curriculum: list[dict], steps: int, epoch_steps: int | None = None
) -> dict[str, float]:
    """The loss weights at ``step``: ``base`` overridden by the stage the step falls in; a stage
    with a ramp moves linearly from the previous stage's weights to its own, reaching them at its
    ``ramp``-th step. Past the last stage its weights hold (progressive global -> region)."""
    weights = {k: float(base.get(k, 0.0)) for k in WEIGHT_KEYS}
    if not curriculum:
        return weights
    previous, start = weights, 0
    for (length, ramp), stage in zip(_stage_lengths(curriculum, steps, epoch_steps), curriculum, strict=True):
        own = {**weights, **{k: float(v) for k, v in stage.get("weights", {}).items()}}
        if step < start + length or stage is curriculum[-1]:
            t = 1.0 if ramp <= 0 else min(1.0, (step - start + 1) / ramp)
            return {k: previous[k] + (own[k] - previous[k]) * t for k in WEIGHT_KEYS}
        previous, start = own, start + length
    return previous


# ----------------------------------------------------------------------------------- losses


def clip_loss(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE between row-aligned, L2-normalized ``a`` and ``b`` (CLIP's loss)."""
    logits = scale * a @ b.T
    target = torch.arange(a.shape[0], device=a.device)
    return (functional.cross_entropy(logits, target) + functional.cross_entropy(logits.T, target)) / 2


def pooled_children(children: torch.Tensor, groups: list[int], parents: int) -> torch.Tensor:
    """Average pooling of each parent's child embeddings (Panel2Patch's v-bar), re-normalized so
    the CLIP loss compares cosines; ``groups[k]`` is the parent index of child ``k``."""
    index = torch.tensor(groups, device=children.device, dtype=torch.long)
    sums = torch.zeros(parents, children.shape[1], device=children.device, dtype=children.dtype)
    sums = sums.index_add(0, index, children)
    return functional.normalize(sums, dim=-1)


def cross_level_loss(
    parent_img: torch.Tensor,
    parent_txt: torch.Tensor,
    child_img: torch.Tensor,
    child_txt: torch.Tensor,
    groups: list[int],
    scale: torch.Tensor | float,
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
) -> torch.Tensor | None:
    """Panel2Patch's L_inter = L_CLIP({v_parent}, {mean v_child}) + L_CLIP({t_parent}, {mean t_child})
    over the parents that have at least one child in ``groups`` (key design 3). ``gather`` joins
    the (parent, pooled children) rows of every rank before the loss (DDP); None when no rank
    has a parent with children."""
    present = sorted(set(groups))
    remap = {p: i for i, p in enumerate(present)}
    local = [remap[g] for g in groups]
    keep = torch.tensor(present, device=parent_img.device, dtype=torch.long)
    v_bar = pooled_children(child_img, local, len(present))
    t_bar = pooled_children(child_txt, local, len(present))
    rows = [gather(x) for x in (parent_img[keep], v_bar, parent_txt[keep], t_bar)]
    if rows[0].shape[0] == 0:
        return None
    return clip_loss(rows[0], rows[1], scale) + clip_loss(rows[2], rows[3], scale)


def negative_sigmoid_loss(
    img: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor, tau: float
) -> torch.Tensor:
    """Mean over (region, hard negative) of -log sigmoid((s(r, t+) - s(r, t-)) / tau): a soft
    margin that grows as a negative's similarity nears or passes the positive's. ``neg`` is
    (regions, K, d), ``mask`` (regions, K) marks real negatives; no negative at all gives 0."""
    if not bool(mask.any()):
        return img.sum() * 0.0
    s_pos = (img * pos).sum(-1, keepdim=True)  # (R, 1)
    s_neg = torch.einsum("rd,rkd->rk", img, neg)
    terms = -functional.logsigmoid((s_pos - s_neg) / tau)
    return terms[mask].mean()


def negative_softmax_loss(
    img: torch.Tensor, txt: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor | float
) -> torch.Tensor:
    """Image -> text InfoNCE of the regions whose softmax also holds their own hard negatives as
    extra logits (NegCLIP): row r is [s(r, t_1..t_B), s(r, neg_r1..neg_rK)], target r."""
    in_batch = scale * img @ txt.T
    extra = (scale * torch.einsum("rd,rkd->rk", img, neg)).masked_fill(~mask, float("-inf"))
    target = torch.arange(img.shape[0], device=img.device)
    return functional.cross_entropy(torch.cat([in_batch, extra], dim=1), target)


# ----------------------------------------------------------------------------------- the data


def parent_key(key: str, level: str) -> str | None:
    """A panel's figure key or a region's panel key, from the release's key suffixes."""
    pattern = PARENT_SUFFIX.get(level)
    match = pattern.match(key) if pattern else None
    return match.group(1) if match else None


def shard_pattern(source: str, shard_name: str) -> str:
    """A brace pattern of tars as given; a release folder through its ``sizes.json`` (a remote
    one streamed by ``pipe:``, as the CLIP trainer does)."""
    if re.search(r"\.tar(\}|$)", source):
        return source
    return clip.subset_data(source, shard_name)[0]


def roi_parent_key(key: str, parent: str) -> str | None:
    """The key of the image whose tokens a region's ROI features pool: its figure or its panel."""
    if parent == FIGURE:
        match = FIGURE_OF_REGION.match(key)
        return match.group(1) if match else None
    return parent_key(key, REGION)


class LevelReader:
    """An endless reader of one level's subsets in the training process (pass after pass, in shard
    order) that counts what it hands out, so a resumed run skips exactly that many samples: the
    cross-level children and the ROI regions, which are matched to the step's parents here (the
    levels' own batches come from :class:`pipelines.training.loader.LevelFeed`).

    Under DDP each rank reads a disjoint share (``loader.reader_share``): every ``world``-th shard
    from its rank when there are at least as many shards as ranks (each rank opens only its own
    files), else every ``world``-th sample (a small subset of one shard still feeds every rank)."""

    def __init__(self, level: str, sources: list[str], shard_name: str, skip: int = 0, info: DistInfo | None = None):
        from webdataset.shardlists import expand_urls

        self.level, self.info = level, info or DistInfo()
        self.patterns = [shard_pattern(s, shard_name) for s in sources]
        shards = [url for pattern in self.patterns for url in expand_urls(pattern)]
        what = f"the {level} subsets {self.patterns} for rank {self.info.rank}"
        self._it = samples(reader_share(shards, self.info), what)
        for _ in range(skip):
            next(self._it)
        self.consumed = skip

    def next(self) -> dict:
        self.consumed += 1
        return next(self._it)

    def take(self, n: int) -> list[dict]:
        return [self.next() for _ in range(n)]


class ChildBuffer:
    """Children waiting for their parent, keyed by parent key; the oldest go first when full."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: OrderedDict[str, tuple[str, dict]] = OrderedDict()  # child key -> (parent key, sample)
        self.evicted = 0

    def add(self, parent: str, key: str, sample: dict) -> None:
        self.items[key] = (parent, sample)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)
            self.evicted += 1

    def take(self, parents: list[str], limit: int) -> list[tuple[int, dict]]:
        """Up to ``limit`` children of ``parents`` as (parent index, sample), removed from the buffer;
        taken round-robin (each parent's first child, then each one's second, ...), so a capped
        step still pairs as many parents as it can: one parent alone gives a 1x1 softmax, no signal."""
        index = {p: i for i, p in enumerate(parents)}
        by_parent: dict[int, list[str]] = {}
        for key, (parent, _) in self.items.items():
            if parent in index:
                by_parent.setdefault(index[parent], []).append(key)
        order = sorted(
            ((rank, i, key) for i, keys in by_parent.items() for rank, key in enumerate(keys)), key=lambda t: t[:2]
        )
        return [(i, self.items.pop(key)[1]) for _, i, key in order[:limit]]


@dataclass
class Decoded:
    key: str
    image: Any  # a preprocessed tensor
    text: str
    negatives: list[str] = field(default_factory=list)
    size: tuple[int, int] = (0, 0)  # the image's (width, height) before the transform
    meta: str = ""  # the sample's JSON member as text


def _text(sample: dict, ext: str) -> str:
    value = sample.get(ext)
    return value.decode("utf-8") if isinstance(value, bytes) else (value or "")


def region_text(sample: dict, prob: float, rng: random.Random) -> str:
    """One of a region's two texts (Panel2Patch, "Loss & Training"): its VLM description with
    probability ``prob`` when it has one, else its caption clause."""
    meta = json.loads(_text(sample, "json") or "{}")
    description = (meta.get("description") or "").strip()
    if description and rng.random() < prob:
        return description
    return _text(sample, "txt").strip()


def decode(sample: dict, level: str, preprocess, config: MultilevelConfig, rng: random.Random) -> Decoded:
    """The sample's image (preprocessed) and text; raises ValueError for an unusable sample."""
    from PIL import Image

    ext = next((e for e in IMAGE_EXTS if e in sample), None)
    if ext is None:
        raise ValueError("no image member")
    image = Image.open(io.BytesIO(sample[ext])).convert("RGB")
    text = region_text(sample, config.region_description_prob, rng) if level == REGION else _text(sample, "txt")
    if not text.strip():
        raise ValueError("empty text")
    negatives = [n.strip() for n in _text(sample, "neg.txt").splitlines() if n.strip()][: config.max_negatives]
    return Decoded(sample["__key__"], preprocess(image), text.strip(), negatives, image.size, _text(sample, "json"))


@dataclass
class RoiRegion:
    key: str
    box: tuple[float, float, float, float]  # in the parent's pixel frame
    text: str
    negatives: list[str]


def decode_roi(sample: dict, config: MultilevelConfig, rng: random.Random) -> RoiRegion:
    """A region for the ROI modes: its texts and its box (the JSON ``box``, in the figure's
    pixels); its crop is not decoded. Raises ValueError for a region without a usable box or text."""
    meta = json.loads(_text(sample, "json") or "{}")
    box = meta.get("box")
    if not isinstance(box, list) or len(box) != 4 or not all(isinstance(v, int | float) for v in box):
        raise ValueError(f"no [x1, y1, x2, y2] box in the region JSON (got {box!r})")
    text = region_text(sample, config.region_description_prob, rng)
    if not text:
        raise ValueError("empty text")
    negatives = [n.strip() for n in _text(sample, "neg.txt").splitlines() if n.strip()][: config.max_negatives]
    return RoiRegion(sample["__key__"], tuple(float(v) for v in box), text, negatives)


def box_in_parent(region: RoiRegion, parent: Decoded) -> tuple[float, float, float, float]:
    """The region's figure-pixel box moved into its parent's frame: a panel's JSON ``box`` (also in
    figure pixels) gives the panel's origin and extent, scaled to the panel image as stored (a
    crop kept at its size scales by 1); a figure is its own frame."""
    meta = json.loads(parent.meta or "{}")
    frame = meta.get("box")
    x1, y1, x2, y2 = region.box
    if not (isinstance(frame, list) and len(frame) == 4 and frame[2] > frame[0] and frame[3] > frame[1]):
        return (x1, y1, x2, y2)
    sx, sy = parent.size[0] / (frame[2] - frame[0]), parent.size[1] / (frame[3] - frame[1])
    return ((x1 - frame[0]) * sx, (y1 - frame[1]) * sy, (x2 - frame[0]) * sx, (y2 - frame[1]) * sy)


# ----------------------------------------------------------------------------------- the model


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


# ----------------------------------------------------------------------------------- one step's inputs


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


# ----------------------------------------------------------------------------------- the trainer


class Trainer:
    def __init__(self, config: MultilevelConfig, info: DistInfo | None = None):
        import open_clip

        from pipelines.training.distributed import rank_device

        self.config, self.info = config, info or DistInfo()
        torch.manual_seed(config.seed)  # the same initial weights on every rank
        self.device = torch.device(rank_device(config.device, self.info))  # no silent CPU fallback on a GPU job
        clip.hf_text.enable_hf_text_towers()  # a BMC-LongCLIP export starts a run too
        clip.check_weights(config.model, config.pretrained)
        tag = clip.resolve_pretrained(config.model, config.pretrained)
        model, self.preprocess, _ = open_clip.create_model_and_transforms(config.model, pretrained=tag)
        if config.temperature_init is not None:
            with torch.no_grad():
                model.logit_scale.fill_(math.log(1.0 / config.temperature_init))
        self.tokenizer = open_clip.get_tokenizer(config.model)
        self.params = set_trainable(model, config)
        self.core = StepModel(model, config, self.info).to(self.device)
        self.model = self.core.model
        self.parent_preprocess = (
            roi.squash_transform(self.preprocess, model.visual.image_size) if config.roi_mode else self.preprocess
        )
        if self.core.roi_processor is not None:
            self.params["trainable"] += sum(p.numel() for p in self.core.roi_processor.parameters())
        trainable = [p for p in self.core.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trainable, lr=config.lr, betas=(config.beta1, config.beta2), weight_decay=config.wd
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, config.warmup, config.steps)
        )
        self.step_module: torch.nn.Module = self.core
        self.base_trainable = {name: p.requires_grad for name, p in self.core.named_parameters()}
        self.stage_index: int | None = None
        self._pool: ThreadPoolExecutor | None = None  # decodes the cross-level children (``_children``)
        self.ckpt_dir = config.checkpoint_dir or f"{config.run_dir.rstrip('/')}/checkpoints"
        self.step = 0
        self.skipped = 0
        self.linked = {FIGURE_PANEL: 0, PANEL_REGION: 0} | ({ROI_REGION: 0} if config.roi_mode else {})
        self.last_terms: dict[str, float] = {}  # each loss term's latest value in this run

    def wrap(self) -> None:
        """DDP after the weights are final (loaded from a checkpoint on every rank). The anchor term
        reaches every tower parameter each step; only the ROI processor sits unused (before the
        region stage, or on a rank whose parents found no region) and the groups a curriculum
        stage freezes (``train``), so only then does DDP search the graph for unused parameters."""
        if self.info.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            staged = any("train" in stage for stage in self.config.curriculum)
            self.step_module = DistributedDataParallel(
                self.core, device_ids=ids, find_unused_parameters=self.core.roi_processor is not None or staged
            )

    def apply_stage(self) -> None:
        """Freeze what the current curriculum stage does not train (its ``train`` groups, within
        what the config lets train at all). The optimizer holds every parameter that may train and
        skips those without a gradient, so a stage switch needs no new optimizer; DDP was built
        with every such parameter and finds the frozen ones unused (``wrap``)."""
        c = self.config
        index = stage_at(self.step, c.curriculum, c.steps, c.epoch_steps)
        if index == self.stage_index:
            return
        self.stage_index = index
        groups = set(c.curriculum[index].get("train", PARAM_GROUPS)) if index is not None else set(PARAM_GROUPS)
        for name, param in self.core.named_parameters():
            param.requires_grad = self.base_trainable[name] and param_group(name) in groups
        if index is not None:
            name = c.curriculum[index].get("name", index)
            launch.log(f"curriculum stage {name} from step {self.step}: trains {sorted(groups)}")

    # -- state

    def levels_used(self) -> set[str]:
        return {lv for slot in self.config.schedule for lv in slot}

    def _reader(self, level: str, skip: int) -> LevelReader:
        return LevelReader(level, self.config.data_of(level), self.config.shard_name, skip, self.info)

    @property
    def workers(self) -> int:
        """Loader workers per level (None in the config: 4 on CUDA, where decoding would stall the
        GPU, 0 on CPU, where workers would compete with the step for the same cores)."""
        if self.config.workers is not None:
            return self.config.workers
        return 4 if self.device.type == "cuda" else 0

    def _feed(self, level: str, consumed: int, saved: dict | None) -> LevelFeed:
        """The level's DataLoader, each worker resuming at its saved position (see ``loader``)."""
        c = self.config
        workers = self.workers
        positions, rotation, batches, exact = resume_positions(saved, consumed, max(1, workers))
        if not exact:
            launch.log(f"{level}: data position saved with other loader workers, resumed approximately", "warning")
        from webdataset.shardlists import expand_urls

        shards = [url for source in c.data_of(level) for url in expand_urls(shard_pattern(source, c.shard_name))]
        preprocess = self.parent_preprocess if level == c.roi_parent else self.preprocess
        decoder = functools.partial(decode, level=level, preprocess=preprocess, config=c)
        dataset = LevelDataset(
            level, shards, self.info, decoder, c.batch_size, positions, rotation, c.seed, 100 * c.batch_size
        )
        pin = c.pin_memory if c.pin_memory is not None else self.device.type == "cuda"
        return LevelFeed(dataset, batches, workers, c.prefetch_factor, pin, c.persistent_workers)

    def open_readers(self, consumed: dict[str, int], loaders: dict[str, dict] | None = None) -> None:
        c = self.config
        own = self.levels_used() - ({REGION} if c.roi_mode else set())
        loaders = loaders or {}
        self.close()
        self.readers = {lv: self._feed(lv, consumed.get(lv, 0), loaders.get(lv)) for lv in LEVELS if lv in own}
        self.links: dict[str, LevelReader] = {}
        self.buffers: dict[str, ChildBuffer] = {}
        for parent in self.levels_used() & set(CHILD):
            child, term = CHILD[parent]
            if c.loss_weights.get(term, 0.0) > 0 or any(term in s.get("weights", {}) for s in c.curriculum):
                if c.data_of(child):
                    self.links[child] = self._reader(child, consumed.get(f"link_{child}", 0))
                    self.buffers[child] = ChildBuffer(c.link_buffer)
        if c.roi_mode and REGION in self.levels_used():
            self.roi_reader = self._reader(REGION, consumed.get(ROI_REGION, 0))
            self.roi_buffer = ChildBuffer(c.link_buffer)

    def consumed(self) -> dict[str, int]:
        out = {lv: r.consumed for lv, r in self.readers.items()}
        out |= {f"link_{lv}": r.consumed for lv, r in self.links.items()}
        if getattr(self, "roi_reader", None) is not None:
            out[ROI_REGION] = self.roi_reader.consumed
        return out

    def loader_state(self) -> dict[str, dict]:
        return {lv: feed.state() for lv, feed in self.readers.items()}

    def close(self) -> None:
        for feed in getattr(self, "readers", {}).values():
            feed.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def state(self, consumed_by_rank: list[dict[str, int]], loaders_by_rank: list[dict[str, dict]]) -> dict:
        return {
            "step": self.step,
            "state_dict": self.model.state_dict(),
            "roi_processor": None if self.core.roi_processor is None else self.core.roi_processor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "consumed": consumed_by_rank[0],
            "consumed_by_rank": consumed_by_rank,
            "loaders_by_rank": loaders_by_rank,  # each level's loader position (per worker, batches used)
            "skipped": self.skipped,
            "linked": dict(self.linked),
            "config": asdict(self.config),
        }

    def resume(self) -> int | None:
        """Load the newest lake checkpoint (every rank the same file); returns its step (None on a
        first launch). Each rank resumes its own data position; a run resumed on a different number
        of ranks re-splits the data and restarts every rank at rank 0's position (logged). The
        children waiting in the link buffers are not saved: they are re-read as the run goes on."""
        newest = launch.latest_checkpoint(self.ckpt_dir) if self.config.resume else None
        if newest is None:
            self.open_readers({})
            return None
        with fsspec.open(newest, "rb") as f:
            state = torch.load(io.BytesIO(f.read()), map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["state_dict"])
        if self.core.roi_processor is not None and state.get("roi_processor") is not None:
            self.core.roi_processor.load_state_dict(state["roi_processor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.skipped, self.linked = state["step"], state["skipped"], {**self.linked, **state["linked"]}
        by_rank = state.get("consumed_by_rank") or [state["consumed"]]
        loaders = state.get("loaders_by_rank") or [{}] * len(by_rank)
        if len(by_rank) != self.info.world:
            launch.log(
                f"checkpoint from {len(by_rank)} rank(s), resumed on {self.info.world}: data restarts", "warning"
            )
            by_rank, loaders = [by_rank[0]] * self.info.world, [loaders[0]] * self.info.world
        self.open_readers(by_rank[self.info.rank], loaders[self.info.rank])
        return self.step

    def save(self) -> str | None:
        """Rank 0 writes the checkpoint between two barriers: every rank has finished the step (and
        sent its data position) before the write, and none reads the folder before it is whole."""
        from pipelines.training.distributed import barrier, gather_objects

        positions = gather_objects((self.consumed(), self.loader_state()), self.info)
        barrier(self.info)
        url = None
        if self.info.is_main:
            buffer = io.BytesIO()
            torch.save(self.state([p[0] for p in positions], [p[1] for p in positions]), buffer)
            url = launch.save_checkpoint(self.ckpt_dir, self.step, buffer.getvalue(), "pt")
            if self.config.keep_last_checkpoint_only:
                launch.prune_checkpoints(self.ckpt_dir, 1, upto=self.step)
        barrier(self.info)
        return url

    # -- one step's data

    def _batch(self, level: str) -> tuple[list[Decoded], torch.Tensor]:
        """The level's next decoded batch from its loader, images stacked; the samples its worker
        could not use are logged and counted here (a worker never raises for one)."""
        while True:
            loaded = self.readers[level].next()
            for key, reason in loaded.skips:
                self._count_skip(level, key, reason)
            if loaded.items:
                return loaded.items, loaded.images

    def _skip(self, level: str, sample: dict, exc: Exception) -> None:
        self._count_skip(level, str(sample.get("__key__")), str(exc))

    def _count_skip(self, level: str, key: str, reason: str) -> None:
        self.skipped += 1
        launch.log(f"skipped {level} sample {key}: {reason}", "warning")
        if self.skipped > 100 * self.config.batch_size:
            raise RuntimeError(f"more than {self.skipped} unusable samples: is the {level} subset right?")

    def _children(self, parent_level: str, parents: list[Decoded], rng: random.Random) -> list[tuple[int, Decoded]]:
        """The step's children, decoded here (only once their parent is in the step, so no
        evicted child is ever decoded) by ``workers`` threads: Pillow's decoding and resizing and
        torch's transforms release the GIL. Each child draws its text from its own generator, so
        the result does not depend on the threads' order."""
        child, _ = CHILD[parent_level]
        found = self._linked(self.links[child], self.buffers[child], parents, lambda k: parent_key(k, child))
        seed = rng.random()

        def one(sample: dict) -> Decoded | Exception:
            try:
                own = random.Random(f"{seed}:{sample.get('__key__')}")
                return decode(sample, child, self.preprocess, self.config, own)
            except Exception as exc:  # noqa: BLE001 - a bad child is skipped, never the step
                return exc

        samples_ = [sample for _, sample in found]
        results = list(self._decode_pool().map(one, samples_) if self.workers > 0 else map(one, samples_))
        out = []
        for (index, sample), result in zip(found, results, strict=True):
            if isinstance(result, Exception):
                self._skip(child, sample, result)
            else:
                out.append((index, result))
        return out

    def _decode_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="decode-children")
        return self._pool

    def _linked(self, reader: LevelReader, buffer: ChildBuffer, parents: list[Decoded], key_of) -> list:
        """Pull the next child samples into ``buffer`` and take those of ``parents``."""
        for sample in reader.take(self.config.link_pull or self.config.batch_size):
            key = sample.get("__key__", "")
            parent = key_of(key)
            if parent is not None:
                buffer.add(parent, key, sample)
        return buffer.take([p.key for p in parents], self.config.max_children or self.config.batch_size)

    def _tensors(self, items: list, negatives: bool = False, images: torch.Tensor | None = None) -> Batch:
        tokens = self.tokenizer([d.text for d in items]).to(self.device)
        if images is None and hasattr(items[0], "image"):
            images = torch.stack([d.image for d in items])
        images = images.to(self.device, non_blocking=True) if images is not None else None
        batch = Batch(images, tokens)
        k = max((len(d.negatives) for d in items), default=0) if negatives else 0
        if k:
            texts = [d.negatives[j] if j < len(d.negatives) else "" for d in items for j in range(k)]
            batch.negatives = self.tokenizer(texts).to(self.device)
            batch.negative_mask = torch.tensor([[j < len(d.negatives) for j in range(k)] for d in items])
            batch.negative_mask = batch.negative_mask.to(self.device)
        return batch

    def _roi_batch(self, parents: list[Decoded], rng: random.Random, negatives: bool) -> RoiBatch:
        """The regions of ``parents`` found in the ROI buffer, their boxes in the parent's grid;
        a region with a missing or out-of-frame box is skipped and logged."""
        c = self.config
        found = self._linked(self.roi_reader, self.roi_buffer, parents, lambda k: roi_parent_key(k, c.roi_parent))
        regions, boxes, index = [], [], []
        for i, sample in found:
            try:
                region = decode_roi(sample, c, rng)
                boxes.append(roi.box_to_grid(box_in_parent(region, parents[i]), parents[i].size, self.core.grid))
            except Exception as exc:  # noqa: BLE001
                self._skip(REGION, sample, exc)
                continue
            regions.append(region)
            index.append(i)
        self.linked[ROI_REGION] += len(regions)
        box_tensor = torch.tensor(boxes, dtype=torch.float32, device=self.device).reshape(-1, 4)
        parent_tensor = torch.tensor(index, dtype=torch.long, device=self.device)
        if not regions:
            return RoiBatch(box_tensor, parent_tensor, None)
        batch = self._tensors(regions, negatives)
        return RoiBatch(box_tensor, parent_tensor, batch.tokens, batch.negatives, batch.negative_mask)

    def inputs(self, levels: list[str], weights: dict[str, float], rng: random.Random) -> StepInputs:
        """Everything the step's tower passes need, read and decoded before the forward pass."""
        c = self.config
        out = StepInputs()
        for level in levels:
            if level not in self.readers:
                continue  # regions in an ROI mode: read with their parent below
            batch, images = self._batch(level)
            out.levels[level] = self._tensors(batch, level == REGION and weights[NEGATIVE] > 0, images)
            if level in CHILD and CHILD[level][0] in self.links and weights[CHILD[level][1]] > 0:
                children = self._children(level, batch, rng)
                tensors = self._tensors([d for _, d in children]) if children else None
                out.children[CHILD[level][1]] = (tensors, [i for i, _ in children])
                self.linked[CHILD[level][1]] += len(children)
            roi_active = weights[REGION] > 0 or weights[NEGATIVE] > 0
            if c.roi_mode and level == c.roi_parent and REGION in levels and roi_active:
                out.roi = self._roi_batch(batch, rng, weights[NEGATIVE] > 0)
        return out

    # -- one step

    def plan(self) -> tuple[list[str], dict[str, float], random.Random]:
        """The current step's levels, loss weights and text-sampling generator."""
        c = self.config
        levels = levels_at(self.step, c.schedule, c.schedule_every)
        weights = curriculum_weights(self.step, c.loss_weights, c.curriculum, c.steps, c.epoch_steps)
        rng = random.Random(c.seed * 1_000_003 + self.step + self.info.rank * 100_003)  # same texts on a re-run
        return levels, weights, rng

    def train_step(self) -> dict[str, float]:
        levels, weights, rng = self.plan()
        return self.compute(self.inputs(levels, weights, rng), weights)

    def compute(self, inputs: StepInputs, weights: dict[str, float]) -> dict[str, float]:
        """Forward, backward and update on inputs already read (split from the reading so the
        training benchmark can time the two apart)."""
        c = self.config
        self.apply_stage()
        self.step_module.train()
        autocast = torch.autocast(
            "cuda", dtype=torch.bfloat16, enabled=c.precision == "bf16" and self.device.type == "cuda"
        )
        with autocast:
            terms = self.step_module(inputs, weights)
            anchor = terms.pop("anchor")
            total = sum((weights[k] * v for k, v in terms.items()), anchor)
        self.optimizer.zero_grad(set_to_none=True)
        if total.requires_grad:
            total.backward()
            if c.grad_clip_norm:
                torch.nn.utils.clip_grad_norm_([p for p in self.core.parameters() if p.requires_grad], c.grad_clip_norm)
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        metrics = {"loss": float(total.detach()), "lr": self.scheduler.get_last_lr()[0]}
        metrics |= {f"loss_{k}": float(v.detach()) for k, v in terms.items()}
        self.last_terms |= {k: v for k, v in metrics.items() if k.startswith("loss_")}
        metrics |= {f"w_{k}": w for k, w in weights.items() if w}
        if not math.isfinite(metrics["loss"]):
            raise FloatingPointError(f"step {self.step}: loss is {metrics['loss']} ({metrics})")
        return metrics


def train(config: MultilevelConfig, info: DistInfo | None = None) -> dict:
    """Train (or resume) to ``config.steps``, checkpointing to the lake; export; the report (rank 0
    exports; every rank returns the report, with each rank's sample counts)."""
    from pipelines.training.distributed import barrier, gather_objects

    config.validate()
    trainer = Trainer(config, info)
    info = trainer.info
    resumed = trainer.resume()
    trainer.wrap()
    if resumed is not None:
        launch.log(f"resumed from step {resumed} ({trainer.ckpt_dir})")
    first, metrics = trainer.step, {}
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
    by_rank = gather_objects({"consumed": trainer.consumed(), "linked": trainer.linked}, info)
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
        "skipped_samples": trainer.skipped,
        "linked_children": json.dumps({k: sum(r["linked"][k] for r in by_rank) for k in trainer.linked}),
        "consumed": json.dumps(trainer.consumed()),
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


if __name__ == "__main__":
    main()
