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

import importlib

from pipelines.training.multilevel.config import (
    CHILD,
    FIGURE,
    FIGURE_PANEL,
    LEVELS,
    NEGATIVE,
    PANEL,
    PANEL_REGION,
    PARAM_GROUPS,
    PRESETS,
    REGION,
    REGION_FEATURES,
    ROI_REGION,
    WEIGHT_KEYS,
    MultilevelConfig,
)
from pipelines.training.multilevel.curriculum import curriculum_weights, levels_at, param_group, stage_at
from pipelines.training.multilevel.decoding import Decoded, RoiRegion, box_in_parent, decode, decode_roi, region_text

# The torch-heavy parts are imported on first use (PEP 562): the assets import the configuration
# from here, and every Dagster process that loads the code location (code servers, run workers,
# the command line) would otherwise import torch (~1.7 s of CPU) for runs that never touch it.
_LAZY = {
    **dict.fromkeys(("main", "process_group", "run", "train"), "job"),
    **dict.fromkeys(
        ("clip_loss", "cross_level_loss", "negative_sigmoid_loss", "negative_softmax_loss", "pooled_children"),
        "losses",
    ),
    **dict.fromkeys(("Batch", "RoiBatch", "StepInputs", "StepModel", "lr_factor", "set_trainable"), "model"),
    **dict.fromkeys(("ChildBuffer", "LevelReader", "parent_key", "roi_parent_key", "shard_pattern"), "readers"),
    "Trainer": "trainer",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CHILD",
    "FIGURE",
    "FIGURE_PANEL",
    "LEVELS",
    "NEGATIVE",
    "PANEL",
    "PANEL_REGION",
    "PARAM_GROUPS",
    "PRESETS",
    "REGION",
    "REGION_FEATURES",
    "ROI_REGION",
    "WEIGHT_KEYS",
    "Batch",
    "ChildBuffer",
    "Decoded",
    "LevelReader",
    "MultilevelConfig",
    "RoiBatch",
    "RoiRegion",
    "StepInputs",
    "StepModel",
    "Trainer",
    "box_in_parent",
    "clip_loss",
    "cross_level_loss",
    "curriculum_weights",
    "decode",
    "decode_roi",
    "levels_at",
    "lr_factor",
    "main",
    "negative_sigmoid_loss",
    "negative_softmax_loss",
    "param_group",
    "parent_key",
    "pooled_children",
    "process_group",
    "region_text",
    "roi_parent_key",
    "run",
    "set_trainable",
    "shard_pattern",
    "stage_at",
    "train",
]
