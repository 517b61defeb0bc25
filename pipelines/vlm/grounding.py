"""Grounded boxes from model text, in original pixels.

Qwen2.5-VL answers ``bbox_2d`` in absolute pixels of the image *as the processor resized it*
(``smart_resize``: sides rounded to a multiple of 28, area brought into the configured pixel
band), so a box maps back to the original by the two scale factors. Qwen2-VL and Qwen3-VL
answer on a 0–1000 grid relative to the image. Getting this wrong shifts every box of a
non-square image, silently.
"""

from __future__ import annotations

import math

from pipelines.vlm.engine import EngineConfig

MAX_ASPECT = 200  # the processor refuses images more elongated than this


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """The processor's resize (``transformers`` ``qwen2_vl`` ``smart_resize``): returns the
    resized (height, width), both multiples of ``factor``, area within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"aspect ratio over {MAX_ASPECT}: {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def model_frame(width: int, height: int, config: EngineConfig) -> tuple[int, int]:
    """The (width, height) the model sees for an image of ``width`` x ``height``."""
    h, w = smart_resize(height, width, config.patch_factor, config.min_pixels, config.max_pixels)
    return w, h
