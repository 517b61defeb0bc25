"""Figure images as the panel methods take them, and bad input turned into a recorded reason.

``prepare_image(data)`` opens bytes (or takes a PIL image) through the one decoder
(:func:`pipelines.images.decode.open_figure`, its rule and reasons: ``not an image``, ``too
large``, ``unreadable image``) and returns ``(image, width, height)``: ``image`` is RGB;
``width``/``height`` are the figure's **original** size. A large JPEG is decoded reduced
(``DRAFT_SIDE``: libjpeg's 1/2, 1/4 or 1/8 DCT scaling), so ``image`` may be smaller than
``width x height``; map boxes back with ``scale_boxes``. Bad input raises
``PanelInputError(reason)`` (the decoder's ``UnusableFigureError``); besides the decoder's reasons,
a side under ``MIN_SIDE`` (32) pixels is ``"too small: WxH px ..."``: nothing to split.

``split_figure(data)`` runs the splitter and never raises for bad input: it returns a
``FigureSplit`` with panels or with a ``reason`` (``"uniform image"`` for a one-colour figure).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from PIL import Image

from pipelines.images.boxes import Panel, scale_boxes
from pipelines.images.decode import OpenedFigure, UnusableFigureError, is_loaded, open_figure, open_image, to_rgb
from pipelines.panels.layout import DRAFT_SIDE, split_panels, work_copy

MIN_SIDE = 32
UNIFORM_TOL = 30  # grey-level spread under which a figure is one colour

PanelInputError = UnusableFigureError  # the name the panel modules and their callers know


@dataclass
class FigureSplit:
    panels: list[Panel] = field(default_factory=list)
    width: int = 0
    height: int = 0
    reason: str | None = None  # None when the figure was split
    labels: list = field(default_factory=list)  # printed labels read (labels.PrintedLabel), original pixels
    route: str | None = None  # how the figure decision split it (split.Decision.route)


def prepare_image(data: bytes | Image.Image) -> tuple[Image.Image, int, int]:
    """An RGB image and the figure's original width and height (module doc), or
    ``PanelInputError``. An image already decoded is taken as it is (it is in memory already);
    one only opened (``Image.open``) is decoded by the one decoder's rule."""
    if isinstance(data, bytes | bytearray | memoryview):
        figure = open_figure(bytes(data), draft_side=DRAFT_SIDE)
    elif is_loaded(data):
        figure = OpenedFigure(None, *data.size)
    else:
        figure = open_image(data, draft_side=DRAFT_SIDE)
    width, height = figure.width, figure.height
    if figure.reason is None and min(width, height) < MIN_SIDE:
        raise PanelInputError(f"too small: {width}x{height} px (a side under {MIN_SIDE} px)")
    if figure.reason is not None:
        raise PanelInputError(figure.reason)
    if figure.image is None:  # decoded by the caller
        return to_rgb(data), width, height
    return figure.image, width, height


def is_uniform(image: Image.Image) -> bool:
    lo, hi = work_copy(image, 256).getextrema()
    return hi - lo <= UNIFORM_TOL


def prepare_figure(data: bytes | Image.Image) -> tuple[Image.Image, int, int] | FigureSplit:
    """``prepare_image``, and a one-colour figure refused: the image and its original size, or
    a ``FigureSplit`` with the reason (never an exception for bad input). One place for the
    layout splitter and the figure decision."""
    try:
        image, width, height = prepare_image(data)
    except PanelInputError as exc:
        return FigureSplit(reason=exc.reason)
    if is_uniform(image):
        return FigureSplit(width=width, height=height, reason="uniform image")
    return image, width, height


def split_figure(data: bytes | Image.Image) -> FigureSplit:
    """``prepare_figure`` then ``split_panels``; bad input is a ``reason``, never an exception."""
    opened = prepare_figure(data)
    if isinstance(opened, FigureSplit):
        return opened
    image, width, height = opened
    panels = split_panels(image)
    boxes = scale_boxes([p.box for p in panels], image.size, width, height)
    panels = [replace(p, box=b) for p, b in zip(panels, boxes, strict=True)]
    return FigureSplit(panels=panels, width=width, height=height, reason=None if panels else "no content")
