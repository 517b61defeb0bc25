"""One sample into what a step uses: the image tensor, the text (a region's text sampled from its
two), the hard negatives, and an ROI region's box in its parent's frame."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from pipelines.images.decode import UnusableFigureError, open_figure
from pipelines.training.multilevel.config import IMAGE_EXTS, REGION, MultilevelConfig


@dataclass
class Decoded:
    key: str
    image: Any  # a preprocessed tensor
    text: str
    negatives: list[str] = field(default_factory=list)
    size: tuple[int, int] = (0, 0)  # the image's (width, height) before the transform
    meta: str = ""  # the sample's JSON member as text


def _text(sample: dict, ext: str) -> str:
    value = sample.get(ext)
    return value.decode("utf-8") if isinstance(value, bytes) else (value or "")


def region_text(sample: dict, prob: float, rng: random.Random) -> str:
    """One of a region's two texts (Panel2Patch, "Loss & Training"): its VLM description with
    probability ``prob`` when it has one, else its caption clause."""
    meta = json.loads(_text(sample, "json") or "{}")
    description = (meta.get("description") or "").strip()
    if description and rng.random() < prob:
        return description
    return _text(sample, "txt").strip()


def decode(sample: dict, level: str, preprocess, config: MultilevelConfig, rng: random.Random) -> Decoded:
    """The sample's image (preprocessed) and text; raises ValueError for an unusable sample (the
    decoder's ``UnusableFigureError`` with its reason for an image it refuses)."""
    ext = next((e for e in IMAGE_EXTS if e in sample), None)
    if ext is None:
        raise ValueError("no image member")
    figure = open_figure(sample[ext])
    if figure.image is None:
        raise UnusableFigureError(figure.reason)
    image = figure.image
    text = region_text(sample, config.region_description_prob, rng) if level == REGION else _text(sample, "txt")
    if not text.strip():
        raise ValueError("empty text")
    negatives = [n.strip() for n in _text(sample, "neg.txt").splitlines() if n.strip()][: config.max_negatives]
    return Decoded(sample["__key__"], preprocess(image), text.strip(), negatives, image.size, _text(sample, "json"))


@dataclass
class RoiRegion:
    key: str
    box: tuple[float, float, float, float]  # in the parent's pixel frame
    text: str
    negatives: list[str]


def decode_roi(sample: dict, config: MultilevelConfig, rng: random.Random) -> RoiRegion:
    """A region for the ROI modes: its texts and its box (the JSON ``box``, in the figure's
    pixels); its crop is not decoded. Raises ValueError for a region without a usable box or text."""
    meta = json.loads(_text(sample, "json") or "{}")
    box = meta.get("box")
    if not isinstance(box, list) or len(box) != 4 or not all(isinstance(v, int | float) for v in box):
        raise ValueError(f"no [x1, y1, x2, y2] box in the region JSON (got {box!r})")
    text = region_text(sample, config.region_description_prob, rng)
    if not text:
        raise ValueError("empty text")
    negatives = [n.strip() for n in _text(sample, "neg.txt").splitlines() if n.strip()][: config.max_negatives]
    return RoiRegion(sample["__key__"], tuple(float(v) for v in box), text, negatives)


def box_in_parent(region: RoiRegion, parent: Decoded) -> tuple[float, float, float, float]:
    """The region's figure-pixel box moved into its parent's frame: a panel's JSON ``box`` (also in
    figure pixels) gives the panel's origin and extent, scaled to the panel image as stored (a
    crop kept at its size scales by 1); a figure is its own frame."""
    meta = json.loads(parent.meta or "{}")
    frame = meta.get("box")
    x1, y1, x2, y2 = region.box
    if not (isinstance(frame, list) and len(frame) == 4 and frame[2] > frame[0] and frame[3] > frame[1]):
        return (x1, y1, x2, y2)
    sx, sy = parent.size[0] / (frame[2] - frame[0]), parent.size[1] / (frame[3] - frame[1])
    return ((x1 - frame[0]) * sx, (y1 - frame[1]) * sy, (x2 - frame[0]) * sx, (y2 - frame[1]) * sy)
