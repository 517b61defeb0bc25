"""Synthetic compound figures with exact panel and panel-label boxes, to train the panel detector.

Real single-panel figures are composed into compound figures whose ground truth is known by
construction. Compared with a grid-only generator (Open-PMC-18M: m x n grids, one default
font, fixed aspect ratio, unseeded workers):

* **Reproducible per sample.** Sample ``index`` of split ``split`` draws everything from
  ``random.Random(sample_seed(seed, split, index))`` (a 64-bit blake2b of
  ``"{seed}:{split}:{index}"``), so any sample can be made alone, in any worker, in any order,
  byte for byte (same source list, same library versions).
* **Layouts beyond grids**, as a guillotine tree written in a small spec language: ``P`` is a
  panel, ``Pi`` a panel carrying an inset (a zoomed part of itself with a zoom box and
  connector lines), ``R[...]`` stacks its children top to bottom, ``C[...]`` puts them side by
  side. Rows with different column counts (``R[C[P,P,P],C[P,P]]``), spanning panels
  (``R[P,C[P,P]]``: the first spans two columns; ``C[P,R[P,P]]``: it spans two rows) and
  nested grids (a cell split again) are all trees. Sources keep their aspect ratio: each is
  letterboxed inside its cell; cell weights follow the sources' own aspect ratios, mixed with
  equal weights by a random amount.
* **Insets are panels**: they are annotated as category ``panel`` with ``inset: true`` and the
  id of the panel they sit in (``parent_id``). Our post-processing, like Open-PMC-18M's, keeps
  a panel contained in another (containment suppression spares insets), so the detector must
  see them as panels.
* **Panel labels in PMC's styles** (A, a, (A), (a), A), a), A., a., 1, (1), 1., i, (i), A1/A2),
  bold or regular, in DejaVu Sans/Serif/Mono and STIX (fonts matplotlib ships), sized relative
  to the figure, inside a corner of the panel or outside above or left of it, plain or in a
  white or black box. The glyph box of each label is annotated as category ``panel_label``.
* **Distractors** drawn inside panels and not annotated: legends, colour bars, scale bars with
  their text (``10 µm``), text blocks, arrows.
* **Degradation**: optional intermediate JPEG pass, random downscaling (boxes scaled with the
  image), and the final JPEG at a random quality.

:func:`write_coco_dataset` streams a COCO dataset per split (train, val) to disk, holding one
image at a time, after de-duplicating source panels between the splits by the project's dHash
(:func:`pipelines.parse.images.dhash`, pairs found by :func:`pipelines.parse.duplicates.find_duplicates`).
:func:`source_panels` picks single-panel figures from the lake with their licences.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from pipelines.concepts.decode import decode_image
from pipelines.parse.duplicates import NEAR_DISTANCE, find_duplicates
from pipelines.parse.images import dhash

GENERATOR_VERSION = "panelforge-synthetic/1"
PANEL, PANEL_LABEL = 1, 2
CATEGORIES = [
    {"id": PANEL, "name": "panel", "supercategory": "figure"},
    {"id": PANEL_LABEL, "name": "panel_label", "supercategory": "figure"},
]
SINGLE_PANEL = "single panel"  # the taxonomy's panel_type of a one-panel figure

# ---------------------------------------------------------------------------------------------
# Sources


@dataclass(frozen=True)
class SourcePanel:
    """A real single-panel figure image. ``image`` is its encoded bytes or a function that
    returns them (so a lake's sources are read only when used). ``phash``: its dHash when
    already known (the ``figures`` table has it), else computed when needed."""

    key: str
    image: bytes | Callable[[], bytes]
    license_code: str | None = None
    license_group: str | None = None
    phash: str | None = None

    def read(self) -> bytes:
        return self.image if isinstance(self.image, bytes | bytearray) else self.image()


MAX_SOURCE_SIDE = 1024  # sources are decoded once and kept at most this large


def load_source(source: SourcePanel) -> Image.Image:
    """The source as an RGB image at most ``MAX_SOURCE_SIDE`` on its long side (ValueError when
    it cannot be decoded)."""
    image, error = decode_image(source.read())
    if image is None:
        raise ValueError(f"source {source.key}: {error}")
    if max(image.size) > MAX_SOURCE_SIDE:
        scale = MAX_SOURCE_SIDE / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    return image


class SourceCache:
    """The last ``size`` decoded sources (decoding is deterministic, so caching never changes
    a sample; it only saves time when sources repeat)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._images: OrderedDict[str, Image.Image] = OrderedDict()

    def get(self, source: SourcePanel) -> Image.Image:
        image = self._images.get(source.key)
        if image is None:
            image = self._images[source.key] = load_source(source)
            while len(self._images) > self.size:
                self._images.popitem(last=False)
        else:
            self._images.move_to_end(source.key)
        return image


# ---------------------------------------------------------------------------------------------
# Seeds


def sample_seed(seed: int, split: str, index: int) -> int:
    """The 64-bit seed of one sample, from the recorded global seed alone."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{split}:{index}".encode(), digest_size=8).digest(), "big")


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


# ---------------------------------------------------------------------------------------------
# Layout specs


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


def _with_insets(node: Node, rng: random.Random, p: float) -> Node:
    if isinstance(node, Leaf):
        return Leaf(inset=rng.random() < p)
    return Split(node.axis, tuple(_with_insets(c, rng, p) for c in node.children))


# ---------------------------------------------------------------------------------------------
# Fonts and labels

_FONT_FILES = {
    "DejaVuSans": "DejaVuSans.ttf",
    "DejaVuSans-Bold": "DejaVuSans-Bold.ttf",
    "DejaVuSerif": "DejaVuSerif.ttf",
    "DejaVuSerif-Bold": "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono": "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold": "DejaVuSansMono-Bold.ttf",
    "STIXGeneral": "STIXGeneral.ttf",
    "STIXGeneral-Bold": "STIXGeneralBol.ttf",
}
FONTS = tuple(_FONT_FILES)


@lru_cache(maxsize=1)
def _font_dir() -> Path:
    import matplotlib  # ships DejaVu and STIX (permissive licences)

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


@lru_cache(maxsize=512)
def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(_font_dir() / _FONT_FILES[name]), size)


LABEL_SCHEMES = {"upper": 0.34, "lower": 0.30, "digit": 0.12, "roman": 0.06, "alnum": 0.18}
DECORATIONS = {"{}": 0.55, "({})": 0.17, "{})": 0.12, "{}.": 0.16}
PLACEMENTS = {"inside_tl": 0.45, "outside_above": 0.25, "outside_left": 0.08, "inside_tr": 0.1, "inside_bl": 0.06}
PLACEMENTS |= {"inside_br": 0.06}
BOX_STYLES = {"plain": 0.6, "white_box": 0.22, "black_box": 0.18}


def _roman(n: int) -> str:
    out = ""
    for value, numeral in ((10, "x"), (9, "ix"), (5, "v"), (4, "iv"), (1, "i")):
        while n >= value:
            out, n = out + numeral, n - value
    return out


def _letters(n: int, upper: bool) -> str:
    """1 -> A, 26 -> Z, 27 -> AA."""
    out = ""
    while n > 0:
        n, rem = divmod(n - 1, 26)
        out = chr((65 if upper else 97) + rem) + out
    return out


def label_texts(root: Node, scheme: str, decoration: str, upper: bool = True) -> list[tuple[str, str]]:
    """(label as printed, label without punctuation) for each panel in reading order. ``alnum``
    gives each child of the root a letter and numbers its panels (A, B1, B2, C)."""
    n = len(leaves(root))
    if scheme == "alnum":
        groups = root.children if isinstance(root, Split) else (root,)
        cores = []
        for g, child in enumerate(groups, start=1):
            size = len(leaves(child))
            letter = _letters(g, upper)
            cores += [letter] if size == 1 else [f"{letter}{i}" for i in range(1, size + 1)]
    elif scheme == "upper":
        cores = [_letters(i, True) for i in range(1, n + 1)]
    elif scheme == "lower":
        cores = [_letters(i, False) for i in range(1, n + 1)]
    elif scheme == "digit":
        cores = [str(i) for i in range(1, n + 1)]
    elif scheme == "roman":
        cores = [_roman(i) for i in range(1, n + 1)]
    else:
        raise ValueError(f"unknown label scheme {scheme!r}")
    return [(decoration.format(core), core) for core in cores]


# ---------------------------------------------------------------------------------------------
# Configuration and samples


@dataclass(frozen=True)
class GeneratorConfig:
    """What a sample may look like; recorded in the dataset's ``info``. Ranges are inclusive."""

    width: tuple[int, int] = (448, 1024)  # figure width before degradation, pixels
    aspect: tuple[float, float] = (0.5, 2.5)  # width / height the figure may take
    max_panels: int = 12
    layout_kinds: tuple[tuple[str, float], ...] = tuple(LAYOUT_KINDS.items())
    inset_prob: float = 0.06  # per panel
    gutter: tuple[float, float] = (0.0, 0.03)  # share of the figure width
    padding: tuple[float, float] = (0.0, 0.04)
    colour_background_prob: float = 0.15
    label_prob: float = 0.9  # per figure: are panels labelled at all
    label_size: tuple[float, float] = (0.022, 0.055)  # glyph size, share of sqrt(width x height)
    placements: tuple[tuple[str, float], ...] = tuple(PLACEMENTS.items())
    box_styles: tuple[tuple[str, float], ...] = tuple(BOX_STYLES.items())
    distractor_prob: float = 0.35  # per panel
    double_jpeg_prob: float = 0.3
    downscale_prob: float = 0.35
    downscale: tuple[float, float] = (0.55, 0.95)
    jpeg_quality: tuple[int, int] = (50, 95)


@dataclass
class Sample:
    """One synthetic figure: the JPEG bytes and its annotations (``bbox`` [x, y, w, h] in the
    saved image's pixels; ``panel`` refers to the index of a label's panel in ``panels``,
    ``parent`` to the index of an inset's host panel)."""

    jpeg: bytes
    width: int
    height: int
    seed: int
    layout: dict
    panels: list[dict] = field(default_factory=list)
    labels: list[dict] = field(default_factory=list)
    fonts: set[str] = field(default_factory=set)
    degradation: dict = field(default_factory=dict)


def _choice(rng: random.Random, weighted: Iterable[tuple[str, float]]) -> str:
    items = list(weighted)
    return rng.choices([k for k, _ in items], weights=[w for _, w in items])[0]


def _aspect(node: Node, ratios: Iterator[float]) -> tuple[float, list]:
    """Natural width/height of ``node`` (children of a C share a height, of an R a width) and
    the tree of natural child weights."""
    if isinstance(node, Leaf):
        return next(ratios), []
    parts = [_aspect(child, ratios) for child in node.children]
    values = [a for a, _ in parts]
    if node.axis == "C":
        total = sum(values)
        return total, [(a / total, sub) for (a, sub) in parts]
    inverse = sum(1 / a for a in values)
    return 1 / inverse, [((1 / a) / inverse, sub) for (a, sub) in parts]


def _cells(node: Node, weights: list, rect: tuple[float, float, float, float], gutter: float, mix: float, out: list):
    """Append the integer cell of every leaf: children share ``rect`` by their weights mixed
    with equal weights (``mix`` 1 = equal); edges are rounded from the same floats, so
    neighbouring cells never overlap."""
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


def _brightness(image: Image.Image, box: tuple[int, int, int, int]) -> float:
    x0, y0, x1, y1 = box
    region = image.crop((max(0, x0), max(0, y0), max(x0 + 1, x1), max(y0 + 1, y1))).convert("L")
    return sum(i * c for i, c in enumerate(region.histogram())) / max(1, region.width * region.height)


def _contrast(image: Image.Image, box) -> tuple[int, int, int]:
    return (0, 0, 0) if _brightness(image, box) > 110 else (255, 255, 255)


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


BACKGROUNDS = [(245, 245, 245), (235, 240, 250), (250, 246, 232), (230, 230, 230), (0, 0, 0), (40, 40, 48)]


def generate_sample(
    sources: Sequence[SourcePanel],
    seed: int,
    index: int,
    split: str = "train",
    config: GeneratorConfig = GeneratorConfig(),  # noqa: B008 (frozen, so sharing is safe)
    cache: SourceCache | None = None,
    layout: str | None = None,
    picks: Sequence[int] | None = None,
) -> Sample:
    """Make sample ``index`` of ``split``. Everything random is drawn from
    ``sample_seed(seed, split, index)``, so the result depends only on these arguments (and
    ``sources`` in the same order). ``layout`` (a spec) and ``picks`` (a source index per
    panel, in reading order) fix what would otherwise be drawn: for tests and previews."""
    if not sources:
        raise ValueError("no source panels")
    cache = cache or SourceCache(8)
    s = sample_seed(seed, split, index)
    rng = random.Random(s)
    kind = _choice(rng, config.layout_kinds)
    root = random_layout(rng, kind, config.max_panels)
    root = _with_insets(root, rng, config.inset_prob)
    if layout is not None:
        root, kind = parse_layout(layout), "given"
    panels_spec = leaves(root)
    n = len(panels_spec)
    chosen = list(picks) if picks is not None else [rng.randrange(len(sources)) for _ in range(n)]
    if len(chosen) != n:
        raise ValueError(f"{len(chosen)} picks for {n} panels")
    images = [cache.get(sources[i]) for i in chosen]

    # figure geometry
    natural, weights = _aspect(root, iter(im.width / im.height for im in images))
    mix = rng.choice([0.0, 0.0, 0.5, 1.0])
    width = rng.randint(*config.width)
    aspect = min(max(natural, config.aspect[0]), config.aspect[1])
    height = max(64, round(width / aspect))
    gutter = rng.uniform(*config.gutter) * width if rng.random() > 0.15 else 0.0
    pad = rng.uniform(*config.padding) * width
    coloured = rng.random() < config.colour_background_prob
    background = rng.choice(BACKGROUNDS) if coloured else (255, 255, 255)
    canvas = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(canvas)

    # labels: decided before layout, since outside labels take room from their cells
    labelled = rng.random() < config.label_prob and n > 1
    texts: list[tuple[str, str]] = []
    font_name, font = "", None
    placement = box_style = ""
    if labelled:
        scheme = _choice(rng, LABEL_SCHEMES.items())
        decoration = _choice(rng, DECORATIONS.items())
        texts = label_texts(root, scheme, decoration, upper=rng.random() < 0.7)
        font_name = rng.choice(FONTS)
        size = max(9, round(rng.uniform(*config.label_size) * math.sqrt(width * height)))
        font = _font(font_name, size)
        placement = _choice(rng, config.placements)
        box_style = "plain" if placement.startswith("outside") else _choice(rng, config.box_styles)
    glyphs = [font.getbbox(t) for t, _ in texts] if font else []
    band = gap = 0
    if labelled:  # outside labels share a baseline (above) or end next to the panel (left)
        gap = max(1, round(rng.uniform(0.1, 0.3) * font.size))
        if placement == "outside_above":
            band = max(b[3] for b in glyphs) - min(b[1] for b in glyphs) + gap
        elif placement == "outside_left":
            band = max(b[2] - b[0] for b in glyphs) + gap

    cells: list[tuple[int, int, int, int]] = []
    _cells(root, weights, (pad, pad, width - pad, height - pad), gutter, mix, cells)
    h_align, v_align = rng.choice(["start", "center"]), rng.choice(["start", "center"])
    boxes, panels, labels, fonts = [], [], [], set()
    for leaf_i, ((cx0, cy0, cx1, cy1), image) in enumerate(zip(cells, images, strict=True)):
        ax0, ay0 = (
            cx0 + (band if placement == "outside_left" else 0),
            cy0 + (band if placement == "outside_above" else 0),
        )
        aw, ah = max(1, cx1 - ax0), max(1, cy1 - ay0)
        scale = min(aw / image.width, ah / image.height)
        pw, ph = max(1, min(aw, round(image.width * scale))), max(1, min(ah, round(image.height * scale)))
        px0 = ax0 + ((aw - pw) // 2 if h_align == "center" else 0)
        py0 = ay0 + ((ah - ph) // 2 if v_align == "center" else 0)
        canvas.paste(image.resize((pw, ph), Image.Resampling.BICUBIC, reducing_gap=2.0), (px0, py0))
        box = (px0, py0, px0 + pw, py0 + ph)
        boxes.append(box)
        source = sources[chosen[leaf_i]]
        panels.append(
            {
                "box": box,
                "source_key": source.key,
                "license_code": source.license_code,
                "license_group": source.license_group,
                "inset": False,
                "parent": None,
                "label_text": None,
                "label": None,
            }
        )
    host_count = len(panels)
    forbidden: list[list[tuple[int, int, int, int]]] = [[] for _ in range(host_count)]

    # labels
    for i in range(host_count if labelled else 0):
        text, core = texts[i]
        x0, y0, x1, y1 = boxes[i]
        gl, gt, gr, gb = glyphs[i]
        tw, th = gr - gl, gb - gt
        margin = max(1, round(rng.uniform(0.01, 0.04) * min(x1 - x0, y1 - y0)))
        padding = max(1, round(0.2 * th)) if box_style != "plain" else 0
        inset_by = margin + padding
        if placement == "outside_above":
            gx, gy = x0 + rng.randint(0, max(0, min(3, x1 - x0 - tw))), y0 - gap - max(b[3] for b in glyphs) + gt
        elif placement == "outside_left":
            gx, gy = x0 - gap - tw, y0 + min(margin, max(0, y1 - y0 - th))
        else:
            if tw + 2 * inset_by > x1 - x0 or th + 2 * inset_by > y1 - y0:
                continue  # the panel is too small for this label
            gx = x0 + inset_by if placement in ("inside_tl", "inside_bl") else x1 - inset_by - tw
            gy = y0 + inset_by if placement in ("inside_tl", "inside_tr") else y1 - inset_by - th
        glyph_box = (gx, gy, gx + tw, gy + th)
        if gx < 0 or gy < 0 or gx + tw > width or gy + th > height:
            continue
        if box_style == "plain":
            colour = _contrast(canvas, glyph_box)
        else:
            fill, colour = ((255, 255, 255), (0, 0, 0)) if box_style == "white_box" else ((0, 0, 0), (255, 255, 255))
            draw.rectangle((gx - padding, gy - padding, gx + tw + padding - 1, gy + th + padding - 1), fill=fill)
        draw.text((gx - gl, gy - gt), text, font=font, fill=colour)
        fonts.add(font_name)
        forbidden[i].append((gx - padding - 2, gy - padding - 2, gx + tw + padding + 2, gy + th + padding + 2))
        panels[i].update(label_text=text, label=core)
        labels.append({"box": glyph_box, "panel": i, "label_text": text, "label": core, "style": box_style})

    # insets, then distractors (never over a label or an inset)
    for i, leaf in enumerate(panels_spec):
        if leaf.inset:
            inset_box = _draw_inset(canvas, draw, rng, boxes[i], images[i], placement, forbidden[i])
            if inset_box is not None:
                forbidden[i].append(inset_box)
                source = panels[i]
                panels.append(
                    source | {"box": inset_box, "inset": True, "parent": i, "label_text": None, "label": None}
                )
    for i in range(host_count):
        if rng.random() < config.distractor_prob:
            for _ in range(rng.choice([1, 1, 2])):
                used = _draw_distractor(canvas, draw, rng, boxes[i], forbidden[i])
                if used:
                    fonts.add(used)

    # degradation
    degradation = {"double_jpeg": None, "scale": 1.0, "quality": None}
    if rng.random() < config.double_jpeg_prob:
        q1 = rng.randint(60, 95)
        buffer = io.BytesIO()
        canvas.save(buffer, "JPEG", quality=q1)
        canvas = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
        degradation["double_jpeg"] = q1
    sx = sy = 1.0
    if rng.random() < config.downscale_prob:
        factor = rng.uniform(*config.downscale)
        new = (max(32, round(width * factor)), max(32, round(height * factor)))
        sx, sy = new[0] / width, new[1] / height
        canvas = canvas.resize(new, Image.Resampling.BICUBIC, reducing_gap=2.0)
        degradation["scale"] = round(factor, 4)
    quality = rng.randint(*config.jpeg_quality)
    degradation["quality"] = quality
    buffer = io.BytesIO()
    canvas.save(buffer, "JPEG", quality=quality)

    def scaled(box):
        x0, y0, x1, y1 = box
        left, top, right, bottom = (round(v, 2) for v in (x0 * sx, y0 * sy, x1 * sx, y1 * sy))
        return [left, top, round(right - left, 2), round(bottom - top, 2)]  # shared edges stay shared

    for item in panels + labels:
        item["bbox"] = scaled(item.pop("box"))
    n_insets = sum(p["inset"] for p in panels)
    return Sample(
        jpeg=buffer.getvalue(),
        width=canvas.width,
        height=canvas.height,
        seed=s,
        layout={
            "kind": kind,
            "spec": format_layout(root),
            "panels": len(panels),
            "insets": n_insets,
            "labels": len(labels),
            "label_placement": placement or None,
            "label_style": box_style or None,
            "label_font": font_name or None,
            "label_size": font.size if font else None,
            "gutter": round(gutter, 2),
            "padding": round(pad, 2),
            "background": list(background),
        },
        panels=panels,
        labels=labels,
        fonts=fonts,
        degradation=degradation,
    )


INSET_COLOURS = [(255, 255, 255), (255, 255, 0), (255, 0, 0), (0, 0, 0), (0, 200, 255)]
CORNERS = ("tl", "tr", "bl", "br")
OPPOSITE = {"tl": "br", "tr": "bl", "bl": "tr", "br": "tl"}


def _draw_inset(canvas, draw, rng, host, image, placement, forbidden):
    """Draw a zoomed part of the host panel in one of its corners, with the zoom box and two
    connector lines; return the inset's box (border included) or None when the host is too
    small."""
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


def _draw_distractor(canvas, draw, rng, host, forbidden) -> str | None:
    """Draw one legend, colour bar, scale bar, text block or arrow set inside ``host`` where it
    covers nothing in ``forbidden``; return the font used (None when nothing or no text was
    drawn)."""
    x0, y0, x1, y1 = host
    pw, ph = x1 - x0, y1 - y0
    if pw < 48 or ph < 48:
        return None
    kind = rng.choice(["legend", "colour_bar", "scale_bar", "text", "arrows"])
    font_name = rng.choice(FONTS)
    font = _font(font_name, max(8, round(min(pw, ph) * rng.uniform(0.025, 0.045))))
    line_h = font.getbbox("Ag")[3] + 2
    if kind == "legend":
        entries = rng.sample(WORDS, rng.randint(2, 4))
        w = max(font.getbbox(e)[2] for e in entries) + line_h + 8
        size = (w, line_h * len(entries) + 6)
    elif kind == "colour_bar":
        size = (
            max(6, round(pw * rng.uniform(0.03, 0.05))) + font.getbbox("1.0")[2] + 4,
            round(ph * rng.uniform(0.4, 0.7)),
        )
    elif kind == "scale_bar":
        text = rng.choice(SCALES)
        bar = round(pw * rng.uniform(0.12, 0.3))
        size = (max(bar, font.getbbox(text)[2]), line_h + max(2, round(ph * 0.02)) + 2)
    elif kind == "text":
        lines = rng.sample(WORDS, rng.randint(1, 3))
        size = (max(font.getbbox(t)[2] for t in lines), line_h * len(lines))
    else:
        size = (round(min(pw, ph) * 0.15), round(min(pw, ph) * 0.15))
    w, h = size
    if w >= pw - 4 or h >= ph - 4:
        return None
    for _ in range(6):
        bx, by = rng.randint(x0 + 2, x1 - 2 - w), rng.randint(y0 + 2, y1 - 2 - h)
        box = (bx, by, bx + w, by + h)
        if not any(_overlaps(box, f) for f in forbidden):
            break
    else:
        return None
    forbidden.append(box)
    ink = _contrast(canvas, box)
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
            draw.text((bx + line_h + 4, ey), entry, font=font, fill=ink)
        return font_name
    if kind == "colour_bar":
        stops = rng.choice(COLOURMAPS)
        bar_w = max(6, round(pw * 0.04))
        for row in range(h):
            draw.line((bx, by + row, bx + bar_w - 1, by + row), fill=_gradient(stops, 1 - row / max(1, h - 1)))
        draw.rectangle((bx, by, bx + bar_w - 1, by + h - 1), outline=ink)
        top = rng.choice(["1.0", "100", "5", "max"])
        draw.text((bx + bar_w + 2, by), top, font=font, fill=ink)
        draw.text((bx + bar_w + 2, by + h - line_h), "0", font=font, fill=ink)
        return font_name
    if kind == "scale_bar":
        thick = max(2, round(ph * 0.02))
        draw.text((bx + (w - font.getbbox(text)[2]) // 2, by), text, font=font, fill=ink)
        draw.rectangle((bx + (w - bar) // 2, by + h - thick, bx + (w + bar) // 2 - 1, by + h - 1), fill=ink)
        return font_name
    if kind == "text":
        for k, line in enumerate(lines):
            draw.text((bx, by + k * line_h), line, font=font, fill=ink)
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


# ---------------------------------------------------------------------------------------------
# Source selection from the lake


def source_panels(
    lake,
    release: str,
    shards: Iterable[str],
    commercial_only: bool = False,
    is_single: Callable[[Image.Image], bool] | None = None,
) -> Iterator[SourcePanel]:
    """Single-panel figure images of ``release``'s ``shards``, with their article's licence.

    A figure image is single panel when ``figure_concepts`` says ``panel_type == 'single
    panel'``; a labelled figure of another panel type is skipped; an unlabelled one is kept
    only when ``is_single`` (a layout check on the decoded image) says so, and skipped when no
    check is given. ``commercial_only`` keeps only the ``commercial`` licence group. Images are
    read from the raw tars only when used (the check decodes them once)."""
    from pipelines.acquire.rawstore import read_raw_file

    for shard in shards:
        tables = {}
        for name in ("articles", "figures", "raw_files", "figure_concepts"):
            found = lake.read_table(name, release, shard)
            tables[name] = found.to_pylist() if found is not None else []
        articles = {r["pmcid"]: r for r in tables["articles"]}
        raw = {(r["pmcid"], r["name"]): r for r in tables["raw_files"]}
        concepts = {(r["pmcid"], r["fig_id"], r["image_file"]): r for r in tables["figure_concepts"]}
        for fig in tables["figures"]:
            article = articles.get(fig["pmcid"])
            if article is None or (commercial_only and article["license_group"] != "commercial"):
                continue
            hashes = fig["phash"] or []
            for index, name in enumerate(fig["image_files"] or []):
                row = raw.get((fig["pmcid"], name))
                if row is None or not row["size"]:
                    continue
                panel_type = (concepts.get((fig["pmcid"], fig["fig_id"], name)) or {}).get("panel_type")
                member = {"tar_path": row["tar_path"], "offset": row["offset"], "size": row["size"]}

                def loader(member=member) -> bytes:
                    return read_raw_file(lake, member)

                if panel_type is not None:
                    if panel_type != SINGLE_PANEL:
                        continue
                elif is_single is None:
                    continue
                else:
                    image, _ = decode_image(loader())
                    if image is None or not is_single(image):
                        continue
                yield SourcePanel(
                    key=f"{fig['pmcid']}/{name}",
                    image=loader,
                    license_code=article["license_code"],
                    license_group=article["license_group"],
                    phash=hashes[index] if index < len(hashes) else None,
                )


# ---------------------------------------------------------------------------------------------
# The COCO writer


@dataclass
class _Checked:
    source: SourcePanel
    phash: str
    width: int
    height: int
    split: str = "train"
    uses: int = 0


def _check_sources(sources: Iterable[SourcePanel]) -> tuple[list[_Checked], list[dict]]:
    """Decode every source once (one at a time) for its size and dHash; undecodable ones are
    returned as problems."""
    checked, problems, seen = [], [], set()
    for source in sources:
        if source.key in seen:
            problems.append({"key": source.key, "problem": "duplicate key"})
            continue
        seen.add(source.key)
        try:
            image = load_source(source)
        except ValueError as exc:
            problems.append({"key": source.key, "problem": str(exc)})
            continue
        checked.append(_Checked(source, source.phash or dhash(image), image.width, image.height))
    return checked, problems


def split_sources(checked: list[_Checked], seed: int, val_share: float, max_distance: int) -> int:
    """Assign each source to train or val (by a hash of seed and key, about ``val_share`` to
    val), then drop from val every source within ``max_distance`` dHash bits of a train source.
    Returns how many were dropped (their ``split`` becomes "dropped")."""
    for item in checked:
        item.split = "val" if _unit(seed, "split", item.source.key) < val_share else "train"
    rows = [
        {"pmcid": str(i), "fig_id": None, "image_files": ["x"], "sha256": None, "phash": [item.phash]}
        for i, item in enumerate(checked)
    ]
    dropped = 0
    for pair in find_duplicates(rows, max_distance):
        a, b = checked[int(pair["pmcid"])], checked[int(pair["other_pmcid"])]
        if a.split == "val" and b.split == "train":
            a.split = "dropped"
            dropped += 1
    return dropped


def _write_json_stream(path: Path, head: dict, parts: list[tuple[str, Path | list]]) -> None:
    """Write ``head`` plus one JSON array per part (a JSON-lines file or a list) as one JSON
    object, without loading the JSON-lines files; atomically."""
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(json.dumps(head, ensure_ascii=False)[:-1])
        for name, part in parts:
            out.write(f', "{name}": [')
            if isinstance(part, list):
                out.write(", ".join(json.dumps(p, ensure_ascii=False) for p in part))
            else:
                with open(part, encoding="utf-8") as lines:
                    for k, line in enumerate(lines):
                        out.write((", " if k else "") + line.rstrip("\n"))
            out.write("]")
        out.write("}\n")
    os.replace(tmp, path)


def write_coco_dataset(
    out_dir: str | os.PathLike[str],
    sources: Iterable[SourcePanel],
    n: int,
    seed: int,
    split: float = 0.1,
    config: GeneratorConfig = GeneratorConfig(),  # noqa: B008
    max_distance: int = NEAR_DISTANCE,
) -> dict:
    """Write ``n`` synthetic figures as COCO datasets ``out_dir/train`` and ``out_dir/val``
    (``round(n * split)`` val images made only from val sources), each with ``images/``,
    ``annotations.json`` and ``sources.json``, plus ``out_dir/summary.json``; return the
    summary. Sources are split by a hash of their key and de-duplicated across the splits
    (dHash within ``max_distance`` bits: the val copy is dropped). One image is held at a time;
    annotations go through JSON-lines files on disk."""
    if not 0 <= split < 1:
        raise ValueError(f"split is the val share, in [0, 1): {split}")
    started = time.perf_counter()
    out = Path(out_dir)
    checked, problems = _check_sources(sources)
    dropped = split_sources(checked, seed, split, max_distance)
    n_val = round(n * split)
    plan = {"train": n - n_val, "val": n_val}
    summary: dict = {
        "version": GENERATOR_VERSION,
        "seed": seed,
        "val_share": split,
        "sources": len(checked),
        "undecodable_sources": problems,
        "dedup": {"hash": "dhash", "max_distance": max_distance, "dropped_near_duplicates": dropped},
        "splits": {},
    }
    for name, count in plan.items():
        pool = [c for c in checked if c.split == name]
        if count and not pool:
            raise ValueError(f"no source panels left for {name} ({len(checked)} sources, {dropped} dropped)")
        if count:
            summary["splits"][name] = _write_split(out / name, name, pool, count, seed, config, summary)
    listing = [
        {"key": c.source.key, "license_code": c.source.license_code, "license_group": c.source.license_group}
        | {"dhash": c.phash, "split": c.split}
        for c in checked
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources.json").write_text(json.dumps(listing, indent=1, ensure_ascii=False) + "\n")
    summary["seconds"] = round(time.perf_counter() - started, 3)
    total = sum(s["images"] for s in summary["splits"].values())
    summary["images_per_second"] = round(total / max(summary["seconds"], 1e-9), 2)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def _write_split(folder: Path, split: str, pool: list[_Checked], count: int, seed: int, config, summary) -> dict:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    images_jsonl, annotations_jsonl = folder / "images.jsonl.tmp", folder / "annotations.jsonl.tmp"
    cache = SourceCache()
    sources = [c.source for c in pool]
    counts = {"images": 0, "panels": 0, "insets": 0, "labels": 0}
    fonts: set[str] = set()
    kinds: dict[str, int] = {}
    by_key = {c.source.key: c for c in pool}
    started = time.perf_counter()
    annotation_id = 0
    with open(images_jsonl, "w", encoding="utf-8") as im_out, open(annotations_jsonl, "w", encoding="utf-8") as an_out:
        for index in range(count):
            sample = generate_sample(sources, seed, index, split, config, cache)
            image_id = index + 1
            file_name = f"{image_id:08d}.jpg"  # COCO: relative to images/, as train.py and coco_eval read it
            (folder / "images" / file_name).write_bytes(sample.jpeg)
            record = {
                "id": image_id,
                "index": index,
                "file_name": file_name,
                "width": sample.width,
                "height": sample.height,
                "seed": sample.seed,
                "layout": sample.layout,
                "degradation": sample.degradation,
            }
            im_out.write(json.dumps(record, ensure_ascii=False) + "\n")
            panel_ids = list(range(annotation_id + 1, annotation_id + 1 + len(sample.panels)))
            annotation_id += len(sample.panels)
            for k, panel in enumerate(sample.panels):
                _, _, w, h = panel["bbox"]
                an_out.write(
                    json.dumps(
                        {
                            "id": panel_ids[k],
                            "image_id": image_id,
                            "category_id": PANEL,
                            "bbox": panel["bbox"],
                            "area": round(w * h, 2),
                            "iscrowd": 0,
                            "label_text": panel["label_text"],
                            "label": panel["label"],
                            "inset": panel["inset"],
                            "parent_id": panel_ids[panel["parent"]] if panel["parent"] is not None else None,
                            "source_key": panel["source_key"],
                            "license_code": panel["license_code"],
                            "license_group": panel["license_group"],
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
            for label in sample.labels:
                annotation_id += 1
                _, _, w, h = label["bbox"]
                an_out.write(
                    json.dumps(
                        {
                            "id": annotation_id,
                            "image_id": image_id,
                            "category_id": PANEL_LABEL,
                            "bbox": label["bbox"],
                            "area": round(w * h, 2),
                            "iscrowd": 0,
                            "label_text": label["label_text"],
                            "label": label["label"],
                            "panel_id": panel_ids[label["panel"]],
                            "style": label["style"],
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
            for panel in sample.panels:
                if not panel["inset"]:
                    by_key[panel["source_key"]].uses += 1
            counts["images"] += 1
            counts["panels"] += len(sample.panels)
            counts["insets"] += sample.layout["insets"]
            counts["labels"] += len(sample.labels)
            fonts |= sample.fonts
            kinds[sample.layout["kind"]] = kinds.get(sample.layout["kind"], 0) + 1
    seconds = time.perf_counter() - started
    info = {
        "description": "PanelForge synthetic compound figures (panels and panel labels)",
        "version": GENERATOR_VERSION,
        "split": split,
        "seed": seed,
        "sample_seed": "blake2b-64 of '{seed}:{split}:{index}', big-endian; image id = index + 1",
        "counts": counts | {"sources": len(pool), "layouts": dict(sorted(kinds.items()))},
        "fonts": sorted(fonts),
        "dedup": summary["dedup"],
        "config": asdict(config),
    }
    _write_json_stream(
        folder / "annotations.json",
        {"info": info, "licenses": []},
        [("images", images_jsonl), ("annotations", annotations_jsonl), ("categories", CATEGORIES)],
    )
    images_jsonl.unlink()
    annotations_jsonl.unlink()
    listing = [
        {
            "key": c.source.key,
            "license_code": c.source.license_code,
            "license_group": c.source.license_group,
            "dhash": c.phash,
            "width": c.width,
            "height": c.height,
            "uses": c.uses,
        }
        for c in pool
    ]
    (folder / "sources.json").write_text(json.dumps(listing, indent=1, ensure_ascii=False) + "\n")
    return counts | {
        "sources": len(pool),
        "fonts": sorted(fonts),
        "seconds": round(seconds, 3),
        "images_per_second": round(counts["images"] / max(seconds, 1e-9), 2),
    }
