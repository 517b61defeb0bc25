"""A batch of prepared images into a model's input: (n, H, W, 3) uint8 pixels become (n, 3, H, W)
float32 ``(pixel * rescale - mean) / std`` (or ``pixel / divide_by``), computed on the device the
model runs on.

Why on the device: the float32 batch is four times the bytes of its uint8 pixels, and building
it with NumPy on the host (convert, scale, normalise, transpose, copy) took about 60 ms of CPU per
DINOv2 batch of 64 (benchmarks/model_inputs.py), where the whole embedding call took 106 ms per
batch on an H100 with the GPU 35% busy (docs/gpu-check.md). Sent as uint8 and normalised there,
the host only copies the pixels. The arithmetic is the NumPy form's, operation for operation in
float32 (a multiply by the embedder's rescale factor, a division by 255 for the detector), so on
the CPU the inputs, and the vectors and boxes made from them, are those of the NumPy form to the
bit. It is done in place, channels last, with one copy at the end to put the channels first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def normalized(
    pixels: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    rescale: float | None = None,
    divide_by: float | None = None,
    device="cpu",
):
    """``pixels``: (n, H, W, 3) uint8; returns a contiguous (n, 3, H, W) float32 tensor on
    ``device``, scaled by ``rescale`` (a processor's rescale factor) or by ``1 / divide_by`` (as
    a division: ``x / 255`` in float32 is what Hugging Face's processors give, computing ``x *
    (1/255)`` in float64 and rounding), then normalised with ``mean`` and ``std``. The caller's
    array is never written."""
    import torch

    if (rescale is None) == (divide_by is None):
        raise ValueError("give one of rescale and divide_by")
    array = np.asarray(pixels)
    if array.dtype != np.uint8:  # a cast would wrap 300 to 44 and -1 to 255
        raise TypeError(f"prepared pixels are uint8, not {array.dtype}")
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:  # read-only memory (a zero-copy batch): torch.from_numpy warns on it
        array = array.copy()
    device = torch.device(device)
    values = torch.from_numpy(array).to(device).to(torch.float32)  # a new tensor: the in-place steps are its own
    mean_t = torch.tensor(np.asarray(mean, dtype=np.float32), device=device)
    std_t = torch.tensor(np.asarray(std, dtype=np.float32), device=device)
    # channels last (contiguous, the mean and std broadcast over the last axis)
    if rescale is not None:
        values.mul_(float(rescale))
    else:
        values.div_(float(divide_by))
    values.sub_(mean_t).div_(std_t)
    return values.permute(0, 3, 1, 2).contiguous()
