"""Image facts after download: size, format and a perceptual hash, without trusting the file.

The perceptual hash is a 64-bit difference hash (dHash: grayscale, 9x8 thumbnail, one bit per
horizontal gradient); two images within a Hamming distance of a few bits are near-duplicates
(re-encoded, rescaled, slightly cropped). Decoding is bounded: images above
``MAX_PIXELS`` (or the caller's ``max_pixels``) are refused as decompression bombs before any
pixel is decoded. An image is read from a stream, so only what the decoder needs is in memory.
"""

from __future__ import annotations

import io
import warnings
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

# figure image files by extension, as PMC packages name them
IMAGE_EXTENSIONS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".gif": "gif", ".tif": "tiff", ".tiff": "tiff"}
MAX_PIXELS = 180_000_000  # about 13,400 x 13,400, PIL's own refusal threshold; PMC figures are far smaller


def dhash(image: Image.Image) -> str:
    """16 hex digits of the image's 64-bit difference hash."""
    small = image.convert("L").resize((9, 8), Image.Resampling.LANCZOS)
    pixels = list(small.getdata())
    bits = 0
    for row in range(8):
        for col in range(8):
            bits = (bits << 1) | (pixels[row * 9 + col] > pixels[row * 9 + col + 1])
    return f"{bits:016x}"


def hamming(a: str, b: str) -> int:
    return (int(a, 16) ^ int(b, 16)).bit_count()


def image_info(source: bytes | BinaryIO, max_pixels: int = MAX_PIXELS) -> dict:
    """Return width, height, format and dHash of an image (bytes or a seekable binary stream),
    or an ``error`` with the reason."""
    info = {"width": None, "height": None, "format": None, "phash": None, "error": None}
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes | bytearray) else source) as image:
            info.update(width=image.width, height=image.height, format=(image.format or "").lower() or None)
            if image.width * image.height > max_pixels:
                info["error"] = f"decompression bomb refused: {image.width}x{image.height} pixels"
                return info
            image.draft("L", (64, 64))  # JPEG: decode at reduced size, much faster
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image.seek(0)  # first frame of an animated GIF
                info["phash"] = dhash(image)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        info["error"] = f"decompression bomb refused: {exc}"
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        info["error"] = f"undecodable image: {type(exc).__name__}: {exc}"
    return info
