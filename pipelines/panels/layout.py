"""The weight-free panel splitter (method ``xycut``): recursive XY-cut on gutter projections.

``split_panels(image)`` works on a grayscale copy whose longest side is at most ``WORK_SIDE``
(1024) pixels and maps the boxes back to the original pixels (x2/y2 exclusive).

* **Gutter colours.** White, then the figure's background colour when it is not white: the
  median grey of its outer frame (2 px), black or any other uniform colour (white is tried
  first because black-backed CT panels touching the figure's edge make a dark frame around
  white gutters). For a colour, a pixel is *ink* when it differs from it by more than
  ``INK_TOL`` grey levels. Between white and the background colour come *divider lines*: thin
  near-uniform lines of any colour that contrast with both sides (``divider_runs``, tolerance
  ``DIVIDER_TOL``). A region is cut by the first of these that splits it, and the pieces of a
  colour cut only ever by that colour (or dividers) again: a dark micrograph inside a
  white-gutter figure is never cut along its own empty black background. Black is not tried
  on a white figure.
* **Gutters.** A row (column) of a region is blank when at most ``BLANK_SHARE`` of its pixels
  are ink (near-uniform and close to the background); a gutter is a run of blank rows
  (columns) inside the region at least ``min_gutter`` = max(2, 0.4 % of the longest side) wide.
* **Cuts.** A region is first trimmed to its ink (uniform margins removed). The axis with the
  widest gutter is tried first, then the other; the region is cut at every gutter of that axis.
  A piece that would be a *sliver* (trimmed side under ``min_side`` = max(12 px, 6 % of the
  longest side, 16 original pixels) or area under 1 % of the figure) is merged back by
  dropping the narrower of the gutters beside it. Pieces are split again, breadth first, to
  ``MAX_DEPTH`` (8) levels and at most ``MAX_PANELS`` (64) panels.
* **Score** of a panel: the clarity of the weakest gutter that cut it out,
  min(1, gutter width / (4 x min_gutter)); 1.0 for a figure that was not cut.

The boxes then go through ``postprocess.finalize`` (clamping, suppression, single-panel rule,
reading order). A figure without ink (one colour) gives no panel; a figure without a gutter
gives one panel covering its content.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from pipelines.images.boxes import Panel, finalize, scale_boxes
from pipelines.images.decode import UnusableFigureError, is_loaded, normalize_mode, open_image

WORK_SIDE = 1024
DRAFT_SIDE = 2048  # a large JPEG is decoded at the smallest scale keeping both sides at least this
INK_TOL = 16
BLANK_SHARE = 0.003
DIVIDER_CONTRAST = 0.5
DIVIDER_NOISE = 0.01
DIVIDER_TOL = 30
MIN_GUTTER_SHARE = 0.004
MIN_SIDE_SHARE = 0.06
MIN_SIDE_PX = 12
MIN_SIDE_ORIGINAL_PX = 16
MIN_AREA_SHARE = 0.01
MAX_DEPTH = 8
MAX_PANELS = 64


@dataclass
class _Params:
    min_gutter: int
    min_side: float
    min_area: float


def work_copy(image: Image.Image, side: int = WORK_SIDE) -> Image.Image:
    """A grayscale copy whose longest side is at most ``side`` (box filter: thin gutters stay
    light)."""
    im = normalize_mode(image)
    gray = im.convert("L") if im.mode != "L" else im.copy()
    if max(gray.size) > side:
        gray.thumbnail((side, side), Image.Resampling.BOX)
    return gray


def _frame_colour(a: np.ndarray, width: int = 2) -> tuple[float, float]:
    """Median grey of a region's outer frame and the share of frame pixels near it."""
    frame = np.concatenate([a[:width].ravel(), a[-width:].ravel(), a[:, :width].ravel(), a[:, -width:].ravel()])
    colour = float(np.median(frame))
    return colour, float(np.mean(np.abs(frame - colour) <= INK_TOL))


def _blank(ink: np.ndarray, axis: int) -> np.ndarray:
    """Blank rows (axis=0) or columns (axis=1) of an ink mask."""
    counts = ink.view(np.uint8).sum(axis=1 - axis, dtype=np.int32)  # twice as fast as a bool sum
    allowance = max(1, math.floor(BLANK_SHARE * ink.shape[1 - axis]))
    return counts <= allowance


def trim_box(ink: np.ndarray, box: tuple[int, int, int, int]) -> tuple[int, int, int, int] | None:
    x1, y1, x2, y2 = box
    sub = ink[y1:y2, x1:x2]
    if sub.size == 0:
        return None
    rows = np.flatnonzero(~_blank(sub, 0))
    cols = np.flatnonzero(~_blank(sub, 1))
    if rows.size == 0 or cols.size == 0:
        return None
    return x1 + int(cols[0]), y1 + int(rows[0]), x1 + int(cols[-1]) + 1, y1 + int(rows[-1]) + 1


def _runs(blank: np.ndarray, offset: int, min_gutter: int) -> list[tuple[int, int]]:
    """Runs of True not touching either end, at least ``min_gutter`` long, as absolute
    (start, end)."""
    padded = np.concatenate([[False], blank, [False]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    runs = []
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        if start > 0 and end < blank.size and end - start >= min_gutter:
            runs.append((offset + int(start), offset + int(end)))
    return runs


def gutter_runs(ink: np.ndarray, box, axis: int, min_gutter: int) -> list[tuple[int, int]]:
    """Runs of blank rows/columns inside a trimmed box, as absolute (start, end)."""
    x1, y1, x2, y2 = box
    return _runs(_blank(ink[y1:y2, x1:x2], axis), y1 if axis == 0 else x1, min_gutter)


def divider_runs(gray: np.ndarray, box, axis: int, max_width: float) -> list[tuple[int, int, float]]:
    """Divider lines: runs of near-uniform rows/columns of one colour (at most ``DIVIDER_NOISE``
    of their pixels off their mean by more than ``DIVIDER_TOL``) that contrast with the line just
    outside the run on both sides (at least ``DIVIDER_CONTRAST`` of its pixels off the run's
    colour by more than ``DIVIDER_TOL``), narrower than ``max_width`` (a flat panel is not a
    divider). Returns absolute (start, end, colour)."""
    x1, y1, x2, y2 = box
    sub = gray[y1:y2, x1:x2]
    lines = sub if axis == 0 else sub.T
    mean = lines.mean(axis=1, keepdims=True)
    # |grey - mean| > DIVIDER_TOL for integer greys, without a float copy of the region: above
    # floor(mean + tol) or below ceil(mean - tol)
    high = np.floor(mean + DIVIDER_TOL).astype(lines.dtype)
    low = np.ceil(mean - DIVIDER_TOL).astype(lines.dtype)
    off = np.count_nonzero((lines > high) | (lines < low), axis=1)
    uniform = off <= max(1, math.floor(DIVIDER_NOISE * lines.shape[1]))
    colour = mean[:, 0]
    # a run of uniform lines is one divider only while its colour holds
    jump = np.concatenate([[True], np.abs(np.diff(colour)) > DIVIDER_TOL])
    out = []
    offset = y1 if axis == 0 else x1
    k = 0
    n = len(uniform)
    while k < n:
        if not uniform[k]:
            k += 1
            continue
        end = k + 1
        while end < n and uniform[end] and not jump[end]:
            end += 1
        if k > 0 and end < n and end - k < max_width:
            c = colour[k:end].mean()
            before = np.mean(np.abs(lines[k - 1] - c) > DIVIDER_TOL)
            after = np.mean(np.abs(lines[end] - c) > DIVIDER_TOL)
            if min(before, after) >= DIVIDER_CONTRAST:
                out.append((offset + k, offset + end, float(c)))
        k = end
    return out


def _pieces(ink, box, axis, gutters, params: _Params):
    """Cut ``box`` at ``gutters`` along ``axis``, merging slivers; returns [(trimmed box,
    clarity of the weakest gutter beside it)] or [] when no cut survives."""
    gutters = list(gutters)
    while gutters:
        lo, hi = (box[1], box[3]) if axis == 0 else (box[0], box[2])
        bounds = [lo] + [g for gut in gutters for g in gut] + [hi]
        pieces = []
        sliver = None
        for k in range(len(gutters) + 1):
            a, b = bounds[2 * k], bounds[2 * k + 1]
            cut = (box[0], a, box[2], b) if axis == 0 else (a, box[1], b, box[3])
            trimmed = trim_box(ink, cut)
            too_small = trimmed is None or (
                min(trimmed[2] - trimmed[0], trimmed[3] - trimmed[1]) < params.min_side
                or (trimmed[2] - trimmed[0]) * (trimmed[3] - trimmed[1]) < params.min_area
            )
            if too_small and sliver is None:
                sliver = k
            pieces.append(trimmed)
        if sliver is None:
            out = []
            for k, trimmed in enumerate(pieces):
                beside = [gutters[i] for i in (k - 1, k) if 0 <= i < len(gutters)]
                width = min(g[1] - g[0] for g in beside)
                out.append((trimmed, min(1.0, width / (4 * params.min_gutter))))
            return out
        beside = [i for i in (sliver - 1, sliver) if 0 <= i < len(gutters)]
        drop = min(beside, key=lambda i: gutters[i][1] - gutters[i][0])
        del gutters[drop]
    return []


def _split_region(gray, masks, box, params: _Params):
    """The pieces of ``box`` by the first of ``masks`` that splits it (a gutter colour's ink
    mask, or None: divider lines) and the index of the one used; or ([], None)."""
    for index, ink in enumerate(masks):
        inner = trim_box(ink, box) if ink is not None else box
        if inner is None:
            continue
        candidates = []
        for axis in (0, 1):
            trim_mask = ink
            if ink is not None:
                gutters = gutter_runs(ink, inner, axis, params.min_gutter)
            else:
                # dividers of the widest one's colour; pieces are trimmed of that colour
                runs = divider_runs(gray, inner, axis, params.min_side)
                if not runs:
                    continue
                ref = max(runs, key=lambda r: r[1] - r[0])[2]
                gutters = [(a, b) for a, b, c in runs if abs(c - ref) <= DIVIDER_TOL]
                trim_mask = np.abs(gray - ref) > DIVIDER_TOL
            if gutters:
                width = max(g[1] - g[0] for g in gutters)
                candidates.append((width, -axis, axis, gutters, trim_mask))
        for *_, axis, gutters, trim_mask in sorted(candidates, key=lambda c: c[:2], reverse=True):
            pieces = _pieces(trim_mask, inner, axis, gutters, params)
            if len(pieces) >= 2:
                return pieces, index
    return [], None


@dataclass
class Sheet:
    """A figure as the cutting works on it: the grey work copy, the gutter colours' ink masks in
    the order they are tried (``None``: divider lines), the size rules, and the scale back to
    the original pixels."""

    gray: np.ndarray
    colour_masks: list[np.ndarray]
    masks: list[np.ndarray | None]
    params: _Params
    width: int
    height: int
    sx: float
    sy: float

    def to_original(self, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        x1, y1, x2, y2 = box
        return (
            math.floor(x1 * self.sx),
            math.floor(y1 * self.sy),
            min(self.width, math.ceil(x2 * self.sx)),
            min(self.height, math.ceil(y2 * self.sy)),
        )


def make_sheet(image: Image.Image) -> Sheet:
    """The work copy of ``image`` and its gutter masks (module doc)."""
    width, height = image.size
    gray_im = work_copy(image)
    gray = np.asarray(gray_im, dtype=np.int16)
    w, h = gray_im.size
    sx, sy = width / w, height / h
    bg, _ = _frame_colour(gray)
    colours = [255.0, bg] if abs(255.0 - bg) > INK_TOL else [bg]
    colour_masks = [np.abs(gray - c) > INK_TOL for c in colours]
    longest = max(w, h)
    params = _Params(
        min_gutter=max(2, round(MIN_GUTTER_SHARE * longest)),
        min_side=max(MIN_SIDE_PX, MIN_SIDE_SHARE * longest, MIN_SIDE_ORIGINAL_PX / max(sx, sy)),
        min_area=MIN_AREA_SHARE * w * h,
    )
    masks = [colour_masks[0], None, *colour_masks[1:]]  # divider lines after the first colour
    return Sheet(gray, colour_masks, masks, params, width, height, sx, sy)


def split_panels(image: Image.Image) -> list[Panel]:
    """The panels of a figure by recursive XY-cut on uniform gutters (module doc), in reading
    order, boxes in the original image's pixels.

    An image only opened (``Image.open(path)``) is decoded by the one decoder's rule
    (:func:`pipelines.images.decode.open_image`): a large JPEG reduced, and a file that is truncated,
    corrupt or over the pixel cap raises ``UnusableFigureError`` (a ``ValueError``) with the reason
    every stage records for it, before any pixel is decoded where the size alone refuses it."""
    if not is_loaded(image):
        figure = open_image(image, draft_side=DRAFT_SIDE)
        if figure.reason is not None:
            raise UnusableFigureError(figure.reason)
        panels = split_panels(figure.image)
        boxes = scale_boxes([p.box for p in panels], figure.image.size, figure.width, figure.height)
        return [replace(p, box=b) for p, b in zip(panels, boxes, strict=True)]
    sheet = make_sheet(image)
    gray, colour_masks, all_masks, params = sheet.gray, sheet.colour_masks, sheet.masks, sheet.params
    h, w = gray.shape
    root = trim_box(all_masks[0], (0, 0, w, h))
    if root is None or trim_box(colour_masks[-1], (0, 0, w, h)) is None:
        return []  # one colour
    done: list[tuple[tuple[int, int, int, int], float]] = []
    # a region is split again only with the gutter colour that cut it out (or dividers)
    queue = deque([(root, 1.0, 0, all_masks)])
    while queue:
        box, score, depth, masks = queue.popleft()
        pieces, used = _split_region(gray, masks, box, params) if depth < MAX_DEPTH else ([], None)
        if len(pieces) < 2 or len(done) + len(queue) + len(pieces) > MAX_PANELS:
            done.append((box, score))
            continue
        if masks[used] is not None:
            child_masks = [masks[used], None]
        else:  # a dark frame colour is not searched inside panels cut out by dividers
            child_masks = [m for m in masks if m is None or m is colour_masks[0]]
        for piece, clarity in pieces:
            queue.append((piece, min(score, clarity), depth + 1, child_masks))
    panels = [Panel(box=sheet.to_original(box), score=round(score, 4)) for box, score in done]
    return finalize(panels, sheet.width, sheet.height)
