"""The layout language of synthetic compound figures, and the cells a layout gives a figure.

Real compound figures are not only grids: rows with different column counts, a panel spanning two
rows or columns, a grid nested in one cell. All of them are guillotine trees, written here in a
small spec language: ``P`` is a panel, ``Pi`` a panel carrying an inset (a zoomed part of itself),
``R[...]`` stacks its children top to bottom, ``C[...]`` puts them side by side
(``R[C[P,P,P],C[P,P]]``: rows of three and two; ``R[P,C[P,P]]``: the first spans two columns;
``C[P,R[P,P]]``: it spans two rows). A spec is recorded with every sample and can be given back to
the generator to make that layout again. Sources keep their aspect ratio, so a layout's cells are
sized from the sources' own aspect ratios (:func:`natural_aspect`) mixed with equal shares.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Leaf:
    """A panel; ``inset``: it carries a zoomed inset of itself."""

    inset: bool = False


@dataclass(frozen=True)
class Split:
    """Children stacked top to bottom (``axis`` "R") or side by side ("C")."""

    axis: str
    children: tuple[Leaf | Split, ...]


Node = Leaf | Split
Cell = tuple[int, int, int, int]  # x0, y0, x1, y1 in the figure's pixels


def parse_layout(spec: str) -> Node:
    """Parse ``P``, ``Pi``, ``R[a,b,...]``, ``C[a,b,...]`` (spaces ignored); ValueError if malformed."""
    text = spec.replace(" ", "")
    pos = 0

    def node() -> Node:
        nonlocal pos
        if text.startswith("Pi", pos):
            pos += 2
            return Leaf(inset=True)
        if text.startswith("P", pos):
            pos += 1
            return Leaf()
        if pos < len(text) and text[pos] in "RC" and text.startswith("[", pos + 1):
            axis, pos = text[pos], pos + 2
            children = [node()]
            while text.startswith(",", pos):
                pos += 1
                children.append(node())
            if not text.startswith("]", pos):
                raise ValueError(f"layout {spec!r}: expected ']' at {pos}")
            pos += 1
            return Split(axis, tuple(children))
        raise ValueError(f"layout {spec!r}: unexpected text at {pos}")

    root = node()
    if pos != len(text):
        raise ValueError(f"layout {spec!r}: trailing text at {pos}")
    return root


def format_layout(node: Node) -> str:
    if isinstance(node, Leaf):
        return "Pi" if node.inset else "P"
    return f"{node.axis}[{','.join(format_layout(c) for c in node.children)}]"


def leaves(node: Node) -> list[Leaf]:
    """The panels in reading order (depth first: top to bottom, left to right)."""
    return [node] if isinstance(node, Leaf) else [leaf for child in node.children for leaf in leaves(child)]


def count_panels(spec: str | Node) -> tuple[int, int]:
    """(panels, insets) a layout spec asks for."""
    found = leaves(parse_layout(spec) if isinstance(spec, str) else spec)
    return len(found), sum(leaf.inset for leaf in found)


# ---------------------------------------------------------------------------------- random layouts


def _grid(rows: int, cols: int) -> Node:
    return _split("R", [_split("C", [Leaf()] * cols)] * rows)


def _split(axis: str, children: list[Node]) -> Node:
    """One child is itself; a child split along the same axis is merged into this one."""
    if len(children) == 1:
        return children[0]
    flat: list[Node] = []
    for child in children:
        flat += child.children if isinstance(child, Split) and child.axis == axis else [child]
    return Split(axis, tuple(flat))


LAYOUT_KINDS = {"single": 0.04, "grid": 0.30, "rows": 0.20, "columns": 0.10, "spanning": 0.18, "nested": 0.18}


def random_layout(rng: random.Random, kind: str, max_panels: int = 12) -> Node:
    """A layout of ``kind`` (one of ``LAYOUT_KINDS``) without insets."""
    if kind == "single":
        return Leaf()
    if kind == "grid":
        while True:
            rows, cols = rng.randint(1, 4), rng.randint(1, 4)
            if 2 <= rows * cols <= max_panels:
                return _grid(rows, cols)
    if kind in ("rows", "columns"):
        while True:
            counts = [rng.randint(1, 4) for _ in range(rng.randint(2, 4))]
            if len(set(counts)) > 1 and sum(counts) <= max_panels:
                inner = "C" if kind == "rows" else "R"
                outer = "R" if kind == "rows" else "C"
                return _split(outer, [_split(inner, [Leaf()] * c) for c in counts])
    if kind == "spanning":
        along = rng.choice("RC")  # R: the big panel spans columns; C: it spans rows
        other = "C" if along == "R" else "R"
        rest = [_split(other, [Leaf()] * rng.randint(2, 3)) for _ in range(rng.randint(1, 2))]
        parts = [Leaf(), *rest] if rng.random() < 0.6 else [*rest, Leaf()]
        return _split(along, parts)
    if kind == "nested":
        rows, cols = rng.choice([(1, 2), (2, 1), (2, 2), (1, 3), (2, 3), (3, 2)])
        cells: list[list[Node]] = [[Leaf()] * cols for _ in range(rows)]
        r, c = rng.randrange(rows), rng.randrange(cols)
        sub_rows, sub_cols = rng.choice([(1, 2), (2, 1), (2, 2), (1, 3), (3, 1)])
        cells[r][c] = _grid(sub_rows, sub_cols)
        return _split("R", [_split("C", row) for row in cells])
    raise ValueError(f"unknown layout kind {kind!r}")


def with_insets(node: Node, rng: random.Random, p: float) -> Node:
    """The same tree with each panel carrying an inset with probability ``p``."""
    if isinstance(node, Leaf):
        return Leaf(inset=rng.random() < p)
    return Split(node.axis, tuple(with_insets(c, rng, p) for c in node.children))


# ------------------------------------------------------------------------------------- geometry


def natural_aspect(node: Node, ratios: Iterator[float]) -> tuple[float, list]:
    """Natural width/height of ``node`` whose leaves have the aspect ratios ``ratios`` (children of
    a C share a height, of an R a width), and the tree of natural child weights."""
    if isinstance(node, Leaf):
        return next(ratios), []
    parts = [natural_aspect(child, ratios) for child in node.children]
    values = [a for a, _ in parts]
    if node.axis == "C":
        total = sum(values)
        return total, [(a / total, sub) for (a, sub) in parts]
    inverse = sum(1 / a for a in values)
    return 1 / inverse, [((1 / a) / inverse, sub) for (a, sub) in parts]


def layout_cells(
    node: Node, weights: list, rect: tuple[float, float, float, float], gutter: float, mix: float
) -> list[Cell]:
    """The integer cell of every leaf in reading order: children share ``rect`` by their
    ``weights`` (from :func:`natural_aspect`) mixed with equal shares (``mix`` 1 = equal), with
    ``gutter`` pixels between them; edges are rounded from the same floats, so neighbouring cells
    never overlap."""
    out: list[Cell] = []
    _cells(node, weights, rect, gutter, mix, out)
    return out


def _cells(node: Node, weights: list, rect: tuple[float, float, float, float], gutter: float, mix: float, out: list):
    if isinstance(node, Leaf):
        x0, y0, x1, y1 = rect
        out.append((round(x0), round(y0), round(x1), round(y1)))
        return
    n = len(node.children)
    x0, y0, x1, y1 = rect
    span = (x1 - x0) if node.axis == "C" else (y1 - y0)
    free = max(0.0, span - gutter * (n - 1))
    pos = x0 if node.axis == "C" else y0
    for child, (w, sub) in zip(node.children, weights, strict=True):
        size = free * ((1 - mix) * w + mix / n)
        child_rect = (pos, y0, pos + size, y1) if node.axis == "C" else (x0, pos, x1, pos + size)
        _cells(child, sub, child_rect, gutter, mix, out)
        pos += size + gutter
