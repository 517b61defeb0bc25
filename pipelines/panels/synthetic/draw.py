"""Painting what is annotated: the panels, their labels and their insets.

Each function paints onto the figure and returns the exact box of what it painted, so the ground
truth is the drawing itself, not an estimate of it. ``forbidden`` (per panel) collects the boxes
already painted inside a panel (a label, an inset) so that later marks (insets, distractors)
never cover them. Insets are panels: a zoomed part of the host with its zoom box and connector
lines, annotated with the host as parent, because the pipeline's post-processing keeps a panel
contained in another and the detector must see them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from PIL import Image, ImageDraw

from pipelines.panels.synthetic.labels import LabelPlan
from pipelines.panels.synthetic.layout import Cell

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive) in the figure's pixels


def brightness(image: Image.Image, box: Box) -> float:
    """Mean grey level of ``image`` under ``box`` (at least one pixel)."""
    x0, y0, x1, y1 = box
    region = image.crop((max(0, x0), max(0, y0), max(x0 + 1, x1), max(y0 + 1, y1))).convert("L")
    return sum(i * c for i, c in enumerate(region.histogram())) / max(1, region.width * region.height)


def contrast(image: Image.Image, box: Box) -> tuple[int, int, int]:
    """Black ink on a light background, white on a dark one."""
    return (0, 0, 0) if brightness(image, box) > 110 else (255, 255, 255)


def overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def paste_panels(
    canvas: Image.Image, rng: random.Random, cells: Sequence[Cell], images: Sequence[Image.Image], plan: LabelPlan
) -> list[Box]:
    """Letterbox each source in its cell (less the band its outside label takes), aligned at the
    start or centred as drawn once for the figure; returns each panel's box."""
    h_align, v_align = rng.choice(["start", "center"]), rng.choice(["start", "center"])
    boxes = []
    for (cx0, cy0, cx1, cy1), image in zip(cells, images, strict=True):
        ax0 = cx0 + (plan.band if plan.placement == "outside_left" else 0)
        ay0 = cy0 + (plan.band if plan.placement == "outside_above" else 0)
        aw, ah = max(1, cx1 - ax0), max(1, cy1 - ay0)
        scale = min(aw / image.width, ah / image.height)
        pw, ph = max(1, min(aw, round(image.width * scale))), max(1, min(ah, round(image.height * scale)))
        px0 = ax0 + ((aw - pw) // 2 if h_align == "center" else 0)
        py0 = ay0 + ((ah - ph) // 2 if v_align == "center" else 0)
        canvas.paste(image.resize((pw, ph), Image.Resampling.BICUBIC, reducing_gap=2.0), (px0, py0))
        boxes.append((px0, py0, px0 + pw, py0 + ph))
    return boxes


def draw_labels(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, plan: LabelPlan, boxes: Sequence[Box],
    forbidden: list[list[Box]],
) -> list[dict]:  # fmt: skip
    """Draw each panel's label where ``plan`` places it; a label that does not fit its panel or
    the figure is left out. Returns one record per drawn label: its glyph ``box``, its ``panel``
    index, ``label_text`` (as printed), ``label`` (without punctuation) and ``style``."""
    if not plan.labelled:
        return []
    width, height = canvas.size
    font, placement, box_style = plan.font, plan.placement, plan.box_style
    labels = []
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        text, core = plan.texts[i]
        gl, gt, gr, gb = plan.glyphs[i]
        tw, th = gr - gl, gb - gt
        margin = max(1, round(rng.uniform(0.01, 0.04) * min(x1 - x0, y1 - y0)))
        padding = max(1, round(0.2 * th)) if box_style != "plain" else 0
        inset_by = margin + padding
        if placement == "outside_above":
            gx = x0 + rng.randint(0, max(0, min(3, x1 - x0 - tw)))
            gy = y0 - plan.gap - max(b[3] for b in plan.glyphs) + gt
        elif placement == "outside_left":
            gx, gy = x0 - plan.gap - tw, y0 + min(margin, max(0, y1 - y0 - th))
        else:
            if tw + 2 * inset_by > x1 - x0 or th + 2 * inset_by > y1 - y0:
                continue  # the panel is too small for this label
            gx = x0 + inset_by if placement in ("inside_tl", "inside_bl") else x1 - inset_by - tw
            gy = y0 + inset_by if placement in ("inside_tl", "inside_tr") else y1 - inset_by - th
        glyph_box = (gx, gy, gx + tw, gy + th)
        if gx < 0 or gy < 0 or gx + tw > width or gy + th > height:
            continue
        if box_style == "plain":
            colour = contrast(canvas, glyph_box)
        else:
            fill, colour = ((255, 255, 255), (0, 0, 0)) if box_style == "white_box" else ((0, 0, 0), (255, 255, 255))
            draw.rectangle((gx - padding, gy - padding, gx + tw + padding - 1, gy + th + padding - 1), fill=fill)
        draw.text((gx - gl, gy - gt), text, font=font, fill=colour)
        forbidden[i].append((gx - padding - 2, gy - padding - 2, gx + tw + padding + 2, gy + th + padding + 2))
        labels.append({"box": glyph_box, "panel": i, "label_text": text, "label": core, "style": box_style})
    return labels


INSET_COLOURS = [(255, 255, 255), (255, 255, 0), (255, 0, 0), (0, 0, 0), (0, 200, 255)]
CORNERS = ("tl", "tr", "bl", "br")
OPPOSITE = {"tl": "br", "tr": "bl", "bl": "tr", "br": "tl"}


def draw_inset(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, host: Box, image: Image.Image, placement: str
) -> Box | None:
    """Draw a zoomed part of the host panel in one of its corners (never the label's corner or
    the one opposite it), with the zoom box and two connector lines; return the inset's box
    (border included) or None when the host is too small."""
    x0, y0, x1, y1 = host
    pw, ph = x1 - x0, y1 - y0
    if pw < 64 or ph < 64:
        return None
    label_corner = {"inside_tl": "tl", "inside_tr": "tr", "inside_bl": "bl", "inside_br": "br"}.get(placement)
    corner = rng.choice([c for c in CORNERS if c != label_corner and OPPOSITE[c] != label_corner] or ["br"])
    iw, ih = round(pw * rng.uniform(0.3, 0.42)), round(ph * rng.uniform(0.3, 0.42))
    zoom = rng.uniform(2.0, 3.5)
    zw, zh = max(4, round(iw / zoom)), max(4, round(ih / zoom))
    m = max(2, round(0.03 * min(pw, ph)))
    ix0 = x0 + m if corner[1] == "l" else x1 - m - iw
    iy0 = y0 + m if corner[0] == "t" else y1 - m - ih
    # the zoomed region lies in the opposite quadrant of the host
    far = OPPOSITE[corner]
    xs = (x0 + m, x0 + pw // 2 - zw) if far[1] == "l" else (x0 + pw // 2, x1 - m - zw)
    ys = (y0 + m, y0 + ph // 2 - zh) if far[0] == "t" else (y0 + ph // 2, y1 - m - zh)
    if xs[1] < xs[0] or ys[1] < ys[0]:
        return None
    zx0, zy0 = rng.randint(*xs), rng.randint(*ys)
    border = max(1, round(0.008 * min(pw, ph)))
    colour = rng.choice(INSET_COLOURS)
    # crop the region from the source at its own resolution
    fx, fy = image.width / pw, image.height / ph
    crop = image.crop(
        (round((zx0 - x0) * fx), round((zy0 - y0) * fy), round((zx0 + zw - x0) * fx), round((zy0 + zh - y0) * fy))
    )
    inner = (max(1, iw - 2 * border), max(1, ih - 2 * border))
    draw.rectangle((zx0, zy0, zx0 + zw - 1, zy0 + zh - 1), outline=colour, width=border)
    pairs = ("tl", "br") if corner in ("tr", "bl") else ("tr", "bl")
    for c in pairs:
        zx = zx0 if c[1] == "l" else zx0 + zw - 1
        zy = zy0 if c[0] == "t" else zy0 + zh - 1
        ix = ix0 if c[1] == "l" else ix0 + iw - 1
        iy = iy0 if c[0] == "t" else iy0 + ih - 1
        draw.line((zx, zy, ix, iy), fill=colour, width=max(1, border - 1 + rng.randint(0, 1)))
    draw.rectangle((ix0, iy0, ix0 + iw - 1, iy0 + ih - 1), fill=colour)
    canvas.paste(crop.resize(inner, Image.Resampling.BICUBIC), (ix0 + border, iy0 + border))
    return (ix0, iy0, ix0 + iw, iy0 + ih)
