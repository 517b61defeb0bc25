"""Figures drawn for the panel tests and ``benchmarks/label_styles.py``: grids of textured panels,
charts, printed labels, micrographs, and huge images made cheaply."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw


def draw_panel(draw: ImageDraw.ImageDraw, box, fill=70, seed: int = 0) -> None:
    """A panel: a filled rectangle with a few lighter strokes inside (content, not a gutter)."""
    x1, y1, x2, y2 = box
    draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=fill)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        a = (int(rng.integers(x1, x2)), int(rng.integers(y1, y2)))
        b = (int(rng.integers(x1, x2)), int(rng.integers(y1, y2)))
        draw.line([a, b], fill=200, width=2)


def micrograph(width: int, height: int, seed: int = 0) -> Image.Image:
    """A light greyscale photograph: blurred noise with dark blobs of a glyph's size (nuclei,
    vesicles), which the label finder must not take for labels."""
    from PIL import ImageFilter

    rng = np.random.default_rng(seed)
    noise = Image.fromarray((rng.random((height // 8 + 1, width // 8 + 1)) * 255).astype(np.uint8))
    im = noise.resize((width, height), Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(2))
    return Image.fromarray((np.asarray(im) * 0.5 + 110).astype(np.uint8)).convert("RGB")


def grid(rows: int, cols: int, cell: int, gap: int, margin: int, bg=255, fill=70, mode="L"):
    """A rows x cols grid of ``cell``-pixel panels ``gap`` apart inside a ``margin``; returns the
    image and the drawn boxes in reading order."""
    width = 2 * margin + cols * cell + (cols - 1) * gap
    height = 2 * margin + rows * cell + (rows - 1) * gap
    im = Image.new(mode, (width, height), bg)
    draw = ImageDraw.Draw(im)
    boxes = []
    for r in range(rows):
        for c in range(cols):
            x1, y1 = margin + c * (cell + gap), margin + r * (cell + gap)
            box = (x1, y1, x1 + cell, y1 + cell)
            draw_panel(draw, box, fill, seed=r * cols + c)
            boxes.append(box)
    return im, boxes


def huge_png(width: int = 20_000, height: int = 20_000) -> bytes:
    """A white 1-bit PNG, streamed row by row through zlib: about 50 kB, never a full image in
    memory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + b"\xff" * ((width + 7) // 8)
    comp = zlib.compressobj(9)
    rows = row * 500
    idat = b"".join(comp.compress(rows) for _ in range(height // 500))
    idat += comp.compress(row * (height % 500)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def huge_uniform_jpeg(width: int = 20_000, height: int = 20_000) -> bytes:
    """A baseline greyscale JPEG of one grey (128), written by hand: one-symbol Huffman tables
    (DC difference 0 and end-of-block, each the 1-bit code ``0``), so every 8x8 block is two zero
    bits and the scan is zero bytes (1.6 MB for 20,000 x 20,000)."""

    def segment(marker: int, payload: bytes) -> bytes:
        return struct.pack(">HH", marker, len(payload) + 2) + payload

    one_code = bytes([1] + [0] * 15)
    blocks = ((width + 7) // 8) * ((height + 7) // 8)
    return b"".join(
        [
            b"\xff\xd8",
            segment(0xFFDB, b"\x00" + b"\x01" * 64),
            segment(0xFFC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"),
            segment(0xFFC4, b"\x00" + one_code + b"\x00"),
            segment(0xFFC4, b"\x10" + one_code + b"\x00"),
            segment(0xFFDA, b"\x01\x01\x00\x00\x3f\x00"),
            bytes((2 * blocks + 7) // 8),
            b"\xff\xd9",
        ]
    )


def encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def mpl_font(file: str, size: int):
    """A font file of matplotlib's own (``DejaVuSans.ttf``, ``STIXGeneral.ttf``, ...: a
    dependency, so no system font is needed)."""
    from pathlib import Path

    import matplotlib
    from PIL import ImageFont

    return ImageFont.truetype(str(Path(matplotlib.__file__).parent / "mpl-data/fonts/ttf" / file), size)


def bold_font(size: int):
    """DejaVu Sans Bold, matplotlib's default bold."""
    return mpl_font("DejaVuSans-Bold.ttf", size)


def draw_chart(draw: ImageDraw.ImageDraw, box, seed: int = 0, font=None) -> None:
    """A bar chart filling ``box``: y tick labels in a strip at its left, an L-shaped axis,
    bars, x tick labels in a strip below the axis (text strips apart from the plot by white
    space, as charts are drawn)."""
    from PIL import ImageFont

    font = font or ImageFont.load_default()
    x1, y1, x2, y2 = box
    ax_x, ax_y = x1 + 30, y2 - 24  # the axis corner
    draw.line([(ax_x, y1), (ax_x, ax_y), (x2 - 1, ax_y)], fill=0, width=2)
    rng = np.random.default_rng(seed)
    n = 5
    step = (x2 - ax_x - 10) / n
    for k in range(n):
        bx = int(ax_x + 8 + k * step)
        top = int(rng.integers(y1 + 5, ax_y - 20))
        draw.rectangle([bx, top, bx + int(step * 0.6), ax_y - 2], fill=(60 + 30 * k) % 200)
    for k, value in enumerate(("0", "5", "10")):
        y = int(ax_y - k * (ax_y - y1 - 10) / 2)
        draw.line([(ax_x - 5, y), (ax_x, y)], fill=0, width=1)
        draw.text((x1, y - 6), value, fill=0, font=font)
    for k in range(n):
        draw.text((int(ax_x + 8 + k * step), y2 - 14), str(k + 1), fill=0, font=font)


def draw_label(draw: ImageDraw.ImageDraw, xy, text: str, font, fill=0) -> tuple[int, int, int, int]:
    """A printed panel label at ``xy``; returns the box of its ink (x2/y2 exclusive)."""
    draw.text(xy, text, fill=fill, font=font)
    left, top, right, bottom = draw.textbbox(xy, text, font=font)
    mask = Image.new("L", (right - left + 2, bottom - top + 2), 0)
    ImageDraw.Draw(mask).text((xy[0] - left + 1, xy[1] - top + 1), text, fill=255, font=font)
    ink = np.asarray(mask) > 127
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    return left - 1 + int(cols[0]), top - 1 + int(rows[0]), left + int(cols[-1]), top + int(rows[-1])
