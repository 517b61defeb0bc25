"""Embed a partition's figure images with DINOv2 on Ray Data.

Two stages, so the GPU never waits on JPEG decoding: CPU tasks read each image from the raw
tar (by offset), decode it robustly and resize/crop it with the model's own processor to a
224 x 224 uint8 array; a pool of actors, each holding the model once, normalises and embeds
batches. Only image references travel into Ray, and every stage holds one batch at a time,
so memory is bounded by the batch size, not the partition size. Locally Ray starts on the
CPU; on a cluster ``address`` points at it and ``gpus_per_actor`` packs actors onto GPUs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict

import numpy as np

from pipelines.acquire.rawstore import read_raw_file
from pipelines.concepts.decode import decode_image
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, load_processor, prepare
from pipelines.errors import ServiceUnavailableError
from pipelines.lake import Lake
from pipelines.stage import Progress

EMPTY = np.zeros((224, 224, 3), dtype=np.uint8)


class ComputeUnavailableError(ServiceUnavailableError):
    """The Ray cluster lost what a partition was running on (a node, an actor, an object).

    Nothing was written, since a stage writes its table only after the last batch, so the run is
    retried like any outage (``run_stage``); a fresh run starts a new actor pool on the nodes left.
    An actor whose constructor failed (weights missing, a bug) is not an outage: that fails as is."""


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    import logging

    import ray
    import ray.data  # its import configures the "ray.data" logger (level DEBUG), so set ours after

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # progress lines flood run logs
    if not ray.is_initialized():
        ray.init(
            address=address or None,
            num_cpus=None if address else num_cpus,
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )


def actor_pool_batches(
    rows: list[dict],
    prepare,
    prepare_kwargs: dict,
    actor,
    actor_kwargs: dict,
    batch_size: int,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: Mapping[str, float] | None = None,
) -> Iterator[dict]:
    """``rows`` through Ray Data: ``prepare`` (CPU tasks: read and decode) then a pool of
    ``actors`` instances of ``actor`` (each holding its model once, ``gpus_per_actor`` GPUs);
    yields the output as numpy batches. Every model stage (embeddings, panel detection) runs
    through here, so they pack GPUs and fail the same way.

    ``actor_resources`` are Ray custom resources each actor also holds (``{"a100": 1}``): a
    cluster whose GPU nodes advertise one keeps the model actors there and the CPU tasks
    elsewhere; the multi-node test uses it to stand in for GPUs it does not have."""
    try:
        import ray

        ensure_ray(address)
        ds = ray.data.from_items(rows)
        ds = ds.map_batches(prepare, fn_kwargs=prepare_kwargs, batch_size=batch_size)
        with warnings.catch_warnings():
            # Ray Data would restart a dead actor forever, but its constructor arguments live in the
            # object store, where a restart cannot rely on them (ray-project/ray#53727; Ray logs an
            # error for every pool): a lost actor fails this partition's run, which is rerun on its own.
            # Ray 2.60 has no named parameter for max_restarts yet, only the deprecated **ray_remote_args.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            ds = ds.map_batches(
                actor,
                fn_constructor_kwargs=actor_kwargs,
                batch_size=batch_size,
                compute=ray.data.ActorPoolStrategy(size=actors),
                num_gpus=gpus_per_actor or None,
                resources=dict(actor_resources) if actor_resources else None,
                max_restarts=0,
            )
        yield from ds.iter_batches(batch_size=batch_size, batch_format="numpy")
    except Exception as exc:
        from pipelines.vlm.ray_llm import is_outage

        if is_outage(exc):
            raise ComputeUnavailableError(f"the Ray cluster lost part of the run: {type(exc).__name__}: {exc}") from exc
        raise


def _prepare_batch(batch: dict, lake_root: str, config: dict) -> dict:
    """CPU stage: raw bytes -> decoded RGB -> 224 x 224 uint8, or an error for that image."""
    cfg = EmbedderConfig(**config)
    lake, processor = Lake(lake_root), load_processor(cfg)
    pixels, errors = [], []
    for tar_path, offset, size in zip(batch["tar_path"], batch["offset"], batch["size"], strict=True):
        image, error = decode_image(
            read_raw_file(lake, {"tar_path": tar_path, "offset": int(offset), "size": int(size)})
        )
        pixels.append(prepare(image, processor, cfg.pad) if image is not None else EMPTY)
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
        {"lake_root": lake.url, "config": cfg},
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
