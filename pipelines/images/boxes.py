"""Post-processing shared by every panel method (``xycut``, ``detr``, ``consensus``).

``finalize(panels, width, height)`` applies, in this order:

1. **clamp** every box to the figure (``0 <= x1 < x2 <= width``, same for y);
2. **drop** boxes with non-positive area (before and after clamping);
3. **containment-aware suppression** (``suppress``): boxes are visited by score, then area, both
   descending; a box is dropped when a box already kept is a *near-duplicate* of it, i.e.

   * IoU >= ``DUPLICATE_IOU`` (0.5), or
   * the intersection covers >= ``DUPLICATE_IOS`` (0.8) of the *smaller* box **and** the smaller
     box has >= ``DUPLICATE_AREA_RATIO`` (0.5) of the larger one's area.

   So an inset (a box inside a panel but less than half its area) survives; a box nested in a
   box of about its own size does not;
4. **single-panel rule** (``single_panel``): when one box covers >= ``SINGLE_PANEL_COVER`` (0.85)
   of the content area (the bounding box of all boxes), the figure is single-panel and only that
   box is returned;
5. **labels** (``attach_labels``): each printed-label box given by a method is attached to the
   panel whose top-left corner it sits in or next to (see ``attach_labels``);
6. **reading order** (``reading_order``): rows then columns, by recursive XY-cut.

Also: ``iou``, ``match_panels`` (Hungarian matching by IoU) and ``consensus`` (XY-cut and DETR
agreeing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in original pixels; x2 and y2 exclusive


@dataclass(frozen=True)
class Panel:
    """One panel of a figure. ``label`` is the printed panel label when known ("A", "b", "2",
    "ii", without brackets or punctuation), else None."""

    box: Box
    score: float = 1.0
    label: str | None = None

    @property
    def width(self) -> int:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> int:
        return self.box[3] - self.box[1]

    @property
    def area(self) -> int:
        return max(0, self.width) * max(0, self.height)


DUPLICATE_IOU = 0.5
DUPLICATE_IOS = 0.8
DUPLICATE_AREA_RATIO = 0.5
SINGLE_PANEL_COVER = 0.85
ROW_OVERLAP = 0.5  # share of the shorter height two panels must share to be on one row
CUT_TOLERANCE = 0.1  # a box may overlap the band before it by this share of its extent and still be cut off

LabelBox = tuple[Box, str]


def area(box: Box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def intersection(a: Box, b: Box) -> int:
    return max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (x2/y2 exclusive); 0.0 when either is empty."""
    inter = intersection(a, b)
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def within(box: Box, outer: Box) -> bool:
    """Whether ``box`` is a non-empty box lying within ``outer``."""
    return outer[0] <= box[0] < box[2] <= outer[2] and outer[1] <= box[1] < box[3] <= outer[3]


def ios(a: Box, b: Box) -> float:
    """Intersection over the smaller box's area: 1.0 when one box lies inside the other."""
    smaller = min(area(a), area(b))
    return intersection(a, b) / smaller if smaller > 0 else 0.0


def clamp(boxes: Iterable[Box], width: int, height: int) -> list[Box]:
    """Every box cut to the figure ``[0, width) x [0, height)``, coordinates as ints. Order and
    count are kept; a box entirely outside comes back with zero (or negative) area."""
    out = []
    for x1, y1, x2, y2 in boxes:
        out.append(
            (
                int(min(max(x1, 0), width)),
                int(min(max(y1, 0), height)),
                int(min(max(x2, 0), width)),
                int(min(max(y2, 0), height)),
            )
        )
    return out


def is_duplicate(a: Box, b: Box) -> bool:
    """The suppression rule of step 3 of the module doc."""
    if iou(a, b) >= DUPLICATE_IOU:
        return True
    small, large = sorted((area(a), area(b)))
    return large > 0 and ios(a, b) >= DUPLICATE_IOS and small / large >= DUPLICATE_AREA_RATIO


def suppress(panels: Sequence[Panel]) -> list[Panel]:
    """Containment-aware suppression: keeps the best of each group of near-duplicates, keeps
    insets. Returns the kept panels in input order."""
    order = sorted(range(len(panels)), key=lambda i: (-panels[i].score, -panels[i].area, i))
    kept: list[int] = []
    for i in order:
        if not any(is_duplicate(panels[i].box, panels[k].box) for k in kept):
            kept.append(i)
    return [panels[i] for i in sorted(kept)]


def content_box(boxes: Sequence[Box]) -> Box:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def single_panel(panels: Sequence[Panel], cover: float = SINGLE_PANEL_COVER) -> list[Panel]:
    """If one panel covers >= ``cover`` of the content area (bounding box of all panels), the
    figure is single-panel: only that panel (the largest) is returned; else the panels as given."""
    if len(panels) < 2:
        return list(panels)
    content = area(content_box([p.box for p in panels]))
    biggest = max(panels, key=lambda p: (p.area, p.score))
    if content > 0 and biggest.area / content >= cover:
        return [biggest]
    return list(panels)


def reading_order(panels: Sequence[Panel]) -> list[Panel]:
    """Rows top-down, panels left-right within a row (``reading_order_indices``)."""
    return [panels[i] for i in reading_order_indices([p.box for p in panels])]


def reading_order_indices(boxes: Sequence[Box]) -> list[int]:
    """The indices of ``boxes`` in reading order, rows first: a recursive XY-cut. The boxes are
    cut into bands of rows where no box crosses between them (``_bands``), read top-down; a band
    that cannot be cut into rows is cut into columns, read left-right; each piece is read the same
    way again. So a tall panel beside a grid is read first, then the grid row by row, instead of
    merging the grid's rows through the tall panel. Boxes that no cut separates (overlapping
    detector boxes) are read by ``_grown_rows``."""
    return _xy_cut(boxes, list(range(len(boxes))), 1)


def column_order_indices(boxes: Sequence[Box]) -> list[int]:
    """The indices of ``boxes`` read down the columns first (the same XY-cut on the transposed
    boxes): the order of labels printed down the columns of a grid."""
    return reading_order_indices([(y1, x1, y2, x2) for x1, y1, x2, y2 in boxes])


def _bands(boxes: Sequence[Box], members: list[int], axis: int) -> list[list[int]]:
    """``members`` grouped into bands along ``axis`` (1: rows, 0: columns) that no box crosses:
    a box joins the band its interval overlaps by more than ``CUT_TOLERANCE`` of its own extent
    (so detector boxes that overlap by a few pixels still fall in separate rows)."""
    bands: list[list[int]] = []
    end = 0
    for i in sorted(members, key=lambda i: (boxes[i][axis], boxes[i][axis + 2])):
        lo, hi = boxes[i][axis], boxes[i][axis + 2]
        if bands and end - lo > CUT_TOLERANCE * (hi - lo):
            bands[-1].append(i)
            end = max(end, hi)
        else:
            bands.append([i])
            end = hi
    return bands


def _xy_cut(boxes: Sequence[Box], members: list[int], axis: int) -> list[int]:
    """Cut along ``axis`` where possible; else along the other axis, but only where that is
    needed: neighbouring pieces that together can be cut along ``axis`` stay together (the
    columns of a grid beside a tall panel are one piece, read along ``axis`` in its turn)."""
    if len(members) <= 1:
        return members
    bands = _bands(boxes, members, axis)
    if len(bands) > 1:
        return [i for band in bands for i in _xy_cut(boxes, band, axis)]
    pieces: list[list[int]] = []
    for band in _bands(boxes, members, 1 - axis):
        if pieces and len(_bands(boxes, pieces[-1] + band, axis)) > 1:
            pieces[-1] = pieces[-1] + band
        else:
            pieces.append(band)
    if len(pieces) > 1:
        return [i for piece in pieces for i in _xy_cut(boxes, piece, axis)]
    return _grown_rows(boxes, members) if axis == 1 else _grown_columns(boxes, members)


def _grown_columns(boxes: Sequence[Box], members: list[int]) -> list[int]:
    transposed = {i: (boxes[i][1], boxes[i][0], boxes[i][3], boxes[i][2]) for i in members}
    return _grown_rows(transposed, members)


def _grown_rows(boxes: Sequence[Box] | dict[int, Box], members: list[int]) -> list[int]:
    """Rows of boxes no cut separates: taken by their top edge, a box joins the current row when
    it shares >= ``ROW_OVERLAP`` of the shorter of its height and the row's height (the row's span
    grows with its members); otherwise it starts a row."""
    rows: list[list[int]] = []
    spans: list[list[int]] = []
    for i in sorted(members, key=lambda i: (boxes[i][1], boxes[i][0])):
        y1, y2 = boxes[i][1], boxes[i][3]
        for row, span in zip(rows, spans, strict=True):
            shared = min(y2, span[1]) - max(y1, span[0])
            if shared >= ROW_OVERLAP * min(y2 - y1, span[1] - span[0]) and shared > 0:
                row.append(i)
                span[0], span[1] = min(span[0], y1), max(span[1], y2)
                break
        else:
            rows.append([i])
            spans.append([y1, y2])
    order = sorted(range(len(rows)), key=lambda r: spans[r][0])
    return [i for r in order for i in sorted(rows[r], key=lambda i: (boxes[i][0], boxes[i][1]))]


def attach_labels(panels: Sequence[Panel], labels: Iterable[LabelBox]) -> list[Panel]:
    """Give each panel the printed label whose box sits in or next to its top-left corner.

    A label fits a panel when the label box's centre lies inside the panel box grown by
    ``m = max(8, 0.1 * longest side)`` pixels on its left and top, and within the first 40 % of
    that grown box's width and height. Among fitting pairs the closest (label centre to the
    grown box's top-left corner) are taken first; each label and each panel is used once; a
    panel that already has a label keeps it."""
    panels = list(panels)
    pairs = []
    for li, (lbox, text) in enumerate(labels):
        if not text:
            continue
        cx, cy = (lbox[0] + lbox[2]) / 2, (lbox[1] + lbox[3]) / 2
        for pi, p in enumerate(panels):
            if p.label is not None:
                continue
            m = max(8.0, 0.1 * max(p.width, p.height))
            gx, gy = p.box[0] - m, p.box[1] - m
            gw, gh = p.box[2] - gx, p.box[3] - gy
            if gx <= cx <= gx + 0.4 * gw and gy <= cy <= gy + 0.4 * gh:
                pairs.append((float(np.hypot(cx - p.box[0], cy - p.box[1])), li, pi, text))
    used_labels, used_panels = set(), set()
    for _, li, pi, text in sorted(pairs):
        if li in used_labels or pi in used_panels:
            continue
        used_labels.add(li)
        used_panels.add(pi)
        panels[pi] = replace(panels[pi], label=text)
    return panels


def finalize(
    panels: Iterable[Panel], width: int, height: int, labels: Iterable[LabelBox] = (), single: bool = True
) -> list[Panel]:
    """Steps 1-6 of the module doc, in order (step 4 only with ``single``: panels that each
    carry a printed label are panels even when one of them covers most of the figure)."""
    kept = [p for p in panels if p.area > 0]
    boxes = clamp([p.box for p in kept], width, height)
    kept = [replace(p, box=b) for p, b in zip(kept, boxes, strict=True) if area(b) > 0]
    kept = suppress(kept)
    if single:
        kept = single_panel(kept)
    kept = attach_labels(kept, labels)
    return reading_order(kept)


def match_panels(a: Sequence[Panel], b: Sequence[Panel]) -> list[tuple[int, int, float]]:
    """One-to-one matching of ``a`` to ``b`` maximising the total IoU (Hungarian algorithm).
    Returns ``(index in a, index in b, iou)`` for matched pairs with IoU > 0, sorted by index in
    ``a``."""
    if not a or not b:
        return []
    from scipy.optimize import linear_sum_assignment

    m = np.array([[iou(p.box, q.box) for q in b] for p in a])
    rows, cols = linear_sum_assignment(m, maximize=True)
    return sorted((int(i), int(j), float(m[i, j])) for i, j in zip(rows, cols, strict=True) if m[i, j] > 0)


def consensus(
    xycut: Sequence[Panel], detr: Sequence[Panel], iou_min: float = 0.5, box: str = "mean"
) -> tuple[list[Panel], float]:
    """Panels both methods agree on, and the figure's agreement.

    Pairs matched by ``match_panels`` with IoU >= ``iou_min`` become one panel: the mean of the
    two boxes (``box="mean"``, rounded) or the DETR box (``box="detr"``), with ``score`` = their
    IoU (the agreement) and the DETR label, else the XY-cut label. Unmatched boxes are left out.

    Figure agreement = sum of the kept pairs' IoU / max(len(xycut), len(detr)): 1.0 when both
    give the same boxes, lower for every panel one method misses; 1.0 when both find nothing."""
    if box not in ("mean", "detr"):
        raise ValueError(f"box must be 'mean' or 'detr', not {box!r}")
    if not xycut and not detr:
        return [], 1.0
    out = []
    total = 0.0
    for i, j, overlap in match_panels(xycut, detr):
        if overlap < iou_min:
            continue
        a, d = xycut[i], detr[j]
        if box == "mean":
            merged = tuple(int(round((u + v) / 2)) for u, v in zip(a.box, d.box, strict=True))
        else:
            merged = d.box
        out.append(Panel(box=merged, score=overlap, label=d.label or a.label))
        total += overlap
    return reading_order(out), total / max(len(xycut), len(detr))


def crop_panel(image: Image.Image, box: Box) -> Image.Image:
    """The panel's pixels, cut from the original image (boxes are original pixels)."""
    return image.crop(box)


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
