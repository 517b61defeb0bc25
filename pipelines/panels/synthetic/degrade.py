"""What publishing does to a figure: an earlier JPEG pass, downscaling, the final JPEG.

PMC's figures have been through authors' tools, journal production and PMC's own conversion; a
detector trained on clean renders meets blocking artefacts and soft edges only at inference.
Boxes are scaled with the image, each edge from the same float, so panels that share an edge
still share it after scaling.
"""

from __future__ import annotations

import io
import random
from typing import TYPE_CHECKING

from PIL import Image

if TYPE_CHECKING:
    from pipelines.panels.synthetic.generate import GeneratorConfig


def degrade(canvas: Image.Image, rng: random.Random, config: GeneratorConfig) -> tuple[bytes, Image.Image, dict]:
    """The figure as published: (final JPEG bytes, the image it encodes, the degradation record
    ``{double_jpeg: quality or None, scale: factor, quality}``)."""
    width, height = canvas.size
    degradation = {"double_jpeg": None, "scale": 1.0, "quality": None}
    if rng.random() < config.double_jpeg_prob:
        q1 = rng.randint(60, 95)
        buffer = io.BytesIO()
        canvas.save(buffer, "JPEG", quality=q1)
        canvas = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
        degradation["double_jpeg"] = q1
    if rng.random() < config.downscale_prob:
        factor = rng.uniform(*config.downscale)
        new = (max(32, round(width * factor)), max(32, round(height * factor)))
        canvas = canvas.resize(new, Image.Resampling.BICUBIC, reducing_gap=2.0)
        degradation["scale"] = round(factor, 4)
    quality = rng.randint(*config.jpeg_quality)
    degradation["quality"] = quality
    buffer = io.BytesIO()
    canvas.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue(), canvas, degradation


def scaled_bbox(box: tuple[int, int, int, int], sx: float, sy: float) -> list[float]:
    """COCO ``[x, y, w, h]`` of ``box`` (x0, y0, x1, y1) scaled by (``sx``, ``sy``), to 0.01 px."""
    x0, y0, x1, y1 = box
    left, top, right, bottom = (round(v, 2) for v in (x0 * sx, y0 * sy, x1 * sx, y1 * sy))
    return [left, top, round(right - left, 2), round(bottom - top, 2)]  # shared edges stay shared
