"""Post-processing shared by every panel method: boxes and expected results worked out by hand."""

from __future__ import annotations

import pytest

from pipelines.images.boxes import (
    Panel,
    attach_labels,
    clamp,
    column_order_indices,
    consensus,
    finalize,
    iou,
    is_duplicate,
    match_panels,
    reading_order,
    single_panel,
    suppress,
)


def test_iou_by_hand():
    # two 10x10 squares sharing a 5x10 strip: 50 / (100 + 100 - 50)
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching edges: x2 is exclusive
    assert iou((0, 0, 0, 10), (0, 0, 0, 10)) == 0.0  # empty boxes


def test_clamp_cuts_to_the_figure():
    assert clamp([(-5, -3, 50, 40), (90, 10, 130, 70), (120, 0, 140, 10)], 100, 60) == [
        (0, 0, 50, 40),
        (90, 10, 100, 60),
        (100, 0, 100, 10),  # wholly outside: zero width, dropped later by finalize
    ]


def test_inset_survives_but_near_duplicate_does_not():
    panel = Panel((0, 0, 100, 100), score=0.9)
    inset = Panel((60, 60, 95, 95), score=0.95)  # inside, 12 % of the panel's area
    duplicate = Panel((2, 2, 98, 98), score=0.5)  # IoU 0.92
    nested_big = Panel((0, 0, 100, 80), score=0.8)  # inside, 80 % of the area, IoU 0.8
    half = Panel((0, 0, 100, 55), score=0.8)  # inside, 55 % of the area: IoU 0.55 -> duplicate
    under_half = Panel((0, 0, 100, 45), score=0.8)  # inside, 45 %: survives like an inset
    assert not is_duplicate(panel.box, inset.box)
    assert is_duplicate(panel.box, duplicate.box)
    assert is_duplicate(panel.box, nested_big.box)
    assert is_duplicate(panel.box, half.box)
    assert not is_duplicate(panel.box, under_half.box)
    assert suppress([panel, inset, duplicate]) == [panel, inset]
    # the better score wins among duplicates, whatever the order
    assert suppress([duplicate, panel]) == [panel]


def test_partial_overlap_duplicate_rule():
    # 100x100 and 60x100 overlapping on 50x100: IoU 5000/11000 = 0.45 (< 0.5), but the
    # intersection is 5000/6000 = 0.83 of the smaller box and its area is 0.6 of the larger one
    assert iou((0, 0, 100, 100), (50, 0, 110, 100)) == pytest.approx(5000 / 11000)
    assert is_duplicate((0, 0, 100, 100), (50, 0, 110, 100))
    # a 40x100 box overlapping on 30x100: 0.75 of the smaller: not a duplicate
    assert not is_duplicate((0, 0, 100, 100), (70, 0, 110, 100))


def test_single_panel_rule():
    big = Panel((0, 0, 100, 100))
    small = Panel((80, 80, 100, 100))  # content box is big itself: big covers 100 %
    assert single_panel([big, small]) == [big]
    # two halves: neither covers 85 % of the content box
    left, right = Panel((0, 0, 50, 100)), Panel((50, 0, 100, 100))
    assert single_panel([left, right]) == [left, right]
    # 90 x 100 next to a 10 x 100 strip: 90 % >= 85 %
    wide, strip = Panel((0, 0, 90, 100)), Panel((90, 0, 100, 100))
    assert single_panel([wide, strip]) == [wide]


def test_reading_order_rows_then_columns():
    a, b = Panel((0, 0, 40, 40), label="a"), Panel((50, 5, 90, 45), label="b")  # same row
    c, d = Panel((55, 50, 95, 90), label="d"), Panel((0, 52, 40, 92), label="c")
    assert [p.label for p in reading_order([c, b, d, a])] == ["a", "b", "c", "d"]


def test_reading_order_tall_left_panel():
    # a | b over c: a spans both rows; b and c share half of their height with a
    a = Panel((0, 0, 50, 100), label="a")
    b = Panel((60, 0, 100, 48), label="b")
    c = Panel((60, 52, 100, 100), label="c")
    assert [p.label for p in reading_order([c, b, a])] == ["a", "b", "c"]


def test_reading_order_tall_panel_beside_a_grid():
    """a spans the height; b c d e over f g h i to its right (rows 1 px apart): a, then the grid
    row by row. Rows grown through a would read b f c g d h e i; read down the columns first, the
    grid is b f c g d h e i."""
    a = Panel((8, 1, 140, 207), label="a")
    grid = [
        Panel((153 + 113 * k, y1, 255 + 113 * k, y2), label=label)
        for (y1, y2), labels in (((1, 104), "bcde"), ((105, 207), "fghi"))
        for k, label in enumerate(labels)
    ]
    assert [p.label for p in reading_order([*grid[::-1], a])] == list("abcdefghi")
    boxes = [p.box for p in [a, *grid]]
    assert [[a, *grid][i].label for i in column_order_indices(boxes)] == list("abfcgdhei")


def test_reading_order_of_boxes_no_cut_separates():
    """Three boxes overlapping in a pinwheel: no row or column cut, rows grown by overlap."""
    a, b, c = Panel((0, 0, 60, 40), label="a"), Panel((50, 0, 100, 60), label="b"), Panel((0, 45, 55, 100), label="c")
    assert [p.label for p in reading_order([c, b, a])] == ["a", "b", "c"]


def test_attach_labels_top_left():
    left, right = Panel((0, 20, 100, 120)), Panel((110, 20, 210, 120))
    labels = [
        ((112, 22, 122, 34), "b"),  # inside right's top-left corner
        ((2, 4, 12, 16), "a"),  # just above left's top-left corner (within the margin)
        ((180, 100, 190, 112), "z"),  # bottom-right of right: attaches to nothing
    ]
    out = attach_labels([left, right], labels)
    assert [p.label for p in out] == ["a", "b"]


def test_finalize_applies_every_step():
    panels = [
        Panel((150, 0, 260, 100), score=0.9),  # sticks out on the right: clamped to 200
        Panel((0, 0, 100, 100), score=0.8),
        Panel((10, 10, 10, 50), score=0.99),  # zero width: dropped
        Panel((1, 1, 99, 99), score=0.5),  # duplicate of the second: suppressed
        Panel((60, 60, 90, 90), score=0.7),  # inset: kept
    ]
    out = finalize(panels, 200, 100, labels=[((152, 2, 160, 12), "B")])
    assert [p.box for p in out] == [(0, 0, 100, 100), (60, 60, 90, 90), (150, 0, 200, 100)]
    assert [p.label for p in out] == [None, None, "B"]


def test_match_panels_hungarian():
    a = [Panel((0, 0, 10, 10)), Panel((20, 0, 30, 10))]
    b = [Panel((21, 0, 31, 10)), Panel((0, 0, 10, 10)), Panel((100, 100, 110, 110))]
    # 9x10 overlap on the right: 90 / 110
    assert match_panels(a, b) == [(0, 1, 1.0), (1, 0, pytest.approx(90 / 110))]
    assert match_panels([], b) == []


def test_consensus_mean_and_agreement():
    xy = [Panel((0, 0, 10, 10)), Panel((20, 0, 30, 10)), Panel((50, 50, 60, 60))]
    detr = [Panel((0, 0, 10, 10), label="a"), Panel((22, 0, 32, 10), label="b")]
    panels, agreement = consensus(xy, detr)
    # second pair: 8x10 overlap -> IoU 80 / 120; mean box (21, 0, 31, 10)
    assert [p.box for p in panels] == [(0, 0, 10, 10), (21, 0, 31, 10)]
    assert [p.label for p in panels] == ["a", "b"]
    assert panels[1].score == pytest.approx(80 / 120)
    assert agreement == pytest.approx((1.0 + 80 / 120) / 3)
    boxes, _ = consensus(xy, detr, box="detr")
    assert boxes[1].box == (22, 0, 32, 10)
    # below iou_min nothing is kept
    assert consensus([Panel((0, 0, 10, 10))], [Panel((6, 0, 16, 10))]) == ([], 0.0)
    assert consensus([], []) == ([], 1.0)
