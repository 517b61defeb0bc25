"""Region features from the parent image's patch tokens: ROI pooling (Panel2Patch) and an ROI
processor (RegionMed-CLIP), the ``roi_pool`` and ``roi_processor`` values of the multi-level
trainer's ``region_features`` (``crop``, the default, sends region crops through the image tower).

* Panel2Patch (``shared/papers/000_1cf676911784e115.txt``, "fine-grained alignment") pairs region
  crops with their descriptions and performs "ROI pooling on panel feature maps". It does not say
  which pooling (max, average, RoIAlign), its output size, nor which layer's map. Ours: RoIAlign
  (``torchvision.ops.roi_align``, ``aligned=True``, 2 samples per bin) over the ViT's last patch
  tokens (after ``ln_post``), the bins averaged into one vector, then the tower's own projection,
  as the pooled token is projected.
* RegionMed-CLIP (``shared/papers/002_027be0657a295389.txt``) has an "ROI processor that
  adaptively integrates fine-grained regional features with the global context", with 8 attention
  heads ("Implementation"), activated in the region-refinement stage. The paper gives neither its
  layers, its query/key roles, nor whether ROI features come from crops or from the image's
  feature map. Ours: one ``nn.MultiheadAttention`` layer in which the pooled ROI vector (query)
  attends to the parent's patch tokens (keys and values), pre-norm, added back as a residual,
  then the tower's projection. Its output projection starts at zero, so when the curriculum turns
  the region terms on the processor starts as plain ROI pooling and learns from there.

Boxes are in the parent image's pixel frame (the release's region JSON ``box``, in the figure's
original pixels). The parent is resized to the tower's square input without a crop (a centre crop
would cut boxes off), so a pixel box maps to patch-grid units by scaling each axis alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

BoxT = tuple[float, float, float, float]


def box_to_grid(box: Sequence[float], image_size: tuple[int, int], grid: tuple[int, int]) -> BoxT:
    """``(x1, y1, x2, y2)`` in pixels of a ``(width, height)`` image -> the same box in patch-grid
    cells of a ``(columns, rows)`` grid (x2/y2 exclusive, as the release writes them)."""
    width, height = image_size
    columns, rows = grid
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {image_size}")
    x1, y1, x2, y2 = (float(v) for v in box)
    if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
        raise ValueError(f"box {list(box)} is empty or outside a {width}x{height} image")
    return (x1 * columns / width, y1 * rows / height, x2 * columns / width, y2 * rows / height)


def token_grid(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Patch tokens ``(N, rows * columns, C)`` (row-major, as the ViT's conv stem flattens them)
    -> a feature map ``(N, C, rows, columns)``."""
    columns, rows = grid
    n, length, channels = tokens.shape
    if length != rows * columns:
        raise ValueError(f"{length} tokens do not fill a {columns}x{rows} grid")
    return tokens.transpose(1, 2).reshape(n, channels, rows, columns)


def roi_pool(feature_map: torch.Tensor, boxes: torch.Tensor, parents: torch.Tensor, output: int = 2) -> torch.Tensor:
    """One vector per box: RoIAlign of ``feature_map`` (N, C, rows, columns) over ``boxes`` (K, 4)
    in grid cells, box ``k`` on map ``parents[k]``, its ``output x output`` bins averaged. With
    ``aligned=True`` a cell's centre sits at ``i + 0.5``, so a box covering cells 2..5 samples
    exactly inside them."""
    from torchvision.ops import roi_align

    rois = torch.cat([parents.to(boxes.dtype).unsqueeze(1), boxes], dim=1).to(feature_map.dtype)
    pooled = roi_align(feature_map, rois, (output, output), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    return pooled.mean(dim=(2, 3))


class RoiProcessor(nn.Module):
    """The ROI vector attends to its parent's patch tokens (the global context) and the answer is
    added back: ``r + W_o attention(LN(r), LN(tokens))``. ``W_o`` starts at zero (see the module
    docstring); ``heads`` must divide the tower's width."""

    def __init__(self, width: int, heads: int = 8):
        super().__init__()
        if width % heads:
            raise ValueError(f"roi_heads {heads} must divide the vision width {width}")
        self.norm_query = nn.LayerNorm(width)
        self.norm_context = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        nn.init.zeros_(self.attention.out_proj.weight)
        nn.init.zeros_(self.attention.out_proj.bias)

    def forward(self, rois: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``rois`` (K, C), ``context`` (K, L, C): each ROI's parent tokens."""
        query = self.norm_query(rois).unsqueeze(1)
        keys = self.norm_context(context)
        attended, _ = self.attention(query, keys, keys, need_weights=False)
        return rois + attended.squeeze(1)


def squash_transform(preprocess: Callable, size: int | tuple[int, int]) -> Callable:
    """The parent's transform for ROI modes: the model's own normalisation after a resize to the
    square input without cropping (so boxes stay inside the frame and scale per axis)."""
    from torchvision import transforms

    norm = next((t for t in getattr(preprocess, "transforms", []) if isinstance(t, transforms.Normalize)), None)
    if norm is None:
        raise ValueError("region_features roi_*: the model's preprocess has no Normalize to reuse")
    side = (size, size) if isinstance(size, int) else tuple(size)
    return transforms.Compose([
        transforms.Resize(side, interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.ToTensor(),
        transforms.Normalize(norm.mean, norm.std),
    ])  # fmt: skip
