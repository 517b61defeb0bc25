"""Connected components of a binary mask, with each one's box and pixel count, in one pass.

Every stage that looks for glyphs, marks or shapes in a figure labels its ink this way: the panel
labels' candidates, the layout's ink structure and chart test, the crop gate and the Set-of-Mark
markers. OpenCV's scan-plus-union-find labelling (SAUF) returns the boxes and pixel counts with
the labels, where ``scipy.ndimage.label`` then ``find_objects`` scanned the whole image twice more:
about 2.6 times less CPU on the evaluation figures' masks (``benchmarks/panels.py`` measures the
whole decision). SAUF numbers the components as ``scipy.ndimage.label`` does, in the raster order
of each one's first pixel, so every rule that walks them in order decides as before
(``tests/unit/test_components.py``).
"""

from __future__ import annotations

import numpy as np

from pipelines.images.opencv import opencv


def components(mask: np.ndarray, eight: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The connected components of the 2-D boolean ``mask``: pixels joined through their sides
    and corners (``eight``), or through their sides only. Returns the label image (int32; 0 where
    ``mask`` is False, components numbered 1..n in the raster order of their first pixels),
    each component's box as (x1, y1, x2, y2) with exclusive ends (n x 4, int32), and its pixel
    count (n)."""
    mask = np.ascontiguousarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"components need a 2-D mask, got shape {mask.shape}")
    if mask.size == 0:
        return np.zeros(mask.shape, np.int32), np.zeros((0, 4), np.int32), np.zeros(0, np.int64)
    cv2 = opencv()
    n, labels, stats, _ = cv2.connectedComponentsWithStatsWithAlgorithm(
        mask.view(np.uint8), 8 if eight else 4, cv2.CV_32S, cv2.CCL_SAUF
    )
    stats = stats[1:]  # row 0 is the background
    boxes = np.empty((n - 1, 4), np.int32)
    boxes[:, 0] = stats[:, cv2.CC_STAT_LEFT]
    boxes[:, 1] = stats[:, cv2.CC_STAT_TOP]
    boxes[:, 2] = boxes[:, 0] + stats[:, cv2.CC_STAT_WIDTH]
    boxes[:, 3] = boxes[:, 1] + stats[:, cv2.CC_STAT_HEIGHT]
    return labels, boxes, stats[:, cv2.CC_STAT_AREA].astype(np.int64)
