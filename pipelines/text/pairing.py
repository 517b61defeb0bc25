"""Each panel paired with its own caption text, or with none.

A panel's text must be its own: a crop paired with another panel's text teaches a model the
wrong thing, and one without text loses only a sample. So a panel gets caption text only where
the evidence names it (:func:`assign_captions`):

1. **By printed label** (``match="label"``): the label read on the image (``Panel.label``) is one
   of the caption's labels, case-insensitively (the image may print "c" where the caption says
   "(C)"). A label printed on two panels names neither.
2. **By reading order** (``match="order"``), only when the caption's labels and the panels agree
   in number, and the layout gives one order: rows-then-columns and columns-then-rows read the
   panels alike (a single row or column, a tall panel beside a stack), or the printed labels that
   were read follow one of the two and not the other (labels printed down the columns of a grid
   are never paired across its rows), or every other panel was paired by its label and one
   caption label is left. In a grid whose labels were not read, rows and columns disagree and
   nothing says which the authors meant: of the 15 hand-boxed labelled figures whose rows and
   columns read differently, 5 are not labelled in row order (``docs/panel-pairing.md``).
3. Otherwise **none**: the panel keeps the shared preface but no text of its own. The mining
   stage may still ask the VLM (``match="vlm"`` on its pairs) or describe the crop; the release
   marks such texts and ships only caption-matched ones by default.

``match_detail`` says which rule paired a panel or why none could. ``count_agreement`` compares
the found panels with the caption's labels; every row of a figure carries it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pipelines.images.boxes import Panel, column_order_indices, reading_order_indices
from pipelines.text.captions import CaptionSplit

LABEL, ORDER, VLM, NONE = "label", "order", "vlm", "none"
MATCHES = (LABEL, ORDER, VLM, NONE)
CAPTION_MATCHES = (LABEL, ORDER)  # the texts the panel subset ships by default

EQUAL, MORE_PANELS, FEWER_PANELS, NO_CAPTION_LABELS = "equal", "more_panels", "fewer_panels", "no_caption_labels"
COUNT_AGREEMENTS = (EQUAL, MORE_PANELS, FEWER_PANELS, NO_CAPTION_LABELS)

# match_detail of the pairing rules
BY_PRINTED_LABEL = "printed label"
ROWS_AND_COLUMNS_ALIKE = "rows and columns read alike"
ROWS_BY_LABELS = "row order, as the printed labels run"
COLUMNS_BY_LABELS = "column order, as the printed labels run"
LAST_LABEL_LEFT = "the one caption label left"
AMBIGUOUS = "ambiguous layout: rows and columns read differently"
LABELS_OFF_ORDER = "the printed labels follow neither row nor column order"


def count_agreement(panels: int, caption_labels: int) -> str:
    """How the number of panels found compares with the number of labels the caption defines."""
    if caption_labels == 0:
        return NO_CAPTION_LABELS
    if panels == caption_labels:
        return EQUAL
    return MORE_PANELS if panels > caption_labels else FEWER_PANELS


def panel_labels(split: CaptionSplit) -> list[str]:
    """The caption's panel labels in order, without sub-labels ("a1", "a2" of panel "a"): what
    the found panels are counted against and paired with by order."""
    return [label for label in split.panels if label not in split.parents]


def assign_captions(panels: Sequence[Panel], split: CaptionSplit) -> list[dict]:
    """The caption part of each panel's ``panel_captions`` row, in the order ``panels`` is given
    (the i-th row is the i-th panel). ``label`` is the panel's printed label, or for an order
    match the caption's label it was given. See the module docstring for the rules: a printed
    sub-label ("a1") is paired with its own text; counts and orders are of panel labels only."""
    caption_labels = panel_labels(split)
    by_key = {label.casefold(): label for label in split.panels}
    agreement = count_agreement(len(panels), len(caption_labels))
    printed = Counter(p.label.casefold() for p in panels if p.label)
    paired: dict[int, tuple[str, str, str]] = {}  # panel -> (caption label, match, detail)
    why: dict[int, str] = {}
    for i, panel in enumerate(panels):
        if not panel.label:
            continue
        key = panel.label.casefold()
        if key not in by_key:
            why[i] = f"printed label {panel.label!r} is not a caption label"
        elif printed[key] > 1:
            why[i] = f"label {panel.label!r} printed on {printed[key]} panels"
        else:
            paired[i] = (by_key[key], LABEL, BY_PRINTED_LABEL)
    unread = [i for i, panel in enumerate(panels) if not panel.label]
    if unread:
        if not caption_labels:
            reason = "the caption defines no panel labels"
        elif agreement != EQUAL:
            reason = f"{len(panels)} panels, {len(caption_labels)} caption labels"
        else:
            by_order, reason = _by_order(panels, caption_labels, paired)
            paired.update(by_order)
        why.update({i: reason for i in unread if i not in paired})
    rows = []
    for i, panel in enumerate(panels):
        caption_label, match, detail = paired.get(i, (None, NONE, why.get(i)))
        rows.append(
            {
                "label": panel.label or caption_label,
                "text": split.panels[caption_label] if caption_label else None,
                "preface": split.preface,
                "match": match,
                "match_detail": detail,
                "scheme": split.scheme,
                "confidence": split.confidence,
                "caption_labels": len(caption_labels),
                "count_agreement": agreement,
                "count_mismatch": agreement != EQUAL,
            }
        )
    return rows


def _by_order(
    panels: Sequence[Panel], caption_labels: list[str], paired: dict[int, tuple[str, str, str]]
) -> tuple[dict[int, tuple[str, str, str]], str]:
    """Caption labels for the panels without a printed label, by reading order, when one order
    is certain (the module docstring, rule 2); else no pairs and why. Panels and caption labels
    are as many; ``paired`` holds the panels paired by their printed label."""
    free = [i for i, panel in enumerate(panels) if not panel.label]
    known = {i: label for i, (label, _, _) in paired.items() if label in caption_labels}  # sub-labels aside
    left = [label for label in caption_labels if label not in known.values()]
    misread = len(panels) - len(free) - len(paired)  # printed labels that named no caption label
    if len(free) == 1 and len(left) == 1 and not misread:
        return {free[0]: (left[0], ORDER, LAST_LABEL_LEFT)}, ""
    boxes = [panel.box for panel in panels]
    rows, columns = reading_order_indices(boxes), column_order_indices(boxes)
    fits = {}
    for name, order in ((ROWS_BY_LABELS, rows), (COLUMNS_BY_LABELS, columns)):
        labels = {panel: caption_labels[position] for position, panel in enumerate(order)}
        if all(labels[i] == label for i, label in known.items()):
            fits[name] = labels
    if not fits:
        return {}, LABELS_OFF_ORDER
    if len({tuple(labels[i] for i in free) for labels in fits.values()}) > 1:
        return {}, AMBIGUOUS
    name, labels = next(iter(fits.items()))
    return _given(free, labels, ROWS_AND_COLUMNS_ALIKE if len(fits) == 2 else name), ""


def _given(free: list[int], labels: dict[int, str], detail: str) -> dict[int, tuple[str, str, str]]:
    return {i: (labels[i], ORDER, detail) for i in free}
