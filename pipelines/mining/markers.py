"""Annotation markers drawn on figure panels: arrows, arrowheads, asterisks, boxes and circles.

Panel2Patch (§3.3) mines regions from the marks authors draw over their images ("the red arrow
shows ...", "asterisks mark ..."). There is no public code; this is a classical detector with
numpy, scipy.ndimage and the shared connected components only, built on what such marks look like:

* they are drawn in a **flat, saturated colour** (yellow, red, green, blue) over photographs and
  micrographs, or in **white on a dark** / **black on a light** background, so three kinds of
  mask find them: one per hue class of saturated pixels, near-white pixels, near-black pixels.
  White and black components must stand out from the ring of pixels around them (contrast
  check), so the page itself and grey content do not count;
* they are **small** compared with the panel (a component wider or taller than
  ``MAX_SHARE`` of the panel is content or a frame) and **uniform** inside (fluorescence and
  stains are graded, drawn marks are not);
* each kind has a shape signature, read from a component's pixels: fill ratio, convex hull
  (``scipy.spatial.ConvexHull``), elongation (PCA of pixel coordinates), holes
  (``binary_fill_holes``), the width profile along the main axis (arrows), radial spokes
  (asterisks), the largest triangle in the hull (arrowheads).

Precision matters more than recall: a missed marker costs one region, a false marker makes a
wrong image–text pair. So every test is a conjunction and the thresholds are on the strict
side; text glyphs (``V``, ``T``, ``O``, ``X``), axes, ticks and plot lines must fail them
(``tests/unit/test_mining_markers.py`` checks a chart with axis text). Grey marks are not looked
for (too easily confused with content).

Cost is bounded: the panel is downscaled so its longer side is at most ``WORK_SIDE`` pixels, at
most ``MAX_COMPONENTS`` components per mask are examined, and cheap bounding-box filters run
before any per-component geometry. A typical crop takes milliseconds to tens of milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
from PIL import Image

from pipelines.images.components import components

# scipy is imported in the functions that use it: every process that loads the code location (code
# servers, run workers, the command line) imports this module, and scipy.ndimage and scipy.spatial
# cost each of them ~0.4 s

ARROW, ARROWHEAD, ASTERISK, BOX, CIRCLE = "arrow", "arrowhead", "asterisk", "box", "circle"
KINDS = (ARROW, ARROWHEAD, ASTERISK, BOX, CIRCLE)
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "other")

WORK_SIDE = 768  # longer side of the working image (pixels)
MAX_COMPONENTS = 400  # per mask, smallest-first after the size filter
MIN_SIDE = 7  # a marker's bounding box is at least this many working pixels on its longer side
MIN_AREA = 12  # pixels at working scale
MAX_SHARE = 0.45  # a component wider or taller than this share of the panel is content
SATURATION_MIN, VALUE_MIN = 0.5, 0.45  # a saturated-colour pixel
WHITE_MIN, WHITE_SAT_MAX = 200, 0.2  # a near-white pixel: every channel >= 200, saturation < 0.2
BLACK_MAX = 70  # a near-black pixel: every channel <= 70
LIGHT_RING_MIN = 0.55  # black marks sit on a ring at least this light, white ones on one at most 1 - this
CONTRAST_MIN = 0.3  # white/black marks: |value of the mark - value of the ring around it|
UNIFORM_STD_MAX = 0.12  # standard deviation of value inside a coloured mark
NMS_IOU = 0.3
SMALL_SHARE = 0.2  # arrowheads and asterisks are at most this share of the panel's longer side
TRIANGLE_SHARE = 0.78  # largest triangle in the hull / hull area: triangle 1, square 0.5, disc 0.41


@dataclass(frozen=True)
class Marker:
    """One annotation marker. ``box`` is in pixels of the image given to ``detect_markers``
    (x2/y2 exclusive); ``tip`` is the pixel an arrow or arrowhead points at (None for the other
    kinds); ``colour`` is a coarse name (``COLOURS``); ``score`` in (0, 1] says how clearly the
    shape tests passed."""

    kind: str
    box: tuple[int, int, int, int]
    tip: tuple[int, int] | None
    colour: str | None
    score: float

    @property
    def centre(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


@dataclass
class _Component:
    """A connected component at working scale: its mask cropped to its bounding box (plus a
    one-pixel margin) and the offset of that crop."""

    mask: np.ndarray
    y0: int
    x0: int
    colour: str
    panel_side: int  # longer side of the working image


def detect_markers(image: Image.Image, max_markers: int = 20) -> list[Marker]:
    """The markers drawn on ``image`` (a panel crop), best score first, at most ``max_markers``."""
    rgb, scale = _prepare(image)
    if rgb.shape[0] < MIN_SIDE or rgb.shape[1] < MIN_SIDE:
        return []
    hsv = _hsv(rgb)
    found: list[Marker] = []
    for component in _components(rgb, hsv):
        marker = _classify(component)
        if marker is not None:
            found.append(_to_image_scale(marker, scale, image.size))
    return _suppress(found)[:max_markers]


# ---------------------------------------------------------------------------- preparation


def _prepare(image: Image.Image) -> tuple[np.ndarray, float]:
    """RGB array at working scale and the scale factor (working pixels per image pixel)."""
    rgb = image.convert("RGB")
    side = max(rgb.size)
    scale = 1.0
    if side > WORK_SIDE:
        scale = WORK_SIDE / side
        size = (max(1, round(rgb.size[0] * scale)), max(1, round(rgb.size[1] * scale)))
        rgb = rgb.resize(size, Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8), scale


def _hsv(rgb: np.ndarray) -> np.ndarray:
    """Hue in degrees [0, 360), saturation and value in [0, 1], stacked on the last axis."""
    f = rgb.astype(np.float32) / 255.0
    mx, mn = f.max(axis=2), f.min(axis=2)
    delta = mx - mn
    sat = np.where(mx > 0, delta / np.maximum(mx, 1e-6), 0.0)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    d = np.maximum(delta, 1e-6)
    hue = np.where(mx == r, ((g - b) / d) % 6, np.where(mx == g, (b - r) / d + 2, (r - g) / d + 4)) * 60.0
    hue = np.where(delta > 0, hue, 0.0)
    return np.stack([hue, sat, mx], axis=2)


def _hue_class(hue: np.ndarray) -> np.ndarray:
    """0 red, 1 yellow (orange included), 2 green, 3 blue, 4 other (magenta, purple)."""
    out = np.full(hue.shape, 4, dtype=np.int8)
    out[(hue < 18) | (hue >= 335)] = 0
    out[(hue >= 18) & (hue < 70)] = 1
    out[(hue >= 70) & (hue < 170)] = 2
    out[(hue >= 170) & (hue < 260)] = 3
    return out


HUE_NAMES = ("red", "yellow", "green", "blue")


def colour_name(rgb: tuple[int, int, int] | np.ndarray) -> str:
    """Coarse colour name of one RGB triple (``COLOURS``)."""
    hsv = _hsv(np.asarray(rgb, dtype=np.uint8).reshape(1, 1, 3))[0, 0]
    hue, sat, val = float(hsv[0]), float(hsv[1]), float(hsv[2])
    if val < 0.3:
        return "black"
    if sat < 0.2:
        return "white" if val > 0.75 else "other"
    cls = int(_hue_class(np.array([hue]))[0])
    return HUE_NAMES[cls] if cls < 4 else "other"


def _masks(rgb: np.ndarray, hsv: np.ndarray):
    """``(colour, mask, needs_contrast)``: one mask per saturated hue class, then white, black."""
    sat, val = hsv[..., 1], hsv[..., 2]
    saturated = (sat >= SATURATION_MIN) & (val >= VALUE_MIN)
    classes = _hue_class(hsv[..., 0])
    for cls, name in enumerate(HUE_NAMES):
        yield name, saturated & (classes == cls), False
    yield "white", (rgb.min(axis=2) >= WHITE_MIN) & (sat < WHITE_SAT_MAX), True
    yield "black", rgb.max(axis=2) <= BLACK_MAX, True


def _components(rgb: np.ndarray, hsv: np.ndarray):
    """Components of every mask that pass the size, contrast and uniformity filters."""
    height, width = rgb.shape[:2]
    val = hsv[..., 2]
    for colour, mask, needs_contrast in _masks(rgb, hsv):
        if not mask.any():
            continue
        labels, boxes, sizes = components(mask, eight=False)
        candidates = []
        for index, ((bx0, by0, bx1, by1), size) in enumerate(zip(boxes.tolist(), sizes.tolist(), strict=True), start=1):
            if size < MIN_AREA:
                continue
            h, w = by1 - by0, bx1 - bx0
            if max(h, w) < MIN_SIDE or w > MAX_SHARE * width or h > MAX_SHARE * height:
                continue
            if min(by0, bx0) < 2 or by1 > height - 2 or bx1 > width - 2:
                continue  # cut by the panel's edge: its shape is not the drawn shape
            candidates.append((size, index, (slice(by0, by1), slice(bx0, bx1))))
        candidates.sort()
        for _, index, sl in candidates[:MAX_COMPONENTS]:
            y0, x0 = max(sl[0].start - 3, 0), max(sl[1].start - 3, 0)
            y1, x1 = min(sl[0].stop + 3, height), min(sl[1].stop + 3, width)
            own = labels[y0:y1, x0:x1] == index
            window = val[y0:y1, x0:x1]
            if needs_contrast and not _stands_out(own, window):
                continue
            if not needs_contrast and not _uniform(own, window):
                continue
            cy0, cx0 = sl[0].start - 1, sl[1].start - 1
            crop = np.pad(labels[sl] == index, 1)
            yield _Component(crop, cy0, cx0, colour, max(height, width))


def _stands_out(own: np.ndarray, value: np.ndarray) -> bool:
    """A white or black mark differs from the ring of pixels just around it; the page and grey
    content do not (their surroundings are the same shade)."""
    from scipy import ndimage

    ring = ndimage.binary_dilation(own, iterations=3) & ~own
    if not ring.any():
        return False
    mark, around = float(value[own].mean()), float(value[ring].mean())
    if mark > around:  # white: on a dark background (a white gap between dark content is not a mark)
        return around <= 1.0 - LIGHT_RING_MIN and mark - around >= CONTRAST_MIN
    return around >= LIGHT_RING_MIN and around - mark >= CONTRAST_MIN


def _uniform(own: np.ndarray, value: np.ndarray) -> bool:
    """Drawn marks are flat colour; the inner pixels (edges are blurred by resampling and JPEG)
    vary little. Thin marks with no inner pixel are judged on all their pixels."""
    from scipy import ndimage

    inner = ndimage.binary_erosion(own)
    pixels = value[inner] if inner.sum() >= 4 else value[own]
    return float(pixels.std()) <= UNIFORM_STD_MAX


# ---------------------------------------------------------------------------- shape features


def _hull(mask: np.ndarray) -> np.ndarray | None:
    """Vertices (x, y) of the convex hull of the pixel squares' corners of the boundary pixels,
    counter-clockwise; None when degenerate."""
    from scipy import ndimage
    from scipy.spatial import ConvexHull, QhullError

    edge = mask & ~ndimage.binary_erosion(mask)
    ys, xs = np.nonzero(edge)
    corners = np.concatenate(
        [np.stack([xs + dx, ys + dy], axis=1) for dx in (0.0, 1.0) for dy in (0.0, 1.0)], axis=0
    ).astype(np.float64)
    try:
        hull = ConvexHull(corners)
    except (QhullError, ValueError):
        return None
    return corners[hull.vertices]


def _polygon_area_centroid(poly: np.ndarray) -> tuple[float, np.ndarray]:
    x, y = poly[:, 0], poly[:, 1]
    xn, yn = np.roll(x, -1), np.roll(y, -1)
    cross = x * yn - xn * y
    area = cross.sum() / 2.0
    if abs(area) < 1e-9:
        return 0.0, poly.mean(axis=0)
    cx = ((x + xn) * cross).sum() / (6.0 * area)
    cy = ((y + yn) * cross).sum() / (6.0 * area)
    return abs(area), np.array([cx, cy])


def _pca(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Pixel centres (x, y), their mean, the unit main axis and the elongation sqrt(l1 / l2)."""
    ys, xs = np.nonzero(mask)
    pts = np.stack([xs + 0.5, ys + 0.5], axis=1).astype(np.float64)
    mean = pts.mean(axis=0)
    cov = np.cov((pts - mean).T) + np.eye(2) / 12.0  # a pixel's own spread keeps lines non-singular
    evals, evecs = np.linalg.eigh(cov)
    return pts, mean, evecs[:, 1], float(np.sqrt(evals[1] / evals[0]))


# ---------------------------------------------------------------------------- classification


def _classify(c: _Component) -> Marker | None:
    from scipy import ndimage

    mask = c.mask
    area = int(mask.sum())
    filled = ndimage.binary_fill_holes(mask)
    filled_area = int(filled.sum())
    hole_share = (filled_area - area) / filled_area
    if hole_share >= 0.45:
        return _ring(c, filled, hole_share)
    if hole_share > 0.08:
        return None  # glyphs with counters (A, a, e, 4, 8...) and other blobs
    hull = _hull(mask)
    if hull is None:
        return None
    hull_area, hull_centre = _polygon_area_centroid(hull)
    if hull_area <= 0:
        return None
    solidity = area / hull_area
    pts, mean, axis, elongation = _pca(mask)
    if elongation >= 2.4:
        return _arrow(c, pts, mean, axis)
    marker = _asterisk(c, pts, mean, solidity, elongation)
    if marker is not None:
        return marker
    return _arrowhead(c, hull, hull_area, hull_centre, mean, solidity)


def _marker(c: _Component, kind: str, tip: tuple[float, float] | None, score: float) -> Marker:
    ys, xs = np.nonzero(c.mask)
    box = (int(xs.min()) + c.x0, int(ys.min()) + c.y0, int(xs.max()) + 1 + c.x0, int(ys.max()) + 1 + c.y0)
    tip_px = None if tip is None else (int(round(tip[0] + c.x0)), int(round(tip[1] + c.y0)))
    return Marker(kind, box, tip_px, c.colour, round(float(min(max(score, 0.05), 1.0)), 3))


def _ring(c: _Component, filled: np.ndarray, hole_share: float) -> Marker | None:
    """A box or circle: a thin closed outline around one large hole. The filled shape's
    extent (area over its bounding box) separates rectangles (~1) from ellipses (~pi/4).
    Black outlines on a light page are chart frames, legend boxes and table cells far more often
    than drawn marks, so black rings are not taken."""
    if c.colour == "black":
        return None
    ys, xs = np.nonzero(filled)
    h, w = int(ys.max() - ys.min() + 1), int(xs.max() - xs.min() + 1)
    if min(h, w) < 12 or not 0.25 <= w / h <= 4.0:
        return None
    _, _, hole_sizes = components(filled & ~c.mask, eight=False)
    if not len(hole_sizes):
        return None
    if hole_sizes.max() < 0.95 * hole_sizes.sum():
        return None  # several holes: a grid, a glyph like B or 8, a table
    extent = filled.sum() / (h * w)
    ring_score = min(1.0, (hole_share - 0.35) / 0.4)
    if extent >= 0.9:
        return _marker(c, BOX, None, ring_score * min(1.0, (extent - 0.85) / 0.1))
    if 0.7 <= extent <= 0.83 and 0.5 <= w / h <= 2.0:
        hull = _hull(filled)
        if hull is None:
            return None
        hull_area, _ = _polygon_area_centroid(hull)
        if filled.sum() / hull_area < 0.9:
            return None  # not convex: a blob outline, not an ellipse
        return _marker(c, CIRCLE, None, ring_score * (1.0 - abs(extent - np.pi / 4) / 0.1))
    return None


def _profile(pts: np.ndarray, mean: np.ndarray, axis: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Width (extent across the main axis) of the shape in ``bins`` slices along it, and each
    pixel's position along the axis."""
    normal = np.array([-axis[1], axis[0]])
    t = (pts - mean) @ axis
    q = (pts - mean) @ normal
    edges = np.linspace(t.min(), t.max() + 1e-6, bins + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    widths = np.zeros(bins)
    for b in range(bins):
        sel = q[which == b]
        widths[b] = sel.max() - sel.min() + 1 if sel.size else 0.0
    return widths, t


def _arrow(c: _Component, pts: np.ndarray, mean: np.ndarray, axis: np.ndarray) -> Marker | None:
    """An elongated mark whose width is small and even along a shaft and widens into a head at
    one end, then tapers to the tip. Plain lines have no head; ``T``, ``Y`` and error bars are
    widest at the very end (no taper); lines with plot symbols bulge in the middle."""
    t_all = (pts - mean) @ axis
    length = float(t_all.max() - t_all.min()) + 1.0
    if length < 14:
        return None
    bins = int(np.clip(length / 2, 10, 40))
    widths, _ = _profile(pts, mean, axis, bins)
    if (widths == 0).any():
        return None  # gaps along the axis: not one stroke
    for flip in (False, True):
        w = widths[::-1] if flip else widths  # w[0] is the candidate tip end
        head_bins = max(2, int(round(0.4 * bins)))
        head = w[:head_bins]
        shaft = w[int(0.5 * bins) : int(0.9 * bins)]
        if shaft.size < 2:
            continue
        shaft_width = float(np.median(shaft))
        head_width = float(head.max())
        peak = int(head.argmax())
        if head_width < 4 or head_width < 2.0 * shaft_width or shaft_width > 0.25 * length:
            continue
        if shaft.max() > 1.6 * shaft_width + 1 or float(w[-max(1, bins // 7) :].max()) > 1.5 * shaft_width + 1:
            continue  # a bulge along the shaft or a widening tail: a plot line, a double arrow, a ``t``
        if peak < 2 or w[0] > 0.6 * head_width:
            continue  # no taper to a point
        if float(w[peak // 2]) < 1.3 * shaft_width + 1 or float(w[peak // 2]) > 0.85 * head_width:
            continue  # the head does not widen steadily from the tip (a ``t``: stem, then crossbar)
        t_tip = t_all.min() if not flip else t_all.max()
        near = np.abs(t_all - t_tip) <= 1.0
        tip = pts[near].mean(axis=0)
        score = min(1.0, (head_width / max(shaft_width, 1.0) - 1.0) / 2.0)
        return _marker(c, ARROW, (float(tip[0]), float(tip[1])), score)
    return None


def _asterisk(c: _Component, pts: np.ndarray, mean: np.ndarray, solidity: float, elongation: float) -> Marker | None:
    """Five to eight thin spokes radiating from a filled centre, at the same angles on an inner
    and an outer circle (radial, unlike the strokes of ``W`` or ``K``), spread around the full
    turn. ``X`` and ``+`` have four spokes."""
    mask = c.mask
    ys, xs = np.nonzero(mask)
    h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    if (
        elongation > 1.5
        or solidity > 0.6
        or not 0.6 <= w / h <= 1.6
        or not 9 <= max(h, w) <= SMALL_SHARE * c.panel_side
    ):
        return None
    cx, cy = (xs.min() + xs.max() + 1) / 2.0, (ys.min() + ys.max() + 1) / 2.0
    if not mask[int(cy), int(cx)]:
        return None
    radius = max(h, w) / 2.0
    angles = np.linspace(0, 2 * np.pi, 90, endpoint=False)
    runs = []
    for r in (0.5 * radius, 0.8 * radius):
        px = np.clip((cx + r * np.cos(angles)).astype(int), 0, mask.shape[1] - 1)
        py = np.clip((cy + r * np.sin(angles)).astype(int), 0, mask.shape[0] - 1)
        runs.append(_run_centres(mask[py, px], angles))
    inner, outer = runs
    if not 5 <= len(outer) <= 8 or len(inner) != len(outer):
        return None
    diffs = [min(abs(np.angle(np.exp(1j * (a - b)))) for b in inner) for a in outer]
    if max(diffs) > np.radians(25):
        return None  # strokes not radial
    gaps = np.diff(np.sort(np.concatenate([outer, [outer.min() + 2 * np.pi]])))
    if gaps.max() > 2.2 * (2 * np.pi / len(outer)):
        return None  # spokes bunched on one side
    score = 1.0 - float(max(diffs)) / np.radians(50)
    return _marker(c, ASTERISK, None, score)


def _run_centres(values: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Angles at the centre of each circular run of True values."""
    if values.all() or not values.any():
        return np.array([])
    start = int(np.argmin(values))  # rotate so the sequence starts on False
    v = np.roll(values, -start)
    a = np.roll(angles, -start)
    centres, i = [], 0
    while i < v.size:
        if v[i]:
            j = i
            while j < v.size and v[j]:
                j += 1
            seg = a[i:j]
            centres.append(float(np.angle(np.exp(1j * seg).mean())) % (2 * np.pi))
            i = j
        else:
            i += 1
    return np.array(centres)


def _arrowhead(
    c: _Component,
    hull: np.ndarray,
    hull_area: float,
    hull_centre: np.ndarray,
    mean: np.ndarray,
    solidity: float,
) -> Marker | None:
    """A solid triangle, or a chevron (a triangle with a notch cut into its back): the hull is
    nearly a triangle, the mark is thick (unlike the thin strokes of ``V`` or ``L``). The tip is
    the triangle's vertex opposite the notch (the mark's mass is displaced towards its tip), or
    for a solid triangle the sharpest vertex."""
    from scipy import ndimage

    if solidity < 0.5 or hull_area < 30 or max(c.mask.shape) - 2 > SMALL_SHARE * c.panel_side:
        return None
    verts = _simplify(hull)
    best, best_area = None, 0.0
    for tri in combinations(range(len(verts)), 3):
        p = verts[list(tri)]
        u, v = p[1] - p[0], p[2] - p[0]
        a = abs(u[0] * v[1] - u[1] * v[0]) / 2.0
        if a > best_area:
            best, best_area = p, a
    if best is None or best_area < TRIANGLE_SHARE * hull_area:
        return None
    thickness = float(ndimage.distance_transform_edt(c.mask).max())
    if thickness < 0.16 * np.sqrt(hull_area):
        return None
    offset = mean - hull_centre
    if np.linalg.norm(offset) > 0.03 * np.sqrt(hull_area):
        tip = best[int(np.argmax((best - hull_centre) @ offset))]
    else:
        tip = best[int(np.argmin(_angles(best)))]
    score = min(1.0, (best_area / hull_area - 0.7) / 0.2) * min(1.0, solidity / 0.8)
    return _marker(c, ARROWHEAD, (float(tip[0]), float(tip[1])), score)


def _simplify(poly: np.ndarray, keep: int = 24) -> np.ndarray:
    """At most ``keep`` hull vertices (the ones with the sharpest turns) so the triangle search
    stays small."""
    if len(poly) <= keep:
        return poly
    turn = _angles(poly)
    return poly[np.sort(np.argsort(turn)[:keep])]


def _angles(poly: np.ndarray) -> np.ndarray:
    """Interior angle (radians) at each vertex of a polygon."""
    prev, nxt = np.roll(poly, 1, axis=0) - poly, np.roll(poly, -1, axis=0) - poly
    cos = (prev * nxt).sum(axis=1) / (np.linalg.norm(prev, axis=1) * np.linalg.norm(nxt, axis=1) + 1e-9)
    return np.arccos(np.clip(cos, -1.0, 1.0))


# ---------------------------------------------------------------------------- output


def _to_image_scale(m: Marker, scale: float, size: tuple[int, int]) -> Marker:
    if scale == 1.0:
        return m
    w, h = size
    x1, y1, x2, y2 = m.box
    box = (
        max(0, int(x1 / scale)),
        max(0, int(y1 / scale)),
        min(w, int(np.ceil(x2 / scale))),
        min(h, int(np.ceil(y2 / scale))),
    )
    tip = (
        None if m.tip is None else (min(w - 1, int(round(m.tip[0] / scale))), min(h - 1, int(round(m.tip[1] / scale))))
    )
    return Marker(m.kind, box, tip, m.colour, m.score)


def _suppress(markers: list[Marker]) -> list[Marker]:
    """Best score first; a marker overlapping one already kept (outline and fill of the same
    mark found by two masks) is dropped."""
    from pipelines.images.boxes import ios, iou

    kept: list[Marker] = []
    for m in sorted(markers, key=lambda m: -m.score):
        if all(iou(m.box, k.box) < NMS_IOU and ios(m.box, k.box) < 0.8 for k in kept):
            kept.append(m)
    return kept
