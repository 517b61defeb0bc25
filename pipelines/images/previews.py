"""Pictures for the UI's metadata panel: contact sheets a person reads beside a stage's numbers.

A count says how many panel crops or region pairs a partition made; a sheet of the first few,
each with its text under it, says whether they are any good (a crop that is only an axis, a
text that belongs to another panel, a random model's "ifi"). Sheets go into the materialization
metadata as Markdown images with a JPEG data URI (``sheet_preview``), small enough for the
event log; the full data stays in the lake.
"""

from __future__ import annotations

import base64
import io
import textwrap

from PIL import Image, ImageDraw, ImageFont

from pipelines.images.decode import open_figure
from pipelines.images.jpeg import jpeg_bytes

PREVIEW_WIDTH = 480  # the sheet shown in the UI's metadata panel: small enough for the event log
PREVIEW_QUALITY = 80  # of the preview's JPEG: small enough for the event log, text still legible
SHEET_ITEMS = 12  # crops per sheet
THUMB, COLUMNS, TEXT_LINES, LINE_CHARS = 150, 4, 4, 26


def sheet_preview(png: bytes, width: int = PREVIEW_WIDTH, title: str = "contact sheet") -> str:
    """A contact sheet scaled to ``width`` as a Markdown image (a JPEG data URI), so the asset's
    metadata panel shows it without opening the lake."""
    image = Image.open(io.BytesIO(png)).convert("RGB")  # our own sheet (captioned_sheet), not a figure
    if image.width > width:  # exactly ``width`` wide (``thumbnail`` may round a pixel off)
        image = image.resize((width, max(1, round(image.height * width / image.width))), Image.LANCZOS)
    encoded = jpeg_bytes(image, quality=PREVIEW_QUALITY)
    return f"![{title}](data:image/jpeg;base64,{base64.b64encode(encoded).decode()})"


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the bitmap font, one size
        return ImageFont.load_default()


def captioned_sheet(items: list[tuple[bytes | None, str]], title: str) -> bytes:
    """A PNG grid of images (encoded bytes; None: could not be read), each with its text wrapped
    under it (``TEXT_LINES`` lines at most, the rest cut with "..."), under a title line."""
    rows = max(1, -(-len(items) // COLUMNS))
    text_h = 14 * TEXT_LINES + 6
    cell_h = THUMB + text_h
    sheet = Image.new("RGB", (COLUMNS * THUMB, 26 + rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((6, 6), title, fill="black", font=_font(13))
    small = _font(11)
    for i, (data, text) in enumerate(items):
        x, y = (i % COLUMNS) * THUMB, 26 + (i // COLUMNS) * cell_h
        image = _decoded(data)
        if image is None:
            draw.text((x + 6, y + 6), "unreadable", fill="red", font=small)
        else:
            image.thumbnail((THUMB - 8, THUMB - 8))
            sheet.paste(image, (x + 4 + (THUMB - 8 - image.width) // 2, y + 4 + (THUMB - 8 - image.height) // 2))
            draw.rectangle((x + 3, y + 3, x + THUMB - 4, y + THUMB - 4), outline="#bbbbbb")
        lines = textwrap.wrap(" ".join((text or "").split()), LINE_CHARS) or ["(no text)"]
        if len(lines) > TEXT_LINES:
            lines = [*lines[: TEXT_LINES - 1], lines[TEXT_LINES - 1][: LINE_CHARS - 3] + "..."]
        draw.multiline_text((x + 5, y + THUMB), "\n".join(lines), fill="#222222", font=small, spacing=2)
    out = io.BytesIO()
    sheet.save(out, "PNG", optimize=True)
    return out.getvalue()


def _decoded(data: bytes | None) -> Image.Image | None:
    return open_figure(data).image if data else None  # a preview never fails a stage: None, "unreadable"
