"""Printed panel labels across the styles figures print them in: drawn figures whose every panel
and label is known, decided as the ``panels`` stage decides a figure.

The hand-boxed evaluation set (``benchmarks/panels.py``) holds the styles its ~150 real figures
happen to use; this benchmark holds each style apart, so that a style the reader misses shows as
its own row instead of a point of the average. Three families:

* ``charts``: 2 x 2 bar charts, each with tick numbers, labelled in 7 fonts (DejaVu Sans, Serif
  and STIX, bold and regular, Computer Modern Sans), 6 forms ("A", "(A)", "A.", "a", "(a)",
  "a)"), 3 sizes (14, 22, 32 px), above the chart or inside it, right of its axis;
* ``photographs``: grids (2 x 2, 2 x 3, 3 x 3, 1 x 4) of blurred-noise micrographs 3 or 12 px
  apart, labelled white inside dark ones or black above light ones, in 3 fonts and 2 sizes;
* ``schemes``: rows of four charts numbered "(1)", "(i)", "a1" or bare "A", above the charts or
  centred below them.

A figure counts as read when every panel carries its own label, and as split when every panel
found matches a drawn one at IoU > 0.66 (ImageCLEF's threshold) and none is missing. The baseline
is the same decision without the printed labels (``evidence`` less ``labels``): the boxes' gain
from reading them. Synthetic figures, not a measure of real ones: what they show is which styles
fail, not how often real figures use them.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections.abc import Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from benchmarks.record import write_results
from pipelines.images.boxes import iou
from pipelines.panels.split import EVIDENCE, decide
from testing.panel_figures import draw_chart, draw_label, micrograph, mpl_font

FONTS = {
    "DejaVu Sans Bold": "DejaVuSans-Bold.ttf",
    "DejaVu Sans": "DejaVuSans.ttf",
    "DejaVu Serif Bold": "DejaVuSerif-Bold.ttf",
    "DejaVu Serif": "DejaVuSerif.ttf",
    "STIX Bold": "STIXGeneralBol.ttf",
    "STIX": "STIXGeneral.ttf",
    "CM Sans": "cmss10.ttf",
}
FORMS = {"A": "{}", "(A)": "({})", "A.": "{}.", "a": "{}", "(a)": "({})", "a)": "{})"}
SCHEMES = {"(1)": ("1234", "({})"), "(i)": (("i", "ii", "iii", "iv"), "({})"), "a1": (("a1", "a2", "b1", "b2"), "{}")}
SCHEMES["A"] = ("ABCD", "{}")
WITHOUT_LABELS = tuple(e for e in EVIDENCE if e != "labels")
Case = tuple[dict, Image.Image, list[tuple[int, int, int, int]], list[str], str]


def _font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return mpl_font(FONTS[name], size)


def _caption(labels: list[str]) -> str:
    return "Figure 1. Results. " + " ".join(f"({label}) Condition {k + 1}." for k, label in enumerate(labels))


def chart_grids(rng: random.Random) -> Iterator[Case]:
    for font, form, size, place in itertools.product(FONTS, FORMS, (14, 22, 32), ("above", "inside")):
        labels = list("abcd" if form.strip("().").islower() else "ABCD")
        im = Image.new("RGB", (800, 640), "white")
        draw = ImageDraw.Draw(im)
        truth = []
        for k, letter in enumerate(labels):
            x, y = 15 + (k % 2) * 395, 12 + (k // 2) * 315
            if place == "above":
                lb = draw_label(draw, (x, y), FORMS[form].format(letter), _font(font, size))
                draw_chart(draw, (x + 4, lb[3] + 6, x + 370, y + 300), seed=rng.randrange(1000))
                truth.append((min(lb[0], x + 4), lb[1], x + 370, y + 300))
            else:  # right of the y axis, above the bars
                lb = draw_label(draw, (x + 45, y + 2), FORMS[form].format(letter), _font(font, size))
                draw_chart(draw, (x, lb[3] + 8, x + 370, y + 300), seed=rng.randrange(1000))
                draw.line([(x + 30, y), (x + 30, lb[3] + 8)], fill=0, width=2)
                truth.append((x, min(y, lb[1]), x + 370, y + 300))
        yield {"font": font, "form": form, "size": size, "place": place}, im, truth, labels, _caption(labels)


def photograph_grids() -> Iterator[Case]:
    grids = {"2x2": (2, 2), "2x3": (2, 3), "3x3": (3, 3), "1x4": (1, 4)}
    fonts = ("DejaVu Sans Bold", "DejaVu Serif Bold", "DejaVu Sans")
    for (grid, (rows, cols)), font, size, style, gap in itertools.product(
        grids.items(), fonts, (14, 24), ("white inside", "black above"), (3, 12)
    ):
        labels = list(("abcdefghi" if style == "white inside" else "ABCDEFGHI")[: rows * cols])
        top = size + 8 if style == "black above" else 0
        im = Image.new("RGB", (10 + cols * (240 + gap), 10 + rows * (200 + gap + top)), "white")
        truth = []
        for k, letter in enumerate(labels):
            x, y = 5 + (k % cols) * (240 + gap), 5 + (k // cols) * (200 + gap + top)
            photo = micrograph(240, 200, seed=k + 7 * rows + cols)
            if style == "white inside":  # a dark micrograph: the light one inverted
                photo = Image.fromarray(255 - np.asarray(photo))
            im.paste(photo, (x, y + top))
            draw = ImageDraw.Draw(im)
            if style == "black above":
                lb = draw_label(draw, (x, y), letter, _font(font, size))
                truth.append((x, lb[1], x + 240, y + top + 200))
            else:
                draw_label(draw, (x + 6, y + 4), letter, _font(font, size), fill=(255, 255, 255))
                truth.append((x, y, x + 240, y + 200))
        style_of = {"grid": grid, "font": font, "size": size, "style": style, "gap": gap}
        yield style_of, im, truth, labels, _caption(labels)


def numbered_rows(rng: random.Random) -> Iterator[Case]:
    fonts = ("DejaVu Sans Bold", "DejaVu Serif", "STIX Bold")
    for scheme, font, size, place in itertools.product(SCHEMES, fonts, (16, 26), ("above", "below")):
        names, form = SCHEMES[scheme]
        labels = list(names)
        im = Image.new("RGB", (1220, 360), "white")
        draw = ImageDraw.Draw(im)
        truth = []
        for k, label in enumerate(labels):
            x, text = 10 + k * 300, form.format(label)
            if place == "above":
                lb = draw_label(draw, (x, 8), text, _font(font, size))
                draw_chart(draw, (x + 4, lb[3] + 6, x + 280, 340), seed=rng.randrange(1000))
                truth.append((x, lb[1], x + 280, 340))
            else:
                draw_chart(draw, (x, 10, x + 280, 300), seed=rng.randrange(1000))
                width = draw.textlength(text, font=_font(font, size))
                lb = draw_label(draw, (int(x + 140 - width / 2), 310), text, _font(font, size))
                truth.append((x, 10, x + 280, lb[3]))
        yield {"scheme": scheme, "font": font, "size": size, "place": place}, im, truth, labels, _caption(labels)


def _split_right(panels, truth) -> bool:
    return len(panels) == len(truth) and all(max(iou(p.box, t) for t in truth) > 0.66 for p in panels)


def _read_right(panels, truth, labels) -> bool:
    """Every drawn panel's best match carries its label."""
    for box, label in zip(truth, labels, strict=True):
        best = max(panels, key=lambda p: iou(p.box, box), default=None)
        if best is None or iou(best.box, box) <= 0.66 or best.label != label:
            return False
    return True


def measure(family: str, cases: Iterator[Case]) -> dict:
    out: dict = {"figures": 0, "labels_all_read": 0, "split_right": 0, "baseline_split_right": 0, "by": {}}
    misses = []
    cpu0 = time.process_time()
    for style, im, truth, labels, caption in cases:
        panels = decide(im, caption).panels
        baseline = decide(im, caption, evidence=WITHOUT_LABELS).panels
        read, split = _read_right(panels, truth, labels), _split_right(panels, truth)
        base = _split_right(baseline, truth)
        out["figures"] += 1
        out["labels_all_read"] += read
        out["split_right"] += split
        out["baseline_split_right"] += base
        for key, value in style.items():
            row = out["by"].setdefault(f"{key}={value}", {"figures": 0, "labels_all_read": 0, "split_right": 0})
            row["figures"] += 1
            row["labels_all_read"] += read
            row["split_right"] += split
        if not (read and split):
            misses.append({**style, "read": [p.label for p in panels]})
    n = out["figures"]
    out["labels_all_read_share"] = round(out["labels_all_read"] / n, 4)
    out["split_right_share"] = round(out["split_right"] / n, 4)
    out["baseline_split_right_share"] = round(out["baseline_split_right"] / n, 4)
    out["split_vs_baseline"] = round(out["split_right"] / max(1, out["baseline_split_right"]), 4)
    out["ms_per_figure_cpu"] = round(1000 * (time.process_time() - cpu0) / n / 2, 1)  # two decisions a figure
    out["misses"] = misses
    print(family, {k: v for k, v in out.items() if k not in ("by", "misses")}, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="label_styles.json")
    args = parser.parse_args()
    families = {
        "charts": chart_grids(random.Random(0)),
        "photographs": photograph_grids(),
        "schemes": numbered_rows(random.Random(1)),
    }
    result = {
        "benchmark": "printed panel labels on drawn figures, one style at a time: every label read, every panel split",
        "baseline": "the same decision without the printed labels (evidence: caption, structure, kind)",
        "note": "synthetic figures: they show which styles fail, not how often real figures print them",
        "families": {name: measure(name, cases) for name, cases in families.items()},
    }
    write_results(args.out, result)


if __name__ == "__main__":
    main()
