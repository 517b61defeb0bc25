"""Building a model's input batch: normalised where the model runs, against the NumPy form on the host.

The embedder (DINOv2) and the detector (DAB-DETR) used to turn each prepared uint8 batch into
float32 with NumPy on the host (scale, subtract the mean, divide by the std, zero the detector's
padding, transpose, copy) and send that float32 batch, with the detector's int64 pixel mask, to
their device. They now send the uint8 pixels and do the same arithmetic there
(``pipelines/images/tensors.py``); the mask is made on the device. On a GPU the host keeps only
the copy of the pixels, which ``make gpu-check`` times end to end (``benchmarks/gpu_check.py``).
What this machine can measure is the host's side: the CPU time of each form at the production
batch shapes (DINOv2: 64 images at 224 px; the detector: 8 figures at 800 px), with torch on one
thread and on every core (CPU time and wall clock, the best of ``--rounds`` taken in turns), the
bytes each sends to the device, and whether the two forms give the same numbers (on the CPU they
must: the same float32 operations in the same order). The pixels are random (seeded): the
arithmetic's cost does not depend on them. The baselines are the code as it was, line for line.

    python -m benchmarks.model_inputs [--rounds 5]

Writes ``benchmarks/results/model_inputs.json``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from benchmarks.record import write_results
from pipelines.compute.weights import IMAGENET_MEAN, IMAGENET_STD
from pipelines.images.tensors import normalized
from pipelines.panels.detector import Frame, frame_for, to_tensors

BASELINE = (
    "the NumPy form on the host, as the embedder and the detector built their inputs before "
    "pipelines/images/tensors.py: a float32 batch (and the detector's int64 mask) sent to the device"
)


def host_normalized(pixels: np.ndarray, mean, std, rescale: float) -> torch.Tensor:
    """The baseline's (n, 3, H, W) float32 DINOv2 inputs: ``Embedder.embed``'s NumPy lines as
    they were."""
    mean, std = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
    values = (np.asarray(pixels, dtype=np.float32) * rescale - mean) / std
    return torch.from_numpy(values.transpose(0, 3, 1, 2).copy())


def host_detector_inputs(pixels: np.ndarray, frames: list[Frame]) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline's detector inputs (values zero outside each figure, and the mask):
    ``detector.to_tensors`` as it was."""
    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)
    std = np.asarray(IMAGENET_STD, dtype=np.float32)
    values = (np.asarray(pixels, dtype=np.float32) / 255.0 - mean) / std
    mask = np.zeros(values.shape[:3], dtype=np.int64)
    for i, frame in enumerate(frames):
        x, y = frame.offset
        mask[i, y : y + frame.resized[1], x : x + frame.resized[0]] = 1
    values *= mask[..., None]
    return torch.from_numpy(values.transpose(0, 3, 1, 2).copy()), torch.from_numpy(mask)


def _timed(step) -> tuple[float, float]:
    """(ms of CPU of this process, all its threads; ms of wall clock) for one call of ``step``."""
    cpu, wall = time.process_time(), time.perf_counter()
    step()
    return 1000 * (time.process_time() - cpu), 1000 * (time.perf_counter() - wall)


def _model(name: str, pixels: np.ndarray, frames: list[Frame] | None, rounds: int, threads: list[int]) -> dict:
    if frames is None:  # DINOv2: normalised only

        def host():
            return host_normalized(pixels, IMAGENET_MEAN, IMAGENET_STD, 1 / 255)

        def here():
            return normalized(pixels, IMAGENET_MEAN, IMAGENET_STD, rescale=1 / 255)

        host_bytes = 4 * pixels.size
    else:  # the detector: normalised, padding zeroed, and the pixel mask

        def host():
            return host_detector_inputs(pixels, frames)

        def here():
            return to_tensors(pixels, frames)

        host_bytes = 4 * pixels.size + 8 * pixels.shape[0] * pixels.shape[1] * pixels.shape[2]
    old, new = host(), here()
    pairs = list(zip(old, new, strict=True)) if isinstance(old, tuple) else [(old, new)]
    timed: dict[str, dict] = {}
    for n in threads:
        torch.set_num_threads(n)
        runs: dict[str, list[tuple[float, float]]] = {"numpy_on_the_host": [], "torch": []}
        for _ in range(rounds):  # in turns, so both see the same machine
            runs["numpy_on_the_host"].append(_timed(host))
            runs["torch"].append(_timed(here))
        cpu = {way: round(min(c for c, _ in found), 1) for way, found in runs.items()}
        wall = {way: round(min(w for _, w in found), 1) for way, found in runs.items()}
        timed[f"{n}_threads"] = {
            "cpu_ms_numpy_on_the_host": cpu["numpy_on_the_host"],
            "cpu_ms_torch": cpu["torch"],
            "wall_ms_numpy_on_the_host": wall["numpy_on_the_host"],
            "wall_ms_torch": wall["torch"],
            "cpu_speed_vs_numpy": round(cpu["numpy_on_the_host"] / cpu["torch"], 2),
            "wall_speed_vs_numpy": round(wall["numpy_on_the_host"] / wall["torch"], 2),
        }
    return {
        "model": name,
        "batch": list(pixels.shape),
        "bytes_to_the_device": {"before": host_bytes, "now": pixels.nbytes},
        "identical_inputs": all(torch.equal(a, b) for a, b in pairs),
        "timings": timed,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timings of each form, in turns (default 5)")
    parser.add_argument("--out", default="model_inputs.json", help="a name under benchmarks/results, or a path")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    threads = sorted({1, os.cpu_count() or 1})
    saved = torch.get_num_threads()
    try:
        dinov2 = _model("dinov2", rng.integers(0, 256, (64, 224, 224, 3), dtype=np.uint8), None, args.rounds, threads)
        frames = [frame_for(600, 800, 800), frame_for(800, 450, 800)] * 4  # a tall and a wide figure, padded
        pixels = rng.integers(0, 256, (8, 800, 800, 3), dtype=np.uint8)
        detector = _model("detector", pixels, frames, args.rounds, threads)
    finally:
        torch.set_num_threads(saved)
    result = {
        "baseline": BASELINE,
        "rounds": args.rounds,
        "threads": threads,
        "models": {"dinov2": dinov2, "detector": detector},
    }
    path = write_results(args.out, result)
    for found in (dinov2, detector):
        one = found["timings"]["1_threads"]
        print(
            f"{found['model']} {found['batch']}: {one['cpu_ms_torch']} ms of CPU with torch (1 thread), "
            f"{one['cpu_ms_numpy_on_the_host']} ms with NumPy; {found['bytes_to_the_device']['now'] / 1e6:.1f} MB "
            f"to the device, {found['bytes_to_the_device']['before'] / 1e6:.1f} MB before -> {path}"
        )
    return result


if __name__ == "__main__":
    main()
