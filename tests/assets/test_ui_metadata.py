"""Plots and pictures reach the UI's metadata panel as Markdown images, which it renders."""

from __future__ import annotations

import base64
import io

import numpy as np
from dagster import MetadataValue
from PIL import Image, JpegImagePlugin

from assets.report import _value
from pipelines.core.stage import Markdown
from pipelines.images.previews import captioned_sheet, sheet_preview


def _png(width: int, height: int) -> bytes:
    """Red left half, blue right half."""
    image = Image.new("RGB", (width, height), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, width // 2, height))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_a_contact_sheet_preview_is_a_small_jpeg_in_markdown():
    markdown = sheet_preview(_png(960, 348))
    prefix = "![contact sheet](data:image/jpeg;base64,"
    assert markdown.startswith(prefix) and markdown.endswith(")")
    image = Image.open(io.BytesIO(base64.b64decode(markdown[len(prefix) : -1])))
    assert image.format == "JPEG" and image.size == (480, 174)  # half of 960 x 348
    red, blue = image.getpixel((60, 87)), image.getpixel((420, 87))
    assert red[0] > 200 > red[2] and blue[2] > 200 > blue[0]
    assert JpegImagePlugin.get_sampling(image) == 0  # the one JPEG encoder's 4:4:4 (PIL's own default: 4:2:0)


def test_a_sheet_cell_whose_image_the_decoder_refuses_says_unreadable():
    """A crop's bytes go through the one decoder: a cell it refuses is drawn as "unreadable"
    (red text on white), never a stage failure, like a cell with no bytes at all."""
    refused, missing = (captioned_sheet([(data, "x")], "t") for data in (b"not an image", None))
    assert refused == missing
    cell = np.asarray(Image.open(io.BytesIO(refused)).convert("RGB").crop((4, 30, 146, 50)))
    assert ((cell[..., 0] > 150) & (cell[..., 1] < 100)).any()  # red text where the thumbnail would be


def test_markdown_counts_become_markdown_metadata():
    """The stage says Markdown; the asset's metadata must say so too, or the UI shows the text."""
    value = _value(Markdown("![scree](data:image/png;base64,AAAA)"))
    assert value == MetadataValue.md("![scree](data:image/png;base64,AAAA)")


def test_floats_are_rounded_for_reading():
    assert _value(12.3456789) == 12.346
    assert _value(0.000123456) == 0.0001235  # a small rate keeps its digits
    assert _value(2 / 3) == 0.6667
    assert _value(7) == 7 and _value(True) is True and _value("0.123456") == "0.123456"
    assert _value({"rate": 1 / 3, "items": [0.98765, 5]}) == MetadataValue.json({"rate": 0.3333, "items": [0.9877, 5]})


def test_a_captioned_sheet_puts_each_text_under_its_image():
    red = Image.new("RGB", (60, 40), (255, 0, 0))
    out = io.BytesIO()
    red.save(out, "JPEG")
    long_text = "A very long panel text that goes on " * 10
    sheet = Image.open(io.BytesIO(captioned_sheet([(out.getvalue(), "Panel A."), (None, long_text)], "two panels")))
    # four 150 px columns; a title line of 26 px, then one row: a 150 px thumbnail and four 14 px text lines + 6
    assert sheet.size == (600, 26 + 150 + 62)
    r, g, b = sheet.getpixel((75, 26 + 75))  # the middle of the first cell: the red image
    assert r > 200 and g < 60 and b < 60
    text_band = np.asarray(sheet.crop((0, 26 + 150, 150, 26 + 212)).convert("L"))
    assert (text_band < 128).sum() > 20  # dark text pixels under the first image
    unreadable = np.asarray(sheet.crop((150, 26, 300, 26 + 40)).convert("RGB"), dtype=int)
    assert ((unreadable[..., 0] > 150) & (unreadable[..., 1] < 100)).sum() > 5  # "unreadable", in red
