"""Image facts after download: size, format and a perceptual hash, without trusting the file.

The perceptual hash is a 64-bit difference hash (dHash: grayscale, 9x8 thumbnail, one bit per
horizontal gradient); two images within a Hamming distance of a few bits are near-duplicates
(re-encoded, rescaled, slightly cropped). The figure's usability is decided here first, by the
one decoder's rule and reasons (:mod:`pipelines.images.decode`: ``too large`` from the header
before any pixel is decoded, ``not an image``, ``unreadable image``); parsing records it in
``figures.image_errors``. An image is read from a stream, so only what the decoder needs is in memory.
"""

from __future__ import annotations

import io
import warnings
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from pipelines.images.decode import DECODE_ERRORS, MAX_PIXELS, NOT_AN_IMAGE, UNREADABLE, open_unchecked, too_large

# figure image files by extension, as PMC packages name them
IMAGE_EXTENSIONS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".gif": "gif", ".tif": "tiff", ".tiff": "tiff"}


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
        with open_unchecked(io.BytesIO(source) if isinstance(source, bytes | bytearray) else source) as image:
            info.update(width=image.width, height=image.height, format=(image.format or "").lower() or None)
            info["error"] = too_large(image.width, image.height, max_pixels)
            if info["error"]:
                return info
            image.draft("L", (64, 64))  # JPEG: decode at reduced size, much faster
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the cap above decides
                image.seek(0)  # first frame of an animated GIF
                info["phash"] = dhash(image)
    except UnidentifiedImageError:
        info["error"] = f"{NOT_AN_IMAGE} (no format PIL can identify)"
    except DECODE_ERRORS as exc:
        info["error"] = f"{UNREADABLE}: {exc}"
    return info
