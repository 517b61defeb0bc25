"""Plots and pictures reach the UI's metadata panel as Markdown images, which it renders."""

from __future__ import annotations

import base64
import io

from dagster import MetadataValue
from PIL import Image

from assets.report import _value
from pipelines.concepts.review import sheet_preview
from pipelines.core.stage import Markdown


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


def test_markdown_counts_become_markdown_metadata():
    """The stage says Markdown; the asset's metadata must say so too, or the UI shows the text."""
    value = _value(Markdown("![scree](data:image/png;base64,AAAA)"))
    assert value == MetadataValue.md("![scree](data:image/png;base64,AAAA)")
