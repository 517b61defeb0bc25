"""Printed panel labels: what counts as a label, which readings form the figure's sequence, and
the real OCR engines reading drawn labels (Tesseract, the one the stage uses; RapidOCR, the one
it was measured against)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipelines.panels.labels import (
    PrintedLabel,
    RapidOcrReader,
    TesseractReader,
    _as_bar,
    choose_labels,
    choose_sequence,
    find_candidates,
    label_at,
    label_text,
    read_labels,
)
from pipelines.panels.layout import work_copy
from testing.panel_figures import bold_font, draw_chart, draw_label, micrograph, mpl_font
from testing.system import require, tesseract_data

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("A", "A"),
        ("(b)", "b"),
        ("c.", "c"),
        ("2)", "2"),
        ("iv", "iv"),
        ("XII", "XII"),
        ("A1", "A1"),
        ("b12", "b12"),
        ("Cc", "c"),  # one glyph whose case the engine could not tell
        ("AB", None),
        ("100", None),
        ("+", None),
        ("", None),
        ("kDa", None),
    ],
)
def test_what_a_label_is(raw, label):
    assert label_text(raw) == label


def test_label_at():
    assert [label_at(i, "upper") for i in range(3)] == ["A", "B", "C"]
    assert label_at(3, "roman", "ii") == "iv" and label_at(101, "alnum", "A1") == "B2"


def _at(text, x, y, h=20, w=14, confidence=0.9):
    return PrintedLabel(text=text, box=(x, y, x + w, y + h), confidence=confidence)


def test_the_reading_aligned_with_the_other_labels_wins():
    # A, B on the top row, C below A; a second "A" read inside a panel, same size, aligned
    # with nothing
    reads = [_at("A", 10, 10), _at("B", 400, 10), _at("C", 10, 300), _at("A", 213, 157)]
    assert [(r.text, r.box[:2]) for r in choose_labels(reads)] == [("A", (10, 10)), ("B", (400, 10)), ("C", (10, 300))]


def test_digits_and_numerals_need_the_caption():
    ticks = [_at("1", 10, 10), _at("2", 10, 60), _at("3", 10, 110)]  # a tick-label column
    assert choose_labels(ticks) == []
    assert [r.text for r in choose_labels(ticks, ["1", "2", "3"])] == ["1", "2", "3"]
    numerals = [_at("i", 10, 10, w=5), _at("ii", 300, 10, w=10)]
    assert choose_labels(numerals) == []  # "i" alone may be a letter, "ii" is no letter
    assert [r.text for r in choose_labels(numerals, ["i", "ii"])] == ["i", "ii"]


def test_the_caption_filters_the_readings():
    reads = [_at("a", 10, 10), _at("b", 400, 10), _at("x", 10, 300)]
    assert [r.text for r in choose_labels(reads, ["a", "b"])] == ["a", "b"]


def test_case_is_the_figures():
    # "c" and "C" are one shape: a figure printing a, b takes "c"
    reads = [_at("a", 10, 10, h=14), _at("b", 300, 6, h=18), _at("C", 600, 10, h=14)]
    labels, scheme = choose_sequence(reads)
    assert scheme == "lower" and [r.text for r in labels] == ["a", "b", "c"]


def test_capitals_share_one_height():
    reads = [_at("A", 10, 10, h=20), _at("B", 400, 10, h=20), _at("C", 10, 300, h=12)]
    assert [r.text for r in choose_labels(reads)] == ["A", "B"]


def test_a_wrongly_split_caption_does_not_hide_the_labels():
    # the caption says "from anterior (a) to posterior (d)": not labels; the image prints A-D
    reads = [_at("A", 10, 10), _at("B", 400, 10), _at("C", 10, 300), _at("D", 400, 300)]
    assert [r.text for r in choose_labels(reads, ["a", "d"])] == ["A", "B", "C", "D"]


def test_a_sequence_starts_at_its_first_or_second_label():
    assert [r.text for r in choose_labels([_at("b", 10, 10), _at("c", 300, 10)])] == ["b", "c"]
    assert choose_labels([_at("c", 10, 10), _at("d", 300, 10)]) == []


def test_sub_labels_of_one_letter_are_panels_of_the_letter_sequence():
    # "a" on the left, "b1".."b2" on the top row, "c" below: read in any order
    reads = [_at("b2", 600, 10, w=24), _at("a", 10, 10), _at("c", 300, 300), _at("b1", 300, 10, w=24)]
    labels, scheme = choose_sequence(reads)
    assert scheme == "lower" and [r.text for r in labels] == ["a", "b1", "b2", "c"]


# --- candidates and the engines ------------------------------------------------------------------


def _figure_with_labels():
    """Two charts, "A" and "B" bold at their top-left; a white "c" inside a dark square."""
    im = Image.new("RGB", (700, 330), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(28)
    boxes = [draw_label(draw, (15, 10), "A", font), draw_label(draw, (360, 10), "B", font)]
    draw_chart(draw, (20, 50, 330, 320), seed=1)
    draw_chart(draw, (365, 50, 680, 320), seed=2)
    return im, boxes


def test_candidates_stand_free():
    im, boxes = _figure_with_labels()
    gray = np.asarray(work_copy(im))
    found = [c.box for c in find_candidates(gray)]
    # both labels are candidates (work pixels = image pixels below 1024), within a pixel
    for box in boxes:
        assert any(all(abs(a - b) <= 2 for a, b in zip(box, f, strict=True)) for f in found)
    # the tick labels of the charts ("0", "5", "10", "1".."5") have neighbours or are digits:
    # none of the label candidates is a word of the charts
    assert len(found) < 40


def test_a_thin_frame_beside_a_label_is_not_text():
    """A photograph's one-pixel white frame, once a figure is resized or recompressed, breaks
    into pieces; a corner piece is an L the size of a word but almost empty (here 40 x 25 px,
    64 ink pixels: 6 % of its box, where glyphs fill more than 8 %). Beside a white label in the
    photograph's dark corner it is no neighbouring text: the label stays a candidate."""
    im = Image.new("L", (300, 200), 0)
    draw = ImageDraw.Draw(im)
    draw.line([(1, 1), (40, 1)], fill=255)  # the frame's corner piece, broken off at (41, 1) and (1, 26)
    draw.line([(1, 1), (1, 25)], fill=255)
    box = draw_label(draw, (6, 8), "a", bold_font(16), fill=255)
    found = [c.box for c in find_candidates(np.asarray(work_copy(im.convert("RGB"))))]
    assert any(all(abs(a - b) <= 2 for a, b in zip(box, f, strict=True)) for f in found), (box, found)


def test_tesseract_reads_the_labels():
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im, boxes = _figure_with_labels()
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), ["A", "B"])
    assert [r.text for r in reading.labels] == ["A", "B"] and reading.scheme == "upper"
    for label, box in zip(reading.labels, boxes, strict=True):
        assert all(abs(a - b) <= 3 for a, b in zip(label.box, box, strict=True))
    assert all(0 < r.confidence <= 1 for r in reading.labels)


def _charts_in_a_row(labels, font_size: int) -> Image.Image:
    """Charts side by side, each with its bold label printed above its top-left."""
    im = Image.new("RGB", (10 + 350 * len(labels), 330), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(font_size)
    for col, text in enumerate(labels):
        x = 15 + col * 350
        draw_label(draw, (x, 10), text, font)
        draw_chart(draw, (x + 5, 50, x + 320, 320), seed=col)
    return im


def test_tesseract_reads_a_letter_with_a_number_without_a_caption():
    # "b1" and "b2" need digits, which a figure without a caption is not read with at first.
    # Set as figures set them at this size: the glyphs two pixels apart, one token (glyphs set
    # wider apart than the join are two tokens with a neighbour each, and not read)
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _charts_in_a_row(("a", "b1", "b2"), font_size=16)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == ["a", "b1", "b2"] and reading.scheme == "lower"


def test_tesseract_reads_labels_with_a_closing_bracket_without_a_caption():
    # "a)", "b)", "c)" set tight (one token each): told letters only, the engine would make the
    # bracket a letter too, unsure of both
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _charts_in_a_row(("a)", "b)", "c)"), font_size=14)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("labels", "size"), [(("A.", "B.", "C."), 16), (("a.", "b.", "c."), 22), (("A.", "B.", "C."), 32)]
)
def test_labels_with_a_full_stop(labels, size):
    # "A." as PLOS and many journals print it: the dot a gap after the letter (a speck beside it,
    # not a word's letter) or a pixel after it (one token, read with the dot)
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _charts_in_a_row(labels, font_size=size)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == [x[0] for x in labels]


def test_a_label_in_brackets_ranks_as_one_at_a_corner():
    # "(1)": the brackets stand left of and above the digit, and are its own, not the ink beside
    # a word; ranked as such, the labels come before the charts' tick numbers
    im = _charts_in_a_row(("(1)", "(2)", "(3)"), font_size=26)
    ranked = find_candidates(np.asarray(work_copy(im)))
    assert all(c.box[1] < 40 for c in ranked[:3])  # the three labels, printed at the top


@pytest.mark.parametrize(
    ("labels", "caption"),
    [
        (("(i)", "(ii)", "(iii)"), ["i", "ii", "iii"]),  # "ii": two glyphs a few pixels apart, one word
        (("a1", "a2", "b1"), ["a1", "a2", "b1"]),  # the engine reads "a1" as "al"; b1 follows a2
    ],
)
def test_numbered_labels_beside_the_charts_tick_numbers(labels, caption):
    # the charts' tick labels are digits too, as tall as a third of the panel labels
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _charts_in_a_row(labels, font_size=26)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), caption)
    assert [r.text for r in reading.labels] == caption


def test_without_a_caption_the_label_after_the_last_is_looked_for():
    # 030213v1_fig23 (tune split, no caption): "(a)" and "(b)" stand out, "(c)" ranks below
    # the arrows' numbers and is found in their row
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    with Image.open(ROOT / "sample/articles/biorxiv-2020.04.07.030213/030213v1_fig23") as im:
        im = im.convert("RGB")
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == ["a", "b", "c"]


def test_one_label_read_clearly_shows_where_the_others_stand():
    # elife-52882 fig5-figsupp2 (holdout split, 600 x 163): three trajectory plots with serif
    # capitals 8 px tall at their top-left, the caption naming (A) to (C). The first reading
    # makes "A" an "N" and only "B" is a label: alone, no sequence, and nothing was read again.
    # "B" shows the labels' height and row; "A" (at 22-29 x 12-20 by hand) stands in it
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    with Image.open(ROOT / "sample/articles/elife-52882/fig5-figsupp2.jpg") as im:
        im = im.convert("RGB")
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), ["A", "B", "C"])
    assert [r.text for r in reading.labels][:2] == ["A", "B"]
    assert all(abs(a - b) <= 2 for a, b in zip(reading.labels[0].box, (22, 12, 29, 20), strict=True))
    # a reading outside the caption's labels seeds nothing
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), ["a1", "a2", "a3"])
    assert reading.labels == []


def test_labels_under_the_glyph_floor_are_read_at_twice_the_scale_when_the_caption_names_them():
    # three charts 170 px apart with bold capitals 5 px tall (drawn at 7 pt) at their top-left:
    # below the 6 work pixels from which a glyph is a candidate, as the labels of a small
    # rendition are. The caption names A to C and none was read: the figure is searched again at
    # twice its size. Without a caption, or with one naming no panel, nothing says labels are
    # there, and the search is not repeated
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = Image.new("RGB", (520, 140), "white")
    draw = ImageDraw.Draw(im)
    boxes = []
    for col, text in enumerate("ABC"):
        x = 8 + col * 170
        boxes.append(draw_label(draw, (x, 4), text, bold_font(7)))
        draw_chart(draw, (x + 4, 16, x + 160, 136), seed=col)
    assert all(b[3] - b[1] == 5 for b in boxes)
    gray = np.asarray(work_copy(im))
    reading = read_labels(im, gray, TesseractReader(), ["A", "B", "C"])
    assert [r.text for r in reading.labels] == ["A", "B", "C"]
    for label, box in zip(reading.labels, boxes, strict=True):
        assert all(abs(a - b) <= 1 for a, b in zip(label.box, box, strict=True))
    assert read_labels(im, gray, TesseractReader()).labels == []
    assert read_labels(im, gray, TesseractReader(), []).labels == []


def test_labels_set_against_a_title_are_found_from_the_labels_below_them():
    # "A Family 1", "B Family 2" (a title a few pixels after the label: no free-standing
    # glyph), "C" and "D" free below them in the same columns
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = Image.new("RGB", (760, 640), "white")
    draw = ImageDraw.Draw(im)
    font, small = bold_font(28), bold_font(20)
    boxes = {}
    for (row, col), text in {(0, 0): "A", (0, 1): "B", (1, 0): "C", (1, 1): "D"}.items():
        x, y = 15 + col * 370, 10 + row * 310
        boxes[text] = draw_label(draw, (x, y), text, font)
        if row == 0:
            draw.text((boxes[text][2] + 6, y + 6), f"Family {col + 1}", fill=0, font=small)
        draw_chart(draw, (x + 5, y + 45, x + 340, y + 300), seed=row * 2 + col)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == ["A", "B", "C", "D"]
    for label in reading.labels:
        assert all(abs(a - b) <= 3 for a, b in zip(label.box, boxes[label.text], strict=True))


def _chart_grid(letters: str, columns: int, width: int, pitch: int, chart: int) -> tuple[Image.Image, dict]:
    """Charts ``chart`` px wide in rows of ``columns``, ``pitch`` px apart, each with its label
    printed in DejaVu Sans Bold 18 above its top-left; returns the figure and each label's ink box."""
    rows = -(-len(letters) // columns)
    im = Image.new("RGB", (width, rows * 215 + 10), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(18)
    boxes = {}
    for k, text in enumerate(letters):
        row, col = divmod(k, columns)
        x, y = 15 + col * pitch, 10 + row * 215
        boxes[text] = draw_label(draw, (x, y), text, font)
        draw_chart(draw, (x + 4, boxes[text][3] + 6, x + chart, y + 200), seed=k)
    return im, boxes


@pytest.mark.parametrize(("letters", "named"), [("ABCDEFGHIJKL", False), ("ABCDEFGHI", True)])
def test_a_sans_serif_capital_i_is_read_where_the_sequence_misses_it(letters, named):
    # DejaVu Sans Bold prints "I" as one upright bar, which Tesseract reads as nothing here.
    # Between "H" and "J" the sequence misses it; as the last label, the caption names it
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im, boxes = _chart_grid(letters, columns=3, width=900, pitch=295, chart=275)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), list(letters) if named else None)
    assert [r.text for r in reading.labels] == list(letters)
    assert all(abs(a - b) <= 3 for a, b in zip(reading.labels[8].box, boxes["I"], strict=True))


def test_a_capital_j_that_descends_is_a_label_of_the_capitals_height():
    # DejaVu Sans (matplotlib's default) prints "J" a third below the baseline: 19 px against
    # the other capitals' 13-14 px here
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im, boxes = _chart_grid("ABCDEFGHIJ", columns=5, width=1200, pitch=235, chart=220)
    assert boxes["J"][3] - boxes["J"][1] >= 1.3 * (boxes["H"][3] - boxes["H"][1])
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader())
    assert [r.text for r in reading.labels] == list("ABCDEFGHIJ")
    assert all(abs(a - b) <= 3 for a, b in zip(reading.labels[9].box, boxes["J"], strict=True))


def _photographs_labelled_above(font, gap: int, seed: int) -> Image.Image:
    """Nine light 240 x 200 micrographs ``gap`` px apart in a 3 x 3 grid, each with its label
    ("A" to "I") above it on the page's white."""
    im = Image.new("RGB", (10 + 3 * (240 + gap), 10 + 3 * (222 + gap)), "white")
    draw = ImageDraw.Draw(im)
    for k, text in enumerate("ABCDEFGHI"):
        r, c = divmod(k, 3)
        x, y = 5 + c * (240 + gap), 5 + r * (222 + gap)
        draw_label(draw, (x, y), text, font)
        im.paste(micrograph(240, 200, seed=k + seed), (x, y + 22))
    return im


def test_labels_above_photographs_outrank_the_photographs_blobs():
    # nine light micrographs 3 px apart, each with its label above it on the page's white: the
    # blobs inside the photographs are glyph-sized and stand free too, but
    # a dark label is printed on white
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _photographs_labelled_above(bold_font(14), gap=3, seed=18)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), list("ABCDEFGHI"))
    assert [r.text for r in reading.labels] == list("ABCDEFGHI")


def test_a_sans_serif_capital_i_read_as_l_is_the_i_the_caption_names():
    # the same grid in DejaVu Sans (regular): its "I" is a plain bar, which Tesseract reads as
    # "l"; a blob of a photograph read as "I" in the labels' column used to take the ninth label
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = _photographs_labelled_above(mpl_font("DejaVuSans.ttf", 14), gap=12, seed=21)
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), list("ABCDEFGHI"))
    assert [r.text for r in reading.labels] == list("ABCDEFGHI")
    assert reading.labels[8].box[1] > 2 * 234  # the bar above the last row (at y = 473), not a blob


def test_a_bar_takes_the_case_of_the_scheme():
    assert _as_bar("l", "upper") == "I" and _as_bar("I", "lower") == "l"
    assert _as_bar("l", "lower") == "l" and _as_bar("I", "upper") == "I"
    assert _as_bar("l", None) == "l" and _as_bar("l", "digit") == "l" and _as_bar("B", "lower") == "B"
    assert _as_bar(None, "upper") is None


def test_white_labels_on_black():
    require(tesseract_data(), "Tesseract (tesserocr and Debian's tesseract-ocr-eng) is not installed")
    im = Image.new("RGB", (620, 240), "white")
    draw = ImageDraw.Draw(im)
    font = bold_font(24)
    boxes = []
    for k, text in enumerate("abc"):
        draw.rectangle([k * 210, 0, k * 210 + 199, 239], fill=(20, 20, 20))
        boxes.append(draw_label(draw, (k * 210 + 10, 8), text, font, fill=(255, 255, 255)))
    reading = read_labels(im, np.asarray(work_copy(im)), TesseractReader(), ["a", "b", "c"])
    assert [r.text for r in reading.labels] == ["a", "b", "c"] and reading.scheme == "lower"
    for label, box in zip(reading.labels, boxes, strict=True):
        assert all(abs(a - b) <= 2 for a, b in zip(label.box, box, strict=True))


def test_rapidocr_reads_the_labels_too():
    pytest.importorskip("rapidocr_onnxruntime", reason="RapidOCR is the measured alternative, not installed")
    im, _ = _figure_with_labels()
    reading = read_labels(im, np.asarray(work_copy(im)), RapidOcrReader(), ["A", "B"])
    assert [r.text for r in reading.labels] == ["A", "B"]
