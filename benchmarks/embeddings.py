"""Embedding throughput with the decode path included, on this machine's CPU.

Three measurements in one run on the sample's figure images (JPEG, PNG, TIFF, extension-less):

* decode + resize/crop only (the CPU stage), images/s on one core;
* the model only on prepared 224 px images: a DINOv2 with ViT-L/14's exact architecture
  (``facebook/dinov2-large``: 24 layers, width 1024) but random weights — the compute is that
  of the real model — in fp32 on the CPU, and the tiny test model for contrast;
* the whole Ray Data pipeline (CPU decode tasks + one model actor) on 1x and 4x the images,
  with the peak memory of Ray's worker processes, to show it does not grow with the input.

Whichever of the first two is slower is the bottleneck. No GPU is used here; see docs/gpu-check.md
for what to run on one.

    python -m benchmarks.embeddings [--images 64]

Writes ``benchmarks/results/embeddings.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks.record import write_results
from pipelines.compute.ray_pool import ensure_ray
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, prepare, resize_of
from pipelines.concepts.embed import embed_images
from pipelines.core.lake import Lake
from pipelines.images.decode import decode_image
from testing.loopback.sample_mirror import SAMPLE_DIR

RESULTS = Path(__file__).parent / "results" / "embeddings.json"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif")


def sample_images() -> list[bytes]:
    paths = sorted(
        p
        for p in (SAMPLE_DIR / "articles").rglob("*")
        if p.is_file() and (p.suffix.lower() in IMAGE_SUFFIXES or (p.suffix == "" and "fig" in p.name))
    )
    return [p.read_bytes() for p in paths]


class WorkerMemory:
    """Peak summed RSS of Ray worker processes, sampled every 50 ms."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if "ray::" in cmd or "default_worker.py" in cmd:
                    total += proc.info["memory_info"].rss if proc.info["memory_info"] else 0
            self.peak = max(self.peak, total)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def vit_large_config():
    from transformers import Dinov2Config

    return Dinov2Config(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        patch_size=14,
        image_size=518,
    )


def time_model(embedder: Embedder, pixels: np.ndarray, batch: int) -> float:
    embedder.embed(pixels[:batch])  # warm-up
    start = time.perf_counter()
    for i in range(0, len(pixels), batch):
        embedder.embed(pixels[i : i + batch])
    return len(pixels) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--large-images", type=int, default=16)
    args = parser.parse_args()
    import torch
    from transformers import Dinov2Model

    torch.set_num_threads(os.cpu_count() or 1)
    data = (sample_images() * (args.images // 20 + 1))[: args.images]
    resize = resize_of(EmbedderConfig(synthetic=True))

    start = time.process_time()
    pixels = np.stack([prepare(decode_image(d)[0], resize, False) for d in data])
    decode_rate = len(data) / (time.process_time() - start)

    tiny = Embedder(EmbedderConfig(synthetic=True))
    tiny_rate = time_model(tiny, pixels, 16)
    large = Embedder(EmbedderConfig(synthetic=True))
    torch.manual_seed(0)
    large.model = Dinov2Model(vit_large_config()).eval()
    large.dim = 1024
    large_rate = time_model(large, pixels[: args.large_images], 8)

    ensure_ray(num_cpus=os.cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp) / "lake")
        blob = Path(tmp) / "lake" / "raw.bin"
        offsets, position = [], 0
        with open(blob, "wb") as fh:
            for d in data:
                fh.write(d)
                offsets.append((position, len(d)))
                position += len(d)
        refs = [
            {
                "pmcid": f"PMC{i}",
                "fig_id": "F1",
                "image_file": f"{i}.img",
                "sha256": str(i),
                "tar_path": "raw.bin",
                "offset": off,
                "size": size,
            }
            for i, (off, size) in enumerate(offsets)
        ]
        pipeline = {}
        for factor in (1, 4):
            with WorkerMemory() as memory:
                start = time.perf_counter()
                rows = embed_images(lake, refs * factor, EmbedderConfig(synthetic=True), batch_size=16)
                seconds = time.perf_counter() - start
            pipeline[f"{factor}x"] = {
                "images": len(rows),
                "seconds": round(seconds, 1),
                "images_per_s": round(len(rows) / seconds, 1),
                "peak_ray_worker_rss_mb": round(memory.peak / 2**20, 1),
            }
    result = {
        "benchmark": "figure embeddings on CPU, decode path included",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.is_available(),
        },
        "decode_and_prepare_images_per_s_one_core": round(decode_rate, 1),
        "model_images_per_s": {
            "dinov2_vit_l14_architecture_fp32_cpu": round(large_rate, 2),
            "tiny_test_model": round(tiny_rate, 1),
        },
        "bottleneck_with_vit_l14_on_cpu": "model" if large_rate < decode_rate else "decode",
        "decode_over_model_ratio": round(decode_rate / large_rate, 1),
        "ray_pipeline_tiny_model": pipeline,
        "note": "ViT-L/14 timings use the real architecture with random weights (same compute). "
        "No GPU in this run: bf16 GPU throughput and utilization are not measured here.",
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
