"""Marks drawn inside panels that are not panels: legends, colour bars, scale bars, text, arrows.

Real panels are full of text and small boxed graphics that look like labels or insets; a detector
that never saw them during training takes them for panel labels or panels. These are drawn where
they cover no label or inset and are deliberately not annotated (only their fonts are recorded).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from PIL import Image, ImageDraw

from pipelines.panels.synthetic.draw import Box, contrast, overlaps
from pipelines.panels.synthetic.labels import FONTS, font

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


def draw_distractor(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, host: Box, forbidden: list[Box]
) -> str | None:
    """Draw one legend, colour bar, scale bar, text block or arrow set inside ``host`` where it
    covers nothing in ``forbidden``; return the font used (None when nothing or no text was
    drawn)."""
    x0, y0, x1, y1 = host
    pw, ph = x1 - x0, y1 - y0
    if pw < 48 or ph < 48:
        return None
    kind = rng.choice(["legend", "colour_bar", "scale_bar", "text", "arrows"])
    font_name = rng.choice(FONTS)
    face = font(font_name, max(8, round(min(pw, ph) * rng.uniform(0.025, 0.045))))
    line_h = face.getbbox("Ag")[3] + 2
    if kind == "legend":
        entries = rng.sample(WORDS, rng.randint(2, 4))
        w = max(face.getbbox(e)[2] for e in entries) + line_h + 8
        size = (w, line_h * len(entries) + 6)
    elif kind == "colour_bar":
        size = (
            max(6, round(pw * rng.uniform(0.03, 0.05))) + face.getbbox("1.0")[2] + 4,
            round(ph * rng.uniform(0.4, 0.7)),
        )
    elif kind == "scale_bar":
        text = rng.choice(SCALES)
        bar = round(pw * rng.uniform(0.12, 0.3))
        size = (max(bar, face.getbbox(text)[2]), line_h + max(2, round(ph * 0.02)) + 2)
    elif kind == "text":
        lines = rng.sample(WORDS, rng.randint(1, 3))
        size = (max(face.getbbox(t)[2] for t in lines), line_h * len(lines))
    else:
        size = (round(min(pw, ph) * 0.15), round(min(pw, ph) * 0.15))
    w, h = size
    if w >= pw - 4 or h >= ph - 4:
        return None
    for _ in range(6):
        bx, by = rng.randint(x0 + 2, x1 - 2 - w), rng.randint(y0 + 2, y1 - 2 - h)
        box = (bx, by, bx + w, by + h)
        if not any(overlaps(box, f) for f in forbidden):
            break
    else:
        return None
    forbidden.append(box)
    ink = contrast(canvas, box)
    if kind == "legend":
        if rng.random() < 0.5:
            draw.rectangle((bx, by, bx + w - 1, by + h - 1), fill=(255, 255, 255), outline=(0, 0, 0))
            ink = (0, 0, 0)
        for k, entry in enumerate(entries):
            ey = by + 3 + k * line_h
            colour = SWATCHES[k % len(SWATCHES)]
            if rng.random() < 0.5:
                draw.rectangle((bx + 3, ey + 2, bx + 3 + line_h - 6, ey + line_h - 4), fill=colour)
            else:
                draw.line((bx + 3, ey + line_h // 2, bx + line_h - 2, ey + line_h // 2), fill=colour, width=2)
            draw.text((bx + line_h + 4, ey), entry, font=face, fill=ink)
        return font_name
    if kind == "colour_bar":
        stops = rng.choice(COLOURMAPS)
        bar_w = max(6, round(pw * 0.04))
        for row in range(h):
            draw.line((bx, by + row, bx + bar_w - 1, by + row), fill=_gradient(stops, 1 - row / max(1, h - 1)))
        draw.rectangle((bx, by, bx + bar_w - 1, by + h - 1), outline=ink)
        top = rng.choice(["1.0", "100", "5", "max"])
        draw.text((bx + bar_w + 2, by), top, font=face, fill=ink)
        draw.text((bx + bar_w + 2, by + h - line_h), "0", font=face, fill=ink)
        return font_name
    if kind == "scale_bar":
        thick = max(2, round(ph * 0.02))
        draw.text((bx + (w - face.getbbox(text)[2]) // 2, by), text, font=face, fill=ink)
        draw.rectangle((bx + (w - bar) // 2, by + h - thick, bx + (w + bar) // 2 - 1, by + h - 1), fill=ink)
        return font_name
    if kind == "text":
        for k, line in enumerate(lines):
            draw.text((bx, by + k * line_h), line, font=face, fill=ink)
        return font_name
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
    return None


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
