"""The figure-level panel decision: ``panels_for_figure(image, caption)``.

It is what the ``panels`` stage keeps for a figure when no detector weights are configured, and
the fallback and second opinion around the detector when they are. Each piece of evidence can
be switched off (``evidence``), so that the benchmark measures what each one adds:

* ``labels`` - printed panel labels read by OCR (``pipelines.panels.labels``). A figure whose
  labels form a sequence of two or more is cut so that every label gets its own region
  (``partition_by_labels``): the region is cut at the gutters (white, then divider lines, then
  the figure's background colour) of the axis whose gutters part the labels most clearly
  (``_parting``: panels are set apart by wider gutters than their own parts), then of the axis
  that separates the most labels; the pieces without a label belong to the label that precedes
  them in that direction (labels are printed at a panel's top-left) or, when the figure prints
  its labels below the panels, to the one that follows them down the page and to the nearer
  side of the widest gutter across it (``_along``); a piece with no label on that side
  is shared (a title, a legend for all) and left out, unless it is a chart or picture of its
  own that no panel spans: a panel whose label was not read, kept without a label (also where
  every label stands in one piece of a cut, ``_beside_unlabelled``); a region with one label is
  one panel, whatever gutters it has inside (a grid of micrograph tiles under one label is one
  panel). A cut that leaves a label's region without graphic content (only its glyph, or an
  axis title) is refused. Labels no gutter
  separates are parted by anchoring (``_part_at_labels``): each block of the region goes to
  the label above and to the left of it, a block holding several labels is parted at their
  own edges, and a block that stretches its label's panel over the next one's (a chart's tick
  labels sticking out to the left of its label, under the label above) goes to that next
  label (``_untangle``). Where the caption names two or more panels, its labels include every label read,
  and the regions are not that many (a label not read leaves its panel joined to a neighbour)
  while the layout splitter's gutters give a count nearer the caption's, the layout's panels
  are kept and each label read names the panel it stands in (route ``labels+layout``): a
  decision is never worse than the gutters alone where the caption can tell.
* ``caption`` - the caption's panel labels (``captions.split_caption``, ``pairing.panel_labels``).
  They restrict the label readings to the caption's labels and scheme (digits and Roman
  numerals count only where the caption uses them; a caption split wrongly cannot hide two more
  labels read without it), name the labels that were not read (``fill_missing``: the region
  that holds such a panel is parted at its widest gutter between graphic blocks, down to
  ``NARROW_GUTTER``: two frames a line of white apart), and a
  caption that names no panel keeps a figure without labels whole unless a clear gutter
  (``UNNAMED_GUTTER``), a row of like photographs or a grid of like charts, each with its own
  axes and data marks (small multiples, ``_chart_row``), parts it. A caption that speaks of
  its panels without labels ("the left panel ... the right panel", "on the left ... on the
  right", "in each panel", ``captions.panels_mentioned``) names no label but is no single
  figure's.
* ``structure`` - chart structure (``pipelines.panels.regions``). Without labels the figure
  is cut only where the cut leaves two or more graphic blocks of comparable size; tick-label
  strips, axis titles, legends, colour bars and titles join the block beside them. Without
  this evidence the layout splitter's own answer (``layout.split_panels``) is used. Here too
  the caption's panel count arbitrates: the layout's panels are kept (route ``layout``) where
  their count is nearer the number of panels the caption names.
* ``kind`` - the concept stage's ``panel_type``: a figure labelled ``single panel`` stays whole
  unless two or more printed labels are read.

Boxes are in the original image's pixels, in reading order, ``label`` set where a printed label
was read (a panel parted off because its label was not read has none). A figure of one colour,
or with a side under ``inputs.MIN_SIDE`` pixels, has no panel; ``decide`` says why.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from pipelines.images.boxes import Box, Panel, area, finalize, intersection, scale_boxes, within
from pipelines.images.components import components
from pipelines.images.decode import UnusableFigureError, is_loaded, normalize_mode, open_image
from pipelines.panels.inputs import MIN_SIDE, FigureSplit, prepare_figure
from pipelines.panels.labels import (
    LabelReader,
    PrintedLabel,
    get_reader,
    label_index,
    missing_labels,
    read_labels,
)
from pipelines.panels.layout import MAX_DEPTH, MAX_PANELS, Sheet, make_sheet, split_panels, trim_box
from pipelines.panels.regions import GRAPHIC_TEXT_HEIGHTS, Structure, cut, ink_structure, union
from pipelines.text.captions import panels_mentioned, split_caption
from pipelines.text.pairing import panel_labels

EVIDENCE = ("labels", "caption", "structure", "kind")
DECISION_VERSION = 2  # results of another version are not carried over to a new release
SINGLE_PANEL = "single panel"
UNNAMED_GUTTER = 0.04  # of the longest side: the gutter that parts a figure whose caption names no panel
SHARED_COVER = 0.8  # an unlabelled piece joins a panel that spans this much of it across the cut
PHOTO_ROW, LIKE_SIZE, PHOTO_INK = 3, 1.3, 0.5  # see _photo_row
AXIS_SHARE, MARK_TEXT_HEIGHTS = 0.5, 1.5  # see _chart_row, _is_chart
NARROW_GUTTER = 2  # work pixels: see split_in
MAX_LEAVES = 400  # blocks a region is broken into when its labels are parted by anchoring
PICTURE_RING = 0.8  # of the pixels around a label: ink, where it is printed inside a picture


@dataclass
class Decision:
    """What ``decide`` found: the panels and the evidence behind them."""

    panels: list[Panel]
    route: str  # labels | labels+layout | structure | layout | single | uniform
    labels: list[PrintedLabel] = field(default_factory=list)  # the chosen label sequence
    readings: list[PrintedLabel] = field(default_factory=list)  # every reading that is a label
    caption_labels: list[str] | None = None
    candidates: int = 0


@dataclass
class _Label:
    box: Box  # work pixels
    text: str

    @property
    def centre(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


def panels_for_figure(
    image: Image.Image,
    caption: str | None = None,
    *,
    panel_type: str | None = None,
    reader: LabelReader | None = None,
    evidence: Collection[str] = EVIDENCE,
) -> list[Panel]:
    """The panels of one figure (module doc). ``caption``: the figure's caption (None when not
    known; "" is a caption without labels); ``panel_type``: the concept stage's label;
    ``reader``: the OCR engine (default Tesseract); ``evidence``: which evidence to use."""
    return decide(image, caption, panel_type=panel_type, reader=reader, evidence=evidence).panels


def decide(
    image: Image.Image,
    caption: str | None = None,
    *,
    panel_type: str | None = None,
    reader: LabelReader | None = None,
    evidence: Collection[str] = EVIDENCE,
) -> Decision:
    """``panels_for_figure`` with the evidence it used. An image only opened (``Image.open``) is
    decoded by the one decoder's rule first: a truncated, corrupt or over-the-cap file raises
    ``UnusableFigureError`` (a ``ValueError``) with the reason every stage records, never ``OSError``."""
    if not is_loaded(image):
        figure = open_image(image)
        if figure.reason is not None:
            raise UnusableFigureError(figure.reason)
        image = figure.image
    if min(image.size) < MIN_SIDE:
        return Decision(panels=[], route="too small")
    image = normalize_mode(image)
    sheet = make_sheet(image)
    h, w = sheet.gray.shape
    root = trim_box(sheet.masks[0], (0, 0, w, h))
    if root is None or trim_box(sheet.colour_masks[-1], (0, 0, w, h)) is None:
        return Decision(panels=[], route="uniform")
    caption_labels, named = None, None
    if "caption" in evidence and caption is not None:
        caption_labels, named = caption_evidence(caption)
    decision = Decision(panels=[], route="layout", caption_labels=caption_labels)
    labels: list[PrintedLabel] = []
    scheme: str | None = None
    if "labels" in evidence:
        found = read_labels(image, sheet.gray, reader or get_reader(), caption_labels)
        labels, scheme = found.labels, found.scheme
        decision.candidates, decision.readings, decision.labels = found.candidates, found.readings, labels
    if named == 0 and len(labels) >= 2 and "structure" in evidence and missing_labels(labels, scheme, caption_labels):
        # a caption that names no panel is evidence of a single figure, and labels read with gaps
        # in their sequence ("A", "C", "E"; "A1" and "C") are weak evidence of several: the
        # letters of a chart or a table's words read as labels. Together they part nothing.
        labels = decision.labels = []
    if len(labels) >= 2:
        work = [_Label(_to_work(sheet, lab.box), lab.text) for lab in labels]
        direction = _direction(root, work)
        missing = missing_labels(labels, scheme, caption_labels) if "structure" in evidence else []
        first_missing = bool(missing) and min(label_index(lab.text, scheme) for lab in labels) > 0
        structure = ink_structure(sheet)
        parts = partition_by_labels(sheet, structure, root, work, direction, first_missing)
        if missing:
            parts = fill_missing(sheet, structure, parts, work, scheme, missing, direction)
        decision.route = "labels"
        panels = [Panel(box=sheet.to_original(box), label=text) for box, text in parts]
        panels = finalize(panels, sheet.width, sheet.height, single=False)
        # the caption's count holds where the labels read are the caption's labels
        trusted = (
            named
            if caption_labels and {lab.text.casefold() for lab in labels} <= {x.casefold() for x in caption_labels}
            else None
        )
        if "structure" in evidence and _off_count(panels, trusted):
            # labels not read leave panels joined: where the layout's gutters give the count the
            # caption names and the labels' regions do not, the gutters part the figure and the
            # labels read name the panels they stand at
            layout = split_panels(image)
            if _closer(layout, panels, trusted):
                decision.route = "labels+layout"
                panels = _name_panels(layout, labels)
        decision.panels = _lone(decision, panels, scheme, caption_labels)
        return decision
    single_kind = "kind" in evidence and panel_type == SINGLE_PANEL
    if single_kind:
        decision.route = "single"
        panels = [Panel(box=sheet.to_original(root))]
    elif "structure" in evidence:
        structure = ink_structure(sheet)
        # a caption that names no panel is evidence of one: only a clear gutter parts it
        unnamed = named == 0
        min_gap = UNNAMED_GUTTER * max(w, h) if unnamed else 0
        boxes = partition_by_structure(sheet, structure, root, min_gap)
        decision.route = "structure"
        panels = [Panel(box=sheet.to_original(box)) for box in boxes]
        if _off_count(panels, named):
            # the caption names more (or fewer) panels than the chart structure keeps apart:
            # the layout's gutters decide when they agree with the caption better
            layout = split_panels(image)
            if _closer(layout, panels, named):
                decision.route, panels = "layout", layout
    else:
        panels = split_panels(image)
    if len(labels) == 1 and len(panels) == 1:
        panels = [Panel(box=panels[0].box, score=panels[0].score, label=labels[0].text)]
    decision.panels = _lone(decision, finalize(panels, sheet.width, sheet.height), scheme, caption_labels)
    return decision


def figure_decision(
    data: bytes | Image.Image,
    caption: str | None = None,
    *,
    panel_type: str | None = None,
    reader: LabelReader | None = None,
    evidence: Collection[str] = EVIDENCE,
) -> FigureSplit:
    """The decision on a figure's bytes as the ``panels`` stage takes it: the image prepared
    by ``inputs.prepare_image`` (one decoder for every stage), boxes and label boxes in the
    original pixels (a huge JPEG is decoded reduced). Bad input is a ``reason``, never an
    exception; so is a failure of the decision on one figure (its type and message), so that a
    batch always completes."""
    opened = prepare_figure(data)
    if isinstance(opened, FigureSplit):
        return opened
    image, width, height = opened
    try:
        decision = decide(image, caption, panel_type=panel_type, reader=reader, evidence=evidence)
    except (ValueError, IndexError, ZeroDivisionError, OSError) as exc:
        return FigureSplit(width=width, height=height, reason=f"panel decision failed: {type(exc).__name__}: {exc}")
    boxes = scale_boxes([p.box for p in decision.panels], image.size, width, height)
    label_boxes = scale_boxes([lab.box for lab in decision.labels], image.size, width, height)
    return FigureSplit(
        panels=[replace(p, box=b) for p, b in zip(decision.panels, boxes, strict=True)],
        width=width,
        height=height,
        reason=None if decision.panels else "no content",
        labels=[replace(lab, box=b) for lab, b in zip(decision.labels, label_boxes, strict=True)],
        route=decision.route,
    )


def _lone(decision: Decision, panels: list[Panel], scheme: str | None, caption_labels: list[str] | None) -> list[Panel]:
    """``panels``, where a figure of one panel keeps its label only if that label can name it:
    the first of its scheme ("A", "a", "1", "i") or one the caption names. Labels that parted
    nothing and name no lone panel are glyphs of the figure's own text (the footnote letters
    "b" and "d" of a table image), so ``decision.labels`` drops them too."""
    if len(panels) != 1 or not panels[0].label:
        return panels
    text = panels[0].label
    named = bool(caption_labels) and text.casefold() in {label.casefold() for label in caption_labels}
    if named or (scheme is not None and label_index(text, scheme) == 0):
        return panels
    decision.labels = []
    return [replace(panels[0], label=None)]


def _name_panels(panels: list[Panel], labels: list[PrintedLabel]) -> list[Panel]:
    """Each label read given to the panel that holds its centre, else to the nearest panel
    (labels printed in a gutter or below); a panel keeps the first label that comes to it."""
    named = [replace(p, label=None) for p in panels]
    for lab in labels:
        free = [i for i in range(len(named)) if named[i].label is None]
        if free:
            best = min(free, key=lambda i: _distance(named[i].box, lab.centre))
            named[best] = replace(named[best], label=lab.text)
    return named


def _distance(box: Box, point: tuple[float, float]) -> float:
    """From a point to a box (0 inside it)."""
    x, y = point
    return float(np.hypot(max(box[0] - x, 0, x - box[2]), max(box[1] - y, 0, y - box[3])))


def _off_count(panels: list[Panel], named: int | None) -> bool:
    """Whether the caption names two or more panels and ``panels`` are not that many."""
    return bool(named) and named >= 2 and len(panels) != named


def _closer(candidate: list[Panel], current: list[Panel], named: int) -> bool:
    """Whether ``candidate`` has a panel count nearer the caption's than ``current``."""
    return abs(len(candidate) - named) < abs(len(current) - named)


def caption_evidence(caption: str) -> tuple[list[str], int | None]:
    """What a caption says about the figure's panels: the labels the image may print (the
    caption's panel labels, ``pairing.panel_labels``; "1A" printed as "A"; none for panels
    named by position, "Left:", "Right:") and how many panels it names (0: none, evidence of a
    single figure; without labels, the places it names, "the left panel ... the right panel",
    or None where it speaks of panels without a count, "in each panel": ``panels_mentioned``)."""
    split = split_caption(caption)
    labels = panel_labels(split)
    if not labels:
        return [], panels_mentioned(caption)
    if split.scheme == "position":
        return [], len(labels)
    if split.scheme == "fignum":
        labels = list(dict.fromkeys(re.sub(r"^\d+", "", label) for label in labels))
    return labels, len(labels)


def _to_work(sheet: Sheet, box: Box) -> Box:
    return (
        int(box[0] / sheet.sx),
        int(box[1] / sheet.sy),
        int(np.ceil(box[2] / sheet.sx)),
        int(np.ceil(box[3] / sheet.sy)),
    )


# ---- labels ---------------------------------------------------------------------------------


def _direction(root: Box, labels: list[_Label]) -> str:
    """``after`` when the figure prints its labels below its panels (graphic content above the
    first label row, none below the last), else ``before``."""
    height = float(np.median([lab.box[3] - lab.box[1] for lab in labels]))
    above = min(lab.box[1] for lab in labels) - root[1]
    below = root[3] - max(lab.box[3] for lab in labels)
    return "after" if above > 2.5 * height and below < 1.0 * height else "before"


def _piece_of(pieces: list[Box], axis: int, label: _Label) -> int:
    """The piece whose span along ``axis`` holds the label's centre (the nearest when the
    centre falls in a gutter)."""
    c = label.centre[1] if axis == 0 else label.centre[0]
    spans = [(p[1], p[3]) if axis == 0 else (p[0], p[2]) for p in pieces]

    def distance(i: int) -> float:
        lo, hi = spans[i]
        return 0.0 if lo <= c < hi else min(abs(c - lo), abs(c - hi))

    return min(range(len(pieces)), key=distance)


def partition_by_labels(
    sheet: Sheet,
    structure: Structure,
    box: Box,
    labels: list[_Label],
    direction: str,
    first_missing: bool = False,
) -> list[tuple[Box, str | None]]:
    """Regions of ``box``, one per label (module doc), as (work box, label text).
    ``first_missing``: the sequence's first label was not read, so the pieces before the first
    label read are its panel (joined to the next region until ``fill_missing`` parts them),
    not a shared title."""
    found = _by_labels(sheet, structure, box, labels, direction, 0, first_missing)
    return found or _part_at_labels(sheet, structure, box, labels, direction)


def _by_labels(
    sheet: Sheet,
    structure: Structure,
    box: Box,
    labels: list[_Label],
    direction: str,
    depth: int,
    first_missing: bool = False,
) -> list[tuple[Box, str | None]] | None:
    """``partition_by_labels``, or None when no gutter of ``box`` separates its labels into
    regions that each hold graphic content (a cut that leaves a label with only its own glyph,
    or with an axis title, parts the figure in the wrong place)."""
    if len(labels) <= 1 or depth >= MAX_DEPTH:
        return [(box, labels[0].text if labels else None)]
    options, aside = [], []
    for rank, mask in enumerate(sheet.masks):
        for axis in (0, 1):
            pieces = cut(sheet, box, axis, mask)
            if not pieces:
                continue
            owners: list[list[_Label]] = [[] for _ in pieces]
            for lab in labels:
                owners[_piece_of(pieces, axis, lab)].append(lab)
            labelled = sum(1 for o in owners if o)
            if labelled >= 2:
                options.append((rank, -_parting(pieces, owners, axis), -labelled, axis, pieces, owners))
            elif labelled == 1:
                aside.append((axis, pieces, owners))
    found = _by_options(sheet, structure, labels, direction, depth, first_missing, options)
    return found if found is not None else _beside_unlabelled(sheet, structure, labels, direction, depth, aside)


def _parting(pieces: list[Box], owners: list[list[_Label]], axis: int) -> int:
    """How clearly a cut parts its labels: the narrowest, over consecutive labelled pieces, of
    the widest gutter between them. Panels are set apart by wider gutters than a panel's own
    parts (a table's title from its body): a cut through a column of panels at a narrow gap
    that happens to run across the figure parts the labels less clearly than the wide gutter
    between the columns."""
    lo, hi = (1, 3) if axis == 0 else (0, 2)
    labelled = [k for k, o in enumerate(owners) if o]
    return min(
        max(pieces[k + 1][lo] - pieces[k][hi] for k in range(a, b))
        for a, b in zip(labelled, labelled[1:], strict=False)
    )


def _beside_unlabelled(
    sheet: Sheet,
    structure: Structure,
    labels: list[_Label],
    direction: str,
    depth: int,
    aside: list[tuple[int, list[Box], list[list[_Label]]]],
) -> list[tuple[Box, str | None]] | None:
    """Every label in one piece of a cut that leaves a chart or picture of its own beside the
    labelled panels (a wide chart below them whose label was not read): the labels' region is
    the labelled piece with the pieces after it (``_assemble``) up to before the last such
    chart, parted by its labels; each piece left that is a chart or picture is a panel without
    a label, the rest (a title, a legend for all) joins the part that spans it or none."""
    for axis, pieces, owners in aside:
        [(members, extras, _)] = _assemble(pieces, owners, direction)
        major = [i for i in extras if structure.is_major(pieces[i], pieces, axis)]
        if not major:
            continue
        region = union(pieces[i] for i in members + extras[: extras.index(major[-1])])
        sub = _by_labels(sheet, structure, region, labels, direction, depth + 1)
        if sub is None:
            continue
        for i in extras[extras.index(major[-1]) :]:
            attached = _attach(sub, pieces[i], axis)
            sub = [*sub, (pieces[i], None)] if i in major else attached
        return sub
    return None


def _by_options(
    sheet: Sheet,
    structure: Structure,
    labels: list[_Label],
    direction: str,
    depth: int,
    first_missing: bool,
    options: list,
) -> list[tuple[Box, str | None]] | None:
    """The first cut of ``options`` (best first) whose label groups each hold graphic content,
    each group parted further by its labels (``_by_labels``)."""
    for *_, axis, pieces, owners in sorted(options, key=lambda o: o[:4]):
        groups = _assemble(pieces, owners, _along(direction, axis), first_missing)
        if not all(structure.graphic_in(union(pieces[i] for i in m + e)) for m, e, _ in groups):
            continue
        out: list[tuple[Box, str | None]] = []
        for members, extras, group_labels in groups:
            if len(group_labels) == 1:
                out.append((union(pieces[i] for i in members + extras), group_labels[0].text))
                continue
            # the unlabelled pieces after a row of labels are usually those labels' panels; a
            # last one that no gutter of the others crosses is shared (a legend for all)
            sub = None
            for keep in range(len(extras), -1, -1):
                region = union(pieces[i] for i in members + extras[:keep])
                sub = _by_labels(sheet, structure, region, group_labels, direction, depth + 1, first_missing)
                if sub is not None:
                    for i in extras[keep:]:
                        attached = _attach(sub, pieces[i], axis)
                        if attached is sub and structure.is_major(pieces[i], pieces, axis):
                            # no panel spans it, and it is no legend or title but a chart or
                            # picture of its own: a panel whose label was not read
                            attached = [*sub, (pieces[i], None)]
                        sub = attached
                    break
            if sub is None:
                sub = _part_at_labels(
                    sheet, structure, union(pieces[i] for i in members + extras), group_labels, direction
                )
            out.extend(sub)
        return out
    return None


def _along(direction: str, axis: int) -> str:
    """How a cut along ``axis`` gives its unlabelled pieces to labels. Labels printed below
    their panels follow them down the page (axis 0: ``after``), but across it (axis 1) they stand
    at a panel's lower-left ("(a) Amplitude vs. delay", its own piece before the graphic to its
    right) or centred (the chart's tick-label strip a piece before it): there each piece between
    two labelled ones goes to the side of the widest gutter between them (``gutter``), as panels
    are set apart by wider gutters than their own parts."""
    return "gutter" if direction == "after" and axis == 1 else direction


def _assemble(
    pieces: list[Box], owners: list[list[_Label]], direction: str, first_missing: bool = False
) -> list[tuple[list[int], list[int], list[_Label]]]:
    """Pieces grouped under the labels they belong to: (labelled piece indices, unlabelled
    piece indices, labels). An unlabelled piece belongs to the labelled piece before it
    (``before``) or after it (``after``); one with none on that side is shared and dropped,
    unless the first label was not read (``first_missing``): then it joins the first group."""
    if direction == "gutter":
        return _assemble_at_gutters(pieces, owners)
    order = list(range(len(pieces)))
    if direction == "after":
        order.reverse()
    groups: list[tuple[list[int], list[int], list[_Label]]] = []
    leading: list[int] = []
    for i in order:
        if owners[i]:
            groups.append(([i], [], list(owners[i])))
            if first_missing and leading and len(groups) == 1:
                groups[0][0][:0] = leading
        elif groups:
            groups[-1][1].append(i)
        else:
            leading.append(i)
    return groups


def _assemble_at_gutters(
    pieces: list[Box], owners: list[list[_Label]]
) -> list[tuple[list[int], list[int], list[_Label]]]:
    """``_assemble`` across a row of panels labelled below (``_along``): an unlabelled piece
    between two labelled ones joins the one on its side of the widest gutter between them;
    pieces before the first or after the last labelled piece join it. Each group's unlabelled
    pieces nearest first."""
    labelled = [i for i, o in enumerate(owners) if o]
    extras: dict[int, list[int]] = {i: [] for i in labelled}
    for i in (k for k, o in enumerate(owners) if not o):
        before = [k for k in labelled if k < i]
        after = [k for k in labelled if k > i]
        if not before or not after:
            extras[before[-1] if before else after[0]].append(i)
            continue
        a, b = before[-1], after[0]
        widest = max(range(a, b), key=lambda k: pieces[k + 1][0] - pieces[k][2])
        extras[a if i <= widest else b].append(i)
    return [([i], sorted(extras[i], key=lambda k: abs(k - i)), list(owners[i])) for i in labelled]


def _attach(parts: list[tuple[Box, str | None]], piece: Box, axis: int) -> list[tuple[Box, str | None]]:
    """An unlabelled piece joins the part beside it that spans it across the cut; else it is
    shared by several panels and joins none."""
    lo, hi = (piece[0], piece[2]) if axis == 0 else (piece[1], piece[3])
    best, gap = None, None
    for k, (box, _) in enumerate(parts):
        a, b = (box[0], box[2]) if axis == 0 else (box[1], box[3])
        if min(b, hi) - max(a, lo) < SHARED_COVER * (hi - lo):
            continue
        d = max(box[1] - piece[3], piece[1] - box[3]) if axis == 0 else max(box[0] - piece[2], piece[0] - box[2])
        if gap is None or d < gap:
            best, gap = k, d
    if best is None:
        return parts
    parts = list(parts)
    box, text = parts[best]
    parts[best] = (union([box, piece]), text)
    return parts


def _part_at_labels(
    sheet: Sheet, structure: Structure, box: Box, labels: list[_Label], direction: str = "before"
) -> list[tuple[Box, str | None]]:
    """Labels no gutter of ``box`` separates into regions that hold graphic content (panels
    that touch, a layout no straight cut parts): the region's blocks that no gutter parts
    further (``_leaves``) each go to the label that anchors them, the last label before them in
    reading order that stands above and to the left of the block (below it, where the figure
    prints its labels below the panels: the nearest label under it); a panel is the union of
    its label's blocks. Blocks no label anchors join the nearest label. Panels do not overlap:
    ``_untangle`` gives a block whose anchor's panel it stretches over another to that one."""
    height = float(np.median([lab.box[3] - lab.box[1] for lab in labels]))
    order = sorted(labels, key=lambda lab: (lab.box[1], lab.box[0]))
    owned: dict[int, list[Box]] = {i: [lab.box] for i, lab in enumerate(order)}
    free: list[tuple[Box, int]] = []  # blocks holding no label, with the label they went to
    pictures = _pictures(sheet, structure, order)
    for leaf in _leaves(sheet, box):
        inside = [i for i, lab in enumerate(order) if _holds(leaf, lab)]
        if len(inside) < 2:
            if inside:
                owned[inside[0]].append(leaf)
            else:
                free.append((leaf, _anchor(leaf, order, height, direction)))
            continue
        # a label printed inside a picture names that picture: the rest of the block is
        # the other labels' (an inset on a diagram, a micrograph set into a chart's corner)
        inset = {i: pictures[i] for i in inside if i in pictures and within(pictures[i], leaf)}
        rest = [i for i in inside if i not in inset]
        if not inset or not rest:
            inset, rest = {}, inside
        for i, picture in inset.items():
            owned[i].append(picture)
        # a block holding several labels (panels that touch): parted at the labels' own edges
        for cell in _grid(leaf, [order[i] for i in rest], height):
            if inset:
                cell = _outside(sheet, cell, list(inset.values()))
                if cell is None:
                    continue
            held = [i for i in rest if _holds(cell, order[i])]
            if held:
                owned[held[0]].append(cell)
            else:
                free.append((cell, rest[_anchor(cell, [order[i] for i in rest], height, direction)]))
    rank = [next(n for n, x in enumerate(labels) if x is lab) for lab in order]
    owners = _untangle(owned, free, order, rank, height)
    for (block, _), i in zip(free, owners, strict=True):
        owned[i].append(block)
    return [(union(boxes), order[i].text) for i, boxes in owned.items()]


def _untangle(
    owned: dict[int, list[Box]], free: list[tuple[Box, int]], labels: list[_Label], rank: list[int], height: float
) -> list[int]:
    """The label each free block goes to: its anchor (``_anchor``), unless its panel then
    overlaps another's, and the block, given to that label, overlaps them less. Panels are
    rectangles side by side: a label over its chart's corner has the chart's tick labels and
    axis title sticking out to the left of it, under the label above, and those blocks (parted
    at the labels' edges, ``_grid``) anchored there stretch the panel above over this one. A
    block goes only to a label after its anchor in the sequence (a letter read inside a
    picture, out of sequence, takes nothing from the picture's panel) and not above its top (a
    panel starts at its label). ``rank``: each label's place in the sequence."""
    owners = [i for _, i in free]

    def panel(i: int, without: int | None = None) -> Box:
        return union([*owned[i], *(free[k][0] for k, o in enumerate(owners) if o == i and k != without)])

    def overlap(box: Box, i: int, panels: dict[int, Box], skip: int) -> int:
        return sum(intersection(box, other) for n, other in panels.items() if n not in (i, skip))

    for _ in range(len(labels) * len(labels)):
        panels = {i: panel(i) for i in owned}
        best: tuple[int, int, int] | None = None  # (overlap removed, block, label)
        for k, (block, _) in enumerate(free):
            i = owners[k]
            for j, lab in enumerate(labels):
                if rank[j] <= rank[i] or block[1] < lab.box[1] - height or not intersection(panels[i], panels[j]):
                    continue
                to_j = union([panels[j], block])
                if any(n != j and _holds(to_j, other) for n, other in enumerate(labels)):
                    continue
                from_i = panel(i, without=k)
                before = (
                    overlap(panels[i], i, panels, j)
                    + overlap(panels[j], j, panels, i)
                    + intersection(panels[i], panels[j])
                )
                after = overlap(from_i, i, panels, j) + overlap(to_j, j, panels, i) + intersection(from_i, to_j)
                if after < before and (best is None or before - after > best[0]):
                    best = (before - after, k, j)
        if best is None:
            break
        owners[best[1]] = best[2]
    return owners


def _pictures(sheet: Sheet, structure: Structure, labels: list[_Label]) -> dict[int, Box]:
    """Label index -> the picture it is printed inside (a white letter on a micrograph or a
    scan): the smallest graphic shape around it whose ink surrounds the glyph
    (``PICTURE_RING``) and that holds no other label."""
    ink, out = sheet.masks[0], {}
    if ink is None or not len(structure.graphic):
        return out
    for i, lab in enumerate(labels):
        x1, y1, x2, y2 = lab.box
        m = max(2, round(0.3 * (y2 - y1)))
        ring = (max(0, x1 - m), max(0, y1 - m), min(ink.shape[1], x2 + m), min(ink.shape[0], y2 + m))
        outer = ink[ring[1] : ring[3], ring[0] : ring[2]]
        inner = ink[y1:y2, x1:x2]
        if outer.size <= inner.size or (outer.sum() - inner.sum()) < PICTURE_RING * (outer.size - inner.size):
            continue
        g = structure.graphic
        around = g[(g[:, 0] <= ring[0]) & (g[:, 1] <= ring[1]) & (g[:, 2] >= ring[2]) & (g[:, 3] >= ring[3])]
        if not len(around):
            continue
        picture = min((tuple(int(v) for v in b) for b in around), key=area)
        if not any(n != i and _holds(picture, other) for n, other in enumerate(labels)):
            out[i] = picture
    return out


def _outside(sheet: Sheet, box: Box, pictures: list[Box]) -> Box | None:
    """``box`` trimmed to its ink outside ``pictures`` (None: none)."""
    ink = sheet.masks[0][box[1] : box[3], box[0] : box[2]].copy()
    for x1, y1, x2, y2 in pictures:
        ink[max(0, y1 - box[1]) : max(0, y2 - box[1]), max(0, x1 - box[0]) : max(0, x2 - box[0])] = False
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not rows.size:
        return None
    return box[0] + int(cols[0]), box[1] + int(rows[0]), box[0] + int(cols[-1]) + 1, box[1] + int(rows[-1]) + 1


def _holds(box: Box, label: _Label) -> bool:
    cx, cy = label.centre
    return box[0] <= cx < box[2] and box[1] <= cy < box[3]


def _grid(box: Box, labels: list[_Label], height: float) -> list[Box]:
    """``box`` parted just before each label's left edge and just above each label's top (a
    row of labels parts it into columns, a column into rows, a grid both ways)."""
    xs = _starts(sorted(lab.box[0] for lab in labels), 0.6 * height)
    ys = _starts(sorted(lab.box[1] for lab in labels), 0.6 * height)
    cols = [box[0]] + [max(box[0], x - 1) for x in xs[1:]] + [box[2]]
    rows = [box[1]] + [max(box[1], y - 1) for y in ys[1:]] + [box[3]]
    return [
        (cols[c], rows[r], cols[c + 1], rows[r + 1])
        for r in range(len(rows) - 1)
        for c in range(len(cols) - 1)
        if cols[c + 1] > cols[c] and rows[r + 1] > rows[r]
    ]


def _starts(values: list[int], tol: float) -> list[int]:
    """The smallest value of each run of sorted values no more than ``tol`` apart."""
    out = values[:1]
    for previous, v in zip(values, values[1:], strict=False):
        if v - previous > tol:
            out.append(v)
    return out


def _anchor(leaf: Box, labels: list[_Label], height: float, direction: str) -> int:
    """The index in ``labels`` (reading order) of the label that anchors a block."""
    if direction == "after":
        below = [i for i, lab in enumerate(labels) if lab.box[1] >= leaf[3] - height]
        if below:
            top = min(labels[i].box[1] for i in below)
            row = [i for i in below if labels[i].box[1] <= top + height]
            cx = (leaf[0] + leaf[2]) / 2
            return min(row, key=lambda i: abs(labels[i].centre[0] - cx))
    else:
        before = [
            i for i, lab in enumerate(labels) if lab.box[0] <= leaf[0] + height and lab.box[1] <= leaf[1] + height
        ]
        if before:
            return max(before, key=lambda i: (labels[i].box[1] // max(1.0, height), labels[i].box[0]))
    cx, cy = (leaf[0] + leaf[2]) / 2, (leaf[1] + leaf[3]) / 2
    return min(range(len(labels)), key=lambda i: np.hypot(labels[i].centre[0] - cx, labels[i].centre[1] - cy))


def _leaves(sheet: Sheet, box: Box, limit: int = MAX_LEAVES) -> list[Box]:
    """The blocks of ``box`` no gutter (of any gutter colour or divider) parts further."""
    out: list[Box] = []
    stack = [(box, 0)]
    while stack:
        region, depth = stack.pop()
        pieces: list[Box] = []
        if depth < MAX_DEPTH and len(out) + len(stack) < limit:
            for mask in sheet.masks:
                for axis in (0, 1):
                    pieces = cut(sheet, region, axis, mask)
                    if pieces:
                        break
                if pieces:
                    break
        if pieces:
            stack.extend((piece, depth + 1) for piece in pieces)
        else:
            out.append(region)
    return out


def fill_missing(
    sheet: Sheet,
    structure: Structure,
    parts: list[tuple[Box, str | None]],
    labels: list[_Label],
    scheme: str,
    missing: list[str],
    direction: str,
) -> list[tuple[Box, str | None]]:
    """A label that was not read leaves its panel joined to the region of the label before it
    (after it, where labels are printed below their panels): that region is parted at its
    widest gutters between graphic blocks into one more region per missing label; the new
    regions have no label (none was read)."""
    index = {text.casefold(): label_index(text, scheme) for _, text in parts if text}
    owner_of: dict[str, int] = {}
    for m in missing:
        try:
            k = label_index(m, scheme)
        except (ValueError, IndexError):
            continue
        before = [t for t, i in index.items() if i < k]
        after = [t for t, i in index.items() if i > k]
        side = (before, after) if direction == "before" else (after, before)
        pick = max(side[0], key=lambda t: index[t]) if side[0] else None
        if pick is None and side[1]:
            pick = min(side[1], key=lambda t: index[t])
        if pick is not None:
            owner_of[pick] = owner_of.get(pick, 0) + 1
    out: list[tuple[Box, str | None]] = []
    for box, text in parts:
        extra = owner_of.get((text or "").casefold(), 0)
        if not extra:
            out.append((box, text))
            continue
        pieces = split_in(sheet, structure, box, extra + 1)
        own = [lab for lab in labels if lab.text == text]
        for piece in pieces:
            holds = own and piece[0] <= own[0].centre[0] <= piece[2] and piece[1] <= own[0].centre[1] <= piece[3]
            out.append((piece, text if holds or len(pieces) == 1 else None))
    return out


# ---- chart structure ----------------------------------------------------------------------------


def _major_cut(sheet: Sheet, structure: Structure, box: Box) -> tuple[int, list[list[Box]]] | None:
    """The cut of ``box`` that leaves the most graphic blocks (two or more), as (axis, groups):
    each group a major piece with the minor pieces (text strips, legends) that join it, in
    order along the axis; None when no cut leaves two."""
    best = None
    for mask in sheet.masks:
        for axis in (0, 1):
            pieces = cut(sheet, box, axis, mask)
            if not pieces:
                continue
            major = [structure.is_major(p, pieces, axis) for p in pieces]
            n = sum(major)
            if n >= 2 and (best is None or n > best[0]):
                best = (n, axis, pieces, major)
        if best is not None:
            break
    if best is None:
        return None
    _, axis, pieces, major = best
    majors = [i for i, m in enumerate(major) if m]
    groups: dict[int, list[int]] = {i: [i] for i in majors}
    for i, m in enumerate(major):
        if m:
            continue
        before = max((j for j in majors if j < i), default=None)
        after = min((j for j in majors if j > i), default=None)
        if before is None or after is None:
            groups[before if after is None else after].append(i)
            continue
        closer = _gap(pieces[before], pieces[i], axis) <= _gap(pieces[i], pieces[after], axis)
        groups[before if closer else after].append(i)
    return axis, [[pieces[i] for i in sorted(groups[j])] for j in majors]


def partition_by_structure(
    sheet: Sheet,
    structure: Structure,
    box: Box,
    min_gap: float = 0,
    depth: int = 0,
    count: list | None = None,
    grid: bool = False,
) -> list[Box]:
    """Regions of ``box`` that each hold one graphic block with its own text (module doc),
    parted only at gutters at least ``min_gap`` work pixels wide, or at any gutter between
    like photographs or like charts (``grid``: ``box`` is a row or column of a grid of charts,
    where two are a row)."""
    count = count if count is not None else [1]
    found = _major_cut(sheet, structure, box) if depth < MAX_DEPTH else None
    if found is None:
        return [box]
    axis, groups = found
    blocks = [union(g) for g in groups]
    gap = min_gap
    if min_gap and _photo_row(sheet, blocks, axis):
        min_gap = gap = 0  # a row of like photographs is compound whatever the caption says
    elif min_gap and _chart_row(sheet, structure, blocks, axis, nested=grid):
        gap, grid = 0, True  # so is a grid of like charts; inside a chart, a clear gutter is still asked for
    else:
        grid = False
    merged = [list(groups[0])]
    for group in groups[1:]:
        if _gap(union(merged[-1]), union(group), axis) < gap:
            merged[-1].extend(group)
        else:
            merged.append(list(group))
    if len(merged) < 2 or count[0] + len(merged) - 1 > MAX_PANELS:
        return [box]
    count[0] += len(merged) - 1
    out: list[Box] = []
    for group in merged:
        out.extend(partition_by_structure(sheet, structure, union(group), min_gap, depth + 1, count, grid))
    return out


def _photo_row(sheet: Sheet, boxes: list[Box], axis: int) -> bool:
    """Three or more blocks of like size along the cut, each mostly ink (photographs,
    micrographs; not charts or tables, which are mostly white)."""
    if len(boxes) < PHOTO_ROW:
        return False
    sides = [(b[3] - b[1]) if axis == 0 else (b[2] - b[0]) for b in boxes]
    if max(sides) > LIKE_SIZE * min(sides):
        return False
    ink = sheet.colour_masks[0]
    return all(ink[b[1] : b[3], b[0] : b[2]].mean() >= PHOTO_INK for b in boxes)


def _chart_row(sheet: Sheet, structure: Structure, boxes: list[Box], axis: int, nested: bool = False) -> bool:
    """Three or more blocks along the cut (two in a row of a grid, ``nested``) whose axes along
    the cut are of like length, each a chart of its own (mostly white, with an axis line across
    most of its height and one across most of its width) or a row of such charts (a grid of
    small multiples: ``_is_chart``); of three or more, one may be neither (two charts whose curves touch, no
    gutter between them). The parts of one chart, its legend's entries or a diagram's boxes
    have no axes of their own."""
    if len(boxes) < (2 if nested else PHOTO_ROW):
        return False
    ink = sheet.colour_masks[0]
    blocks = [ink[b[1] : b[3], b[0] : b[2]] for b in boxes]
    # like charts have like axes, whatever titles, headers or a legend stand beside them
    axes = [_longest_run(block if axis == 0 else block.T) for block in blocks]
    if min(axes) == 0 or max(axes) > LIKE_SIZE * min(axes) or any(b.mean() >= PHOTO_INK for b in blocks):
        return False
    misses = 0
    for box, block in zip(boxes, blocks, strict=True):
        if _is_chart(block, structure.text_height):
            continue
        found = None if nested else _major_cut(sheet, structure, box)
        if found is None or found[0] == axis:
            misses += 1
        elif not _chart_row(sheet, structure, [union(g) for g in found[1]], found[0], nested=True):
            misses += 1
    return misses == 0 or (misses == 1 and len(boxes) >= 3)


def _is_chart(ink: np.ndarray, text_height: float) -> bool:
    """Whether an ink mask is a chart: a vertical line across ``AXIS_SHARE`` of its height, a
    horizontal one across ``AXIS_SHARE`` of its width, and, those long lines taken away, data
    marks larger than text (a curve, bars, a box plot; a ruled table holds only glyphs)."""
    h, w = ink.shape
    if _longest_run(ink) < AXIS_SHARE * h or _longest_run(ink.T) < AXIS_SHARE * w:
        return False
    lines = _in_runs(ink, max(2, int(AXIS_SHARE * w))) | _in_runs(ink.T, max(2, int(AXIS_SHARE * h))).T
    _, marks, _ = components(ink & ~lines)
    # larger than a word of text: taller than a line of it, and longer than a few glyphs
    sides = np.sort(marks[:, 2:] - marks[:, :2], axis=1)
    return bool(
        ((sides[:, 0] >= MARK_TEXT_HEIGHTS * text_height) & (sides[:, 1] >= GRAPHIC_TEXT_HEIGHTS * text_height)).any()
    )


def _in_runs(ink: np.ndarray, length: int) -> np.ndarray:
    """The ink pixels that lie in a run of at least ``length`` along a row (a binary opening
    by a 1 x ``length`` line, by running sums)."""
    h, w = ink.shape
    if length > w:
        return np.zeros_like(ink)
    sums = np.zeros((h, w + 1), np.int32)
    np.cumsum(ink, axis=1, out=sums[:, 1:])
    full = (sums[:, length:] - sums[:, :-length]) == length  # a run of ``length`` starts here
    starts = np.zeros((h, w + 1), np.int32)
    np.cumsum(np.pad(full, ((0, 0), (0, length - 1))), axis=1, out=starts[:, 1:])
    # covered: a full window starts within ``length`` before or at the pixel
    covered = starts[:, 1:] - np.concatenate([np.zeros((h, length), np.int32), starts[:, 1 : w + 1 - length]], axis=1)
    return covered > 0


def _longest_run(ink: np.ndarray) -> int:
    """The longest run of ink down any column."""
    run = np.zeros(ink.shape[1], np.int32)
    best = np.zeros(ink.shape[1], np.int32)
    for row in ink:
        run = (run + 1) * row
        np.maximum(best, run, out=best)
    return int(best.max()) if best.size else 0


def split_in(sheet: Sheet, structure: Structure, box: Box, parts: int) -> list[Box]:
    """``box`` in at most ``parts`` regions, parted at the widest gutters between the graphic
    blocks of its first cut (a panel whose label was not read, joined to its neighbour)."""
    found = _major_cut(sheet, structure, box)
    if found is None and parts >= 2 and sheet.params.min_gutter > NARROW_GUTTER:
        # the caption or the label sequence says the region holds more than one panel: the
        # narrowest gutter figures print (two frames a line of white apart) parts it
        narrow = replace(sheet, params=replace(sheet.params, min_gutter=NARROW_GUTTER))
        found = _major_cut(narrow, structure, box)
    if found is None or parts < 2:
        return [box]
    axis, groups = found
    boxes = [union(g) for g in groups]
    gaps = [_gap(boxes[k], boxes[k + 1], axis) for k in range(len(boxes) - 1)]
    at = sorted(sorted(range(len(gaps)), key=lambda k: -gaps[k])[: parts - 1])
    out, start = [], 0
    for k in at:
        out.append(union(boxes[start : k + 1]))
        start = k + 1
    out.append(union(boxes[start:]))
    return out


def _gap(a: Box, b: Box, axis: int) -> int:
    return b[1] - a[3] if axis == 0 else b[0] - a[2]
