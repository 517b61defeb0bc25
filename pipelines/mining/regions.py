"""Mark-guided regions (Panel2Patch §3.3): caption-grounded boxes fused with detected markers.

The vision-language model proposes boxes for what a caption phrase refers to ("caption boxes");
the marker detector (``pipelines.mining.markers``) finds the marks authors drew. A caption box
is kept only when its centre lies within normalised distance ``tau`` of a marker's anchor
(the paper's rule: the model's box must be supported by a drawn mark). Normalised distance is
the euclidean distance between the two points divided by the panel's diagonal, so one ``tau``
works for every panel size. A marker with no caption box near it still yields a region
("lone marker"): the area it encloses or points at. Non-maximum suppression removes duplicates
from the union.

``TAU_DEFAULT`` is the value maximising region F1 in ``benchmarks/mining_tau.py`` (results in
``benchmarks/results/mining_tau.json``): a sweep on **synthetic** panels (markers drawn over
crops of real figures, caption boxes simulated as a jittered true region plus distractors), not
on real model output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.images.boxes import Box, iou
from pipelines.mining.markers import ARROW, ARROWHEAD, ASTERISK, BOX, CIRCLE, Marker

TAU_DEFAULT = 0.15  # chosen by benchmarks/mining_tau.py (max F1 on the synthetic sweep)
LONE_MARKER_SCALE = 0.2  # side of a lone arrow's / asterisk's region, as a share of the panel diagonal
LONE_SCORE = 0.5  # a lone marker's region is less certain than one the model also proposed

CAPTION_MARKER, MARKER = "caption+marker", "marker"


@dataclass(frozen=True)
class Region:
    """One mined region of a panel. ``source`` is ``"caption+marker"`` (a model box supported by
    a marker) or ``"marker"`` (a lone marker's region); ``marker`` is the supporting marker's
    kind; ``distance`` the normalised anchor–centre distance (None for lone markers)."""

    box: Box
    source: str
    marker: str | None
    score: float
    distance: float | None


def anchor(marker: Marker) -> tuple[float, float]:
    """The point a marker designates. For arrows and arrowheads this is the **tip**, not the
    centre: an arrow is drawn beside its target, pointing at it, so its centre lies up to a
    whole arrow length away from the target while its tip touches it; measuring from the centre
    would reject the right caption box for a long arrow and accept boxes behind its tail.
    Boxes, circles and asterisks sit on or next to what they mark: their centre."""
    if marker.kind in (ARROW, ARROWHEAD) and marker.tip is not None:
        return float(marker.tip[0]), float(marker.tip[1])
    return marker.centre


def normalised_distance(a: tuple[float, float], b: tuple[float, float], size: tuple[int, int]) -> float:
    """Euclidean distance of two points over the panel's diagonal."""
    diagonal = math.hypot(size[0], size[1])
    return math.hypot(a[0] - b[0], a[1] - b[1]) / diagonal if diagonal > 0 else math.inf


def centre(box: Box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def fuse_regions(
    caption_boxes: list[Box],
    markers: list[Marker],
    size: tuple[int, int],
    tau: float = TAU_DEFAULT,
    lone_marker_scale: float = LONE_MARKER_SCALE,
    iou_nms: float = 0.5,
) -> list[Region]:
    """Regions of a panel of ``size`` (width, height), best score first.

    * each caption box whose centre is within ``tau`` of its nearest marker anchor is kept,
      scored ``marker.score * (1 - distance / tau)`` (closer support, higher score);
    * each marker no kept caption box leaned on becomes a lone region (``lone_region``);
    * NMS at ``iou_nms`` over the union, best score first: a caption box and the lone region of
      another marker covering the same area keep only the better one.
    """
    regions: list[Region] = []
    used: set[int] = set()
    if markers:
        anchors = [anchor(m) for m in markers]
        for box in caption_boxes:
            if box[2] <= box[0] or box[3] <= box[1]:
                continue
            dists = [normalised_distance(centre(box), a, size) for a in anchors]
            best = min(range(len(markers)), key=dists.__getitem__)
            if dists[best] <= tau:
                used.add(best)
                score = markers[best].score * (1.0 - dists[best] / tau) if tau > 0 else markers[best].score
                regions.append(Region(box, CAPTION_MARKER, markers[best].kind, round(score, 4), round(dists[best], 4)))
    for i, m in enumerate(markers):
        if i not in used:
            box = lone_region(m, size, lone_marker_scale)
            if box is not None:
                regions.append(Region(box, MARKER, m.kind, round(LONE_SCORE * m.score, 4), None))
    return suppress_regions(regions, iou_nms)


def lone_region(marker: Marker, size: tuple[int, int], scale: float = LONE_MARKER_SCALE) -> Box | None:
    """The region a marker designates on its own. A box or circle encloses it: its box is the
    region. An arrow or arrowhead points at it: a square of side ``scale`` x diagonal placed just
    beyond the tip, along the pointing direction (from the marker's centre to its tip), because
    the target lies past the tip, not around it. An asterisk sits beside its target in no known
    direction: a square centred on it."""
    width, height = size
    if marker.kind in (BOX, CIRCLE):
        return _clip(marker.box, width, height)
    side = scale * math.hypot(width, height)
    cx, cy = marker.centre
    if marker.kind in (ARROW, ARROWHEAD) and marker.tip is not None:
        tx, ty = marker.tip
        dx, dy = tx - cx, ty - cy
        norm = math.hypot(dx, dy)
        if norm > 0:
            cx, cy = tx + dx / norm * side / 2, ty + dy / norm * side / 2
        else:
            cx, cy = tx, ty
    elif marker.kind != ASTERISK:
        return None
    return _clip(
        (round(cx - side / 2), round(cy - side / 2), round(cx + side / 2), round(cy + side / 2)), width, height
    )


def _clip(box: Box, width: int, height: int) -> Box | None:
    x1, y1 = max(0, int(box[0])), max(0, int(box[1]))
    x2, y2 = min(width, int(box[2])), min(height, int(box[3]))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


def suppress_regions(regions: list[Region], iou_nms: float = 0.5) -> list[Region]:
    """Greedy NMS: best score first (caption+marker before marker on ties), a region whose IoU
    with one already kept is >= ``iou_nms`` is dropped."""
    order = sorted(regions, key=lambda r: (-r.score, r.source != CAPTION_MARKER))
    kept: list[Region] = []
    for r in order:
        if all(iou(r.box, k.box) < iou_nms for k in kept):
            kept.append(r)
    return kept
