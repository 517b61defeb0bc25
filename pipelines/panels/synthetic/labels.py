"""Panel labels as PMC's figures print them: the texts, the fonts, and one figure's label style.

A detector trained on one label style misses the others, so a figure's labels are drawn from the
styles found in PMC: letters, digits, roman numerals or letter-number pairs per group (A, a, (A),
(a), A), a), A., a., 1, (1), 1., i, (i), A1/A2), bold or regular, in DejaVu Sans/Serif/Mono or
STIX (fonts matplotlib ships, under permissive licences), sized relative to the figure, inside a
corner of the panel or outside above or left of it, plain or in a white or black box. One figure
uses one style throughout, as journals do; :func:`plan_labels` draws it before the panels are
placed, because labels outside a panel take room from its cell.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import ImageFont

from pipelines.panels.synthetic.layout import Node, Split, leaves
from pipelines.panels.synthetic.seeds import weighted_choice

if TYPE_CHECKING:
    from pipelines.panels.synthetic.generate import GeneratorConfig

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
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    """The TrueType font ``name`` (one of ``FONTS``) at ``size`` pixels (loaded once)."""
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


@dataclass
class LabelPlan:
    """One figure's label style. ``texts``: (printed, core) per panel in reading order;
    ``glyphs``: each text's bounding box in ``font``; ``gap``: pixels between an outside label and
    its panel; ``band``: the room an outside label takes from its cell (above or left). The
    default is an unlabelled figure."""

    texts: list[tuple[str, str]] = field(default_factory=list)
    font_name: str = ""
    font: ImageFont.FreeTypeFont | None = None
    placement: str = ""
    box_style: str = ""
    glyphs: list[tuple[int, int, int, int]] = field(default_factory=list)
    gap: int = 0
    band: int = 0

    @property
    def labelled(self) -> bool:
        return self.font is not None


def plan_labels(rng: random.Random, config: GeneratorConfig, root: Node, width: int, height: int) -> LabelPlan:
    """Draw whether the figure is labelled (a single panel never is) and, if so, its style; outside
    labels share a baseline (above) or end next to the panel (left), which sets their band."""
    if not (rng.random() < config.label_prob and len(leaves(root)) > 1):
        return LabelPlan()
    scheme = weighted_choice(rng, LABEL_SCHEMES.items())
    decoration = weighted_choice(rng, DECORATIONS.items())
    texts = label_texts(root, scheme, decoration, upper=rng.random() < 0.7)
    font_name = rng.choice(FONTS)
    size = max(9, round(rng.uniform(*config.label_size) * math.sqrt(width * height)))
    face = font(font_name, size)
    placement = weighted_choice(rng, config.placements)
    box_style = "plain" if placement.startswith("outside") else weighted_choice(rng, config.box_styles)
    glyphs = [face.getbbox(t) for t, _ in texts]
    gap = max(1, round(rng.uniform(0.1, 0.3) * face.size))
    band = 0
    if placement == "outside_above":
        band = max(b[3] for b in glyphs) - min(b[1] for b in glyphs) + gap
    elif placement == "outside_left":
        band = max(b[2] - b[0] for b in glyphs) + gap
    return LabelPlan(texts, font_name, face, placement, box_style, glyphs, gap, band)
