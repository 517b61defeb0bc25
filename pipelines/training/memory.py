"""How much GPU memory a CLIP training step needs, estimated before a GPU job starts.

A launched job that cannot fit its batch fails minutes later, on a GPU, with a CUDA out-of-memory
error that names no setting. :func:`estimate` is the arithmetic instead, a pure function of the
architecture and the recipe, and :func:`check_batch` refuses a batch that cannot fit, naming the
setting to change. ``docs/training-memory.md`` has the numbers per recipe.

What a step holds (``B`` samples per GPU, ``P`` parameters):

* **model states**: weights, gradients and AdamW's two moments, 16 bytes per parameter in fp32
  and in OpenCLIP's ``amp`` modes (autocast keeps fp32 master weights), 8 in its ``bf16`` /
  ``fp16`` / ``pure_*`` modes (the model itself in 16 bits); DistributedDataParallel adds its
  gradient buckets, one more copy of the gradients, above one GPU.
* **activations**, per sample: what each transformer block saves for its backward pass, as
  PyTorch saves it on CUDA for OpenCLIP's ``ResidualAttentionBlock`` (sequence ``s``, width
  ``w``, MLP width ``m``, ``h`` heads): 9·s·w (the inputs of both LayerNorms, of the QKV and
  output projections and of the first MLP layer, the packed Q, K, V, the attention output, and
  on CUDA the output projection's input as a copy of it in another layout) + 2·s·m (the GELU's
  input and the second MLP layer's input) + h·s' (the fused attention kernel's log-sum-exp,
  ``s'`` = s padded to a multiple of 32 by the memory-efficient kernel; no s² matrix is kept) +
  4·s (LayerNorm statistics), plus the tower's stem and head (the image itself and 3·s·w for the
  image tower, s·w + w for the text tower). In fp32 that is 433.8 MB per sample for ViT-L/14's
  image tower and 48.6 MB for its text tower. Measured on an H100 (PyTorch 2.11, fp32,
  ViT-B/16) the towers saved that to within 0.1%; on CPU PyTorch saves one s·w and the
  log-sum-exp padding less per block (the tests check both). In the ``amp`` modes the residual
  stream (the two LayerNorm inputs) stays fp32 and the rest is 16-bit.
  With gradient checkpointing (``--grad-checkpointing``) a block keeps only its input (s·w) and
  is recomputed in the backward pass, so the peak is every block's input + one block's full
  activations + its gradients in flight (2·s·w): 52.6 MB per sample for ViT-L/14 in fp32,
  against 482 MB without.
* **the batch and the loss**: OpenCLIP keeps every accumulation step's images and tokens on the
  GPU (``accum_freq`` x ``B`` inputs) and their features; the contrastive logits are B x (B x
  GPUs) with ``--local-loss`` (and the global batch squared without it), in fp32, each with its
  softmax and gradient.
* **headroom**: a share of the GPU (``HEADROOM``, 10%) kept for the CUDA context, cuBLAS and NCCL
  workspaces and the caching allocator's fragmentation.

A step that is not one CLIP batch (the multi-level trainer's: each level's batch, the cross-level
children, the hard-negative texts, the ROI rows) is a :class:`StepLoad`, what it sends through each
tower, and :func:`estimate_step` prices it with the same per-sample counts. Parameters that do not
train cost their weights alone, and a frozen pass saves nothing for the backward pass: a vision
tower with only its last blocks trained saves those blocks (and its stem and head, counted whole),
a frozen text tower nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GB = 1e9
HEADROOM = 0.10
FP32_PRECISIONS = ("fp32",)
AMP_PRECISIONS = ("amp", "amp_bf16", "amp_bfloat16")
HALF_PRECISIONS = ("bf16", "fp16", "pure_bf16", "pure_fp16")
PRECISIONS = FP32_PRECISIONS + AMP_PRECISIONS + HALF_PRECISIONS


@dataclass(frozen=True)
class Tower:
    """One transformer tower: ``tokens`` per sample, ``layers`` blocks of ``width`` with ``heads``
    attention heads and an MLP of width ``mlp`` (``glu``: a gated MLP, whose first layer is twice
    as wide and whose gate product is one more saved tensor); ``stem``: elements per sample the
    embeddings and the head keep (the input image among them)."""

    tokens: int
    width: int
    layers: int
    heads: int
    mlp: int
    glu: bool = False
    stem: int = 0

    def _mlp_saved(self) -> int:
        """Elements per token the MLP keeps beyond its input: GELU input + second layer input
        (2·m); a gated MLP keeps the doubled first-layer output, the activation and the product (4·m)."""
        return 4 * self.mlp if self.glu else 2 * self.mlp

    def block_bytes(self, precision: str) -> int:
        """Bytes one block saves for its backward pass, per sample (see the module docstring)."""
        s, w = self.tokens, self.width
        small = (self.heads * -(-s // 32) * 32 + 4 * s) * 4  # log-sum-exp (padded) and LayerNorm statistics, fp32
        if precision in FP32_PRECISIONS:
            return (9 * s * w + s * self._mlp_saved()) * 4 + small
        residual = 2 * s * w * (4 if precision in AMP_PRECISIONS else 2)  # the two LayerNorm inputs
        return residual + (7 * s * w + s * self._mlp_saved()) * 2 + small

    def stem_bytes(self, precision: str) -> int:
        return self.stem * _residual_bytes(precision)

    def activation_bytes(self, precision: str, grad_checkpointing: bool, trained_layers: int | None = None) -> int:
        """Bytes per sample this tower holds at the peak of its backward pass; ``trained_layers``
        (without checkpointing): only the last blocks train, the earlier ones save nothing (their
        input needs no gradient), and the stem is counted whole (an over-count when it is frozen)."""
        if not grad_checkpointing:
            layers = self.layers if trained_layers is None else min(trained_layers, self.layers)
            return layers * self.block_bytes(precision) + self.stem_bytes(precision)
        inputs = self.layers * self.tokens * self.width * _residual_bytes(precision)
        in_flight = 2 * self.tokens * self.width * _residual_bytes(precision)
        return inputs + self.block_bytes(precision) + in_flight + self.stem_bytes(precision)


@dataclass(frozen=True)
class Architecture:
    """What the estimate needs of a CLIP model: its towers, parameter count, embedding size and
    the bytes of one sample's input (image pixels in fp32 + token ids); ``vision_params``: the
    image tower's share of ``params`` (0: not known)."""

    name: str
    vision: Tower
    text: Tower
    params: int
    embed_dim: int
    input_bytes: int
    vision_params: int = 0

    @property
    def image_bytes(self) -> int:
        """One image on the GPU (fp32 pixels): the input less its token ids."""
        return self.input_bytes - self.text.tokens * 8


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one training step; ``per_sample`` is the part that grows with the batch."""

    model_states: int
    activations: int
    batch_and_loss: int
    per_sample: int
    total: int

    def describe(self) -> str:
        return (
            f"{self.total / GB:.1f} GB: {self.model_states / GB:.1f} GB of weights, gradients and optimizer states, "
            f"{self.activations / GB:.1f} GB of activations ({self.per_sample / 1e6:.0f} MB per sample), "
            f"{self.batch_and_loss / GB:.2f} GB of inputs, features and logits"
        )


def _residual_bytes(precision: str) -> int:
    return 2 if precision in HALF_PRECISIONS else 4


def _check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; OpenCLIP's are {PRECISIONS}")


def per_sample_bytes(arch: Architecture, precision: str, grad_checkpointing: bool) -> int:
    """Activation bytes per sample: both towers' saved tensors and, with checkpointing, the one
    block recomputed at a time (the larger tower's; the towers run their backward one after the other)."""
    _check_precision(precision)
    if not grad_checkpointing:
        return arch.vision.activation_bytes(precision, False) + arch.text.activation_bytes(precision, False)
    stored = [t.activation_bytes(precision, True) - t.block_bytes(precision) for t in (arch.vision, arch.text)]
    return sum(stored) + max(arch.vision.block_bytes(precision), arch.text.block_bytes(precision))


def estimate(
    arch: Architecture,
    batch_size: int,
    precision: str = "fp32",
    grad_checkpointing: bool = True,
    gpus: int = 1,
    accum_freq: int = 1,
    local_loss: bool = True,
) -> MemoryEstimate:
    """Bytes per GPU of a training step of ``batch_size`` samples per GPU (see the module docstring)."""
    _check_precision(precision)
    world = max(gpus, 1)
    states = state_bytes(arch.params, arch.params, precision, world)
    per_sample = per_sample_bytes(arch, precision, grad_checkpointing)
    activations = batch_size * per_sample
    inputs = accum_freq * batch_size * arch.input_bytes
    features = (accum_freq * batch_size + batch_size * world) * arch.embed_dim * 2 * 4  # cached + gathered, fp32
    rows = batch_size if local_loss else batch_size * world
    logits = 2 * rows * batch_size * world * 4 * 3  # image->text and text->image, with softmax and gradient
    batch_and_loss = inputs + features + logits
    return MemoryEstimate(states, activations, batch_and_loss, per_sample, states + activations + batch_and_loss)


def state_bytes(params: int, trainable: int, precision: str, gpus: int = 1) -> int:
    """Weights of every parameter, and gradients and AdamW's two moments of those that train (16
    bytes per trained parameter in fp32 and the ``amp`` modes, 8 in 16 bits; a frozen one costs
    its weight alone), plus DistributedDataParallel's gradient buckets above one GPU."""
    half = precision in HALF_PRECISIONS
    weight = 2 if half else 4
    return params * weight + trainable * (3 * weight + (weight if gpus > 1 else 0))


def max_batch(
    arch: Architecture,
    gpu_bytes: float,
    precision: str = "fp32",
    grad_checkpointing: bool = True,
    gpus: int = 1,
    accum_freq: int = 1,
    local_loss: bool = True,
    headroom: float = HEADROOM,
) -> int:
    """The largest per-GPU batch whose estimate fits ``gpu_bytes`` less the headroom (0: none fits)."""
    usable = gpu_bytes * (1.0 - headroom)
    return _largest(
        lambda b: estimate(arch, b, precision, grad_checkpointing, gpus, accum_freq, local_loss).total <= usable
    )


def _largest(fits: Callable[[int], bool]) -> int:
    """The largest batch ``fits`` accepts (the estimates grow with the batch; 0: none)."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def check_batch(
    arch: Architecture,
    batch_size: int,
    gpu_bytes: float,
    precision: str = "fp32",
    grad_checkpointing: bool = True,
    gpus: int = 1,
    accum_freq: int = 1,
    local_loss: bool = True,
    headroom: float = HEADROOM,
) -> MemoryEstimate:
    """The estimate, or a ValueError that says what does not fit and which setting to change."""
    found = estimate(arch, batch_size, precision, grad_checkpointing, gpus, accum_freq, local_loss)
    if found.total <= gpu_bytes * (1.0 - headroom):
        return found
    most = max_batch(arch, gpu_bytes, precision, grad_checkpointing, gpus, accum_freq, local_loss, headroom)
    fixes = []
    if most:
        keep = f" and raise accum_freq to {-(-batch_size * accum_freq // most)} to keep the global batch"
        fixes.append(f"lower batch_size to {most} or less{keep if accum_freq * batch_size > most else ''}")
    if not grad_checkpointing:
        with_ckpt = max_batch(arch, gpu_bytes, precision, True, gpus, accum_freq, local_loss, headroom)
        fixes.append(f"set grad_checkpointing: true (then up to {with_ckpt} per GPU fit)")
    if not fixes:
        fixes.append("use a GPU with more memory or a precision that stores less (precision: amp_bf16)")
    raise ValueError(
        f"batch_size {batch_size} per GPU does not fit: {arch.name} in {precision} "
        f"{'with' if grad_checkpointing else 'without'} gradient checkpointing needs about {found.describe()}, "
        f"but the GPU has {gpu_bytes / GB:.0f} GB ({HEADROOM:.0%} kept free); " + "; or ".join(fixes)
    )


def job_gpu_bytes(gpu_memory_gb: float | None, device: str) -> float | None:
    """The memory of the GPU a job trains on: ``gpu_memory_gb`` when set (0: no check), else the
    first visible CUDA device's (None on CPU: nothing to check)."""
    if gpu_memory_gb is not None:
        return gpu_memory_gb * GB or None
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(0).total_memory)


# ----------------------------------------------------------------------------------- other steps


@dataclass(frozen=True)
class StepLoad:
    """What one training step sends through the towers when it is not one CLIP batch: ``images``
    through the image tower, ``texts`` through the text tower, ``rois`` rows each attending to one
    image's patch tokens (the ROI processor), ``logits`` contrastive logit elements (every term's
    rows x columns, both directions). ``vision_layers``: the image tower's blocks that train (None:
    all; 0: none, its passes save nothing); ``text_trains``: whether the text tower does."""

    images: int
    texts: int
    rois: int = 0
    logits: int = 0
    vision_layers: int | None = None
    text_trains: bool = True
    label: str = ""


def trainable_params(arch: Architecture, vision_layers: int | None, text: bool) -> int:
    """Parameters that train when the image tower trains its last ``vision_layers`` blocks and
    its head (``ln_post`` and the projection; None: all of it, 0: none) and the text tower (with
    its projection) trains or not; the logit scale is the caller's."""
    v = arch.vision
    if vision_layers is None:
        vision = arch.vision_params
    elif vision_layers == 0:
        vision = 0
    else:
        vision = min(vision_layers, v.layers) * (_blocks(v) // v.layers) + 2 * v.width + v.width * arch.embed_dim
    return vision + (arch.params - arch.vision_params - 1 if text else 0)


def roi_bytes(arch: Architecture, precision: str) -> int:
    """What an ROI processor row saves: its copy of the parent's patch tokens (the context
    LayerNorm's input), the normalised context (the key and value projections' input), the keys
    and values (4·s·w), and a few width-sized vectors (8·w)."""
    t = arch.vision
    return (4 * t.tokens * t.width + 8 * t.width) * _residual_bytes(precision)


def estimate_step(
    arch: Architecture, load: StepLoad, batch_size: int, trainable: int, precision: str = "fp32", gpus: int = 1
) -> MemoryEstimate:
    """Bytes per GPU of a step of ``load`` (without gradient checkpointing), ``trainable`` of the
    model's parameters training; ``per_sample`` is the activations per unit of ``batch_size``."""
    _check_precision(precision)
    vision = arch.vision.activation_bytes(precision, False, load.vision_layers) if load.vision_layers != 0 else 0
    text = arch.text.activation_bytes(precision, False) if load.text_trains else 0
    activations = load.images * vision + load.texts * text + load.rois * roi_bytes(arch, precision)
    inputs = load.images * arch.image_bytes + load.texts * arch.text.tokens * 8
    features = (load.images + load.texts + load.rois) * arch.embed_dim * 2 * 4  # each pass's and normalised, fp32
    batch_and_loss = inputs + features + load.logits * 4 * 3  # logits with softmax and gradient
    states = state_bytes(arch.params, trainable, precision, max(gpus, 1))
    total = states + activations + batch_and_loss
    return MemoryEstimate(states, activations, batch_and_loss, activations // max(batch_size, 1), total)


def worst_step(
    arch: Architecture, loads: list[StepLoad], batch_size: int, trainable: int, precision: str, gpus: int = 1
) -> tuple[StepLoad, MemoryEstimate]:
    """The step of ``loads`` that needs the most memory, and its estimate."""
    found = [(load, estimate_step(arch, load, batch_size, trainable, precision, gpus)) for load in loads]
    return max(found, key=lambda pair: pair[1].total)


def check_step(
    arch: Architecture,
    loads_of: Callable[[int], list[StepLoad]],
    batch_size: int,
    gpu_bytes: float,
    trainable: int,
    precision: str = "fp32",
    gpus: int = 1,
    headroom: float = HEADROOM,
    lighter: dict[str, str] | None = None,
) -> tuple[StepLoad, MemoryEstimate]:
    """The largest of the steps ``loads_of(batch_size)`` lists, or a ValueError (as
    :func:`check_batch`) naming the largest ``batch_size`` that fits; ``lighter``: other settings
    that store less, as setting -> the precision it sets (their largest batch is said too)."""
    usable = gpu_bytes * (1.0 - headroom)
    load, found = worst_step(arch, loads_of(batch_size), batch_size, trainable, precision, gpus)
    if found.total <= usable:
        return load, found

    def most(prec: str) -> int:
        return _largest(lambda b: worst_step(arch, loads_of(b), b, trainable, prec, gpus)[1].total <= usable)

    largest = {prec: most(prec) for prec in (precision, *(lighter or {}).values())}  # each a search: once
    fixes = [f"lower batch_size to {largest[precision]} or less"] if largest[precision] else []
    fixes += [f"set {setting} (then up to {largest[prec]} fit)" for setting, prec in (lighter or {}).items()]
    if not any(largest.values()):
        fixes.append("use a GPU with more memory")
    where = f" ({load.label})" if load.label else ""
    raise ValueError(
        f"batch_size {batch_size} per GPU does not fit: the largest step{where} of {arch.name} in {precision} "
        f"needs about {found.describe()}, but the GPU has {gpu_bytes / GB:.0f} GB ({headroom:.0%} kept free); "
        + "; or ".join(fixes)
    )


# ----------------------------------------------------------------------------------- architectures


def open_clip_tower(cfg: dict, vision: bool) -> Tower:
    """A :class:`Tower` from an OpenCLIP ``vision_cfg`` or ``text_cfg`` (its defaults filled in as
    OpenCLIP fills them: ``head_width`` 64, ``mlp_ratio`` 4, 77 tokens, 12 layers of 512)."""
    width = int(cfg.get("width", 768 if vision else 512))
    if vision:
        height, across = _image_size(cfg)
        patch = int(cfg.get("patch_size", 16))
        tokens = (height // patch) * (across // patch) + 1
        heads = width // int(cfg.get("head_width", 64))
        stem = 3 * height * across + 3 * tokens * width  # the image (conv input), ln_pre and ln_post
    else:
        tokens = int(cfg.get("context_length", 77))
        heads = int(cfg.get("heads", 8))
        stem = tokens * width + width  # ln_final's input and the pooled token
    mlp = int(width * float(cfg.get("mlp_ratio", 4.0)))
    return Tower(tokens, width, int(cfg.get("layers", 12)), heads, mlp, stem=stem)


def _image_size(vision_cfg: dict) -> tuple[int, int]:
    image = vision_cfg.get("image_size", 224)
    return (int(image[0]), int(image[1])) if isinstance(image, (list, tuple)) else (int(image), int(image))


def hf_text_tower(hf_config: dict, context_length: int) -> Tower:
    """A Hugging Face text tower (OpenCLIP's ``hf_model_name``) from its ``config.json``;
    ModernBERT's MLP is gated (GeGLU)."""
    return Tower(
        tokens=context_length,
        width=int(hf_config["hidden_size"]),
        layers=int(hf_config["num_hidden_layers"]),
        heads=int(hf_config["num_attention_heads"]),
        mlp=int(hf_config["intermediate_size"]),
        glu=hf_config.get("model_type") == "modernbert",
        stem=2 * context_length * int(hf_config["hidden_size"]),  # the embedding and final norms' inputs
    )


def vit_params(cfg: dict, embed_dim: int) -> int:
    """Parameters of OpenCLIP's ``VisionTransformer``: patch embedding (no bias), class and
    position embeddings, ``ln_pre``, the blocks, ``ln_post`` and the projection."""
    t = open_clip_tower(cfg, vision=True)
    patch = int(cfg.get("patch_size", 16))
    return 3 * patch * patch * t.width + t.width + t.tokens * t.width + 4 * t.width + _blocks(t) + t.width * embed_dim


def text_params(cfg: dict, embed_dim: int) -> int:
    """Parameters of OpenCLIP's text ``Transformer``: token and position embeddings, the blocks,
    ``ln_final`` and the projection."""
    t = open_clip_tower(cfg, vision=False)
    vocab = int(cfg.get("vocab_size", 49408))
    return vocab * t.width + t.tokens * t.width + _blocks(t) + 2 * t.width + t.width * embed_dim


def _blocks(t: Tower) -> int:
    """``ResidualAttentionBlock``: two LayerNorms (4w), QKV (3w² + 3w), output projection (w² + w),
    MLP (w·m + m + m·w + w)."""
    w, m = t.width, t.mlp
    return t.layers * (4 * w * w + 2 * w * m + 9 * w + m)


def input_bytes(vision_cfg: dict, context_length: int) -> int:
    """One sample's input on the GPU: the fp32 image and int64 token ids."""
    height, across = _image_size(vision_cfg)
    return 3 * height * across * 4 + context_length * 8


def open_clip_architecture(
    name: str, model_cfg: dict, hf_text_config: dict | None = None, hf_text_params: int | None = None
) -> Architecture:
    """The :class:`Architecture` of an OpenCLIP ``model_cfg``. A Hugging Face text tower
    (``text_cfg.hf_model_name``) needs its ``config.json`` and its parameter count (the projection
    and logit scale are counted on top)."""
    embed = int(model_cfg["embed_dim"])
    vision_cfg, text_cfg = model_cfg["vision_cfg"], model_cfg["text_cfg"]
    vision = open_clip_tower(vision_cfg, vision=True)
    if "hf_model_name" in text_cfg:
        if hf_text_config is None or hf_text_params is None:
            raise ValueError(f"{name}: a Hugging Face text tower needs its config and parameter count")
        context = int(text_cfg.get("context_length", 77))
        text = hf_text_tower(hf_text_config, context)
        proj = text.width * embed  # OpenCLIP's "mlp" projection: width -> (width+embed)/2 -> embed
        if text_cfg.get("hf_proj_type", "mlp") == "mlp":
            hidden = (text.width + embed) // 2
            proj = text.width * hidden + hidden * embed
        params = vit_params(vision_cfg, embed) + hf_text_params + proj + 1  # + logit_scale
    else:
        text = open_clip_tower(text_cfg, vision=False)
        params = vit_params(vision_cfg, embed) + text_params(text_cfg, embed) + 1  # + logit_scale
    return Architecture(
        name, vision, text, params, embed, input_bytes(vision_cfg, text.tokens), vit_params(vision_cfg, embed)
    )
