"""Panel detector throughput on this machine's CPU, decode included, against Open-PMC-18M's path.

Every figure is decoded from its encoded bytes (the sample's JPEG/PNG/TIFF figures), prepared
and run through the model; figures/s is wall time over all of it, after one warm-up batch.

* ours: aspect-preserving resize to ``input_size`` (800, and 480 for a like-for-like pixel
  count) padded to a square with the pixel mask, batch sizes 1 and 8;
* baseline ``openpmc_detect``: Open-PMC-18M's inference path, 480 x 480 squash, batch 128 (or
  all the images measured when fewer: the largest batch this run can fill), NMS at IoU 0.2;
* two models: the tiny synthetic test model, and the production architecture at real size
  (``DetectorConfig(architecture="full")``: ResNet-50 DC5 backbone, output stride 16, 300
  queries, 6+6 layers, as Open-PMC-18M's checkpoint has it) with random weights, whose compute
  is that of the real model;
* the Ray Data pipeline (CPU decode tasks + one model actor) with the tiny model.

No GPU is used here. Keep it under five minutes on 2 cores:

    python -m benchmarks.panels_detector [--images 32] [--full-images 8]

Writes ``benchmarks/results/panels_detector.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.embeddings import sample_images
from benchmarks.record import write_results
from pipelines.core.lake import Lake
from pipelines.images.decode import decode_image
from pipelines.panels.detector import (
    OPENPMC_BATCH,
    Detector,
    DetectorConfig,
    decode_and_detect,
    detect_images,
    openpmc_detect,
)

RESULTS = Path(__file__).parent / "results" / "panels_detector.json"


def rate(fn, data: list[bytes], batch: int) -> float:
    fn(data[:batch])  # warm-up
    start = time.perf_counter()
    fn(data)
    return round(len(data) / (time.perf_counter() - start), 2)


def ours(detector: Detector, batch: int):
    return lambda data: decode_and_detect(detector, data, batch)


def baseline(detector: Detector, batch: int):
    def run(data: list[bytes]):
        images = [im for im, _ in (decode_image(d) for d in data) if im is not None]
        return openpmc_detect(detector, images, batch_size=batch)

    return run


def measure(architecture: str, data: list[bytes]) -> dict:
    out = {}
    for size in (800, 480):
        detector = Detector(DetectorConfig(synthetic=True, architecture=architecture, input_size=size, threshold=0.3))
        for batch in (1, 8):
            if size == 480 and batch == 1:
                continue
            out[f"ours_{size}px_aspect_kept_batch{batch}"] = rate(ours(detector, batch), data, batch)
    batch = min(OPENPMC_BATCH, len(data))
    detector = Detector(DetectorConfig(synthetic=True, architecture=architecture, threshold=0.3))
    out[f"openpmc_480px_squash_batch{batch}"] = rate(baseline(detector, batch), data, batch)
    out["images"] = len(data)
    return out


def ray_pipeline(data: list[bytes], batch: int) -> dict:
    from pipelines.compute.ray_pool import ensure_ray

    ensure_ray(num_cpus=os.cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(Path(tmp) / "lake")
        blob = Path(tmp) / "lake" / "raw.bin"
        blob.parent.mkdir(parents=True, exist_ok=True)
        refs, position = [], 0
        with open(blob, "wb") as fh:
            for i, d in enumerate(data):
                fh.write(d)
                refs.append({"image_file": f"{i}.img", "tar_path": "raw.bin", "offset": position, "size": len(d)})
                position += len(d)
        config = DetectorConfig(synthetic=True, threshold=0.3)
        detect_images(lake, refs[:batch], config, batch_size=batch)  # warm-up: Ray workers, model load
        start = time.perf_counter()
        rows = detect_images(lake, refs, config, batch_size=batch)
        seconds = time.perf_counter() - start
    return {
        "images": len(rows),
        "batch_size": batch,
        "seconds": round(seconds, 2),
        "figures_per_s": round(len(rows) / seconds, 2),
        "errors": sum(1 for r in rows if r["error"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32, help="figures for the tiny model")
    parser.add_argument("--full-images", type=int, default=8, help="figures for the full-size architecture")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    pool = sample_images()
    data = (pool * (args.images // len(pool) + 1))[: args.images]
    began = time.perf_counter()
    tiny = measure("tiny", data)
    full = measure("full", data[: args.full_images])
    pipeline = ray_pipeline(data, 8)
    sizes = [decode_image(d)[0].size for d in data]
    full_base = next(v for k, v in full.items() if k.startswith("openpmc_"))
    full_ours = full["ours_800px_aspect_kept_batch8"]
    result = {
        "benchmark": "panel detector figures/s on CPU, decode included",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.is_available(),
        },
        "figures": {
            "count": len(data),
            "mean_width": round(sum(w for w, _ in sizes) / len(sizes)),
            "mean_height": round(sum(h for _, h in sizes) / len(sizes)),
        },
        "figures_per_s": {"tiny_synthetic": tiny, "full_dab_detr_r50_random_weights": full},
        "full_model_ours800_over_openpmc_time_ratio": round(full_base / full_ours, 2),
        "full_model": "DAB-DETR, ResNet-50 DC5 (output stride 16), 300 queries, 6+6 layers (Open-PMC-18M's)",
        "ray_pipeline_tiny_model": pipeline,
        "seconds_total": round(time.perf_counter() - began, 1),
        "note": "Full-size timings use the published architecture (ResNet-50 DC5) with random weights (same "
        "compute as trained weights). Ours pads to input_size x input_size, so at 480 it runs the same pixel "
        "count as the 480 x 480 squash; 800 costs about (800/480)^2 = 2.8x the pixels. Open-PMC-18M's batch is "
        "128 where the run has that many figures, else all of them. fp32 on CPU; no GPU in this run.",
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
