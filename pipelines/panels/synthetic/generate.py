"""One synthetic compound figure from its seed: the order of the draws, and the sample it gives.

Every random decision of sample ``index`` of ``split`` is drawn from one
``random.Random(sample_seed(seed, split, index))``, in a fixed order: the layout, the sources, the
figure's geometry, its label style, the panels' alignment, each label, each inset, the
distractors, the degradation. That order is what makes a sample reproducible byte for byte from
its recorded seed, so it lives here in one short function; what each step draws and paints lives
in the module named for it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from pipelines.panels.synthetic.degrade import degrade, scaled_bbox
from pipelines.panels.synthetic.distractors import draw_distractors
from pipelines.panels.synthetic.draw import Box, draw_inset, draw_labels, paste_panels
from pipelines.panels.synthetic.labels import BOX_STYLES, PLACEMENTS, LabelPlan, plan_labels
from pipelines.panels.synthetic.layout import (
    LAYOUT_KINDS,
    Node,
    format_layout,
    layout_cells,
    leaves,
    natural_aspect,
    parse_layout,
    random_layout,
    with_insets,
)
from pipelines.panels.synthetic.seeds import sample_seed, weighted_choice
from pipelines.panels.synthetic.sources import SourceCache, SourcePanel

GENERATOR_VERSION = "panelforge-synthetic/1"
BACKGROUNDS = [(245, 245, 245), (235, 240, 250), (250, 246, 232), (230, 230, 230), (0, 0, 0), (40, 40, 48)]


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


@dataclass(frozen=True)
class Geometry:
    """The figure before anything is pasted: its size, the gutter between cells and the padding
    around them, the background, and how the cells share space (``weights`` from the sources'
    aspect ratios, mixed with equal shares by ``mix``)."""

    width: int
    height: int
    gutter: float
    pad: float
    background: tuple[int, int, int]
    mix: float
    weights: list


def draw_layout(rng: random.Random, config: GeneratorConfig, layout: str | None) -> tuple[str, Node]:
    """(kind, tree): a random layout with insets, or ``layout`` parsed (kind "given"); the random
    one is drawn either way, so a given layout leaves the later draws as they were."""
    kind = weighted_choice(rng, config.layout_kinds)
    root = with_insets(random_layout(rng, kind, config.max_panels), rng, config.inset_prob)
    return ("given", parse_layout(layout)) if layout is not None else (kind, root)


def pick_sources(rng: random.Random, panels: int, available: int, picks: Sequence[int] | None) -> list[int]:
    """A source index per panel in reading order: ``picks`` when given, else drawn."""
    chosen = list(picks) if picks is not None else [rng.randrange(available) for _ in range(panels)]
    if len(chosen) != panels:
        raise ValueError(f"{len(chosen)} picks for {panels} panels")
    return chosen


def draw_geometry(rng: random.Random, config: GeneratorConfig, root: Node, images: Sequence[Image.Image]) -> Geometry:
    """The figure's size follows the sources' natural aspect ratio within ``config.aspect``."""
    natural, weights = natural_aspect(root, iter(im.width / im.height for im in images))
    mix = rng.choice([0.0, 0.0, 0.5, 1.0])
    width = rng.randint(*config.width)
    aspect = min(max(natural, config.aspect[0]), config.aspect[1])
    height = max(64, round(width / aspect))
    gutter = rng.uniform(*config.gutter) * width if rng.random() > 0.15 else 0.0
    pad = rng.uniform(*config.padding) * width
    coloured = rng.random() < config.colour_background_prob
    background = rng.choice(BACKGROUNDS) if coloured else (255, 255, 255)
    return Geometry(width, height, gutter, pad, background, mix, weights)


def panel_record(box: Box, source: SourcePanel) -> dict:
    """A panel's annotation before scaling (``box``) with its source's key and licence."""
    return {
        "box": box,
        "source_key": source.key,
        "license_code": source.license_code,
        "license_group": source.license_group,
        "inset": False,
        "parent": None,
        "label_text": None,
        "label": None,
    }


def add_insets(
    canvas: Image.Image, draw: ImageDraw.ImageDraw, rng: random.Random, root: Node, panels: list[dict],
    images: Sequence[Image.Image], placement: str, forbidden: list[list[Box]],
) -> None:  # fmt: skip
    """Draw the insets the layout asks for and append each as a panel whose parent is its host
    (an inset that does not fit its host is left out)."""
    for i, leaf in enumerate(leaves(root)):
        if not leaf.inset:
            continue
        box = draw_inset(canvas, draw, rng, panels[i]["box"], images[i], placement)
        if box is not None:
            forbidden[i].append(box)
            panels.append(panels[i] | {"box": box, "inset": True, "parent": i, "label_text": None, "label": None})


def layout_record(kind: str, root: Node, geometry: Geometry, plan: LabelPlan, panels: list, labels: list) -> dict:
    """What the sample's ``layout`` records: the spec to make it again and the style drawn."""
    return {
        "kind": kind,
        "spec": format_layout(root),
        "panels": len(panels),
        "insets": sum(p["inset"] for p in panels),
        "labels": len(labels),
        "label_placement": plan.placement or None,
        "label_style": plan.box_style or None,
        "label_font": plan.font_name or None,
        "label_size": plan.font.size if plan.font else None,
        "gutter": round(geometry.gutter, 2),
        "padding": round(geometry.pad, 2),
        "background": list(geometry.background),
    }


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
    kind, root = draw_layout(rng, config, layout)
    chosen = pick_sources(rng, len(leaves(root)), len(sources), picks)
    images = [cache.get(sources[i]) for i in chosen]
    geometry = draw_geometry(rng, config, root, images)
    canvas = Image.new("RGB", (geometry.width, geometry.height), geometry.background)
    draw = ImageDraw.Draw(canvas)
    # labels are decided before the panels are placed: outside labels take room from their cells
    plan = plan_labels(rng, config, root, geometry.width, geometry.height)
    inner = (geometry.pad, geometry.pad, geometry.width - geometry.pad, geometry.height - geometry.pad)
    cells = layout_cells(root, geometry.weights, inner, geometry.gutter, geometry.mix)
    boxes = paste_panels(canvas, rng, cells, images, plan)
    panels = [panel_record(box, sources[i]) for box, i in zip(boxes, chosen, strict=True)]
    forbidden: list[list[Box]] = [[] for _ in boxes]  # per panel: what later marks must not cover
    labels = draw_labels(canvas, draw, rng, plan, boxes, forbidden)
    for label in labels:
        panels[label["panel"]].update(label_text=label["label_text"], label=label["label"])
    add_insets(canvas, draw, rng, root, panels, images, plan.placement, forbidden)
    fonts = ({plan.font_name} if labels else set()) | draw_distractors(
        canvas, draw, rng, boxes, forbidden, config.distractor_prob
    )
    jpeg, published, degradation = degrade(canvas, rng, config)
    sx, sy = published.width / geometry.width, published.height / geometry.height
    for item in panels + labels:
        item["bbox"] = scaled_bbox(item.pop("box"), sx, sy)
    return Sample(
        jpeg=jpeg,
        width=published.width,
        height=published.height,
        seed=s,
        layout=layout_record(kind, root, geometry, plan, panels, labels),
        panels=panels,
        labels=labels,
        fonts=fonts,
        degradation=degradation,
    )
