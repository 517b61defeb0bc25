"""Bad input (§4): every odd figure gives panels or a recorded reason, never an exception."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipelines.images.boxes import iou
from pipelines.images.decode import normalize_mode
from pipelines.panels.inputs import (
    DRAFT_SIDE,
    PanelInputError,
    prepare_image,
    split_figure,
)
from testing.panel_figures import draw_panel, encode, grid, huge_png, huge_uniform_jpeg

TWO = [(10, 10, 110, 110), (130, 10, 230, 110)]  # two panels 20 px apart on 240 x 120


def two_panels(mode="L", bg=255, fill=70) -> Image.Image:
    im = Image.new(mode, (240, 120), bg)
    draw = ImageDraw.Draw(im)
    for i, box in enumerate(TWO):
        draw_panel(draw, box, fill, seed=i)
    return im


def assert_two(result):
    assert result.reason is None, result.reason
    assert len(result.panels) == 2
    for panel, box in zip(result.panels, TWO, strict=True):
        assert iou(panel.box, box) > 0.9, (panel.box, box)


def test_tiny_image_is_a_reason():
    result = split_figure(encode(Image.new("RGB", (20, 500), "white"), "PNG"))
    assert result.panels == [] and result.reason.startswith("too small: 20x500")
    with pytest.raises(PanelInputError, match="too small"):
        prepare_image(Image.new("L", (31, 31)))


def test_not_an_image_and_truncated_are_reasons():
    assert split_figure(b"<html>not an image</html>").reason == "not an image (no format PIL can identify)"
    data = encode(two_panels(), "JPEG")
    assert split_figure(data[: len(data) // 3]).reason.startswith("unreadable image: image file is truncated")


def test_huge_png_is_refused_without_decoding():
    data = huge_png()  # 20,000 x 20,000, 1-bit, about 76 kB
    result = split_figure(data)
    assert result.panels == []
    assert result.reason == "too large: 20000x20000 px = 400,000,000 px, over the cap of 89,478,485 px"


def test_huge_jpeg_is_refused_like_everywhere_else():
    # 20,000 x 20,000 = 400 Mpx: over the one cap, so no stage takes it (issue 23 §6), panels included
    result = split_figure(huge_uniform_jpeg())
    assert result.panels == []
    assert result.reason == "too large: 20000x20000 px = 400,000,000 px, over the cap of 89,478,485 px"
    with pytest.raises(PanelInputError, match="too large: 20000x20000 px"):
        prepare_image(huge_uniform_jpeg())


def test_large_jpeg_with_panels_maps_boxes_to_original_pixels():
    im = Image.new("L", (8000, 7000), 255)  # 56 Mpx, under the cap; both sides >= 2 x 2048: drafted
    assert min(8000, 7000) >= 2 * DRAFT_SIDE
    draw = ImageDraw.Draw(im)
    truth = [(400, 400, 3800, 6600), (4200, 400, 7600, 6600)]
    for i, box in enumerate(truth):
        draw_panel(draw, box, seed=i)
    data = encode(im, "JPEG", quality=70)
    del im, draw
    image, width, height = prepare_image(data)
    assert image.size == (4000, 3500) and (width, height) == (8000, 7000)  # 1/2: >= 2048 px
    result = split_figure(data)
    assert len(result.panels) == 2
    for panel, box in zip(result.panels, truth, strict=True):
        assert all(abs(a - b) <= 8 for a, b in zip(panel.box, box, strict=True)), panel.box


@pytest.mark.parametrize("colour", ["white", "black", (0, 90, 200)])
def test_single_colour_is_uniform_image(colour):
    result = split_figure(encode(Image.new("RGB", (300, 200), colour), "PNG"))
    assert result.panels == [] and result.reason == "uniform image"


def test_transparent_rgba_on_white():
    # panels drawn opaque on a fully transparent *black* canvas: on white the gutters are white
    im = Image.new("RGBA", (240, 120), (0, 0, 0, 0))
    draw = ImageDraw.Draw(im)
    for i, box in enumerate(TWO):
        draw_panel(draw, box, (70, 70, 70, 255), seed=i)
    rgb = normalize_mode(im)
    assert rgb.mode == "RGB" and rgb.getpixel((0, 0)) == (255, 255, 255)
    assert_two(split_figure(encode(im, "PNG")))
    assert_two(split_figure(encode(im.convert("LA"), "PNG")))


def test_palette_with_transparency_and_plain_palette():
    im = Image.new("RGBA", (240, 120), (0, 0, 0, 0))
    draw = ImageDraw.Draw(im)
    for i, box in enumerate(TWO):
        draw_panel(draw, box, (70, 70, 70, 255), seed=i)
    p = im.convert("P")  # RGBA -> P keeps a transparent palette entry
    data = encode(p, "PNG")
    assert Image.open(io.BytesIO(data)).info.get("transparency") is not None
    assert_two(split_figure(data))
    assert_two(split_figure(encode(two_panels("RGB").convert("P"), "PNG")))


def test_cmyk():
    cmyk = two_panels("RGB").convert("CMYK")
    assert_two(split_figure(encode(cmyk, "JPEG", quality=95)))
    assert_two(split_figure(encode(cmyk, "TIFF")))


def test_sixteen_and_thirty_two_bit_grey():
    a = np.asarray(two_panels(), dtype=np.uint16) * 257  # 0..65535
    im16 = Image.fromarray(a)
    assert im16.mode == "I;16"
    assert_two(split_figure(encode(im16, "PNG")))
    im32 = Image.fromarray(a.astype(np.int32) * 4)
    assert im32.mode == "I"
    assert_two(split_figure(im32))
    assert_two(split_figure(encode(im32, "TIFF")))


def test_animated_gif_first_frame():
    first = two_panels("RGB").convert("P")
    one = Image.new("RGB", (240, 120), "white")
    draw_panel(ImageDraw.Draw(one), (10, 10, 230, 110), (70, 70, 70))
    blank = Image.new("RGB", (240, 120), "white")
    data = encode(first, "GIF", save_all=True, append_images=[one.convert("P"), blank.convert("P")])
    assert Image.open(io.BytesIO(data)).n_frames == 3
    assert_two(split_figure(data))


def test_sixty_panel_grid_in_reading_order():
    im, truth = grid(rows=6, cols=10, cell=110, gap=10, margin=10)  # 1210 x 730
    result = split_figure(encode(im, "PNG"))
    assert result.reason is None and len(result.panels) == 60
    for panel, box in zip(result.panels, truth, strict=True):
        assert iou(panel.box, box) > 0.9, (panel.box, box)
