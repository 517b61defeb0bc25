"""Figure images as the panel methods take them, and bad input turned into a recorded reason.

``prepare_image(data)`` opens bytes (or takes a PIL image) and returns ``(image, width,
height)``: ``image`` is RGB; ``width``/``height`` are the figure's **original** size. A huge
JPEG is decoded reduced (``draft``: libjpeg's 1/2, 1/4 or 1/8 DCT scaling), so ``image`` may be
smaller than ``width x height``; map boxes back with ``scale_boxes``. Bad input raises
``PanelInputError(reason)``:

* not an image / truncated: ``"unreadable image: ..."``;
* a side under ``MIN_SIDE`` (32) pixels: ``"too small: WxH px ..."``;
* more than ``MAX_DECODE_PIXELS`` (50 Mpx) that cannot be decoded reduced (anything but JPEG),
  or a JPEG still above the cap at 1/8 scale: ``"too large: WxH px ..."``. Nothing is decoded
  at full size above the cap; PIL's own decompression-bomb guard is turned into this reason.

Modes: transparency (RGBA, LA, PA, P or L/RGB with a transparent colour) is composited on
white; CMYK, YCbCr, LAB, HSV are converted; 16- and 32-bit greys (I;16, I;16B, I, F) are
stretched min-max to 8 bits; 1-bit to grey; an animated image gives its first frame.

``split_figure(data)`` runs the splitter and never raises for bad input: it returns a
``FigureSplit`` with panels or with a ``reason`` (``"uniform image"`` for a one-colour figure).
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from dataclasses import dataclass, field

from PIL import Image, JpegImagePlugin

from pipelines.concepts.decode import to_rgb
from pipelines.panels.types import Box, Panel

MIN_SIDE = 32
MAX_DECODE_PIXELS = 50_000_000
DRAFT_SIDE = 2048  # a drafted JPEG is decoded at the smallest scale keeping this side
UNIFORM_TOL = 30  # grey-level spread under which a figure is one colour

_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


class PanelInputError(ValueError):
    """A figure the panel methods cannot take; ``reason`` says why (recorded, never raised on)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class FigureSplit:
    panels: list[Panel] = field(default_factory=list)
    width: int = 0
    height: int = 0
    reason: str | None = None  # None when the figure was split
    labels: list = field(default_factory=list)  # printed labels read (labels.PrintedLabel), original pixels
    route: str | None = None  # how the figure decision split it (split.Decision.route)


def normalize_mode(im: Image.Image) -> Image.Image:
    """The image as ``L`` or ``RGB``: grey and colour images as they are, anything else by the
    decoding rules every stage shares (:func:`pipelines.concepts.decode.to_rgb`: transparency on
    white, 16-bit stretched, CMYK and palettes converted, first frame of animations)."""
    if im.mode in ("L", "RGB") and "transparency" not in im.info:
        return im
    return to_rgb(im)


def _open(data: bytes) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        if data[:3] == b"\xff\xd8\xff":  # a JPEG can still be decoded reduced
            return JpegImagePlugin.JpegImageFile(io.BytesIO(data))
        if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
            width, height = struct.unpack(">II", data[16:24])
            raise PanelInputError(
                f"too large: {width}x{height} px = {width * height:,} px over the cap of "
                f"{MAX_DECODE_PIXELS:,} px, and only JPEG can be decoded reduced"
            ) from exc
        raise PanelInputError(f"too large: {exc}") from exc
    except _PIL_ERRORS as exc:
        raise PanelInputError(f"unreadable image: {exc}") from exc


def _is_loaded(im: Image.Image) -> bool:
    """Whether the pixels are already decoded (an opened file is not until ``load``)."""
    try:
        return im.im is not None
    except (AssertionError, AttributeError):  # Pillow >= 11: ``im.im`` asserts when not loaded
        return False


def prepare_image(data: bytes | Image.Image) -> tuple[Image.Image, int, int]:
    """An RGB image and the figure's original width and height (module doc), or
    ``PanelInputError``."""
    im = _open(bytes(data)) if isinstance(data, bytes | bytearray | memoryview) else data
    width, height = im.size
    if min(width, height) < MIN_SIDE:
        raise PanelInputError(f"too small: {width}x{height} px (a side under {MIN_SIDE} px)")
    loaded = _is_loaded(im)
    if width * height > MAX_DECODE_PIXELS and not loaded:
        if im.format == "JPEG":
            im.draft("RGB", (DRAFT_SIDE, DRAFT_SIDE))
            if im.size[0] * im.size[1] > MAX_DECODE_PIXELS:
                raise PanelInputError(
                    f"too large: {width}x{height} px, still {im.size[0]}x{im.size[1]} at the "
                    f"smallest JPEG scale (cap {MAX_DECODE_PIXELS:,} px)"
                )
        else:
            raise PanelInputError(
                f"too large: {width}x{height} px = {width * height:,} px over the cap of "
                f"{MAX_DECODE_PIXELS:,} px, and only JPEG can be decoded reduced"
            )
    try:
        if getattr(im, "n_frames", 1) > 1:
            im.seek(0)
        im.load()
        rgb = normalize_mode(im)
        rgb = rgb.convert("RGB") if rgb.mode != "RGB" else rgb
    except _PIL_ERRORS as exc:
        raise PanelInputError(f"unreadable image: {exc}") from exc
    return rgb, width, height


def scale_boxes(boxes: list[Box], image_size: tuple[int, int], width: int, height: int) -> list[Box]:
    """Boxes found on a reduced decode (``image_size``) in the original ``width x height``."""
    sx, sy = width / image_size[0], height / image_size[1]
    if sx == 1 and sy == 1:
        return list(boxes)
    return [
        (
            math.floor(x1 * sx),
            math.floor(y1 * sy),
            min(width, math.ceil(x2 * sx)),
            min(height, math.ceil(y2 * sy)),
        )
        for x1, y1, x2, y2 in boxes
    ]


def is_uniform(image: Image.Image) -> bool:
    from pipelines.panels.layout import work_copy

    lo, hi = work_copy(image, 256).getextrema()
    return hi - lo <= UNIFORM_TOL


def open_figure(data: bytes | Image.Image) -> tuple[Image.Image, int, int] | FigureSplit:
    """``prepare_image``, and a one-colour figure refused: the image and its original size, or
    a ``FigureSplit`` with the reason (never an exception for bad input)."""
    try:
        image, width, height = prepare_image(data)
    except PanelInputError as exc:
        return FigureSplit(reason=exc.reason)
    if is_uniform(image):
        return FigureSplit(width=width, height=height, reason="uniform image")
    return image, width, height


def split_figure(data: bytes | Image.Image) -> FigureSplit:
    """``open_figure`` then ``split_panels``; bad input is a ``reason``, never an exception."""
    from dataclasses import replace

    from pipelines.panels.layout import split_panels

    opened = open_figure(data)
    if isinstance(opened, FigureSplit):
        return opened
    image, width, height = opened
    panels = split_panels(image)
    boxes = scale_boxes([p.box for p in panels], image.size, width, height)
    panels = [replace(p, box=b) for p, b in zip(panels, boxes, strict=True)]
    return FigureSplit(panels=panels, width=width, height=height, reason=None if panels else "no content")
