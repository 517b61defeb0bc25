"""The release gate of panel crops (pipelines/images/gate.py) on crops drawn here, each the kind of
thing a splitter boxes by mistake or a real panel; expected verdicts are what each drawing is."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from pipelines.images.gate import (
    BLANK,
    TEXT_OR_LINES,
    TOO_ELONGATED,
    TOO_SMALL,
    GateSettings,
    crop_gate,
    farther_than,
    measure,
)

FONT = ImageFont.load_default(size=16)


def _canvas(width: int, height: int, colour="white") -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (width, height), colour)
    return image, ImageDraw.Draw(image)


def row_headers() -> Image.Image:
    """Six lines of labels, as printed beside the rows of a grid of panels."""
    image, draw = _canvas(220, 210)
    for k, text in enumerate(["Group size", "Home range", "Group location", "Spawning", "Diel", "Lunar"]):
        draw.text((10, 8 + k * 33), text, fill="black", font=FONT)
    return image


def tick_strip() -> Image.Image:
    """An x axis with its ticks, tick labels and title: a strip cut off a chart."""
    image, draw = _canvas(420, 80)
    draw.line((20, 10, 400, 10), fill="black", width=2)
    for k in range(5):
        x = 20 + k * 95
        draw.line((x, 10, x, 18), fill="black", width=2)
        draw.text((x - 8, 22), str(k * 30), fill="black", font=FONT)
    draw.text((170, 50), "Time (min)", fill="black", font=FONT)
    return image


def rotated_axis_title() -> Image.Image:
    """A y-axis title printed sideways beside a lone axis line."""
    text, draw = _canvas(260, 30)
    draw.text((10, 5), "Expression of Cathepsin Z", fill="black", font=FONT)
    image, draw = _canvas(90, 280)
    image.paste(text.rotate(90, expand=True), (10, 10))
    draw.line((70, 5, 70, 275), fill="black", width=2)
    return image


def line_chart() -> Image.Image:
    """Axes, tick labels and a curve across the plot."""
    image, draw = _canvas(300, 220)
    draw.line((40, 10, 40, 190, 290, 190), fill="black", width=2)
    for k in range(4):
        draw.text((5, 180 - k * 55), str(k * 10), fill="black", font=FONT)
    points = [(40 + x, 190 - 80 - 70 * math.sin(x / 40)) for x in range(0, 250, 5)]
    draw.line(points, fill="blue", width=2)
    return image


def scatter() -> Image.Image:
    """Markers spread over the plot, no axes joined to them."""
    image, draw = _canvas(260, 240)
    rng = random.Random(4)
    for _ in range(120):
        x, y = rng.uniform(20, 240), rng.uniform(20, 220)
        draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=(90, 90, 220))
    return image


def bar_chart() -> Image.Image:
    image, draw = _canvas(240, 200)
    draw.line((30, 10, 30, 180, 230, 180), fill="black", width=2)
    for k, h in enumerate((120, 80, 150, 40)):
        draw.rectangle((45 + k * 45, 180 - h, 75 + k * 45, 180), fill=(60, 60, 60))
    return image


def micrograph() -> Image.Image:
    """Bright cells on a black background (the background is the crop's most common colour)."""
    image, draw = _canvas(200, 200, "black")
    rng = random.Random(1)
    for _ in range(40):
        x, y, r = rng.uniform(10, 190), rng.uniform(10, 190), rng.uniform(2, 9)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(0, rng.randint(120, 255), 0))
    return image


def diagram() -> Image.Image:
    """Two long arrows and a boxed label, a sparse diagram: two lines across the text are a drawing."""
    image, draw = _canvas(160, 400)
    draw.text((40, 5), "AVL19m", fill="black", font=FONT)
    for x in (60, 100):
        draw.line((x, 30, x, 300), fill=(60, 100, 200), width=3)
    draw.text((20, 150), "33", fill="black", font=FONT)
    draw.text((110, 150), "16", fill="black", font=FONT)
    draw.rectangle((30, 310, 110, 360), outline="black", width=2)
    draw.text((50, 325), "LC13", fill="black", font=FONT)
    return image


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        (row_headers, TEXT_OR_LINES),
        (tick_strip, TEXT_OR_LINES),
        (rotated_axis_title, TEXT_OR_LINES),
        (line_chart, None),
        (scatter, None),
        (bar_chart, None),
        (micrograph, None),
        (diagram, None),
    ],
)
def test_text_and_lines_are_not_panels_and_drawings_are(draw, expected):
    reason, measures = crop_gate(draw())
    assert reason == expected, measures


def test_size_shape_and_ink():
    assert crop_gate(_canvas(50, 200)[0])[0] == TOO_SMALL  # a side under 64 px
    assert crop_gate(line_chart().resize((80, 90)))[0] == TOO_SMALL  # area 7,200 under 8,192
    assert crop_gate(line_chart().resize((900, 100)))[0] == TOO_ELONGATED  # 9:1
    assert crop_gate(_canvas(300, 300)[0])[0] == BLANK
    speck, draw = _canvas(300, 300)
    draw.point([(150, 150), (151, 150)], fill="black")
    assert crop_gate(speck)[0] == BLANK


def test_settings_move_the_thresholds():
    strict = GateSettings(min_side=250)
    assert crop_gate(line_chart(), strict)[0] == TOO_SMALL
    assert crop_gate(tick_strip(), GateSettings(max_aspect=4))[0] == TOO_ELONGATED


def test_measures_are_taken_on_a_reduced_copy_of_a_large_crop():
    big = line_chart().resize((3000, 2200))
    measures = measure(big)
    assert (measures.width, measures.height) == (3000, 2200)
    assert measures.row_run <= 512 and measures.column_run <= 512
    assert crop_gate(big)[0] is None


def test_single_colour_crops_of_any_mode_are_blank():
    for image in (
        Image.new("L", (100, 100), 255),
        Image.new("RGBA", (100, 100), (0, 0, 0, 0)),
        Image.new("CMYK", (100, 100)),
        Image.new("RGB", (100, 100), "red"),
        Image.new("I;16", (100, 100), 4000),
    ):
        assert crop_gate(image)[0] == BLANK, image.mode


def test_farther_than_is_the_distance_transform_read_by_hand():
    """A 7 x 7 block of ink inside a 9 x 9 image: its centre is 4 pixels from the white ring, the
    eight pixels around the centre 3, the block's outer ring 1. Farther than 3: the centre alone;
    than 2: the 3 x 3 middle; the image's edge is not outside (a block touching it keeps its edge)."""
    mask = np.zeros((9, 9), bool)
    mask[1:8, 1:8] = True
    assert np.argwhere(farther_than(mask, 3)).tolist() == [[4, 4]]
    assert np.argwhere(farther_than(mask, 2)).tolist() == [[y, x] for y in (3, 4, 5) for x in (3, 4, 5)]
    edge = np.zeros((5, 5), bool)
    edge[:, :3] = True  # ink from the left edge to column 2, white from column 3
    assert farther_than(edge, 1)[:, 0].all() and farther_than(edge, 1)[:, 1].all()
    assert not farther_than(edge, 1)[:, 2].any()


def test_farther_than_agrees_with_scipy_on_random_masks():
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(7)
    for _ in range(150):
        h, w = (int(v) for v in rng.integers(1, 70, 2))
        mask = rng.random((h, w)) < rng.uniform(0.02, 0.4)
        mask = ndimage.binary_dilation(mask, iterations=int(rng.integers(0, 4)))
        if mask.all():  # a crop always has background (its own colour): the transform's premise
            continue
        for radius in (1, 2, 3, 4.5):
            assert (farther_than(mask, radius) == (ndimage.distance_transform_edt(mask) > radius)).all()
