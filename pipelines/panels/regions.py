"""Regions of a figure: cutting a box at every gutter of one axis, and telling a chart's own
parts (tick-label strips, axis titles, legends, colour bars, lone titles) from panels.

How figures are made decides the rules. A panel is a block of *graphic* content (a plot frame,
a photograph, a drawing: ink whose connected shapes are larger than text) with the text that
serves it around it. Text-only strips (tick labels, axis titles, legends' words, titles, row
headers) and small graphic pieces beside a much larger one (a legend's swatches, a colour bar)
are parts of the panel next to them, never panels by themselves.

* ``Sheet`` (from ``layout.make_sheet``) holds the work copy and the gutter masks;
  ``Structure`` (``ink_structure``) adds the connected shapes of the ink, the figure's text
  height (median height of glyph-sized shapes) and, from it, the size from which a shape is
  graphic (``GRAPHIC_TEXT_HEIGHTS`` text heights on both sides).
* ``cut(sheet, box, axis, mask)``: ``box`` cut at every gutter of ``mask`` (a gutter colour's
  ink mask, or None for divider lines) along ``axis`` (0: horizontal gutters, pieces stacked;
  1: vertical gutters, pieces side by side), each piece trimmed to its ink; no sliver merging:
  a label row or a tick strip is a piece of its own here.
* ``Structure.is_major(piece, siblings)``: the piece holds a graphic shape that is not a colour
  bar (``is_colour_bar``) and is not small beside its largest sibling (``MINOR_AREA`` of its
  area, or a strip thinner than ``MINOR_SIDE`` of the sibling's side across the cut).
* ``is_colour_bar(gray, box)``: a colour bar is a long strip whose shade runs smoothly along its
  length and stays the same across it (a scale, not a picture). With its tick labels and title
  it can be as wide as a small panel beside it, so its width alone does not tell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.images.boxes import Box
from pipelines.images.components import components
from pipelines.panels.layout import Sheet, divider_runs, gutter_runs, trim_box

GRAPHIC_TEXT_HEIGHTS = 2.5
MINOR_AREA = 0.12
MINOR_SIDE = 0.25
DEFAULT_TEXT_HEIGHT = 10.0
BAR_ASPECT = 4  # a colour bar is at least this many times as long as it is wide
BAR_RANGE = 64  # grey levels its scale spans along its length, at least
BAR_ACROSS = 12  # grey levels (median standard deviation) it varies across, at most
BAR_WAVES = 3  # its shade's total variation along its length, in multiples of its range, at most


def cut(sheet: Sheet, box: Box, axis: int, mask: np.ndarray | None) -> list[Box]:
    """``box`` cut at every gutter along ``axis`` (module doc); [] when it has none."""
    if mask is None:
        runs = divider_runs(sheet.gray, box, axis, sheet.params.min_side)
        if not runs:
            return []
        ref = max(runs, key=lambda r: r[1] - r[0])[2]
        gutters = [(a, b) for a, b, c in runs if abs(c - ref) <= 30]
        trim_mask = np.abs(sheet.gray - ref) > 30
    else:
        inner = trim_box(mask, box)
        if inner is None:
            return []
        box = inner
        gutters = gutter_runs(mask, box, axis, sheet.params.min_gutter)
        trim_mask = mask
    if not gutters:
        return []
    lo, hi = (box[1], box[3]) if axis == 0 else (box[0], box[2])
    bounds = [lo] + [g for gut in gutters for g in gut] + [hi]
    pieces = []
    for k in range(len(gutters) + 1):
        a, b = bounds[2 * k], bounds[2 * k + 1]
        piece = (box[0], a, box[2], b) if axis == 0 else (a, box[1], b, box[3])
        trimmed = trim_box(trim_mask, piece)
        if trimmed is not None:
            pieces.append(trimmed)
    return pieces if len(pieces) >= 2 else []


def union(boxes) -> Box:
    boxes = list(boxes)
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def box_area(box: Box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


@dataclass
class Structure:
    """The ink's connected shapes of a sheet, for telling graphic content from text."""

    sheet: Sheet
    shapes: np.ndarray  # (n, 4) boxes of the ink's connected shapes, work pixels
    text_height: float
    graphic: np.ndarray  # boxes of the shapes that are graphic (both sides >= graphic_side)

    @property
    def graphic_side(self) -> float:
        return GRAPHIC_TEXT_HEIGHTS * self.text_height

    def graphic_in(self, box: Box) -> bool:
        """Whether a graphic shape fills at least ``graphic_side`` on both sides inside ``box``."""
        if not len(self.graphic):
            return False
        g = self.graphic
        iw = np.minimum(g[:, 2], box[2]) - np.maximum(g[:, 0], box[0])
        ih = np.minimum(g[:, 3], box[3]) - np.maximum(g[:, 1], box[1])
        return bool(np.any((iw >= self.graphic_side) & (ih >= self.graphic_side)))

    def is_major(self, piece: Box, siblings: list[Box], axis: int) -> bool:
        """A piece that is a panel (or holds panels) rather than a part of the chart beside it."""
        if not self.graphic_in(piece):
            return False
        inside = self.graphic[
            (self.graphic[:, 0] >= piece[0])
            & (self.graphic[:, 1] >= piece[1])
            & (self.graphic[:, 2] <= piece[2])
            & (self.graphic[:, 3] <= piece[3])
        ]
        if len(inside) and all(is_colour_bar(self.sheet.gray, tuple(int(v) for v in g)) for g in inside):
            return False  # a colour bar with its ticks and title serves the picture beside it
        largest = max(siblings, key=box_area)
        if box_area(piece) < MINOR_AREA * box_area(largest):
            return False
        # across the cut: a strip much thinner than the largest piece is a colour bar or a
        # legend column, not a panel
        side = (piece[3] - piece[1]) if axis == 0 else (piece[2] - piece[0])
        big = (largest[3] - largest[1]) if axis == 0 else (largest[2] - largest[0])
        return side >= MINOR_SIDE * big


def is_colour_bar(gray: np.ndarray, box: Box) -> bool:
    """Whether the shape in ``box`` of the grey work copy is a colour bar (module doc): at least
    ``BAR_ASPECT`` times as long as wide; inside its frame, its shade spans ``BAR_RANGE`` grey
    levels along its length, varies by at most ``BAR_ACROSS`` across it, and runs there without
    waves (a gel lane's bands, a kymograph's tracks go up and down many times; a rainbow scale's
    brightness rises and falls once)."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    if max(w, h) < BAR_ASPECT * min(w, h):
        return False
    # its frame left out: a fifth of its width on every side
    m = max(1, min(w, h) // 5)
    inner = gray[y1 + m : y2 - m, x1 + m : x2 - m].astype(np.float32)
    if min(inner.shape) < 2:
        return False
    across = 1 if h > w else 0  # a vertical bar's shade is constant along each row
    profile = inner.mean(axis=across)
    span = float(profile.max() - profile.min())
    if span < BAR_RANGE or float(np.median(inner.std(axis=across))) > BAR_ACROSS:
        return False
    return float(np.abs(np.diff(profile)).sum()) <= BAR_WAVES * span


def ink_structure(sheet: Sheet) -> Structure:
    """The connected shapes of the sheet's first gutter colour's ink (module doc)."""
    mask = sheet.colour_masks[0]
    _, shapes, _ = components(mask)
    if not len(shapes):
        return Structure(sheet, shapes, DEFAULT_TEXT_HEIGHT, shapes)
    h = shapes[:, 3] - shapes[:, 1]
    w = shapes[:, 2] - shapes[:, 0]
    longest = max(mask.shape)
    glyph = (h >= 4) & (h <= 0.05 * longest) & (w <= 2 * h) & (w >= 0.2 * h)
    text_height = float(np.median(h[glyph])) if glyph.sum() >= 5 else DEFAULT_TEXT_HEIGHT
    side = GRAPHIC_TEXT_HEIGHTS * text_height
    graphic = shapes[(h >= side) & (w >= side)]
    return Structure(sheet, shapes, text_height, graphic)
