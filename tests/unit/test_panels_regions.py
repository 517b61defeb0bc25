"""A chart's own parts told from panels (``pipelines.panels.regions``): colour bars, drawn with
known shades."""

from __future__ import annotations

import numpy as np

from pipelines.panels.regions import is_colour_bar


def _sheet(strip: np.ndarray, at=(20, 10)) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """``strip`` (grey levels) framed in black on a white work copy; returns it and the box."""
    h, w = strip.shape
    gray = np.full((h + 2 * at[1] + 2, w + 2 * at[0] + 2), 255, np.int16)
    x, y = at
    gray[y : y + h + 2, x : x + w + 2] = 0
    gray[y + 1 : y + h + 1, x + 1 : x + w + 1] = strip
    return gray, (x, y, x + w + 2, y + h + 2)


def test_a_ramp_along_its_length_is_a_colour_bar():
    ramp = np.repeat(np.linspace(0, 255, 300)[:, None], 30, axis=1)  # dark at the top, light below
    assert is_colour_bar(*_sheet(ramp))
    assert is_colour_bar(*_sheet(ramp.T.copy()))  # the same scale lying across


def test_a_rainbow_scale_whose_brightness_rises_and_falls_once_is_a_colour_bar():
    # jet's grey levels: dark blue, light cyan and yellow, dark red
    shades = np.concatenate([np.linspace(30, 220, 150), np.linspace(220, 60, 150)])
    assert is_colour_bar(*_sheet(np.repeat(shades[None, :], 24, axis=0)))


def test_strips_that_are_pictures_or_swatches_are_not_colour_bars():
    lane = np.full((300, 30), 230.0)
    for top in range(20, 300, 36):  # a gel lane: dark bands, constant across, up and down along
        lane[top : top + 8] = 40
    assert not is_colour_bar(*_sheet(lane))
    assert not is_colour_bar(*_sheet(np.full((300, 30), 120.0)))  # a legend's swatch: one shade
    rng = np.random.default_rng(0)
    noise = np.repeat(np.linspace(0, 255, 300)[:, None], 30, axis=1) + rng.normal(0, 40, (300, 30))
    assert not is_colour_bar(*_sheet(np.clip(noise, 0, 255)))  # a micrograph strip varies across too
    square = np.repeat(np.linspace(0, 255, 200)[:, None], 200, axis=1)
    assert not is_colour_bar(*_sheet(square))  # a shaded picture as wide as it is long
