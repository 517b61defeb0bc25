"""Prepared uint8 images into normalised model inputs (pipelines/images/tensors.py), the form the
embedder and the detector now send to their device; expected values are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.images.tensors import normalized


def test_a_two_pixel_image_by_hand():
    """One image, 1 x 2 pixels: (255, 0, 51) and (0, 255, 102). With mean 0.5 and std 0.25 per
    channel and rescale 1/255: 255 -> (1 - 0.5) / 0.25 = 2; 0 -> -2; 51 -> (0.2 - 0.5) / 0.25 =
    -1.2; 102 -> (0.4 - 0.5) / 0.25 = -0.4. Channels first: red (2, -2), green (-2, 2), blue
    (-1.2, -0.4)."""
    pixels = np.array([[[[255, 0, 51], [0, 255, 102]]]], dtype=np.uint8)
    values = normalized(pixels, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), rescale=1 / 255)
    assert values.dtype == torch.float32 and values.shape == (1, 3, 1, 2) and values.is_contiguous()
    expected = torch.tensor([[[[2.0, -2.0]], [[-2.0, 2.0]], [[-1.2, -0.4]]]])
    assert torch.allclose(values, expected, atol=1e-6)


def test_each_channel_takes_its_own_mean_and_std():
    """A grey 128 pixel: red (128/255 - 0.485) / 0.229, green (128/255 - 0.456) / 0.224, blue
    (128/255 - 0.406) / 0.225, the ImageNet values: 128/255 = 0.50196, so 0.01696 / 0.229 = 0.0741,
    0.04596 / 0.224 = 0.2052 and 0.09596 / 0.225 = 0.4265."""
    values = normalized(
        np.full((1, 1, 1, 3), 128, np.uint8), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), divide_by=255
    )
    assert torch.allclose(values.flatten(), torch.tensor([0.0741, 0.2052, 0.4265]), atol=1e-4)


def test_the_same_float32_arithmetic_as_the_numpy_form():
    """On the CPU the numbers are those the host-side NumPy forms gave (same operations, same order,
    float32), so the demo's and tests' vectors and boxes do not move: the embedder multiplied by
    its processor's rescale factor, the detector divided by 255 (every uint8 value, each channel)."""
    pixels = np.arange(256, dtype=np.uint8).repeat(3).reshape(1, 16, 16, 3)
    mean, std = np.asarray((0.485, 0.456, 0.406), np.float32), np.asarray((0.229, 0.224, 0.225), np.float32)
    multiplied = (pixels.astype(np.float32) * (1 / 255) - mean) / std
    divided = (pixels.astype(np.float32) / 255.0 - mean) / std
    assert not np.array_equal(multiplied, divided)  # the two forms differ in the last bit for some values
    for kwargs, host in (({"rescale": 1 / 255}, multiplied), ({"divide_by": 255}, divided)):
        assert torch.equal(normalized(pixels, mean, std, **kwargs), torch.from_numpy(host.transpose(0, 3, 1, 2).copy()))


def test_the_device_is_where_the_inputs_are_built_and_the_callers_array_is_left_alone():
    """``device="meta"`` (shapes without data, on any machine) shows the tensors are made there,
    not on the CPU and moved; the caller's uint8 batch keeps its values."""
    from pipelines.panels.detector import frame_for, to_tensors

    pixels = np.full((2, 8, 8, 3), 200, np.uint8)
    values = normalized(pixels, (0.5,) * 3, (0.25,) * 3, rescale=1 / 255, device="meta")
    assert values.device.type == "meta" and values.shape == (2, 3, 8, 8)
    values, mask = to_tensors(pixels, [frame_for(8, 4, 8)] * 2, device="meta")
    assert values.device.type == "meta" and mask.device.type == "meta" and mask.shape == (2, 8, 8)
    to_tensors(pixels, [frame_for(8, 4, 8)] * 2)
    assert (pixels == 200).all()


def test_pixels_that_are_not_uint8_and_an_unclear_scale_are_refused():
    """A cast would wrap a float 300.0 to 44: prepared pixels are uint8 or an error."""
    with pytest.raises(TypeError, match="uint8"):
        normalized(np.full((1, 1, 1, 3), 300.0), (0.5,) * 3, (0.25,) * 3, rescale=1 / 255)
    with pytest.raises(ValueError, match="one of"):
        normalized(np.zeros((1, 1, 1, 3), np.uint8), (0.5,) * 3, (0.25,) * 3, rescale=1 / 255, divide_by=255)


def test_the_inputs_benchmark_counts_what_each_form_sends(tmp_path):
    """benchmarks/model_inputs.py at the production shapes. Before, the device got float32 values
    (4 bytes a channel) and the detector's int64 mask (8 bytes a pixel); now the uint8 pixels only:
    DINOv2 64 x 224 x 224 x 3 = 9,633,792 bytes against 4 x that = 38,535,168; the detector
    8 x 800 x 800 x 3 = 15,360,000 against 61,440,000 + 8 x 800 x 800 x 8 = 102,400,000."""
    from benchmarks.model_inputs import main

    result = main(["--rounds", "1", "--out", str(tmp_path / "model_inputs.json")])
    dinov2, detector = result["models"]["dinov2"], result["models"]["detector"]
    assert dinov2["bytes_to_the_device"] == {"before": 38_535_168, "now": 9_633_792}
    assert detector["bytes_to_the_device"] == {"before": 102_400_000, "now": 15_360_000}
    assert dinov2["identical_inputs"] is True and detector["identical_inputs"] is True
    assert all(t["cpu_ms_torch"] > 0 and t["cpu_ms_numpy_on_the_host"] > 0 for t in dinov2["timings"].values())


def test_a_read_only_batch_is_taken_without_a_warning():
    """Zero-copy batches (Arrow, np.frombuffer) are read-only; torch.from_numpy warns on those."""
    import warnings

    pixels = np.frombuffer(bytes([0, 255, 51] * 2), dtype=np.uint8).reshape(1, 1, 2, 3)
    assert not pixels.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = normalized(pixels, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), rescale=1 / 255)
    assert torch.allclose(values[0, :, 0, 0], torch.tensor([-2.0, 2.0, -1.2]), atol=1e-6)
