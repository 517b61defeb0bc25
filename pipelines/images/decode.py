"""The one image decoder: a figure file becomes an RGB image, or a recorded reason why not.

Every stage opens figure images through :func:`open_figure` (``decode_image`` is its tuple form),
so a figure is usable in all of them or in none, for the same reason. The rule, decided from the
file alone, so every stage and every rerun decides alike (and parsing records it first, in
``figures.image_errors``, which the release follows):

* ``not an image``: no format PIL can identify;
* ``too large: WxH px = N px, over the cap of M px``: more than ``MAX_PIXELS`` (89,478,485,
  PIL's own decompression-bomb threshold), read from the header, before any pixel is decoded,
  whatever the format (a huge JPEG is refused too, not decoded reduced: its crops, pairs and long
  captions would need the full image);
* ``unreadable image: ...``: truncated or corrupt data, found while decoding (never half-decoded),
  or an image of no pixels (``empty image``).

Modes are converted deliberately: CMYK to RGB with PIL's profile-free conversion, palette and
alpha images composited on white (figures are drawn on white paper; black would invent a
background), 16-bit and 32-bit grayscale scaled to 8 bits by their actual range, animated GIFs by
their first frame. ``draft_side`` lets a caller that needs only a small copy (the layout
splitter) decode a large JPEG reduced (libjpeg's 1/2, 1/4, 1/8 scaling), keeping both sides at
least ``draft_side``; the figure's original size is returned beside the image.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import BinaryIO

from PIL import Image, ImageFile, UnidentifiedImageError

ImageFile.LOAD_TRUNCATED_IMAGES = False

MAX_PIXELS = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS (about 9,459 x 9,459); PMC figures are far smaller
NOT_AN_IMAGE, TOO_LARGE, UNREADABLE = "not an image", "too large", "unreadable image"
REASONS = (NOT_AN_IMAGE, TOO_LARGE, UNREADABLE)  # every reason starts with one of these
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


class UnusableFigureError(ValueError):
    """A figure image the decoder refuses; ``reason`` (one of ``REASONS``, with detail) is what
    stages record for it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class OpenedFigure:
    """``image``: RGB (reduced when drafted), or None with ``reason``; ``width``/``height``: the
    figure's original size (0 when not even its header could be read)."""

    image: Image.Image | None
    width: int = 0
    height: int = 0
    reason: str | None = None


def reason_kind(reason: str | None) -> str | None:
    """The reason's kind (``not an image``, ``too large``, ``unreadable image``), for counting."""
    return next((kind for kind in REASONS if reason and reason.startswith(kind)), None)


def too_large(width: int, height: int, max_pixels: int = MAX_PIXELS) -> str | None:
    """The size rule: the reason a ``width x height`` figure is refused, or None."""
    if width * height > max_pixels:
        return f"{TOO_LARGE}: {width}x{height} px = {width * height:,} px, over the cap of {max_pixels:,} px"
    return None


def open_unchecked(source: bytes | BinaryIO) -> Image.Image:
    """``Image.open`` (of bytes or a seekable stream) without PIL's own decompression-bomb refusal,
    so that the size rule above, with the figure's size in its reason, is the only one. Nothing is
    decoded here."""
    fp = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(fp)
    except Image.DecompressionBombError:
        for fmt in Image.ID:  # what Image.open does, less the check: the header gives the size
            factory, accept = Image.OPEN[fmt]
            fp.seek(0)
            if accept and not accept(fp.read(16)):
                continue
            fp.seek(0)
            try:
                return factory(fp, "")
            except DECODE_ERRORS:
                continue
        raise


def _on_white(image: Image.Image) -> Image.Image:
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _high_bit_depth_to_rgb(image: Image.Image) -> Image.Image:
    low, high = image.getextrema()
    if high <= low:
        return Image.new("RGB", image.size, (255, 255, 255) if high else (0, 0, 0))
    scaled = image.point(lambda v: (v - low) * 255.0 / (high - low))  # stays in mode I/F
    return scaled.convert("L").convert("RGB")


def to_rgb(image: Image.Image) -> Image.Image:
    """An RGB copy of ``image`` by the rules above (first frame of animations)."""
    image.seek(0)
    mode = image.mode
    if mode == "RGB":
        return image.copy()
    if mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in image.info):
        return _on_white(image)
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        return _high_bit_depth_to_rgb(image.convert("I") if mode.startswith("I;16") else image)
    return image.convert("RGB")  # L, 1, P without transparency, CMYK, YCbCr, LAB, HSV


def normalize_mode(im: Image.Image) -> Image.Image:
    """The image as ``L`` or ``RGB``: grey and colour images as they are, anything else by the
    decoding rules every stage shares (:func:`to_rgb`: transparency on
    white, 16-bit stretched, CMYK and palettes converted, first frame of animations)."""
    if im.mode in ("L", "RGB") and "transparency" not in im.info:
        return im
    return to_rgb(im)


def is_loaded(image: Image.Image) -> bool:
    """Whether the pixels are already decoded (an opened file is not until ``load``)."""
    try:
        return image.im is not None
    except (AssertionError, AttributeError):  # Pillow >= 11: ``im.im`` asserts when not loaded
        return False


def open_image(image: Image.Image, max_pixels: int = MAX_PIXELS, draft_side: int | None = None) -> OpenedFigure:
    """The rule and the decoding for an image PIL has opened but not decoded (``Image.open``)."""
    width, height = image.size
    reason = too_large(width, height, max_pixels)
    if reason:
        return OpenedFigure(None, width, height, reason)
    if not width or not height:  # nothing to embed, split or crop
        return OpenedFigure(None, width, height, f"{UNREADABLE}: empty image ({width}x{height} px)")
    try:
        if draft_side and image.format == "JPEG" and min(width, height) >= 2 * draft_side:
            image.draft("RGB", (draft_side, draft_side))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the cap above decides
            image.load()
            return OpenedFigure(to_rgb(image), width, height)
    except DECODE_ERRORS as exc:
        return OpenedFigure(None, width, height, f"{UNREADABLE}: {exc}")


def open_figure(data: bytes, max_pixels: int = MAX_PIXELS, draft_side: int | None = None) -> OpenedFigure:
    """A figure file by the rule of the module doc; never raises on bad input."""
    try:
        image = open_unchecked(bytes(data))
    except UnidentifiedImageError:
        return OpenedFigure(None, reason=f"{NOT_AN_IMAGE} (no format PIL can identify)")
    except DECODE_ERRORS as exc:
        return OpenedFigure(None, reason=f"{UNREADABLE}: {exc}")
    with image:
        return open_image(image, max_pixels, draft_side)


def decode_image(data: bytes, max_pixels: int = MAX_PIXELS) -> tuple[Image.Image | None, str | None]:
    """``(RGB image, None)`` or ``(None, reason)``: :func:`open_figure` at full size."""
    figure = open_figure(data, max_pixels)
    return figure.image, figure.reason
