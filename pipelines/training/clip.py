"""Continual CLIP pretraining with OpenCLIP's trainer on the release's WebDataset, as a launched job.

    python -m pipelines.training.clip --config config.json

The JSON config holds :class:`ClipTrainConfig`'s fields; the launcher adds a ``launch`` section
(``run_dir``, ``checkpoint_dir``, ``gpus``). The defaults are BIOMEDICA's recipe
(``shared/papers/004_3487d638bbd8f5c4.txt``, section 15 and table 11): ViT-L-14 from CommonPool
XL filtered by CLIP score (``commonpool_xl_clip_s13b_b90k``, the tag of every BIOMEDICA launch
script and of ``experiments.csv``), 1024 per GPU x 4 GPUs x 2 accumulation steps = 8192, lr 1e-6
with 1,000 warm-up steps, Adam beta 0.9/0.95, weight decay 0.2, gradient clipping 1.0, fp32; 9
epochs on the full data, 27 concept-balanced, 36 concept-filtered (:data:`RECIPE_EPOCHS`). Like
BIOMEDICA's launch scripts (``scripts/submit_and_manage_jobs_wds.py`` in
``Ale9806/open_clip_with_biomedica``) the trainer runs with ``--grad-checkpointing --local-loss
--gather-with-grad``: without checkpointing a ViT-L-14 sample holds about 482 MB of fp32
activations and 1,024 of them cannot fit an 80 GB GPU. Before the trainer starts, the job
estimates the step's memory (:mod:`pipelines.training.memory`) and refuses a batch that cannot
fit its GPU, naming the setting to change.

The training itself is ``open_clip_train.main`` (it ships inside open-clip-torch), run as a child
process so that its global logging setup, its process group and a crash stay out of this one:
its output is streamed line by line into the run log and its loss lines become progress reports
(``pipelines.launch``). With more than one GPU the child runs under its own torchrun; when the
launcher started this module under torchrun too, rank 0 runs the trainer and the others exit.

Checkpoints: OpenCLIP writes ``epoch_N.pt`` under ``<logs>/train/checkpoints``. When the run dir
is on a local disk, ``<logs>`` is ``<run_dir>/openclip``, so the checkpoints are in the lake
already; otherwise ``<logs>`` is a local scratch folder and each finished epoch is copied to
``<checkpoint_dir>/ckpt-0000000N.pt`` (``launch.save_checkpoint``), and a fresh machine fetches
the newest copy back before OpenCLIP's ``--resume latest`` looks, so a preempted run resumes from
its last whole epoch anywhere.

Held-out articles: with ``heldout`` (the release's recorded split, which the asset always passes)
every shard is read through a ``pipe:`` that drops the held-out articles' samples
(:mod:`pipelines.training.heldout`), and an epoch is the samples kept.

After training, WiSE-FT (Wortsman et al.) interpolates the fine-tuned weights with the base
model's, theta = (1 - alpha) * theta_base + alpha * theta_ft, and exports the result to
``<run_dir>/model`` as ``open_clip_model.safetensors`` + ``open_clip_config.json``, loadable with
``open_clip.create_model_and_transforms("local-dir:<dir>")``.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipelines import launch
from pipelines.compute import hf_text, weights
from pipelines.core.heldout import HeldoutSplit
from pipelines.training import heldout, memory

RECIPE_EPOCHS = {"full": 9, "concept-balanced": 27, "concept-filtered": 36}  # BIOMEDICA, table 11
# BIOMEDICA's base model: CommonPool XL filtered by CLIP score (76.4% ImageNet zero-shot, against
# 72.3% for the unfiltered commonpool_xl_s13b_b90k), the --pretrained of all their launch scripts
COMMONPOOL = "commonpool_xl_clip_s13b_b90k"
# BMC-CLIP (concept-filtered), where Panel2Patch starts: a ViT-L-14 OpenCLIP trainer checkpoint
# (``state_dict`` with DDP's ``module.`` prefixes, which OpenCLIP's loader strips) on the Hub
BMC_CLIP = "hf-hub:BIOMEDICA/BMC_CLIP_CF/BMC_CLIP_CF.pt"
HF_HUB = "hf-hub:"
# BMC-LongCLIP (shared/papers/003_9645439f2590c986.txt, section 2 and appendix F, table 4)
LONGCLIP_VISION = ("ViT-L-14-quickgelu", "dfn2b")  # ViT-L/14 pretrained on DFN-2B (trained with QuickGELU)
LONGCLIP_TEXT = "thomas-sounack/BioClinical-ModernBERT-base"  # BioClinical ModernBERT, 150M
LONGCLIP_CONTEXTS = (77, 154, 512)
LONGCLIP_RECIPE = dict(batch_size=1024, accum_freq=1, gpus=8, lr=5e-4, warmup=1000, epochs=20, beta1=0.9, beta2=0.95,
                       grad_clip_norm=1.0, precision="fp32", wise_ft_alpha=1.0)  # fmt: skip
TRAINER_MODULE = "pipelines.compute.hf_text"  # open_clip_train.main with ModernBERT enabled
SHARD_NAME = "panelforge"
RUN_NAME = "train"  # OpenCLIP's --name: <logs>/train/{out.log,checkpoints/}
LOCAL_DIR = "local-dir:"
EXPORT_WEIGHTS = "open_clip_model.safetensors"
EXPORT_CONFIG = "open_clip_config.json"
EPOCH_CKPT = re.compile(r"^epoch_(\d+)\.pt$")
# OpenCLIP's log lines: "Train Epoch: 0 [16/16 (100%)] ... LR: 0.000100 Logit Scale: 14.286
# Contrastive_loss: 2.4 (2.4) Loss: 2.4 (2.4)" (each loss: its last value, then its running mean)
TRAIN_LINE = re.compile(r"Train Epoch: (\d+) \[\s*(\d+)/(\d+)")
LOSS_TERM = re.compile(r"(\w+): ([-+0-9.eE]+|nan|inf) \(")
LR_TERM = re.compile(r"LR: ([-+0-9.eE]+)")
RATE_TERM = re.compile(r"([0-9.eE+]+)/s,")
RESUMED_LINE = re.compile(r"=> resuming checkpoint '([^']+)' \(epoch (\d+)\)")
START_LINE = re.compile(r"Start epoch (\d+)")


@dataclass
class ClipTrainConfig(launch.JobConfig):
    """One continual-pretraining run. ``train_data``: WebDataset subset folders (each with
    ``panelforge-NNNNNN.tar`` and ``sizes.json``); more than one is a mixture, sampled with
    ``upsampling_factors`` (OpenCLIP needs ``dataset_resampled`` for that)."""

    train_data: list[str]
    run_dir: str
    upsampling_factors: list[float] | None = None
    dataset_resampled: bool = False
    train_num_samples: int | None = None  # samples per epoch; None: the sum of the subsets' sizes.json
    model: str = "ViT-L-14"  # an OpenCLIP name, hf-hub:org/repo or local-dir:/path
    pretrained: str = COMMONPOOL  # a tag or a weights file; ignored for local-dir:
    batch_size: int = 1024  # per GPU
    accum_freq: int = 2
    gpus: int = 4
    lr: float = 1e-6
    warmup: int = 1000
    epochs: int = RECIPE_EPOCHS["full"]
    beta1: float = 0.9
    beta2: float = 0.95
    wd: float = 0.2
    grad_clip_norm: float = 1.0
    precision: str = "fp32"
    grad_checkpointing: bool = True  # recompute each block in the backward pass (BIOMEDICA's scripts)
    local_loss: bool = True  # logits of this GPU's samples against the global batch only
    gather_with_grad: bool = True  # the gathered features carry gradients (needed with local_loss)
    gpu_memory_gb: float | None = None  # for the memory check; None: the job's GPU's own (no check on CPU); 0: none
    workers: int = 8
    seed: int = 0
    device: str = "cuda"
    log_every_n_steps: int = 50
    save_frequency: int = 1
    delete_previous_checkpoint: bool = True
    resume: bool = True
    wise_ft_alpha: float = 0.5  # 1: the fine-tuned weights, 0: the base model's
    checkpoint_dir: str | None = None  # lake copies of the epochs; None: <run_dir>/checkpoints
    scratch_dir: str | None = None  # local OpenCLIP logs when run_dir is not local; None: a temp folder
    python: str | None = None  # the trainer's interpreter; None: this one
    # the release's recorded held-out split (models/eval/<release>/heldout.json, a path or URL): its
    # articles' samples are filtered out of the shards OpenCLIP reads; None: train on every sample
    heldout: str | None = None
    shard_name: str = SHARD_NAME
    extra_args: list[str] = field(default_factory=list)  # passed to open_clip_train.main as they are
    # a Hugging Face text tower (Hub id or local folder): the model is then assembled from ``model``
    # + ``pretrained``'s vision tower and this text tower (BMC-LongCLIP, :func:`longclip_config`)
    text_model: str | None = None
    context_length: int = 77  # the text tower's tokens (truncated and padded); with text_model only
    text_pooler: str = "mean_pooler"  # OpenCLIP's hf_pooler_type
    text_proj: str = "mlp"  # OpenCLIP's hf_proj_type

    JOB = "CLIP training"
    LAUNCH_FIELDS = {"run_dir": "run_dir", "checkpoint_dir": "checkpoint_dir", "gpus": "gpus"}

    def validate(self) -> None:
        if not self.train_data:
            raise ValueError("train_data names no WebDataset subset")
        if self.upsampling_factors is not None:
            if len(self.upsampling_factors) != len(self.train_data):
                raise ValueError("upsampling_factors needs one factor per train_data subset")
            if not self.dataset_resampled:
                raise ValueError("upsampling_factors needs dataset_resampled (OpenCLIP samples with replacement)")
        if not 0.0 <= self.wise_ft_alpha <= 1.0:
            raise ValueError(f"wise_ft_alpha must be in [0, 1], got {self.wise_ft_alpha}")
        if self.gpus < 0 or self.epochs < 1 or self.batch_size < 1 or self.accum_freq < 1:
            raise ValueError("gpus >= 0, epochs >= 1, batch_size >= 1 and accum_freq >= 1")
        if self.precision not in memory.PRECISIONS:
            raise ValueError(f"precision must be one of {memory.PRECISIONS}, got {self.precision!r}")
        if self.text_model is not None and self.context_length < 2:
            raise ValueError(f"context_length must hold at least the two special tokens, got {self.context_length}")


def longclip_config(
    train_data: list[str], run_dir: str, context_length: int = 512, **overrides: Any
) -> ClipTrainConfig:
    """BMC-LongCLIP's recipe: DFN-2B ViT-L/14 + BioClinical ModernBERT, 8 GPUs x 1024 = 8192, lr 5e-4
    with 1,000 warm-up steps, Adam 0.9/0.95, clipping 1.0, fp32, 20 epochs; the paper's context
    lengths are 77, 154 and 512. ``train_data`` is typically a mixture of the figure-level subset
    and a ``longcap-<group>`` subset (BMC-LongCLIP+). The new text projection has no base to
    interpolate with, so WiSE-FT is off (alpha 1) unless ``overrides`` say otherwise."""
    model, pretrained = LONGCLIP_VISION
    values: dict[str, Any] = dict(LONGCLIP_RECIPE, model=model, pretrained=pretrained, text_model=LONGCLIP_TEXT)
    if len(train_data) > 1:
        values["dataset_resampled"] = True
    return ClipTrainConfig(train_data=train_data, run_dir=run_dir, context_length=context_length, **values | overrides)


@dataclass(frozen=True)
class TrainData:
    """What OpenCLIP reads: one brace pattern per subset and the samples of one epoch."""

    patterns: list[str]
    samples: int
    heldout_excluded: int = 0  # samples of held-out articles filtered out of the stream


# ----------------------------------------------------------------------------------- the data


def is_local(url: str) -> bool:
    return isinstance(fsspec.core.url_to_fs(url)[0], LocalFileSystem)


def local_path(url: str) -> str:
    return fsspec.core.url_to_fs(url)[1]


def subset_shards(directory: str, shard_name: str) -> tuple[str, list[int], int]:
    """A subset's shard folder (a local path or a URL), its shard numbers and its sample count,
    from its ``sizes.json``."""
    sizes = json.loads(launch.read_bytes(f"{directory.rstrip('/')}/sizes.json"))
    pattern = re.compile(rf"^{re.escape(shard_name)}-(\d{{6}})\.tar$")
    indices = sorted(int(m.group(1)) for name in sizes if (m := pattern.match(name)))
    if not indices:
        raise ValueError(f"{directory}/sizes.json lists no {shard_name}-NNNNNN.tar shard")
    if indices != list(range(indices[0], indices[-1] + 1)):
        raise ValueError(f"{directory}: shard numbers are not contiguous: {indices}")
    base = local_path(directory).rstrip("/") if is_local(directory) else directory.rstrip("/")
    return base, indices, sum(int(v) for v in sizes.values())


def subset_data(directory: str, shard_name: str = SHARD_NAME, python: str | None = None) -> tuple[str, int]:
    """The brace pattern of a subset's shards and its sample count, from its ``sizes.json``.
    A subset off this machine (s3://, gs://) is read through a ``pipe:`` that streams each shard
    with fsspec, so the trainer streams from the lake with the job's own credentials."""
    base, indices, samples = subset_shards(directory, shard_name)
    url = f"{base}/{shard_name}-{{{indices[0]:06d}..{indices[-1]:06d}}}.tar"
    if not is_local(directory):
        url = f"pipe:{python or sys.executable} -m pipelines.training.clip --cat {url}"
    return url, samples


def subset_data_without(
    directory: str, split: HeldoutSplit, split_url: str, shard_name: str = SHARD_NAME, python: str | None = None
) -> tuple[str, int, int]:
    """:func:`subset_data` without the held-out articles: every shard streamed through the
    held-out filter (``pipelines/training/heldout.py``, which opens local and remote shards
    alike); (pattern, samples kept, samples excluded), counted from the shards' sidecars."""
    base, indices, listed = subset_shards(directory, shard_name)
    shards = [f"{base}/{shard_name}-{i:06d}.tar" for i in indices]
    total, held = heldout.count_heldout(shards, split)
    if total != listed:
        raise ValueError(f"{directory}: the shards' sidecars hold {total} samples, sizes.json {listed}")
    pattern = f"{base}/{shard_name}-{{{indices[0]:06d}..{indices[-1]:06d}}}.tar"
    return heldout.filter_command(pattern, split_url, python), total - held, held


def resolve_data(config: ClipTrainConfig) -> TrainData:
    """What OpenCLIP reads; with ``heldout`` the held-out articles' samples are filtered out of
    the stream and the epoch's samples are those kept (unless ``train_num_samples`` is set)."""
    if config.heldout is None:
        found = [(*subset_data(d, config.shard_name, config.python), 0) for d in config.train_data]
    else:
        split = heldout.load_split(config.heldout)
        found = [
            subset_data_without(d, split, config.heldout, config.shard_name, config.python) for d in config.train_data
        ]
    samples = config.train_num_samples or sum(n for _, n, _ in found)
    return TrainData([p for p, _, _ in found], samples, sum(h for _, _, h in found))


# ----------------------------------------------------------------------------------- the command


def _number(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def trainer_args(config: ClipTrainConfig, data: TrainData, logs_dir: str) -> list[str]:
    """The argument list of ``open_clip_train.main`` for this run (a pure function of its inputs)."""
    args = [
        "--model", config.model,
        "--train-data", "::".join(data.patterns),
        "--dataset-type", "webdataset",
        "--train-num-samples", str(data.samples),
        "--batch-size", str(config.batch_size),
        "--accum-freq", str(config.accum_freq),
        "--epochs", str(config.epochs),
        "--lr", _number(config.lr),
        "--warmup", str(config.warmup),
        "--beta1", _number(config.beta1),
        "--beta2", _number(config.beta2),
        "--wd", _number(config.wd),
        "--grad-clip-norm", _number(config.grad_clip_norm),
        "--precision", config.precision,
        "--workers", str(config.workers),
        "--seed", str(config.seed),
        "--device", config.device,
        "--log-every-n-steps", str(config.log_every_n_steps),
        "--save-frequency", str(config.save_frequency),
        "--logs", logs_dir,
        "--name", RUN_NAME,
    ]  # fmt: skip
    if config.pretrained and not config.model.startswith(LOCAL_DIR):
        args += ["--pretrained", config.pretrained]
    args += [flag for flag, on in (("--grad-checkpointing", config.grad_checkpointing),
             ("--local-loss", config.local_loss), ("--gather-with-grad", config.gather_with_grad)) if on]  # fmt: skip
    if config.dataset_resampled:
        args.append("--dataset-resampled")
    if config.upsampling_factors is not None:
        args += ["--train-data-upsampling-factors", "::".join(_number(f) for f in config.upsampling_factors)]
    if config.delete_previous_checkpoint:
        args.append("--delete-previous-checkpoint")
    if config.resume:
        args += ["--resume", "latest"]
    return args + list(config.extra_args)


def trainer_command(python: str, args: list[str], gpus: int) -> list[str]:
    """``python -m open_clip_train.main <args>`` (through :mod:`pipelines.compute.hf_text`, which
    enables ModernBERT), under torchrun (one process per GPU) above one GPU.
    The child inherits this environment: its torchrun sets every rank and rendezvous variable
    for its workers anew, so a launcher's torchrun around this module does not leak into them."""
    if gpus > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                "-m", TRAINER_MODULE, *args]  # fmt: skip
    return [python, "-m", TRAINER_MODULE, *args]


# ----------------------------------------------------------------------------------- the weights


def hub_file(pretrained: str) -> tuple[str, str] | None:
    """``hf-hub:<org>/<repo>/<file>`` (one file of a Hub repository, e.g. :data:`BMC_CLIP`) as
    (repo id, file name); None for anything else."""
    if not pretrained.startswith(HF_HUB):
        return None
    repo, _, name = pretrained.removeprefix(HF_HUB).rpartition("/")
    if repo.count("/") != 1 or not name:
        raise ValueError(f"pretrained={pretrained!r}: a Hub file is hf-hub:<org>/<repo>/<file>")
    return repo, name


def _is_path(value: str) -> bool:
    return value.startswith(("/", "~", ".")) or value.endswith((".pt", ".pth", ".bin", ".safetensors"))


def has_own_weights(model: str) -> bool:
    """A ``local-dir:`` folder that holds weights beside its config (OpenCLIP loads them)."""
    folder = Path(model.removeprefix(LOCAL_DIR))
    return any((folder / name).is_file() for name in (EXPORT_WEIGHTS, "open_clip_pytorch_model.bin"))


def starts_from_weights(model: str, pretrained: str) -> bool:
    """Whether a run of ``model`` with ``pretrained`` starts from trained weights rather than a
    random initialisation: a ``local-dir:`` with weights, an ``hf-hub:`` model, or a tag or file."""
    if model.startswith(LOCAL_DIR):
        return has_own_weights(model)
    return model.startswith(HF_HUB) or bool(pretrained)


def _tag_files(model: str, tag: str) -> tuple[str, tuple[str, ...]] | None:
    """The Hub repository and weight files OpenCLIP fetches for a pretrained tag (None: a URL tag)."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(model, tag)
    if not cfg:
        known = ", ".join(open_clip.list_pretrained_tags_by_model(model)) or "none"
        raise ValueError(f"pretrained={tag!r} is not an OpenCLIP weight tag of {model} (its tags: {known})")
    hub = cfg.get("hf_hub", "")
    if not hub:
        return None
    repo, name = os.path.split(hub)  # OpenCLIP's own reading: "org/repo/" or "org/repo/file"
    return repo, (name,) if name else ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def _cached(repo: str, names: tuple[str, ...]) -> str | None:
    import huggingface_hub

    for name in names:
        found = huggingface_hub.try_to_load_from_cache(repo, name)
        if isinstance(found, str):
            return found
    return None


def check_weights(model: str, pretrained: str, setting: str = "model") -> None:
    """The set-up check of a CLIP run's weights, without the network: the ``local-dir:`` folder,
    the weights file, the tag or the Hub file is there (a Hub file or tag that is not cached is
    fine while online: OpenCLIP fetches it). Fails in one line that names the setting and, for
    Hub weights, the ``hf download`` command; "offline" when offline mode is on."""
    import open_clip

    offline = "; offline mode is on (HF_HUB_OFFLINE), so nothing is downloaded" if weights.is_offline() else ""
    if model.startswith(LOCAL_DIR):
        folder = Path(model.removeprefix(LOCAL_DIR)).expanduser()
        if not (folder / EXPORT_CONFIG).is_file():
            raise weights.ModelUnavailableError(
                f"{setting}={model!r}: no {EXPORT_CONFIG} in {folder} (an OpenCLIP model folder, e.g. a training "
                "run's exported model/)"
            )
        return
    if model.startswith(HF_HUB):
        repo = model.removeprefix(HF_HUB).strip("/")
        if weights.is_offline() and _cached(repo, (EXPORT_CONFIG,)) is None:
            raise weights.ModelUnavailableError(
                f"{setting}={model!r}: not in the Hugging Face cache; fetch it with "
                f"`{weights.fetch_command(repo, '<folder>')}` and set {setting}=local-dir:<folder>{offline}"
            )
        return
    if open_clip.get_model_config(model) is None:
        raise ValueError(f"{setting}={model!r} is not an OpenCLIP model name (nor local-dir:<folder> or hf-hub:<id>)")
    if not pretrained:
        return
    if (found := hub_file(pretrained)) is not None:
        repo, names = found[0], (found[1],)
        fetch = weights.fetch_command(repo, "<folder>", files=names)
    elif _is_path(pretrained):
        if not Path(pretrained).expanduser().is_file():
            raise weights.ModelUnavailableError(f"pretrained={pretrained!r} ({model} weights): no such file")
        return
    elif (files := _tag_files(model, pretrained)) is not None:
        repo, names = files
        fetch = weights.fetch_command(repo, "<folder>")
    else:
        return
    if weights.is_offline() and _cached(repo, names) is None:
        raise weights.ModelUnavailableError(
            f"pretrained={pretrained!r} ({model} weights): not in the Hugging Face cache; fetch them with "
            f"`{fetch}` and set pretrained=<folder>/{names[-1]}{offline}"
        )


def resolve_pretrained(model: str, pretrained: str) -> str | None:
    """What OpenCLIP's ``pretrained`` gets: None (a ``local-dir:`` model, or no weights), a tag,
    or a file path (a Hub file is fetched into the Hugging Face cache first, unless offline)."""
    if model.startswith(LOCAL_DIR) or not pretrained:
        return None
    found = hub_file(pretrained)
    if found is None:
        return pretrained
    check_weights(model, pretrained, "model")
    import huggingface_hub

    return huggingface_hub.hf_hub_download(*found)


# ----------------------------------------------------------------------------------- memory


def model_cfg_of(model: str) -> dict | None:
    """An OpenCLIP ``model_cfg`` without the network: a named model's or a ``local-dir:``'s own
    (None for an ``hf-hub:`` model, whose config is on the Hub)."""
    import open_clip

    if model.startswith(LOCAL_DIR):
        path = Path(model.removeprefix(LOCAL_DIR)) / EXPORT_CONFIG
        return json.loads(path.read_text())["model_cfg"] if path.is_file() else None
    return open_clip.get_model_config(model)


def hf_text_size(text_model: str) -> tuple[dict, int]:
    """A Hugging Face text tower's ``config.json`` and parameter count, counted on the meta device
    (no weights are read or allocated). Offline-first: the local folder or the cache."""
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(text_model)
    with torch.device("meta"):
        tower = AutoModel.from_config(config)
    return config.to_dict(), sum(p.numel() for p in tower.parameters())


def architecture(config: ClipTrainConfig) -> memory.Architecture | None:
    """What the memory estimate needs of the run's model, or None when its config is not at hand."""
    model_cfg = model_cfg_of(config.model)
    if model_cfg is None:
        return None
    if config.text_model is not None:
        model_cfg = hf_text.hf_text_model_cfg(
            model_cfg, config.text_model, config.context_length, config.text_pooler, config.text_proj
        )
    text_cfg = model_cfg["text_cfg"]
    if "hf_model_name" in text_cfg:
        hf_config, params = hf_text_size(text_cfg["hf_model_name"])
        return memory.open_clip_architecture(config.model, model_cfg, hf_config, params)
    return memory.open_clip_architecture(config.model, model_cfg)


def check_memory(config: ClipTrainConfig, gpu_bytes: float) -> memory.MemoryEstimate | None:
    """The step's memory estimate on a GPU of ``gpu_bytes``; a batch that cannot fit is a
    ValueError naming the setting to change (``batch_size``, ``accum_freq``, ``grad_checkpointing``)."""
    arch = architecture(config)
    if arch is None:
        return None
    return memory.check_batch(
        arch,
        config.batch_size,
        gpu_bytes,
        config.precision,
        config.grad_checkpointing,
        max(config.gpus, 1),
        config.accum_freq,
        config.local_loss,
    )


def job_gpu_bytes(config: ClipTrainConfig) -> float | None:
    """The memory of the GPU the job trains on (:func:`memory.job_gpu_bytes`)."""
    return memory.job_gpu_bytes(config.gpu_memory_gb, config.device)


# ----------------------------------------------------------------------------------- the log


@dataclass
class RunLog:
    """What the trainer's output said: progress, the epoch it resumed from, the last loss."""

    steps_per_epoch: int
    resumed_from_epoch: int | None = None
    resumed_from: str | None = None
    epochs_started: list[int] = field(default_factory=list)
    last: dict[str, float] = field(default_factory=dict)
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))

    def read(self, line: str) -> tuple[int, dict[str, float]] | None:
        """Record ``line``; for a training line return (global step, metrics)."""
        self.tail.append(line)
        if m := RESUMED_LINE.search(line):
            self.resumed_from, self.resumed_from_epoch = m.group(1), int(m.group(2))
        if m := START_LINE.search(line):
            self.epochs_started.append(int(m.group(1)))
        m = TRAIN_LINE.search(line)
        if m is None:
            return None
        epoch, seen, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        losses = {k.lower(): float(v) for k, v in LOSS_TERM.findall(line)}
        metrics = {"epoch": float(epoch), **losses}
        if lr := LR_TERM.search(line):
            metrics["lr"] = float(lr.group(1))
        if rate := RATE_TERM.search(line):
            metrics["samples_per_second"] = float(rate.group(1))
        step = epoch * self.steps_per_epoch + round(self.steps_per_epoch * seen / max(total, 1))
        self.last = metrics
        return step, metrics


def steps_per_epoch(samples: int, batch_size: int, accum_freq: int, world: int) -> int:
    """Optimizer steps per epoch as OpenCLIP counts them for WebDataset (whole global batches)."""
    return max(1, -(-samples // (batch_size * max(world, 1))) // accum_freq)


# ----------------------------------------------------------------------------------- checkpoints


def local_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := EPOCH_CKPT.match(p.name)))


def copy_checkpoints(local: Path, lake_dir: str, upto: int | None = None, keep_last_only: bool = False) -> list[str]:
    """Copy the finished epochs (``<= upto`` when given: the newest file may still be written)
    from OpenCLIP's folder to the lake as ``ckpt-0000000N.pt``; returns the new URLs."""
    newest = launch.latest_checkpoint(lake_dir)
    have = launch.checkpoint_step(newest) if newest else 0
    copied = []
    for epoch, path in local_checkpoints(local):
        if epoch > have and (upto is None or epoch <= upto):
            copied.append(launch.save_checkpoint(lake_dir, epoch, path.read_bytes(), "pt"))
    if copied and keep_last_only:
        launch.prune_checkpoints(lake_dir, 1, upto=launch.checkpoint_step(copied[-1]))
    return copied


def restore_checkpoint(local: Path, lake_dir: str) -> int | None:
    """On a machine without OpenCLIP's folder, fetch the newest lake copy as ``epoch_N.pt`` so
    ``--resume latest`` finds it; returns the epoch fetched."""
    if local_checkpoints(local):
        return None
    newest = launch.latest_checkpoint(lake_dir)
    if newest is None:
        return None
    epoch = launch.checkpoint_step(newest)
    local.mkdir(parents=True, exist_ok=True)
    tmp = local / f".epoch_{epoch}.pt.tmp"
    with fsspec.open(newest, "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    os.replace(tmp, local / f"epoch_{epoch}.pt")
    return epoch


# ----------------------------------------------------------------------------------- WiSE-FT


def strip_prefixes(state: dict) -> dict:
    """A trainer checkpoint's state dict without DDP's ``module.`` prefix."""
    return {k.removeprefix("module."): v for k, v in state.items()}


def wise_ft(base: dict, finetuned: dict, alpha: float) -> dict:
    """theta = (1 - alpha) * theta_base + alpha * theta_ft for every floating-point tensor (integer
    buffers come from the fine-tuned model). The formula, not ``lerp``: alpha 0 and 1 then give
    the base and the fine-tuned weights bit for bit."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if set(base) != set(finetuned):
        raise ValueError(f"base and fine-tuned weights differ in keys: {sorted(set(base) ^ set(finetuned))[:10]}")
    out = {}
    for key, theta_base in base.items():
        theta_ft = finetuned[key]
        if theta_base.shape != theta_ft.shape:
            raise ValueError(f"{key}: base shape {tuple(theta_base.shape)} != fine-tuned {tuple(theta_ft.shape)}")
        if theta_ft.is_floating_point():
            out[key] = ((1.0 - alpha) * theta_base.to(theta_ft.dtype) + alpha * theta_ft).contiguous()
        else:
            out[key] = theta_ft.clone().contiguous()
    return out


def base_state(model: str, pretrained: str) -> dict:
    """The base model's weights: a ``local-dir:`` model's own, else ``pretrained`` (tag or file)."""
    import open_clip

    hf_text.enable_hf_text_towers()
    return open_clip.create_model(model, pretrained=resolve_pretrained(model, pretrained), device="cpu").state_dict()


def export_config(model: str, pretrained: str) -> dict:
    """The ``open_clip_config.json`` of the exported model: a local dir's own, else the named
    model's architecture and its pretrained tag's preprocessing."""
    import open_clip

    if model.startswith(LOCAL_DIR):
        return json.loads((Path(model.removeprefix(LOCAL_DIR)) / EXPORT_CONFIG).read_text())
    model_cfg = open_clip.get_model_config(model)
    if model_cfg is None:
        raise ValueError(f"no OpenCLIP config for {model!r}: export needs a named model or a local-dir: model")
    preprocess = {}
    if pretrained and (tag := open_clip.get_pretrained_cfg(model, pretrained)):
        preprocess = {k: tag[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in tag}
    return {"model_cfg": model_cfg, "preprocess_cfg": preprocess}


def export_wise_ft(config: ClipTrainConfig, checkpoint: Path, dest_url: str) -> str:
    """Interpolate the final checkpoint with the base model and write ``<dest_url>/`` (weights +
    config) for ``open_clip.create_model_and_transforms("local-dir:...")``; returns the URL."""
    import torch
    from safetensors.torch import save_file

    finetuned = strip_prefixes(torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"])
    merged = wise_ft(base_state(config.model, config.pretrained), finetuned, config.wise_ft_alpha)
    with tempfile.TemporaryDirectory() as tmp:
        save_file(merged, f"{tmp}/{EXPORT_WEIGHTS}", metadata={"wise_ft_alpha": str(config.wise_ft_alpha)})
        Path(tmp, EXPORT_CONFIG).write_text(json.dumps(export_config(config.model, config.pretrained), indent=2))
        for name in (EXPORT_WEIGHTS, EXPORT_CONFIG):
            launch.atomic_write(f"{dest_url.rstrip('/')}/{name}", Path(tmp, name).read_bytes())
    for path in companion_files(config.model):
        launch.atomic_write(f"{dest_url.rstrip('/')}/{path.name}", path.read_bytes())
    return dest_url


def companion_files(model: str) -> list[Path]:
    """A ``local-dir:`` model's other files (a Hugging Face tokenizer's: OpenCLIP reads it from
    the model's own folder), which its export needs beside the weights and the config."""
    if not model.startswith(LOCAL_DIR):
        return []
    folder = Path(model.removeprefix(LOCAL_DIR))
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name not in (EXPORT_WEIGHTS, EXPORT_CONFIG))


def assemble_model(config: ClipTrainConfig, folder: Path) -> ClipTrainConfig:
    """For a run with a Hugging Face text tower: the base model (``model`` + ``pretrained``'s
    vision tower, ``text_model``'s text tower) as a ``local-dir:`` model in ``folder``, and the
    config that trains it; from then on the run is an ordinary ``local-dir:`` run (trainer,
    resume, WiSE-FT and export alike). A folder from an earlier launch is kept if it is the same
    model; a different one (another context length, say) is an error, not a silent mix."""
    if config.text_model is None:
        return config
    source = export_config(config.model, config.pretrained)
    model_cfg = hf_text.hf_text_model_cfg(
        source["model_cfg"], config.text_model, config.context_length, config.text_pooler, config.text_proj
    )
    if (folder / EXPORT_WEIGHTS).is_file():
        have = json.loads((folder / EXPORT_CONFIG).read_text())["model_cfg"]
        if have != model_cfg:
            raise ValueError(f"{folder} holds another model than this run asks for: {have} != {model_cfg}")
    else:
        import open_clip

        hf_text.enable_hf_text_towers()
        tag = resolve_pretrained(config.model, config.pretrained)
        vision = open_clip.create_model(config.model, pretrained=tag, device="cpu").state_dict()
        hf_text.assemble(model_cfg, source["preprocess_cfg"], vision, folder, seed=config.seed)
        launch.log(f"assembled {config.model} ({config.pretrained}) + {config.text_model} in {folder}")
    return replace(config, model=f"{LOCAL_DIR}{folder}", pretrained="", text_model=None)


# ----------------------------------------------------------------------------------- the run


def run_trainer(command: list[str], runlog: RunLog, on_epoch_start=None) -> int:
    """Run the trainer, streaming every line to the run log and each loss line as progress."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        launch.log(f"[open_clip] {line}")
        started = len(runlog.epochs_started)
        progress = runlog.read(line)
        if progress is not None:
            launch.report_progress(*progress)
        if on_epoch_start is not None and len(runlog.epochs_started) > started:
            on_epoch_start(runlog.epochs_started[-1])
    return proc.wait()


def train(config: ClipTrainConfig) -> dict:
    """Train (or resume), copy checkpoints to the lake, export the WiSE-FT model; the report."""
    config.validate()
    check_weights(config.model, config.pretrained)  # one line naming the setting, before anything starts
    if config.text_model is not None:
        weights.Weights("text_model", config.text_model, LONGCLIP_TEXT, "the Hugging Face text tower").config_file()
    asked = config
    config = replace(config, pretrained=resolve_pretrained(config.model, config.pretrained) or config.pretrained)
    data = resolve_data(config)
    ckpt_lake = config.checkpoint_dir or f"{config.run_dir.rstrip('/')}/checkpoints"
    in_lake = is_local(config.run_dir)
    scratch = None
    if in_lake:
        logs = Path(local_path(config.run_dir)) / "openclip"
    else:
        scratch = config.scratch_dir or tempfile.mkdtemp(prefix="panelforge-clip-")
        logs = Path(scratch)
    ckpt_local = logs / RUN_NAME / "checkpoints"
    gpu_bytes = job_gpu_bytes(config)
    if gpu_bytes is not None:  # before any weights are fetched: a batch that cannot fit fails now
        found = check_memory(config, gpu_bytes)
        if found is not None:
            launch.log(f"memory per GPU at batch_size {config.batch_size}: about {found.describe()}")
    config = assemble_model(config, logs / "base-model")
    fetched = None if in_lake or not config.resume else restore_checkpoint(ckpt_local, ckpt_lake)
    if fetched is not None:
        launch.log(f"fetched the epoch {fetched} checkpoint from {ckpt_lake}")
    world = max(config.gpus, 1)
    runlog = RunLog(steps_per_epoch(data.samples, config.batch_size, config.accum_freq, world))
    python = config.python or sys.executable
    command = trainer_command(python, trainer_args(config, data, str(logs)), config.gpus)
    if config.heldout is not None:
        launch.log(f"held-out split {config.heldout}: {data.heldout_excluded} samples of held-out articles excluded")
    launch.log(f"open_clip_train on {data.samples} samples/epoch, {config.epochs} epochs: {' '.join(command)}")

    def on_epoch_start(epoch: int) -> None:
        # "Start epoch N" comes after epoch N's predecessor was saved: epochs < N+1 are whole
        if not in_lake:
            copy_checkpoints(ckpt_local, ckpt_lake, upto=epoch, keep_last_only=config.delete_previous_checkpoint)

    code = run_trainer(command, runlog, on_epoch_start)
    if not in_lake:  # after an exit the files are whole; after a crash only the epochs before it
        done = None if code == 0 else (runlog.epochs_started[-1] if runlog.epochs_started else 0)
        copy_checkpoints(ckpt_local, ckpt_lake, upto=done, keep_last_only=config.delete_previous_checkpoint)
    if code != 0:
        raise RuntimeError(f"open_clip_train exited with {code}; its last lines:\n" + "\n".join(runlog.tail))
    found = local_checkpoints(ckpt_local)
    if not found or found[-1][0] != config.epochs:
        raise RuntimeError(f"open_clip_train finished without the epoch {config.epochs} checkpoint in {ckpt_local}")
    final_epoch, final = found[-1]
    model_dir = export_wise_ft(config, final, f"{config.run_dir.rstrip('/')}/model")
    report = {
        "model": asked.model,
        "pretrained": asked.pretrained,
        "text_model": asked.text_model,
        "context_length": asked.context_length if asked.text_model else None,
        "epochs": final_epoch,
        "samples_per_epoch": data.samples,
        "train_data": "::".join(data.patterns),
        "heldout": config.heldout,
        "heldout_samples_excluded": data.heldout_excluded,
        "resumed_from_epoch": runlog.resumed_from_epoch,
        "epochs_run": ",".join(str(e) for e in runlog.epochs_started),
        "final_loss": runlog.last.get("loss"),
        "checkpoint": str(final) if in_lake else (launch.latest_checkpoint(ckpt_lake) or ""),
        "wise_ft_alpha": config.wise_ft_alpha,
        "model_dir": model_dir,
    }
    if scratch is not None and config.scratch_dir is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def cat(url: str) -> None:
    """Stream one lake file to stdout: the ``pipe:`` OpenCLIP's WebDataset reads remote shards with."""
    with fsspec.open(url, "rb") as src:
        shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)


def run(config: ClipTrainConfig, job: launch.LaunchInfo) -> dict | None:
    """The launched job: train, then report (rank 0 only: under the launcher's torchrun, rank 0's
    trainer uses every GPU and the other ranks exit)."""
    if launch.job_rank() != 0:
        return None
    report = train(config)
    launch.report_final(launch.flat_metadata(report), config.run_dir)
    return report


def main(argv: list[str] | None = None) -> dict | None:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) == 2 and args[0] == "--cat":  # the pipe: command OpenCLIP reads remote shards with
        cat(args[1])
        return None
    return launch.main(ClipTrainConfig, run, args, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()
