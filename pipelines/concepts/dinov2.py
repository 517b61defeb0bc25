"""DINOv2 image embeddings with the model's own preprocessing, loaded once per worker.

Production loads real weights by model id (Hugging Face cache or hub) or a local directory;
offline without them is a clear error naming the model. Tests and the demo pass
``synthetic=True``: a tiny randomly initialised DINOv2 built from a config in code, and every
vector made that way carries ``synthetic = True`` — it is never used silently in place of the
real model. Its weights come from a fixed seed (without touching the global RNG) and it runs on
the CPU in float32 unless a device is named, so its vectors, and the demo's clusters, are the
same on every run and machine, GPU or not (bf16 autocast on a GPU would give other vectors).

Preprocessing is DINOv2's (``BitImageProcessor``): resize so the shortest edge is 256 px
(bicubic, aspect ratio kept), centre crop 224 x 224, scale to [0, 1], normalise with the
ImageNet mean and std. The crop drops the margins of very wide or tall figures; ``pad=True``
letterboxes onto white instead so nothing is cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import huggingface_hub.constants
import numpy as np
from PIL import Image

from pipelines.weights import ModelUnavailableError

DEFAULT_MODEL = "facebook/dinov2-large"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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


def _unavailable(config: EmbedderConfig, exc: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"DINOv2 weights {config.model!r} are not available (offline and not in the Hugging Face cache, "
        f"nor a local directory). Download them once (huggingface-cli download {config.model}) "
        "or set PANELFORGE_DINOV2_MODEL to a local directory."
    )


def from_pretrained_offline_first(cls, model: str, unavailable, revision: str | None = None):
    """``cls.from_pretrained(model)`` from a local directory or the Hugging Face cache first; the
    hub only when not offline. ``unavailable(exc)`` builds the error raised when neither has it.
    A folder that exists is loaded as it is, never from the network: what goes wrong there is
    that folder's error, not "unavailable"."""
    if Path(model).expanduser().is_dir():
        return cls.from_pretrained(str(Path(model).expanduser()), local_files_only=True)
    kwargs = {"revision": revision} if revision else {}
    try:
        return cls.from_pretrained(model, local_files_only=True, **kwargs)
    except OSError as exc:
        if huggingface_hub.constants.is_offline_mode():
            raise unavailable(exc) from exc
    try:
        return cls.from_pretrained(model, **kwargs)
    except OSError as exc:
        raise unavailable(exc) from exc


def _from_pretrained(cls, config: EmbedderConfig):
    return from_pretrained_offline_first(cls, config.model, lambda exc: _unavailable(config, exc))


def load_processor(config: EmbedderConfig):
    """DINOv2's own image processor (from the weights' directory; built in code when synthetic)."""
    from transformers import BitImageProcessor

    if config.synthetic:
        return BitImageProcessor(
            size={"shortest_edge": 256},
            crop_size={"height": 224, "width": 224},
            resample=Image.Resampling.BICUBIC,
            image_mean=list(IMAGENET_MEAN),
            image_std=list(IMAGENET_STD),
        )
    return _from_pretrained(BitImageProcessor, config)


def load_model(config: EmbedderConfig):
    """Return the model on the chosen device, in eval mode."""
    import torch
    from transformers import Dinov2Model

    if config.synthetic:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = Dinov2Model(tiny_dinov2_config())
    else:
        model = _from_pretrained(Dinov2Model, config)
    default = "cpu" if config.synthetic or not torch.cuda.is_available() else "cuda"
    device = config.device or default
    return model.to(device).eval()


def _field(size, name: str) -> int:
    """transformers 4 keeps sizes as dicts, 5 as ``SizeDict`` objects."""
    return size[name] if isinstance(size, dict) else getattr(size, name)


def _crop_size(processor) -> tuple[int, int]:
    return _field(processor.crop_size, "height"), _field(processor.crop_size, "width")


def prepare(image: Image.Image, processor, pad: bool) -> np.ndarray:
    """Resize and crop (or letterbox) on the CPU with the processor's own parameters: shortest
    edge, resample filter and crop size. Returns a (height, width, 3) uint8 array."""
    height, width = _crop_size(processor)
    if pad:
        return np.asarray(letterbox(image, max(height, width)), dtype=np.uint8)
    edge = _field(processor.size, "shortest_edge")
    scale = edge / min(image.size)
    resized = image.resize(
        (max(edge, round(image.width * scale)), max(edge, round(image.height * scale))), processor.resample
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
        self.processor = load_processor(config)
        self.device = next(self.model.parameters()).device
        self.dim = self.model.config.hidden_size
        self._torch = torch

    def embed(self, pixels: np.ndarray) -> np.ndarray:
        """``pixels``: (n, 224, 224, 3) uint8 from :func:`prepare`; returns (n, dim) float16."""
        torch = self._torch
        if len(pixels) == 0:
            return np.zeros((0, self.dim), dtype=np.float16)
        mean = np.asarray(self.processor.image_mean, dtype=np.float32)
        std = np.asarray(self.processor.image_std, dtype=np.float32)
        normalized = (np.asarray(pixels, dtype=np.float32) * self.processor.rescale_factor - mean) / std
        tensor = torch.from_numpy(normalized.transpose(0, 3, 1, 2).copy()).to(self.device)
        with torch.inference_mode():
            if self.device.type == "cuda":  # bf16 autocast on GPU, full fp32 on CPU
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    hidden = self.model(pixel_values=tensor).last_hidden_state
            else:
                hidden = self.model(pixel_values=tensor).last_hidden_state
        pooled = hidden[:, 0] if self.config.pooling == "cls" else hidden[:, 1:].mean(dim=1)
        return pooled.float().cpu().numpy().astype(np.float16)

    def embed_images(self, images: list[Image.Image]) -> np.ndarray:
        """Convenience for notebooks: prepare and embed RGB images in one call."""
        return self.embed(np.stack([prepare(im, self.processor, self.config.pad) for im in images]) if images else [])
