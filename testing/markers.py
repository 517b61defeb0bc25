"""Drawing annotation markers with PIL, the way figure authors draw them, for the marker tests
and the τ sweep (``benchmarks/mining_tau.py``). Every function draws one mark and returns the
box it covers (x2/y2 exclusive, before clipping) so callers can state where it is."""

from __future__ import annotations

import math

from PIL import ImageDraw

Point = tuple[float, float]
Colour = tuple[int, int, int]


def _box(points: list[Point], pad: float = 0.0) -> tuple[int, int, int, int]:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return (
        math.floor(min(xs) - pad),
        math.floor(min(ys) - pad),
        math.ceil(max(xs) + pad) + 1,
        math.ceil(max(ys) + pad) + 1,
    )


def _head(tip: Point, angle: float, length: float, half_width: float) -> list[Point]:
    """Triangle with its apex at ``tip``, pointing in direction ``angle`` (radians)."""
    bx, by = tip[0] - length * math.cos(angle), tip[1] - length * math.sin(angle)
    nx, ny = -math.sin(angle), math.cos(angle)
    return [tip, (bx + half_width * nx, by + half_width * ny), (bx - half_width * nx, by - half_width * ny)]


def draw_arrow(
    draw: ImageDraw.ImageDraw, tail: Point, tip: Point, colour: Colour, width: int = 4, head: float = 16
) -> tuple[int, int, int, int]:
    """A straight shaft from ``tail`` ending in a solid triangular head whose apex is ``tip``."""
    angle = math.atan2(tip[1] - tail[1], tip[0] - tail[0])
    triangle = _head(tip, angle, head, 0.6 * head)
    base = (tip[0] - head * math.cos(angle), tip[1] - head * math.sin(angle))
    draw.line([tail, base], fill=colour, width=width)
    draw.polygon(triangle, fill=colour)
    return _box([tail, *triangle], pad=width / 2)


def draw_arrowhead(
    draw: ImageDraw.ImageDraw, tip: Point, angle: float, colour: Colour, size: float = 18
) -> tuple[int, int, int, int]:
    """A solid isosceles triangle (apex ``tip``, pointing along ``angle``), as used for
    "arrowheads point to ..."."""
    triangle = _head(tip, angle, size, 0.5 * size)
    draw.polygon(triangle, fill=colour)
    return _box(triangle)


def draw_asterisk(
    draw: ImageDraw.ImageDraw, centre: Point, radius: float, colour: Colour, width: int = 3, spokes: int = 6
) -> tuple[int, int, int, int]:
    """``spokes`` / 2 lines crossing at ``centre`` (six spokes: the usual typographic asterisk)."""
    for k in range(spokes // 2):
        a = math.pi * k / (spokes // 2) + math.pi / 2
        dx, dy = radius * math.cos(a), radius * math.sin(a)
        draw.line([(centre[0] - dx, centre[1] - dy), (centre[0] + dx, centre[1] + dy)], fill=colour, width=width)
    return _box([(centre[0] - radius, centre[1] - radius), (centre[0] + radius, centre[1] + radius)])


def draw_box(
    draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], colour: Colour, width: int = 3
) -> tuple[int, int, int, int]:
    """A rectangle outline; ``box`` is x1, y1, x2, y2 with x2/y2 exclusive."""
    draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], outline=colour, width=width)
    return box


def draw_circle(
    draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], colour: Colour, width: int = 3
) -> tuple[int, int, int, int]:
    """An ellipse outline inscribed in ``box`` (x2/y2 exclusive)."""
    draw.ellipse([box[0], box[1], box[2] - 1, box[3] - 1], outline=colour, width=width)
    return box
