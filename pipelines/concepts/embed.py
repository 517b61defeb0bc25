"""Embed a partition's figure images with DINOv2 on Ray Data.

Two stages, so the GPU never waits on JPEG decoding: CPU tasks read each image from the raw
tar (by offset), decode it robustly and resize/crop it with the model's own processor settings
to its crop (224 x 224 uint8 for DINOv2); a pool of actors, each holding the model once,
normalises and embeds batches. Only image references travel into Ray, and every stage holds one
batch at a time, so memory is bounded by the batch size, not the partition size. Locally Ray starts on the
CPU; on a cluster ``address`` points at it and ``gpus_per_actor`` packs actors onto GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict

import numpy as np

from pipelines.compute.ray_pool import actor_pool_batches
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, Resize, prepare, resize_of
from pipelines.core.lake import Lake
from pipelines.core.rawstore import read_raw_file
from pipelines.core.stage import Progress
from pipelines.images.decode import decode_image


def _prepare_batch(batch: dict, lake_root: str, resize: dict, pad: bool) -> dict:
    """CPU stage: raw bytes -> decoded RGB -> the model's crop (224 x 224 for DINOv2) as uint8, or
    zeros of that shape and an error for an image that does not decode."""
    lake, to_model = Lake(lake_root), Resize(**resize)
    empty = np.zeros((*to_model.output(pad), 3), dtype=np.uint8)
    pixels, errors = [], []
    for tar_path, offset, size in zip(batch["tar_path"], batch["offset"], batch["size"], strict=True):
        image, error = decode_image(
            read_raw_file(lake, {"tar_path": tar_path, "offset": int(offset), "size": int(size)})
        )
        pixels.append(prepare(image, to_model, pad) if image is not None else empty)
        errors.append(error or "")
    return {**{k: v for k, v in batch.items()}, "pixels": np.stack(pixels), "error": np.array(errors, dtype=object)}


class _EmbedActor:
    """GPU (or CPU) stage: the model is loaded once per actor."""

    def __init__(self, config: dict):
        self.embedder = Embedder(EmbedderConfig(**config))

    def __call__(self, batch: dict) -> dict:
        ok = np.array([not e for e in batch["error"]], dtype=bool)
        vectors = np.zeros((len(ok), self.embedder.dim), dtype=np.float16)
        if ok.any():
            vectors[ok] = self.embedder.embed(batch["pixels"][ok])
        out = {k: v for k, v in batch.items() if k != "pixels"}
        out["vector"] = np.array(
            [v.tobytes() if good else b"" for v, good in zip(vectors, ok, strict=True)], dtype=object
        )
        out["dim"] = np.full(len(ok), self.embedder.dim, dtype=np.int32)
        return out


def embed_images(
    lake: Lake,
    refs: list[dict],
    config: EmbedderConfig,
    batch_size: int = 32,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: Mapping[str, float] | None = None,
) -> list[dict]:
    """Embed ``refs`` (rows with pmcid, fig_id, image_file, sha256, tar_path, offset, size).

    Returns one row per ref with ``vector`` (float16 bytes, empty on error), ``dim`` and ``error``.
    """
    if not refs:
        return []
    cfg = asdict(config)
    batches = actor_pool_batches(
        refs,
        _prepare_batch,
        {"lake_root": lake.url, "resize": asdict(resize_of(config)), "pad": config.pad},
        _EmbedActor,
        {"config": cfg},
        batch_size,
        actors,
        gpus_per_actor,
        address,
        actor_resources,
    )
    rows = []
    progress = Progress("embedding", len(refs), "images")
    with progress.heartbeat():
        for batch in batches:
            rows.extend(_batch_rows(batch))
            progress.advance(len(batch["sha256"]), failed=sum(1 for e in batch["error"] if e))
    return sorted(rows, key=lambda r: (r["pmcid"], r["fig_id"] or "", r["image_file"]))


def _batch_rows(batch: dict) -> Iterator[dict]:
    for i in range(len(batch["sha256"])):
        yield {
            "pmcid": str(batch["pmcid"][i]),
            "fig_id": batch["fig_id"][i],
            "image_file": str(batch["image_file"][i]),
            "sha256": str(batch["sha256"][i]),
            "vector": bytes(batch["vector"][i]) or None,
            "dim": int(batch["dim"][i]),
            "error": batch["error"][i] or None,
        }
