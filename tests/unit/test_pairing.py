"""Each panel paired with its own caption text, or with none (pipelines/text/pairing.py).

Every expected value is read off the hand-drawn layouts below (or, for elife-46472 fig. 7, off
the figure and its caption) by looking at which label sits on which panel."""

from __future__ import annotations

import pytest

from pipelines.images.boxes import Panel, column_order_indices, reading_order_indices
from pipelines.text import pairing
from pipelines.text.captions import CaptionSplit
from pipelines.text.pairing import assign_captions, count_agreement

# A 2x2 grid of 100 px panels with 10 px gutters, listed in the order a splitter gives them
# (rows): top-left, top-right, bottom-left, bottom-right.
TL, TR, BL, BR = (0, 0, 100, 100), (110, 0, 210, 100), (0, 110, 100, 210), (110, 110, 210, 210)
GRID = [TL, TR, BL, BR]
ABCD = CaptionSplit(
    preface="Four assays.",
    panels={"a": "Blot.", "b": "Counts.", "c": "Confocal images.", "d": "Survival curves."},
    scheme="lower",
    confidence=1.0,
)


def _panels(boxes, labels):
    return [Panel(box, label=label) for box, label in zip(boxes, labels, strict=True)]


def _pairs(rows):
    return [(r["match"], r["text"]) for r in rows]


def test_row_and_column_orders_of_a_grid():
    assert reading_order_indices(GRID) == [0, 1, 2, 3]  # TL, TR, BL, BR
    assert column_order_indices(GRID) == [0, 2, 1, 3]  # TL, BL, TR, BR


def test_a_grid_labelled_down_its_columns_is_paired_by_label():
    """a, b down the left column and c, d down the right: every panel gets its own text."""
    rows = assign_captions(_panels(GRID, ["a", "c", "b", "d"]), ABCD)
    assert _pairs(rows) == [
        ("label", "Blot."),
        ("label", "Confocal images."),
        ("label", "Counts."),
        ("label", "Survival curves."),
    ]
    assert {r["count_agreement"] for r in rows} == {"equal"} and not any(r["count_mismatch"] for r in rows)
    assert {r["match_detail"] for r in rows} == {pairing.BY_PRINTED_LABEL}
    assert [r["preface"] for r in rows] == ["Four assays."] * 4


def test_labels_read_down_one_column_give_the_order_of_the_rest():
    """Only a (top-left) and b (bottom-left) were read: the labels run down the columns, so the
    top-right panel is c and the bottom-right d, never b across the first row."""
    rows = assign_captions(_panels(GRID, ["a", None, "b", None]), ABCD)
    assert _pairs(rows) == [
        ("label", "Blot."),
        ("order", "Confocal images."),
        ("label", "Counts."),
        ("order", "Survival curves."),
    ]
    assert [r["label"] for r in rows] == ["a", "c", "b", "d"]
    assert rows[1]["match_detail"] == pairing.COLUMNS_BY_LABELS


def test_labels_read_along_one_row_give_the_row_order():
    rows = assign_captions(_panels(GRID, ["a", "b", None, None]), ABCD)
    assert [r["label"] for r in rows] == ["a", "b", "c", "d"]
    assert [r["match"] for r in rows] == ["label", "label", "order", "order"]
    assert rows[2]["match_detail"] == pairing.ROWS_BY_LABELS


def test_an_unlabelled_grid_is_ambiguous_and_gets_no_text():
    """Rows read TL, TR, BL, BR; columns TL, BL, TR, BR: nothing says which the authors meant."""
    rows = assign_captions(_panels(GRID, [None] * 4), ABCD)
    assert _pairs(rows) == [("none", None)] * 4
    assert {r["match_detail"] for r in rows} == {pairing.AMBIGUOUS}
    assert [r["label"] for r in rows] == [None] * 4


def test_one_label_read_at_the_corner_both_orders_share_is_no_help():
    rows = assign_captions(_panels(GRID, ["a", None, None, None]), ABCD)
    assert _pairs(rows) == [("label", "Blot."), ("none", None), ("none", None), ("none", None)]
    assert rows[1]["match_detail"] == pairing.AMBIGUOUS


def test_the_one_caption_label_left_goes_to_the_one_unread_panel():
    rows = assign_captions(_panels(GRID, ["a", "c", "b", None]), ABCD)
    assert rows[3]["match"] == "order" and rows[3]["text"] == "Survival curves." and rows[3]["label"] == "d"
    assert rows[3]["match_detail"] == pairing.LAST_LABEL_LEFT


def test_an_unlabelled_row_of_panels_is_paired_in_order():
    """1x4 strip: rows and columns read it alike, and the counts agree."""
    strip = [(0, 0, 100, 100), (110, 0, 210, 100), (220, 0, 320, 100), (330, 0, 430, 100)]
    rows = assign_captions(_panels(strip[::-1], [None] * 4), ABCD)  # given right to left
    assert [r["label"] for r in rows] == ["d", "c", "b", "a"]
    assert _pairs(rows)[0] == ("order", "Survival curves.")
    assert {r["match_detail"] for r in rows} == {pairing.ROWS_AND_COLUMNS_ALIKE}


def test_a_tall_panel_beside_a_stack_reads_one_way():
    """A spans the left column; B over C on the right: rows and columns both read A, B, C."""
    layout = [(0, 0, 100, 200), (110, 0, 210, 95), (110, 105, 210, 200)]
    split = CaptionSplit(panels={"A": "Map.", "B": "Site 1.", "C": "Site 2."}, scheme="upper")
    rows = assign_captions(_panels(layout, [None] * 3), split)
    assert _pairs(rows) == [("order", "Map."), ("order", "Site 1."), ("order", "Site 2.")]


def test_counts_that_disagree_pair_nothing_by_order():
    """Three panels found, four caption labels: order would shift every text after the missed one."""
    strip = [(0, 0, 100, 100), (110, 0, 210, 100), (220, 0, 320, 100)]
    rows = assign_captions(_panels(strip, [None] * 3), ABCD)
    assert _pairs(rows) == [("none", None)] * 3
    assert {r["count_agreement"] for r in rows} == {"fewer_panels"} and all(r["count_mismatch"] for r in rows)
    assert rows[0]["match_detail"] == "3 panels, 4 caption labels" and rows[0]["caption_labels"] == 4
    # a printed label still pairs its panel whatever the counts
    labelled = assign_captions(_panels(strip, [None, "c", None]), ABCD)
    assert _pairs(labelled) == [("none", None), ("label", "Confocal images."), ("none", None)]
    five = assign_captions(_panels([*GRID, (220, 0, 320, 100)], [None] * 5), ABCD)
    assert {r["count_agreement"] for r in five} == {"more_panels"} and {r["match"] for r in five} == {"none"}


def test_printed_labels_that_follow_neither_order_pair_no_other_panel():
    """C, ?, A, ? along a row: the labels run against both orders, so the two unread panels get
    nothing (with one unread panel, elimination would still name it)."""
    strip = [(0, 0, 100, 100), (110, 0, 210, 100), (220, 0, 320, 100), (330, 0, 430, 100)]
    split = CaptionSplit(panels={"A": "One.", "B": "Two.", "C": "Three.", "D": "Four."}, scheme="upper")
    rows = assign_captions(_panels(strip, ["C", None, "A", None]), split)
    assert _pairs(rows) == [("label", "Three."), ("none", None), ("label", "One."), ("none", None)]
    assert rows[1]["match_detail"] == pairing.LABELS_OFF_ORDER
    three = assign_captions(_panels(strip, ["C", None, "A", "D"]), split)
    assert _pairs(three)[1] == ("order", "Two.") and three[1]["match_detail"] == pairing.LAST_LABEL_LEFT


def test_case_is_ignored_and_the_printed_form_kept():
    split = CaptionSplit(panels={"A": "Blot.", "B": "Counts."}, scheme="upper")
    rows = assign_captions(_panels([(0, 0, 10, 10), (20, 0, 30, 10)], ["b", "a"]), split)
    assert [(r["label"], r["text"]) for r in rows] == [("b", "Counts."), ("a", "Blot.")]


def test_a_label_printed_twice_or_not_in_the_caption_names_no_panel():
    rows = assign_captions(_panels(GRID, ["a", "a", "b", "d"]), ABCD)
    assert _pairs(rows) == [("none", None), ("none", None), ("label", "Counts."), ("label", "Survival curves.")]
    assert rows[0]["match_detail"] == "label 'a' printed on 2 panels"
    # "8" is no caption label (a misread "b"?): that panel gets nothing; the unread bottom-right one
    # is not paired by elimination (two caption labels are left) but by the column order a, c show
    misread = assign_captions(_panels(GRID, ["a", "c", "8", None]), ABCD)
    assert _pairs(misread)[2:] == [("none", None), ("order", "Survival curves.")]
    assert misread[2]["match_detail"] == "printed label '8' is not a caption label"
    assert misread[3]["match_detail"] == pairing.COLUMNS_BY_LABELS
    # with "8" top-right and nothing read below, only a is known: both orders fit, nothing else is given
    rows = assign_captions(_panels(GRID, ["a", "8", None, None]), ABCD)
    assert _pairs(rows) == [("label", "Blot."), ("none", None), ("none", None), ("none", None)]
    assert rows[2]["match_detail"] == pairing.AMBIGUOUS


def test_a_caption_without_labels_gives_no_panel_text():
    split = CaptionSplit(preface="A single photograph.", panels={}, scheme="none")
    rows = assign_captions(_panels([(0, 0, 10, 10)], [None]), split)
    assert rows == [
        {
            "label": None,
            "text": None,
            "preface": "A single photograph.",
            "match": "none",
            "match_detail": "the caption defines no panel labels",
            "scheme": "none",
            "confidence": 0.0,
            "caption_labels": 0,
            "count_agreement": "no_caption_labels",
            "count_mismatch": True,
        }
    ]
    assert assign_captions([], split) == []


@pytest.mark.parametrize(
    ("panels", "labels", "expected"),
    [(4, 4, "equal"), (5, 4, "more_panels"), (3, 4, "fewer_panels"), (1, 0, "no_caption_labels")],
)
def test_count_agreement(panels, labels, expected):
    assert count_agreement(panels, labels) == expected


# elife-46472 fig. 7 (CC0; sample/articles/elife-46472/fig7.jpg): four QTL plots, a and b down
# the left column, c and d down the right; the boxes are sample/panels/boxes.json's, the texts
# split from its caption by reading it ("... mapping of (a) consumption of MA from a 40 mg/l
# solution, and 15 strains for mapping of (b) body temperature response ... Composite interval
# mapping for MA consumption (c) and body temperature response (d) ...").
FIG7_BOXES = [(0, 0, 292, 112), (300, 0, 600, 112), (0, 117, 292, 245), (300, 117, 600, 245)]  # a, c, b, d
FIG7 = CaptionSplit(
    preface="Genome-wide QTL scans identify a significant QTL on mouse chromosome 10.",
    panels={
        "a": "consumption of MA from a 40 mg/l solution",
        "b": "body temperature response to 2 mg/kg MA at 30 min post-treatment",
        "c": "Composite interval mapping for MA consumption",
        "d": "body temperature response",
    },
    scheme="lower",
)


def test_a_real_figure_labelled_down_its_columns():
    read = assign_captions(_panels(FIG7_BOXES, ["a", "c", "b", "d"]), FIG7)
    assert [r["text"] for r in read] == [
        "consumption of MA from a 40 mg/l solution",  # top left: interval mapping, MA consumption
        "Composite interval mapping for MA consumption",  # top right
        "body temperature response to 2 mg/kg MA at 30 min post-treatment",  # bottom left
        "body temperature response",  # bottom right
    ]
    # with no label read, reading order would have given the top-right plot b's text: none instead
    unread = assign_captions(_panels(FIG7_BOXES, [None] * 4), FIG7)
    assert {r["match"] for r in unread} == {"none"}


def test_a_tall_panel_beside_a_grid():
    """A spans the height on the left; B C over D E on the right. Read by rows the grid is B C D E,
    by columns B D C E: unread, it is ambiguous; B and C read along its top row settle it."""
    layout = [(0, 0, 100, 210), (110, 0, 210, 100), (220, 0, 320, 100), (110, 110, 210, 210), (220, 110, 320, 210)]
    split = CaptionSplit(panels={k: f"Text {k}." for k in "ABCDE"}, scheme="upper")
    unread = assign_captions(_panels(layout, [None] * 5), split)
    assert {r["match"] for r in unread} == {"none"} and unread[0]["match_detail"] == pairing.AMBIGUOUS
    read = assign_captions(_panels(layout, [None, "B", "C", None, None]), split)
    assert [(r["label"], r["match"]) for r in read] == [
        ("A", "order"),
        ("B", "label"),
        ("C", "label"),
        ("D", "order"),
        ("E", "order"),
    ]
    assert read[3]["match_detail"] == pairing.ROWS_BY_LABELS


def test_sub_labels_pair_by_label_and_count_as_their_panel():
    """The caption defines a (with a1, a2) and b: two panels. A panel printed "a2" gets a2's text;
    two unlabelled panels in a row are a and b by order."""
    split = CaptionSplit(
        panels={"a": "Overview. (a1) left. (a2) right.", "a1": "left.", "a2": "right.", "b": "Bars."},
        parents={"a1": "a", "a2": "a"},
        scheme="lower",
    )
    row = [(0, 0, 100, 100), (110, 0, 210, 100)]
    rows = assign_captions(_panels(row, [None, None]), split)
    assert [(r["label"], r["text"], r["match"]) for r in rows] == [
        ("a", "Overview. (a1) left. (a2) right.", "order"),
        ("b", "Bars.", "order"),
    ]
    assert {r["caption_labels"] for r in rows} == {2} and {r["count_agreement"] for r in rows} == {"equal"}
    three = assign_captions(_panels([*row, (220, 0, 320, 100)], ["a1", "a2", None]), split)
    assert [(r["text"], r["match"]) for r in three] == [("left.", "label"), ("right.", "label"), (None, "none")]
    assert three[2]["match_detail"] == "3 panels, 2 caption labels"
