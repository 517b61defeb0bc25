"""The one JPEG encoder: every JPEG PanelForge writes (converted figures, panel crops, release
crops) is baseline, quality 95, 4:4:4 chroma, not optimised, so the same pixels give the same bytes;
the UI's metadata previews use it at a lower quality."""

from __future__ import annotations

import io

from PIL import Image

from pipelines.images.decode import decode_image

JPEG_MAGIC = b"\xff\xd8\xff"
JPEG_QUALITY = 95  # conversions of PNG/TIFF/GIF figures: 4:4:4 chroma, no visible loss on line art


def jpeg_bytes(image: Image.Image, quality: int = JPEG_QUALITY) -> bytes:
    """An RGB image as JPEG with the release's settings (quality 95, 4:4:4), deterministic;
    ``quality`` lower only for what is no data (the UI's previews)."""
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality, subsampling=0, optimize=False)
    return out.getvalue()


def to_jpeg(data: bytes) -> tuple[bytes | None, str | None]:
    """The image re-encoded as baseline JPEG (RGB by PanelForge's decoding rules), or a reason."""
    image, reason = decode_image(data)
    if image is None:
        return None, reason
    return jpeg_bytes(image), None
