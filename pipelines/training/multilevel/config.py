"""The job's configuration: the levels and loss terms, the two recipes (``PRESETS``) and
:class:`MultilevelConfig`, checked whole before a step runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipelines import launch
from pipelines.training import clip

FIGURE, PANEL, REGION = "figure", "panel", "region"
LEVELS = (FIGURE, PANEL, REGION)
FIGURE_PANEL, PANEL_REGION, NEGATIVE = "figure_panel", "panel_region", "negative"
ROI_REGION = "roi_region"  # regions read with their parent in the ROI modes
WEIGHT_KEYS = (FIGURE, PANEL, REGION, FIGURE_PANEL, PANEL_REGION, NEGATIVE)
CHILD = {FIGURE: (PANEL, FIGURE_PANEL), PANEL: (REGION, PANEL_REGION)}  # parent level -> (child level, term)
PARENT_SUFFIX = {PANEL: re.compile(r"^(.+)_p\d{3}$"), REGION: re.compile(r"^(.+_p\d{3})_r\d{2}$")}
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
REGION_FEATURES = ("crop", "roi_pool", "roi_processor")
PRECISIONS = ("fp32", "bf16")  # bf16: autocast on CUDA, fp32 weights
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
    gpu_memory_gb: float | None = None  # for the memory check; None: the job's GPU's own (no check on CPU); 0: none
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
    # the release's recorded held-out split (models/eval/<release>/heldout.json, a path or URL): its
    # articles' samples are dropped at every level as they are read; None: train on every sample
    heldout: str | None = None
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
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
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
