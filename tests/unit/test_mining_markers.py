"""Marker detection on hand-placed drawings and a real figure, and fusion of caption boxes with
markers. Every expected position below is where the test drew the mark, or (real figure) where
a person located it by looking at the image."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from pipelines.mining.markers import Marker, detect_markers
from pipelines.mining.regions import fuse_regions
from testing.markers import draw_arrow, draw_arrowhead, draw_asterisk, draw_box, draw_circle

ROOT = Path(__file__).resolve().parents[2]
PHOTO = ROOT / "sample" / "images" / "PMC7003341" / "40779_2020_233_Fig3_HTML.jpg"  # CT scans (CC BY)
# bioRxiv 2021.11.17.469032 Figure 2 (CC BY 4.0, attributed in sample/SOURCES.md): yellow
# chevron arrowheads, "yellow arrows in a and c" in the caption
REAL_FIG = ROOT / "sample" / "articles" / "biorxiv-2021.11.17.469032" / "469032v1_fig2"

YELLOW, RED, GREEN, BLUE, WHITE = (255, 215, 0), (230, 20, 20), (20, 200, 40), (30, 90, 255), (255, 255, 255)


def plain() -> Image.Image:
    return Image.new("RGB", (400, 300), (235, 235, 235))


def photo() -> Image.Image:
    """A real CT-scan crop (grey, textured), resized to 400 x 300."""
    return Image.open(PHOTO).convert("RGB").crop((180, 10, 350, 190)).resize((400, 300))


BACKGROUNDS = pytest.mark.parametrize("background", [plain, photo], ids=["plain", "photo"])


def only(markers: list[Marker], kind: str) -> Marker:
    assert [m.kind for m in markers] == [kind], markers
    return markers[0]


def inside(point: tuple[float, float], box: tuple[int, int, int, int], slack: int = 3) -> bool:
    return box[0] - slack <= point[0] <= box[2] + slack and box[1] - slack <= point[1] <= box[3] + slack


@BACKGROUNDS
def test_arrow_tip_is_where_it_was_drawn(background):
    image = background()
    draw_arrow(ImageDraw.Draw(image), tail=(80, 240), tip=(170, 160), colour=YELLOW)
    m = only(detect_markers(image), "arrow")
    assert math.dist(m.tip, (170, 160)) <= 3
    assert m.colour == "yellow"
    assert inside((80, 240), m.box) and inside((170, 160), m.box)


@BACKGROUNDS
def test_arrowhead_pointing_left(background):
    image = background()
    draw_arrowhead(ImageDraw.Draw(image), tip=(250, 120), angle=math.pi, colour=RED, size=22)
    m = only(detect_markers(image), "arrowhead")
    assert math.dist(m.tip, (250, 120)) <= 3  # apex drawn at (250, 120), base at x = 272
    assert m.colour == "red"


@BACKGROUNDS
def test_asterisk(background):
    image = background()
    draw_asterisk(ImageDraw.Draw(image), centre=(200, 150), radius=12, colour=GREEN)
    m = only(detect_markers(image), "asterisk")
    assert inside((200, 150), m.box, slack=0) and m.box[2] - m.box[0] <= 30
    assert m.tip is None and m.colour == "green"


@BACKGROUNDS
def test_box_outline(background):
    image = background()
    draw_box(ImageDraw.Draw(image), (120, 80, 260, 200), YELLOW if background is photo else BLUE)
    m = only(detect_markers(image), "box")
    assert all(abs(a - b) <= 2 for a, b in zip(m.box, (120, 80, 260, 200), strict=True))
    assert m.colour == ("yellow" if background is photo else "blue")


@BACKGROUNDS
def test_circle_outline(background):
    image = background()
    draw_circle(ImageDraw.Draw(image), (100, 60, 220, 160), YELLOW)
    m = only(detect_markers(image), "circle")
    assert all(abs(a - b) <= 2 for a, b in zip(m.box, (100, 60, 220, 160), strict=True))
    assert m.colour == "yellow"


def test_plain_photo_has_no_marker():
    assert detect_markers(photo()) == []
    assert detect_markers(plain()) == []


def test_line_chart_with_axis_text_has_no_marker():
    """Axes, ticks, a polyline with square and triangle plot symbols, a frame and axis text
    (letters such as V, T, t, O, X, A, 4) are not markers."""
    image = Image.new("RGB", (420, 320), (255, 255, 255))
    d = ImageDraw.Draw(image)
    d.line([(50, 20), (50, 270), (400, 270)], fill=(0, 0, 0), width=2)
    for x in range(50, 401, 50):
        d.line([(x, 270), (x, 276)], fill=(0, 0, 0), width=2)
        d.text((x - 6, 280), str(x // 5), fill=(0, 0, 0))
    for y in range(20, 271, 50):
        d.line([(44, y), (50, y)], fill=(0, 0, 0), width=2)
    points = [(60, 240), (120, 200), (180, 210), (240, 140), (300, 120), (360, 60)]
    d.line(points, fill=(30, 90, 255), width=2)
    for x, y in points:
        d.rectangle([x - 3, y - 3, x + 3, y + 3], fill=(30, 90, 255))
    d.line([(60, 250), (360, 160)], fill=(230, 20, 20), width=2)
    d.text((150, 295), "Time after infection (h)  V T t O X A 4", fill=(0, 0, 0), font_size=14)
    d.text((5, 120), "Titer", fill=(0, 0, 0), font_size=14)
    d.rectangle([300, 220, 390, 262], outline=(0, 0, 0), width=1)  # legend frame
    d.text((306, 226), "WT  KO", fill=(0, 0, 0), font_size=13)
    assert detect_markers(image) == []


def test_real_figure_yellow_arrowheads():
    """Panel A (middle) of bioRxiv 469032 Figure 2: two yellow chevron arrowheads, located by
    eye at about x 630-660, y 102-130 (pointing left, tip near (631, 116)) and x 700-730,
    y 104-132 (pointing right, tip near (729, 118)) in the full 1280 x 1045 image."""
    figure = Image.open(REAL_FIG).convert("RGB")
    x0, y0 = 430, 20
    found = detect_markers(figure.crop((x0, y0, 900, 330)))
    heads = [m for m in found if m.kind == "arrowhead" and m.colour == "yellow"]
    tips = sorted((m.tip[0] + x0, m.tip[1] + y0) for m in heads)
    assert len(tips) == 2, found
    assert math.dist(tips[0], (631, 116)) <= 6
    assert math.dist(tips[1], (729, 118)) <= 6


# ---------------------------------------------------------------------------- fusion

SIZE = (400, 300)  # diagonal 500, so a normalised distance of 0.1 is 50 px


def test_caption_box_kept_within_tau_and_dropped_beyond():
    arrow = Marker("arrow", (40, 40, 100, 100), tip=(100, 100), colour="red", score=1.0)
    near = (110, 110, 150, 150)  # centre (130, 130): 30 * sqrt(2) = 42.4 px from the tip = 0.0849
    far = (300, 200, 360, 260)  # centre (330, 230): far from the tip
    regions = fuse_regions([near, far], [arrow], SIZE, tau=0.1, lone_marker_scale=0.1)
    assert [(r.box, r.source, r.marker) for r in regions] == [(near, "caption+marker", "arrow")]
    assert regions[0].distance == pytest.approx(0.0849, abs=1e-3)
    # the same box is rejected when tau is smaller than its distance; the arrow then stands
    # alone: a 50 px square beyond the tip along the tail-to-tip direction (centre (117.7, 117.7))
    regions = fuse_regions([near], [arrow], SIZE, tau=0.08, lone_marker_scale=0.1)
    assert [(r.box, r.source) for r in regions] == [((93, 93, 143, 143), "marker")]


def test_arrow_distance_is_measured_from_the_tip_not_the_centre():
    arrow = Marker("arrow", (0, 0, 200, 20), tip=(200, 10), colour="yellow", score=0.9)
    target = (210, 0, 250, 20)  # centre (230, 10): 30 px from the tip (0.06), 130 px from the centre
    regions = fuse_regions([target], [arrow], SIZE, tau=0.1)
    assert [r.source for r in regions] == ["caption+marker"]


def test_lone_box_marker_gives_its_interior():
    box_marker = Marker("box", (50, 60, 150, 140), tip=None, colour="white", score=0.8)
    regions = fuse_regions([], [box_marker], SIZE, tau=0.15)
    assert [(r.box, r.source, r.marker, r.distance) for r in regions] == [((50, 60, 150, 140), "marker", "box", None)]


def test_nms_merges_duplicate_caption_boxes():
    circle = Marker("circle", (100, 100, 200, 200), tip=None, colour="blue", score=1.0)
    a = (110, 110, 190, 190)  # centre (150, 150) = the circle's centre: distance 0
    b = (112, 112, 192, 192)  # nearly the same box, centre 2.8 px away
    regions = fuse_regions([b, a], [circle], SIZE, tau=0.1)
    # both are supported; a is closer (higher score) so it is kept, b (IoU 0.91 with a) and the
    # circle's own region (not lone: a caption box used it) are gone
    assert [(r.box, r.source) for r in regions] == [(a, "caption+marker")]


def test_no_marker_means_no_region():
    assert fuse_regions([(10, 10, 50, 50)], [], SIZE) == []


def test_white_arrowhead_on_dark_background():
    image = Image.new("RGB", (300, 240), (20, 20, 25))
    draw_arrowhead(ImageDraw.Draw(image), tip=(150, 100), angle=math.pi / 2, colour=WHITE, size=20)  # points down
    m = only(detect_markers(image), "arrowhead")
    assert math.dist(m.tip, (150, 100)) <= 3 and m.colour == "white"
