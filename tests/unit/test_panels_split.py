"""The figure-level panel decision (``pipelines.panels.split``) on drawn figures, whose panels
and labels are known from the drawing, on hand-boxed real figures (``sample/panels``), and on
bad input. Printed labels are read by the real Tesseract engine (no mock)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipelines.images.boxes import iou
from pipelines.images.components import components
from pipelines.panels.evaluate import load_eval_figures, match_at_iou, score_figures
from pipelines.panels.split import (
    _in_runs,
    _Label,
    _parting,
    _untangle,
    decide,
    figure_decision,
    panels_for_figure,
)
from testing.panel_figures import bold_font, draw_chart, draw_label, draw_panel, huge_png
from testing.system import require, tesseract_data

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "sample" / "panels" / "eval"


@pytest.fixture(scope="module", autouse=True)
def tesseract():
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")


def _same(found, truth, min_iou=0.9) -> bool:
    return len(found) == len(truth) and all(iou(p.box, t) >= min_iou for p, t in zip(found, truth, strict=True))


def _labelled_grid(labels_at, size=(760, 620), font_size=30):
    """Charts in a 2 x 2 grid, each with a bold label printed at its top-left, above the chart;
    ``labels_at`` maps (row, column) to the label. Returns the figure and, in reading order, the
    panels drawn (the chart with its label) and their labels."""
    im = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(font_size)
    out = []
    for (row, col), text in sorted(labels_at.items()):
        x, y = 20 + col * 370, 15 + row * 300
        lx1, ly1, lx2, ly2 = draw_label(draw, (x, y), text, font)
        chart = (x + 5, ly2 + 8, x + 340, y + 280)
        draw_chart(draw, chart, seed=row * 2 + col)
        out.append(((min(lx1, chart[0]), ly1, chart[2], chart[3]), text))
    return im, [box for box, _ in out], [text for _, text in out]


def test_a_labelled_grid_is_one_panel_per_label():
    im, boxes, labels = _labelled_grid({(0, 0): "A", (0, 1): "B", (1, 0): "C", (1, 1): "D"})
    caption = "Figure 2. Growth. (A) Day 1. (B) Day 2. (C) Day 3. (D) Day 4."
    panels = panels_for_figure(im, caption)
    assert [p.label for p in panels] == labels == ["A", "B", "C", "D"]
    assert _same(panels, boxes)


def test_labels_printed_down_the_columns_stay_with_their_panels():
    # a, b down the left column, c, d down the right one; panels come in reading order (rows)
    im, boxes, labels = _labelled_grid({(0, 0): "a", (1, 0): "b", (0, 1): "c", (1, 1): "d"})
    panels = panels_for_figure(im, "Fig. 7. (a) first (b) second (c) third (d) fourth")
    assert labels == ["a", "c", "b", "d"]
    assert [p.label for p in panels] == labels
    assert _same(panels, boxes)


def test_labels_printed_below_their_panels():
    im = Image.new("RGB", (760, 380), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(26)
    truth = []
    for col, text in enumerate(("(a)", "(b)")):
        chart = (20 + col * 380, 15, 20 + col * 380 + 330, 300)
        draw_chart(draw, chart, seed=col)
        lx1, ly1, lx2, ly2 = draw_label(draw, (chart[0] + 140, 318), text, font)
        truth.append((chart[0], chart[1], chart[2], ly2))
    decision = decide(im, "Figure 6. Two fits: (a) the first, (b) the second.")
    assert decision.route == "labels"
    assert [p.label for p in decision.panels] == ["a", "b"]
    assert _same(decision.panels, truth)


def test_white_labels_inside_dark_photographs():
    # three photographs 2 px apart (white gutters), labels white at their top-left corner
    im = Image.new("RGB", (604, 220), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(22)
    truth = [(0, 0, 200, 220), (202, 0, 402, 220), (404, 0, 604, 220)]
    for i, (box, text) in enumerate(zip(truth, "abc", strict=True)):
        draw_panel(draw, box, fill=(25, 25, 25), seed=i)
        draw_label(draw, (box[0] + 8, 6), text, font, fill=(255, 255, 255))
    panels = panels_for_figure(im, "Chest CT of patient 1 (a), patient 2 (b) and patient 3 (c).")
    assert [p.label for p in panels] == ["a", "b", "c"]
    assert _same(panels, truth)


def test_a_label_whose_foot_runs_into_a_rounded_black_frame():
    # three MRI rows, each a black rounded frame the width of the figure with its label at its
    # top-left corner; the "A"'s right foot runs into its frame's rounded corner (biorxiv
    # 469032v1 Fig. 2 prints it so), "B" and "C" stand free. The caption names "a" to "c": the
    # labels are recorded as printed, capitals
    im = Image.new("RGB", (900, 780), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(26)
    truth, labels = [], []
    for k, text in enumerate("ABC"):
        top = 8 + k * 258
        frame = (16 if k == 0 else 22, top + 22, 890, top + 248)
        draw.rounded_rectangle(frame, radius=40, fill=(0, 0, 0))
        draw.text((300, top + 60), "RSC (medial)", fill=(255, 255, 255), font=font)
        labels.append(draw_label(draw, (6, top + 15) if k == 0 else (4, top - 6), text, font))
        truth.append((min(labels[-1][0], frame[0]), labels[-1][1], frame[2] + 1, frame[3] + 1))
    # the "A" and its frame are one shape of ink
    shapes, _, _ = components(np.asarray(im.convert("L")) < 128)
    assert shapes[truth[0][1] + 1, (truth[0][0] + labels[0][2]) // 2] == shapes[200, 400] > 0
    panels = panels_for_figure(im, "Figure 2. Tracts of the hippocampus. (a) Head. (b) Body. (c) Tail.")
    assert [p.label for p in panels] == ["A", "B", "C"]
    assert _same(panels, truth)


def test_a_labelled_grid_of_tiles_is_one_panel():
    # A: four micrograph tiles 4 px apart under one label; B: a chart
    im = Image.new("RGB", (760, 360), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(28)
    lx1, ly1, _, ly2 = draw_label(draw, (15, 10), "A", font)
    for r in range(2):
        for c in range(2):
            x, y = 15 + c * 164, ly2 + 8 + r * 154
            draw_panel(draw, (x, y, x + 160, y + 150), fill=(30, 30, 30), seed=r * 2 + c)
    tiles = (15, ly1, 15 + 324, ly2 + 8 + 304)
    _, bly1, _, bly2 = draw_label(draw, (400, 10), "B", font)
    chart = (405, bly2 + 8, 745, ly2 + 8 + 304)
    draw_chart(draw, chart, seed=5)
    panels = panels_for_figure(im, "Figure 3. (A) Micrographs of four channels. (B) Their intensities.")
    assert [p.label for p in panels] == ["A", "B"]
    assert _same(panels, [tiles, (400, bly1, chart[2], chart[3])])


def test_a_panel_whose_label_is_not_read_is_parted_from_its_neighbour():
    # three charts in a row; the middle one's label is not printed, the caption names three
    im = Image.new("RGB", (1120, 330), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(28)
    truth = []
    for col, text in enumerate(("a", None, "c")):
        x = 15 + col * 370
        top = 15
        if text:
            _, top, _, bottom = draw_label(draw, (x, 15), text, font)
            chart = (x + 5, bottom + 8, x + 330, 315)
        else:
            chart = (x + 5, 50, x + 330, 315)
        draw_chart(draw, chart, seed=col)
        truth.append((x if text else chart[0], top if text else chart[1], chart[2], chart[3]))
    panels = panels_for_figure(im, "Figure 4. Runs (a) one, (b) two and (c) three.")
    assert [p.label for p in panels] == ["a", None, "c"]
    assert len(panels) == 3 and all(iou(p.box, t) >= 0.8 for p, t in zip(panels, truth, strict=True))


def test_the_wide_gutter_between_columns_parts_labels_before_a_narrow_gap_across_them():
    # elife-46793 Fig. 3's layout: Venn diagrams A-C down the left, tables D-F down the right.
    # A 3 px white row runs across the figure between A and B on the left and between E's title
    # and its table on the right; the columns are 37 px apart.
    lab = [_Label((0, 0, 10, 10), t) for t in "ABCDEF"]
    rows = [(1, 2, 482, 164), (1, 167, 598, 392), (18, 395, 600, 861)]
    rows_owners = [[lab[0], lab[3], lab[4]], [lab[1], lab[2]], [lab[5]]]
    columns = [(1, 3, 15, 367), (18, 22, 127, 469), (164, 2, 600, 861)]  # labels, Venns, tables
    columns_owners = [lab[:3], [], lab[3:]]
    assert _parting(rows, rows_owners, axis=0) == 3  # 167 - 164, 395 - 392
    assert _parting(columns, columns_owners, axis=1) == 37  # 164 - 127 (18 - 15 is the narrower)


def test_a_picture_whose_label_is_not_read_below_labelled_panels_is_a_panel():
    # "a" and "b" over two charts, a wide photograph below with no label printed: no caption
    # to count the panels, and the photograph is no legend or title shared by the others
    im = Image.new("RGB", (760, 640), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(28)
    truth = []
    for col, text in enumerate("ab"):
        x = 15 + col * 370
        lx1, ly1, _, ly2 = draw_label(draw, (x, 10), text, font)
        chart = (x + 5, ly2 + 8, x + 340, 300)
        draw_chart(draw, chart, seed=col)
        truth.append((lx1, ly1, chart[2], chart[3]))
    wide = (20, 340, 725, 625)
    draw_panel(draw, wide, fill=(40, 40, 40), seed=7)
    truth.append(wide)
    decision = decide(im, None)
    assert decision.route == "labels"
    assert [p.label for p in decision.panels] == ["a", "b", None]
    assert len(decision.panels) == 3 and all(iou(p.box, t) >= 0.8 for p, t in zip(decision.panels, truth, strict=True))


def test_a_chart_with_its_text_strips_and_legend_stays_whole():
    # one chart, its tick-label strips, an axis title below and a legend box to its right
    im = Image.new("RGB", (700, 420), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(14)
    draw_chart(draw, (20, 20, 480, 360), seed=3)
    draw.text((180, 380), "Time after infection (h)", fill=0, font=font)
    draw.rectangle([520, 120, 540, 140], fill=(200, 30, 30))
    draw.text((550, 122), "treated", fill=0, font=font)
    draw.rectangle([520, 160, 540, 180], fill=(30, 30, 200))
    draw.text((550, 162), "control", fill=0, font=font)
    panels = panels_for_figure(im, "Figure 5. Viral load over time in treated and control mice.")
    assert len(panels) == 1 and panels[0].label is None
    assert iou(panels[0].box, (20, 20, 610, 398)) >= 0.9


def test_a_colour_bar_with_its_ticks_and_title_joins_the_picture_it_scales():
    # an intensity scale (a framed grey ramp, its tick values and a title below), 40 px from the
    # picture it scales, then two more pictures 110 px apart: three panels. With its ticks and
    # title the scale is wider than a quarter of the widest picture, so its width alone would
    # make it a panel of its own
    im = Image.new("RGB", (1010, 420), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(14)
    for y in range(30, 390):
        shade = round(255 * (y - 30) / 359)
        draw.line([(10, y), (49, y)], fill=(shade, shade, shade))
    draw.rectangle([10, 30, 49, 389], outline=0)
    for k, value in enumerate(("200", "100", "0", "-100", "-200")):
        draw.text((56, 24 + 88 * k), value, fill=0, font=font)
    draw.text((8, 398), "HU intensity", fill=0, font=font)
    pictures = [(140, 40, 390, 380), (500, 40, 740, 380), (850, 20, 1000, 400)]
    for i, box in enumerate(pictures):
        draw_panel(draw, box, fill=(40, 40, 40), seed=i)
    panels = panels_for_figure(im, None)
    assert _same(panels, [(8, 30, 390, 412), *pictures[1:]])
    # a rainbow scale drawn across, under its picture, 40 px below it: as tall with its words
    # as a third of the picture
    im = Image.new("RGB", (900, 280), "white")
    draw = ImageDraw.Draw(im)
    draw_panel(draw, (20, 10, 400, 160), fill=(40, 40, 40), seed=5)
    for x in range(20, 400):
        shade = round(255 * (x - 20) / 379)
        draw.line([(x, 200), (x, 229)], fill=(shade, 255 - shade, 128))
    draw.text((20, 236), "0      Expression (log2)      12", fill=0, font=font)
    draw_panel(draw, (500, 10, 880, 160), fill=(40, 40, 40), seed=6)
    panels = panels_for_figure(im, None)
    assert _same(panels, [(20, 10, 400, 253), (500, 10, 880, 160)])


def test_a_caption_naming_no_panel_and_labels_read_with_a_gap_keep_one_chart_whole():
    """One chart with a bold "A" over its left end and a "C" over its middle (letters a chart or a
    table prints: site codes, words of one letter). A caption that names no panel is evidence of
    one figure, and "A", "C" without a "B" is a sequence with a gap: together they part nothing.
    Without a caption, or with one that names A to C, the letters stay labels and part it."""
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = Image.new("RGB", (700, 420), "white")
    draw = ImageDraw.Draw(im)
    draw_chart(draw, (40, 50, 680, 400), seed=3)
    draw_label(draw, (12, 10), "A", bold_font(22))
    draw_label(draw, (360, 10), "C", bold_font(22))
    whole = decide(im, "Figure 2. Catch per unit effort at each site over the study years.")
    assert len(whole.panels) == 1 and whole.route == "structure" and whole.labels == []
    for caption in (None, "Figure 2. (A) Catch at site 1. (B) Catch at site 2. (C) Catch at site 3."):
        parted = decide(im, caption)
        assert parted.route == "labels" and len(parted.panels) >= 2, caption


def test_a_caption_that_speaks_of_left_and_right_panels_parts_a_narrow_gutter():
    # two bar charts 20 px apart (under UNNAMED_GUTTER of the 760 px side), no printed label
    im = Image.new("RGB", (760, 330), "white")
    draw = ImageDraw.Draw(im)
    draw_chart(draw, (20, 20, 365, 310), seed=0)
    draw_chart(draw, (385, 20, 740, 310), seed=1)
    single = "Figure 2. Growth of two strains in rich medium."
    assert len(panels_for_figure(im, single)) == 1  # a caption naming no panel: one chart
    for caption in (
        "Figure 2. Growth in rich medium. The left panel shows strain X; the right panel strain Y.",
        "Figure 2. Growth in rich medium, one strain in each panel.",
    ):
        panels = panels_for_figure(im, caption)
        truth = [(20, 20, 365, 310), (385, 20, 740, 310)]
        assert len(panels) == 2 and all(iou(p.box, t) >= 0.9 for p, t in zip(panels, truth, strict=True)), caption


def test_small_multiples_are_panels_whatever_the_caption_says():
    # six bar charts, each with its own axes, 12 px apart (under UNNAMED_GUTTER): a caption that
    # names no panel does not make them one chart
    im = Image.new("RGB", (900, 560), "white")
    draw = ImageDraw.Draw(im)
    truth = []
    for row in range(2):
        for col in range(3):
            box = (10 + col * 296, 10 + row * 276, 294 + col * 296, 274 + row * 276)
            draw_chart(draw, box, seed=row * 3 + col)
            truth.append(box)
    panels = panels_for_figure(im, "Figure 4. Growth of six strains in rich medium.")
    assert len(panels) == 6 and all(iou(p.box, t) >= 0.8 for p, t in zip(panels, truth, strict=True))


def test_pixels_in_long_runs_are_a_binary_opening_by_a_line():
    from scipy import ndimage

    rng = np.random.default_rng(0)
    for _ in range(100):
        h, w, length = int(rng.integers(1, 30)), int(rng.integers(2, 40)), int(rng.integers(2, 20))
        ink = rng.random((h, w)) < rng.random()
        expected = ndimage.binary_opening(ink, np.ones((1, length), bool)) if length <= w else np.zeros_like(ink)
        assert (_in_runs(ink, length) == expected).all()


def test_ruled_tables_side_by_side_stay_one_figure():
    # three ruled tables 12 px apart: frames and rules as long as a chart's axes, but only text
    # inside them
    im = Image.new("RGB", (900, 520), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(13)
    for col in range(3):
        x = 10 + col * 296
        draw.rectangle([x, 10, x + 284, 505], outline=0, width=2)
        draw.line([x + 90, 10, x + 90, 505], fill=0, width=1)
        for k in range(20):
            y = 14 + k * 24
            draw.text((x + 6, y + 4), f"AB{k}(R)", fill=0, font=font)
            draw.text((x + 96, y + 4), f"region name {k}", fill=0, font=font)
            if k % 4 == 3:
                draw.line([x, y + 22, x + 284, y + 22], fill=0, width=1)
    panels = panels_for_figure(im, "Table 2. Abbreviations of the brain regions.")
    assert len(panels) == 1 and iou(panels[0].box, (10, 10, 885, 506)) >= 0.95


def test_a_label_set_beside_its_charts_top_tick_label():
    # pone.0056489's Fig 1, read by eye: two scatter plots, a serif "A" above the left one's
    # top tick label, a serif "B" level with the right one's, "0.027", about half its own
    # height from it: more than a word space, and the tick labels a smaller type, so no word
    # of the label ("B" was not read before)
    im = Image.open(ROOT / "sample/articles/pone.0056489/pone.0056489.g001.tif")
    decision = decide(im, "Figure 1. (A) Seed length. (B) Seed weight.")
    assert [lab.text for lab in decision.labels] == ["A", "B"]
    (a, b) = decision.labels
    assert a.box[2] < 200 and b.box[0] > 880 and b.box[2] < 1000  # the left edge of each plot
    assert [p.label for p in decision.panels] == ["A", "B"]


def test_a_table_image_keeps_no_label_from_its_footnotes():
    # PLOS's table image, read by eye: a ruled table, two footnotes (the first begins with its
    # marker), a doi line; the table is the figure's one panel and prints no label. Letters of
    # its footnotes read as labels part nothing and name no lone panel (only "A", "a", "1", "i"
    # or a label of the caption could)
    im = Image.open(ROOT / "sample/articles/pone.0091296/t004.png")
    decision = decide(im, None)
    assert [p.label for p in decision.panels] == [None]
    assert iou(decision.panels[0].box, (0, 0, 600, 380)) >= 0.9
    assert decision.labels == []


def test_the_concept_stage_single_panel_keeps_a_figure_whole():
    im = Image.new("RGB", (760, 330), "white")
    draw = ImageDraw.Draw(im)
    for col in range(2):
        draw_chart(draw, (20 + col * 380, 20, 340 + col * 380, 310), seed=col)
    assert len(panels_for_figure(im, None)) == 2  # two charts, a clear gutter, nothing else known
    assert len(panels_for_figure(im, None, panel_type="single panel")) == 1


def test_each_evidence_can_be_switched_off():
    im, boxes, _ = _labelled_grid({(0, 0): "A", (0, 1): "B", (1, 0): "C", (1, 1): "D"})
    without = decide(im, "(A) x (B) y (C) z (D) w", evidence=("caption", "structure"))
    # without labels: the chart structure, or the layout where its count is nearer the caption's
    assert without.route in ("structure", "layout") and not without.labels and not without.readings
    assert all(p.label is None for p in without.panels)


# --- real figures, boxes and labels drawn by hand (sample/panels) ----------------------------------


def test_labels_set_before_their_titles_below_the_panels():
    # "a  Amplitude vs. delay" at each panel's lower-left (030213v1_fig25 in the tune set prints
    # "(a) Amplitude vs. delay"): the title beside the label keeps it from standing free, and the
    # label sits left of its chart
    im = Image.new("RGB", (840, 360), "white")
    draw = ImageDraw.Draw(im)
    font, title = bold_font(20), bold_font(16)
    truth = []
    for col, (text, words) in enumerate((("a", "Amplitude vs. delay"), ("b", "Operating conditions"))):
        x = 10 + col * 420
        draw_chart(draw, (x + 50, 10, x + 390, 300), seed=col)
        lx1, ly1, lx2, ly2 = draw_label(draw, (x, 318), text, font)
        draw.text((lx2 + 5, 320), words, fill=0, font=title)  # a word space
        truth.append((lx1, 10, x + 390, ly2))
    decision = decide(im, "Figure 25. The response. (a) Amplitude against delay. (b) Operating conditions.")
    assert [lab.text for lab in decision.labels] == ["a", "b"]
    assert decision.route == "labels"
    assert [p.label for p in decision.panels] == ["a", "b"]
    assert _same(decision.panels, truth)


def _tune() -> list[dict]:
    # only the tune split: the holdout is scored by benchmarks/panels.py, never here
    files = [EVAL / f"figures-{group}.json" for group in ("A", "B", "D")]
    return load_eval_figures(ROOT / "sample" / "panels" / "boxes.json", files, ROOT, split="tune")


def _figure(name: str) -> dict:
    (fig,) = [f for f in _tune() if f["file"].endswith(name)]
    return fig


@pytest.mark.parametrize(
    "name",
    [
        "40779_2020_233_Fig2_HTML.jpg",  # four chest radiographs, white labels a-d inside, 1-2 px gutters
        "030213v1_fig6",  # two scatter charts, (a)/(b) printed below them
        "030213v1_fig25",  # two scatter charts, "(a) Amplitude vs. delay" below each: labels before titles
        "469032v1_figs7",  # MRI slices in two black rounded frames, A over B; A is two slices
        "488149v1_fig1",  # seven blots and charts a-g, unequal sizes
        "030213v1_tbl1",  # a table rendered as an image: one panel
        "469032v1_fig2",  # three black rounded frames a 3 px white line apart; "A" touches its frame, unread
        "469032v1_figs8",  # a flow diagram A with three MRI slices B-D set into its left side, white labels inside
    ],
)
def test_hand_boxed_real_figures(name):
    fig = _figure(name)
    with Image.open(fig["path"]) as im:
        panels = panels_for_figure(im, fig["caption"])
    assert match_at_iou([p.box for p in panels], fig["boxes"]) == (len(fig["boxes"]), 0, 0)
    # a label read is the one printed on that panel (every label is read on most figures: the
    # share is held on the whole tune split below)
    for panel in panels:
        truth = max(range(len(fig["boxes"])), key=lambda t: iou(panel.box, fig["boxes"][t]))
        assert panel.label in (None, fig["labels"][truth])
    assert sum(p.label is not None for p in panels) >= len([x for x in fig["labels"] if x]) - 1


def test_the_tune_split_of_the_evaluation_set():
    figures = _tune()
    predictions = []
    for fig in figures:
        with Image.open(fig["path"]) as im:
            predictions.append(panels_for_figure(im, fig["caption"]))
    scores = score_figures(figures, predictions)
    # measured on 95 tune figures (259 panels, 27 single): recall 0.996, precision 0.996,
    # ImageCLEF accuracy 0.996, single figures whole 1.0, labels read 0.938
    assert scores["figures"] == len(figures) >= 90
    assert scores["recall"] >= 0.97 and scores["precision"] >= 0.97
    assert scores["imageclef_accuracy"] >= 0.97 and scores["single_whole"] >= 0.95
    assert scores["labels_read"] >= 0.9


# --- bad input: a recorded reason, never an exception ------------------------------------------------


def _encoded(im: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    im.save(out, format=fmt, **kwargs)
    return out.getvalue()


def test_bad_input_is_a_reason():
    assert figure_decision(b"not an image").reason == "not an image (no format PIL can identify)"
    assert figure_decision(_encoded(Image.new("RGB", (20, 300), "white"), "PNG")).reason.startswith("too small")
    assert figure_decision(huge_png()).reason.startswith("too large")
    assert figure_decision(_encoded(Image.new("RGB", (400, 300), (40, 90, 160)), "PNG")).reason == "uniform image"
    assert panels_for_figure(Image.new("RGB", (10, 10), "white")) == []
    assert panels_for_figure(Image.new("RGB", (300, 300), (12, 200, 40))) == []


@pytest.mark.parametrize("mode", ["RGBA", "LA", "CMYK", "I;16", "P", "1", "L"])
def test_every_image_mode(mode):
    im, boxes, _ = _labelled_grid({(0, 0): "A", (0, 1): "B", (1, 0): "C", (1, 1): "D"})
    if mode == "I;16":
        converted = Image.fromarray(np.asarray(im.convert("L"), dtype=np.uint16) * 257)  # I;16
    elif mode in ("RGBA", "LA"):
        converted = im.convert(mode)
        alpha = np.asarray(converted)[..., -1].copy()
        alpha[:5] = 0  # a transparent strip: composited on white
        converted.putalpha(Image.fromarray(alpha))
    else:
        converted = im.convert(mode)
    fmt = "TIFF" if mode in ("CMYK", "I;16") else "PNG"
    split = figure_decision(_encoded(converted, fmt), "(A) a (B) b (C) c (D) d")
    assert split.reason is None
    assert len(split.panels) == 4 if mode != "1" else len(split.panels) >= 1


@pytest.mark.parametrize("caption", [None, "Figure 9. Sixty fields of view."])
def test_sixty_panels(caption):
    # a 6 x 10 grid of photographs, no labels: every one of them a panel, also when the caption
    # names none (a grid of like photographs is compound whatever the caption says)
    im = Image.new("RGB", (10 * 84 + 9 * 8, 6 * 84 + 5 * 8), "white")
    draw = ImageDraw.Draw(im)
    truth = []
    for r in range(6):
        for c in range(10):
            box = (c * 92, r * 92, c * 92 + 84, r * 92 + 84)
            draw_panel(draw, box, fill=(60, 60, 60), seed=r * 10 + c)
            truth.append(box)
    split = figure_decision(_encoded(im, "PNG"), caption)
    assert split.reason is None
    assert match_at_iou([p.box for p in split.panels], truth) == (60, 0, 0)


@pytest.mark.parametrize(
    "caption",
    [None, "", "Figure 1.", "As shown in Fig. 2B and (Fig. 3C), at 37 (C) for 2 h.", "(n = 5) (i.v.) (p < 0.05)"],
)
def test_captions_without_labels_or_with_references_only(caption):
    im, boxes, _ = _labelled_grid({(0, 0): "A", (0, 1): "B", (1, 0): "C", (1, 1): "D"})
    split = figure_decision(_encoded(im, "PNG"), caption)
    assert split.reason is None and 1 <= len(split.panels) <= 4


def test_a_block_that_stretches_the_panel_above_over_the_next_goes_to_the_next():
    # elife-52882 Fig. 1's right column, boxes read off the figure: chart C above chart D, D's
    # label printed over its plot's corner, its tick labels sticking out to the left of it
    # (x 348-379), under C's label. Anchored to C (the label above and to its left), that strip
    # stretched C's panel down over D's; it goes to D, the label after C whose panel C's
    # overlapped. Labels in reading order; rank: their place in the label sequence
    b, c, d = (_Label((153, 2, 161, 12), "B"), _Label((349, 2, 357, 12), "C"), _Label((380, 100, 388, 110), "D"))
    owned = {0: [b.box, (152, 1, 348, 197)], 1: [c.box, (348, 1, 379, 99)], 2: [d.box, (379, 99, 600, 197)]}
    free = [((379, 1, 600, 99), 1), ((348, 99, 379, 197), 1)]  # C's plot; D's tick labels
    assert _untangle(owned, free, [b, c, d], [0, 1, 2], height=10) == [1, 2]
    # a label read inside a picture, before the picture's own label in the sequence ("a" in
    # panel b's radiograph) takes nothing from it
    assert _untangle(owned, free, [b, c, d], [0, 2, 1], height=10) == [1, 1]
    # nor does a label take a block above it: a panel starts at its label
    high = [((379, 1, 600, 99), 1), ((348, 60, 379, 197), 1)]
    assert _untangle(owned, high, [b, c, d], [0, 1, 2], height=10) == [1, 1]
