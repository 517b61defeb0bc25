"""Robust decoding, the DINOv2 embedder, and embeddings on a local Ray through the asset."""

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, ModelUnavailableError, load_model
from pipelines.images.decode import decode_image
from testing.loopback.sample_mirror import SAMPLE_DIR

SYNTHETIC = EmbedderConfig(synthetic=True)


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def _bomb() -> bytes:
    data = bytearray(_encode(Image.new("L", (1, 1)), "PNG"))
    data[16:24] = (60000).to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:])


@pytest.mark.parametrize(
    ("name", "data", "pixel"),
    [
        ("cmyk", lambda: _encode(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=100), (255, 0, 0)),
        ("palette", lambda: _encode(Image.new("P", (8, 8), 0), "PNG"), (0, 0, 0)),
        ("16-bit", lambda: _encode(Image.frombytes("I;16", (2, 1), b"\x00\x00\xff\xff"), "PNG"), (0, 0, 0)),
        ("gray+alpha", lambda: _encode(Image.new("LA", (8, 8), (0, 0)), "PNG"), (255, 255, 255)),  # on white
        ("animated gif", _animated_gif, (255, 0, 0)),  # first frame
        ("1x1", lambda: _encode(Image.new("RGB", (1, 1), (1, 2, 3)), "PNG"), (1, 2, 3)),
    ],
)
def test_every_mode_decodes_to_rgb(name, data, pixel):
    image, error = decode_image(data())
    assert error is None and image.mode == "RGB"
    assert all(abs(a - b) <= 2 for a, b in zip(image.getpixel((0, 0)), pixel, strict=True)), name


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (
            lambda: _encode(Image.new("RGB", (64, 64), (9, 9, 9)), "JPEG")[:300],
            "unreadable image: ",
        ),  # cut inside its headers
        (_bomb, "too large: 60000x60000 px = 3,600,000,000 px, over the cap of 89,478,485 px"),
        (lambda: b"%PDF-1.4 not an image", "not an image (no format PIL can identify)"),
    ],
)
def test_bad_images_give_a_reason(data, reason):
    image, error = decode_image(data())
    assert image is None and error.startswith(reason)


def test_synthetic_embedder_is_deterministic_and_marked():
    images = [Image.open(SAMPLE_DIR / "articles" / "elife-46472" / f"fig{i}.jpg").convert("RGB") for i in (1, 2, 3)]
    first = Embedder(SYNTHETIC).embed_images(images)
    again = Embedder(SYNTHETIC).embed_images(images)
    assert first.shape == (3, 32) and first.dtype == np.float16
    assert np.array_equal(first, again)
    assert not np.array_equal(first[0], first[1])
    mean = Embedder(EmbedderConfig(synthetic=True, pooling="mean", pad=True)).embed_images(images)
    assert mean.shape == (3, 32) and not np.array_equal(mean, first)
    assert SYNTHETIC.model_label == "synthetic-tiny-dinov2"


def test_offline_without_weights_is_a_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelUnavailableError, match="PANELFORGE_DINOV2_MODEL='facebook/dinov2-large' .* not in the"):
        load_model(EmbedderConfig(model="facebook/dinov2-large"))


def test_synthetic_model_stays_on_the_cpu_and_leaves_the_global_rng_alone(monkeypatch):
    """bf16 on a GPU would give the demo other vectors, hence other clusters than its annotations."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    model = load_model(SYNTHETIC)
    assert torch.equal(torch.rand(3), expected)
    assert next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype == torch.float32
