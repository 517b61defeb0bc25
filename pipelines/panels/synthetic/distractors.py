"""Marks drawn inside panels that are not panels: legends, colour bars, scale bars, text, arrows.

Real panels are full of text and small boxed graphics that look like labels or insets; a detector
that never saw them during training takes them for panel labels or panels. These are drawn where
they cover no label or inset and are deliberately not annotated (only their fonts are recorded).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from pipelines.panels.synthetic.draw import Box, contrast, overlaps
from pipelines.panels.synthetic.labels import FONTS, font

Ink = tuple[int, int, int]
Size = tuple[int, int]  # the host panel's width and height

WORDS = ["Control", "WT", "KO", "Treated", "Sham", "Day 7", "siRNA", "Vehicle", "DAPI", "GFP", "Merge", "CD31"]
WORDS += ["Ki67", "H&E", "n = 12", "p < 0.05", "***", "×40", "Pre", "Post", "Baseline", "24 h", "Mock", "LPS"]
SCALES = ["10 µm", "20 µm", "50 µm", "100 µm", "200 nm", "1 mm", "5 mm", "2 µm", "500 µm"]
SWATCHES = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (0, 0, 0)]
COLOURMAPS = [
    [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)],  # viridis-like
    [(0, 0, 4), (120, 28, 109), (237, 105, 37), (252, 255, 164)],  # inferno-like
    [(59, 76, 192), (221, 221, 221), (180, 4, 38)],  # cool-warm
    [(0, 0, 0), (255, 255, 255)],
    [(0, 0, 0), (0, 255, 0)],
]


def _gradient(stops, t: float) -> tuple[int, int, int]:
    pos = t * (len(stops) - 1)
    i = min(int(pos), len(stops) - 2)
    f = pos - i
    return tuple(round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1], strict=True))


@dataclass(frozen=True)
class Mark:
    """One distractor before it is placed: its kind, font, words (legend entries, text lines or
    the scale bar's text), scale bar length and size in pixels."""

    kind: str
    font_name: str
    face: ImageFont.FreeTypeFont
    words: tuple[str, ...]
    bar: int
    size: tuple[int, int]

    @property
    def line_h(self) -> int:
        return self.face.getbbox("Ag")[3] + 2


def plan_mark(rng: random.Random, pw: int, ph: int) -> Mark:
    """Draw a distractor's kind, font and content for a ``pw`` x ``ph`` panel, and size it."""
    kind = rng.choice(["legend", "colour_bar", "scale_bar", "text", "arrows"])
    font_name = rng.choice(FONTS)
    face = font(font_name, max(8, round(min(pw, ph) * rng.uniform(0.025, 0.045))))
    line_h = face.getbbox("Ag")[3] + 2
    words: list[str] = []
    bar = 0
    if kind == "legend":
        words = rng.sample(WORDS, rng.randint(2, 4))
        size = (max(face.getbbox(e)[2] for e in words) + line_h + 8, line_h * len(words) + 6)
    elif kind == "colour_bar":
        size = (
            max(6, round(pw * rng.uniform(0.03, 0.05))) + face.getbbox("1.0")[2] + 4,
            round(ph * rng.uniform(0.4, 0.7)),
        )
    elif kind == "scale_bar":
        words = [rng.choice(SCALES)]
        bar = round(pw * rng.uniform(0.12, 0.3))
        size = (max(bar, face.getbbox(words[0])[2]), line_h + max(2, round(ph * 0.02)) + 2)
    elif kind == "text":
        words = rng.sample(WORDS, rng.randint(1, 3))
        size = (max(face.getbbox(t)[2] for t in words), line_h * len(words))
    else:
        size = (round(min(pw, ph) * 0.15), round(min(pw, ph) * 0.15))
    return Mark(kind, font_name, face, tuple(words), bar, size)


def place_mark(rng: random.Random, host: Box, size: tuple[int, int], forbidden: list[Box]) -> Box | None:
    """A box of ``size`` inside ``host`` that covers nothing in ``forbidden`` (six tries)."""
    x0, y0, x1, y1 = host
    w, h = size
    for _ in range(6):
        bx, by = rng.randint(x0 + 2, x1 - 2 - w), rng.randint(y0 + 2, y1 - 2 - h)
        box = (bx, by, bx + w, by + h)
        if not any(overlaps(box, f) for f in forbidden):
            return box
    return None


def draw_distractor(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, host: Box, forbidden: list[Box]
) -> str | None:
    """Draw one legend, colour bar, scale bar, text block or arrow set inside ``host`` where it
    covers nothing in ``forbidden`` (and add its box there); return the font used (None when
    nothing or no text was drawn)."""
    pw, ph = host[2] - host[0], host[3] - host[1]
    if pw < 48 or ph < 48:
        return None
    mark = plan_mark(rng, pw, ph)
    w, h = mark.size
    if w >= pw - 4 or h >= ph - 4:
        return None
    box = place_mark(rng, host, mark.size, forbidden)
    if box is None:
        return None
    forbidden.append(box)
    ink = contrast(canvas, box)
    if mark.kind == "arrows":
        _arrows(draw, rng, box)
        return None
    PAINTERS[mark.kind](draw, rng, mark, box, ink, (pw, ph))
    return mark.font_name


def _legend(draw: ImageDraw.ImageDraw, rng: random.Random, mark: Mark, box: Box, ink: Ink, panel: Size) -> None:
    bx, by, bx1, by1 = box
    line_h = mark.line_h
    if rng.random() < 0.5:
        draw.rectangle((bx, by, bx1 - 1, by1 - 1), fill=(255, 255, 255), outline=(0, 0, 0))
        ink = (0, 0, 0)
    for k, entry in enumerate(mark.words):
        ey = by + 3 + k * line_h
        colour = SWATCHES[k % len(SWATCHES)]
        if rng.random() < 0.5:
            draw.rectangle((bx + 3, ey + 2, bx + 3 + line_h - 6, ey + line_h - 4), fill=colour)
        else:
            draw.line((bx + 3, ey + line_h // 2, bx + line_h - 2, ey + line_h // 2), fill=colour, width=2)
        draw.text((bx + line_h + 4, ey), entry, font=mark.face, fill=ink)


def _colour_bar(draw: ImageDraw.ImageDraw, rng: random.Random, mark: Mark, box: Box, ink: Ink, panel: Size) -> None:
    bx, by, _, by1 = box
    h = by1 - by
    stops = rng.choice(COLOURMAPS)
    bar_w = max(6, round(panel[0] * 0.04))
    for row in range(h):
        draw.line((bx, by + row, bx + bar_w - 1, by + row), fill=_gradient(stops, 1 - row / max(1, h - 1)))
    draw.rectangle((bx, by, bx + bar_w - 1, by + h - 1), outline=ink)
    top = rng.choice(["1.0", "100", "5", "max"])
    draw.text((bx + bar_w + 2, by), top, font=mark.face, fill=ink)
    draw.text((bx + bar_w + 2, by + h - mark.line_h), "0", font=mark.face, fill=ink)


def _scale_bar(draw: ImageDraw.ImageDraw, rng: random.Random, mark: Mark, box: Box, ink: Ink, panel: Size) -> None:
    bx, by, bx1, by1 = box
    w, h, bar = bx1 - bx, by1 - by, mark.bar
    (text,) = mark.words
    thick = max(2, round(panel[1] * 0.02))
    draw.text((bx + (w - mark.face.getbbox(text)[2]) // 2, by), text, font=mark.face, fill=ink)
    draw.rectangle((bx + (w - bar) // 2, by + h - thick, bx + (w + bar) // 2 - 1, by + h - 1), fill=ink)


def _text(draw: ImageDraw.ImageDraw, rng: random.Random, mark: Mark, box: Box, ink: Ink, panel: Size) -> None:
    for k, line in enumerate(mark.words):
        draw.text((box[0], box[1] + k * mark.line_h), line, font=mark.face, fill=ink)


def _arrows(draw: ImageDraw.ImageDraw, rng: random.Random, box: Box) -> None:
    """One to three arrows of one colour through the box's centre."""
    bx, by, bx1, by1 = box
    w, h = bx1 - bx, by1 - by
    colour = rng.choice([(255, 255, 255), (255, 255, 0), (255, 0, 0), (0, 0, 0)])
    for _ in range(rng.randint(1, 3)):
        angle = rng.uniform(0, 2 * math.pi)
        length = w * rng.uniform(0.6, 1.0)
        cx, cy = bx + w / 2, by + h / 2
        tx, ty = cx + math.cos(angle) * length / 2, cy + math.sin(angle) * length / 2
        sx, sy = cx - math.cos(angle) * length / 2, cy - math.sin(angle) * length / 2
        draw.line((sx, sy, tx, ty), fill=colour, width=max(1, round(length / 12)))
        head = length / 3
        left = (tx - head * math.cos(angle - 0.45), ty - head * math.sin(angle - 0.45))
        right = (tx - head * math.cos(angle + 0.45), ty - head * math.sin(angle + 0.45))
        draw.polygon([(tx, ty), left, right], fill=colour)


PAINTERS = {"legend": _legend, "colour_bar": _colour_bar, "scale_bar": _scale_bar, "text": _text}


def draw_distractors(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, boxes: Sequence[Box],
    forbidden: list[list[Box]], prob: float,
) -> set[str]:  # fmt: skip
    """With probability ``prob`` per panel, one or two distractors inside it; the fonts used."""
    fonts = set()
    for i, host in enumerate(boxes):
        if rng.random() < prob:
            for _ in range(rng.choice([1, 1, 2])):
                used = draw_distractor(canvas, draw, rng, host, forbidden[i])
                if used:
                    fonts.add(used)
    return fonts
