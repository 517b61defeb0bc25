"""DINOv2 image embeddings with the model's own preprocessing, loaded once per worker.

Production loads real weights by model id (Hugging Face cache or hub) or a local directory
(``PANELFORGE_DINOV2_MODEL``; torch hub names such as ``dinov2_vitl14_reg`` are read as their
Hugging Face ids). The class is the one the checkpoint's config names: ``Dinov2Model`` for
``dinov2``, ``Dinov2WithRegistersModel`` for ``dinov2_with_registers`` (the registers model
BIOMEDICA's labeler used: its 4 register tokens sit between the CLS token and the patches, so
mean pooling skips them); any other config is refused, never loaded as a plain DINOv2. Missing
weights fail in one line naming the setting and the ``hf download`` command
(:func:`check_weights`, run when the stage is built, before any Ray worker). Tests and the demo pass
``synthetic=True``: a tiny randomly initialised DINOv2 built from a config in code, and every
vector made that way carries ``synthetic = True`` — it is never used silently in place of the
real model. Its weights come from a fixed seed (without touching the global RNG) and it runs on
the CPU in float32 unless a device is named, so its vectors, and the demo's clusters, are the
same on every run and machine, GPU or not (bf16 autocast on a GPU would give other vectors).

Preprocessing is DINOv2's (``BitImageProcessor``): resize so the shortest edge is 256 px
(bicubic, aspect ratio kept), centre crop 224 x 224, scale to [0, 1], normalise with the
ImageNet mean and std. The crop drops the margins of very wide or tall figures (a 4:1 strip
keeps 22% of its width); ``pad=True`` letterboxes onto white instead so nothing is cut. The
default is the crop: measured on the sample's figures (``benchmarks/dinov2_pad.py``), padding
changes most clustering assignments of the wide and tall figures, but with no trained weights
here that measurement cannot say which of the two groups figures better (docs/dinov2-padding.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from pipelines.compute.weights import (  # noqa: F401 - ModelUnavailableError: re-exported
    IMAGENET_MEAN,
    IMAGENET_STD,
    ModelUnavailableError,
    Weights,
    from_pretrained_offline_first,
)
from pipelines.images.tensors import normalized

DEFAULT_MODEL = "facebook/dinov2-large"
SETTING = "PANELFORGE_DINOV2_MODEL"
# the config's model_type -> the transformers class that has its weights
MODEL_CLASSES = {"dinov2": "Dinov2Model", "dinov2_with_registers": "Dinov2WithRegistersModel"}
# facebookresearch/dinov2's torch hub names -> their Hugging Face ids
TORCH_HUB_NAMES = {
    f"dinov2_vit{size}14{reg}": f"facebook/dinov2{'-with-registers' if reg else ''}-{name}"
    for size, name in (("s", "small"), ("b", "base"), ("l", "large"), ("g", "giant"))
    for reg in ("", "_reg")
}


@dataclass(frozen=True)
class EmbedderConfig:
    model: str = DEFAULT_MODEL
    synthetic: bool = False
    pooling: str = "cls"  # or "mean" (mean of the patch tokens)
    pad: bool = False
    device: str | None = None  # None: cuda when available, else cpu (synthetic: always cpu)

    @property
    def model_label(self) -> str:
        return "synthetic-tiny-dinov2" if self.synthetic else self.model


def tiny_dinov2_config():
    """A DINOv2 small enough for CPU tests: 2 layers, width 32, patch 14, 224 px."""
    from transformers import Dinov2Config

    return Dinov2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=224, patch_size=14
    )


def model_id(model: str) -> str:
    """A torch hub name (``dinov2_vitl14_reg``) as its Hugging Face id; anything else as it is."""
    return TORCH_HUB_NAMES.get(model, model)


def weights_of(config: EmbedderConfig) -> Weights:
    return Weights(SETTING, model_id(config.model), DEFAULT_MODEL, "DINOv2 image embeddings")


def model_class(config_dict: dict, where: str = SETTING):
    """The transformers class of a DINOv2 checkpoint, from its config's ``model_type`` (and its
    ``architectures`` agreeing with it); a config of anything else is a ValueError, so that a
    registers model is never loaded as a plain ``Dinov2Model`` without its register tokens."""
    import transformers

    model_type = config_dict.get("model_type")
    named = config_dict.get("architectures") or []
    expected = MODEL_CLASSES.get(model_type)
    if expected is None or any(name != expected for name in named):
        raise ValueError(
            f"{where}: the checkpoint's config is model_type={model_type!r} with architectures {named}; PanelForge "
            f"embeds with {' or '.join(MODEL_CLASSES.values())} (model_type {' or '.join(MODEL_CLASSES)})"
        )
    return getattr(transformers, expected)


def check_weights(config: EmbedderConfig) -> None:
    """The set-up check, before any Ray worker starts: the weights are where the setting says
    (or, online, the hub has the id) and their config names a DINOv2 class this loader reads.
    Downloads at most the config.json of a hub id that is not cached; one line per failure."""
    import json

    if config.synthetic:
        return
    weights = weights_of(config)
    model_class(json.loads(weights.config_file().read_text()), f"{SETTING}={config.model!r}")


@dataclass(frozen=True)
class Resize:
    """What the CPU decode stage needs of DINOv2's processor: the shortest edge it resizes to, the
    centre crop (height, width) and the resampling filter (PIL's number). Read from the weights'
    ``preprocessor_config.json`` in the driver (:func:`resize_of`), so the Ray Data tasks that
    decode and resize never load the processor: that imports transformers and torch, 6.3 s of CPU
    and 900 MB in every CPU worker, to read three numbers."""

    shortest_edge: int = 256
    crop: tuple[int, int] = (224, 224)
    resample: int = Image.Resampling.BICUBIC

    def output(self, pad: bool) -> tuple[int, int]:
        """(height, width) of what :func:`prepare` returns: the crop, or a square of its longer side
        when the image is letterboxed instead."""
        return (max(self.crop), max(self.crop)) if pad else self.crop


def load_processor(config: EmbedderConfig):
    """DINOv2's own image processor (from the weights' directory; built in code when synthetic)."""
    from transformers import BitImageProcessor

    if config.synthetic:
        resize = Resize()  # DINOv2's published preprocessing
        return BitImageProcessor(
            size={"shortest_edge": resize.shortest_edge},
            crop_size={"height": resize.crop[0], "width": resize.crop[1]},
            resample=resize.resample,
            image_mean=list(IMAGENET_MEAN),
            image_std=list(IMAGENET_STD),
        )
    return BitImageProcessor.from_pretrained(str(weights_of(config).folder()), local_files_only=True)


def resize_of(config: EmbedderConfig) -> Resize:
    """The checkpoint's resize and crop; the synthetic model's are DINOv2's published ones (:class:`Resize`)."""
    import json

    if config.synthetic:
        return Resize()
    processor = json.loads((weights_of(config).folder() / "preprocessor_config.json").read_text())
    return resize_from(processor)


def resize_from(processor: dict) -> Resize:
    """A ``preprocessor_config.json`` read as ``BitImageProcessor`` reads it: a missing size is a
    224 px shortest edge, a missing crop 224 x 224, a missing filter bicubic; a number is a
    shortest edge (size) or a square (crop)."""
    size = processor.get("size") or {"shortest_edge": 224}
    crop = processor.get("crop_size") or {"height": 224, "width": 224}
    if not isinstance(size, int) and "shortest_edge" not in size:
        raise ValueError(f"{SETTING}: preprocessor_config.json's size {size} has no shortest_edge, as DINOv2's has")
    return Resize(
        shortest_edge=int(size if isinstance(size, int) else size["shortest_edge"]),
        crop=(int(crop), int(crop)) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"])),
        resample=int(processor.get("resample", Image.Resampling.BICUBIC)),
    )


def load_model(config: EmbedderConfig):
    """Return the model on the chosen device, in eval mode: the class its config names."""
    import json

    import torch
    from transformers import Dinov2Model

    if config.synthetic:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = Dinov2Model(tiny_dinov2_config())
    else:
        folder = weights_of(config).folder()
        cls = model_class(json.loads((folder / "config.json").read_text()), f"{SETTING}={config.model!r}")
        model = cls.from_pretrained(str(folder), local_files_only=True)
    default = "cpu" if config.synthetic or not torch.cuda.is_available() else "cuda"
    device = config.device or default
    return model.to(device).eval()


def prepare(image: Image.Image, resize: Resize, pad: bool) -> np.ndarray:
    """Resize and crop (or letterbox) on the CPU with the processor's own parameters (``resize``):
    shortest edge, resample filter and crop size. Returns a (height, width, 3) uint8 array."""
    height, width = resize.output(pad)
    if pad:
        return np.asarray(letterbox(image, height), dtype=np.uint8)
    edge = resize.shortest_edge
    scale = edge / min(image.size)
    resized = image.resize(
        (max(edge, round(image.width * scale)), max(edge, round(image.height * scale))), resize.resample
    )
    left, top = (resized.width - width) // 2, (resized.height - height) // 2
    return np.asarray(resized.crop((left, top, left + width, top + height)), dtype=np.uint8)


def letterbox(image: Image.Image, size: int = 224) -> Image.Image:
    """Fit the whole image into ``size`` x ``size`` on white, aspect ratio kept."""
    scale = size / max(image.size)
    resized = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.BICUBIC)
    canvas = Image.new("RGB", (size, size), (255, 255, 255))
    canvas.paste(resized, ((size - resized.width) // 2, (size - resized.height) // 2))
    return canvas


class Embedder:
    """Loads the model once (per Ray actor) and embeds prepared 224 x 224 uint8 images."""

    def __init__(self, config: EmbedderConfig):
        import torch

        self.config = config
        self.model = load_model(config)
        self.processor = load_processor(config)  # its mean, std and rescale factor normalise
        self.resize = resize_from(self.processor.to_dict())  # the file the processor read, not read again
        self.device = next(self.model.parameters()).device
        self.dim = self.model.config.hidden_size
        self.registers = int(getattr(self.model.config, "num_register_tokens", 0) or 0)  # after CLS, before patches
        self._torch = torch

    def embed(self, pixels: np.ndarray) -> np.ndarray:
        """``pixels``: (n, 224, 224, 3) uint8 from :func:`prepare`; returns (n, dim) float16. The
        uint8 batch goes to the model's device and is normalised there (``images.tensors``)."""
        if len(pixels) == 0:
            return np.zeros((0, self.dim), dtype=np.float16)
        mean, std, rescale = self.processor.image_mean, self.processor.image_std, self.processor.rescale_factor
        return self.forward(normalized(pixels, mean, std, rescale=rescale, device=self.device))

    def forward(self, pixel_values) -> np.ndarray:
        """Normalised (n, 3, 224, 224) float32 -> pooled (n, dim) float16."""
        torch = self._torch
        pixel_values = pixel_values.to(self.device)  # a no-op for what ``embed`` built there
        with torch.inference_mode():
            if self.device.type == "cuda":  # bf16 autocast on GPU, full fp32 on CPU
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    hidden = self.model(pixel_values=pixel_values).last_hidden_state
            else:
                hidden = self.model(pixel_values=pixel_values).last_hidden_state
        pooled = hidden[:, 0] if self.config.pooling == "cls" else hidden[:, 1 + self.registers :].mean(dim=1)
        return pooled.float().cpu().numpy().astype(np.float16)

    def embed_images(self, images: list[Image.Image]) -> np.ndarray:
        """Convenience for notebooks: prepare and embed RGB images in one call."""
        return self.embed(np.stack([prepare(im, self.resize, self.config.pad) for im in images]) if images else [])
