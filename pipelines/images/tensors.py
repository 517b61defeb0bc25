"""A batch of prepared images into a model's input: (n, H, W, 3) uint8 pixels become (n, 3, H, W)
float32 ``(pixel * rescale - mean) / std``, computed on the device the model runs on.

Why on the device: the float32 batch is four times the bytes of its uint8 pixels, and building
it with NumPy on the host (convert, scale, normalise, transpose, copy) took about 60 ms of CPU per
DINOv2 batch of 64 (benchmarks/model_inputs.py), where the whole embedding call took 106 ms per
batch on an H100 with the GPU 35% busy (docs/gpu-check.md). Sent as uint8 and normalised there,
the host only copies the pixels. On the CPU the same arithmetic runs in the same float32 order, so
CPU results (the tests', the demo's) are those of the NumPy form; the arithmetic is done in
place, channels last, with one copy at the end to put the channels first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def normalized(pixels: np.ndarray, mean: Sequence[float], std: Sequence[float], rescale: float, device="cpu"):
    """``pixels``: (n, H, W, 3) uint8 (or any array NumPy reads as such); returns a contiguous
    (n, 3, H, W) float32 tensor on ``device``."""
    import torch

    device = torch.device(device)
    array = np.ascontiguousarray(pixels, dtype=np.uint8)
    if not array.flags.writeable:  # read-only memory (a zero-copy batch): torch.from_numpy warns on it
        array = array.copy()
    values = torch.from_numpy(array).to(device).to(torch.float32)
    mean_t = torch.tensor(np.asarray(mean, dtype=np.float32), device=device)
    std_t = torch.tensor(np.asarray(std, dtype=np.float32), device=device)
    # in place, channels last (contiguous, the mean and std broadcast over the last axis); one copy
    # at the end puts the channels first
    values.mul_(float(rescale)).sub_(mean_t).div_(std_t)
    return values.permute(0, 3, 1, 2).contiguous()
