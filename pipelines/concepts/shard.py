"""Embeddings of one (release, shard): every resolved figure image, reusing earlier vectors.

An image embedded before (same sha256, same model and settings) in the previous release is
not embedded again; its vector is carried over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pipelines.concepts.dinov2 import EmbedderConfig
from pipelines.concepts.embed import embed_images
from pipelines.core.figures import image_refs, raw_locations  # noqa: F401 - used by the embedding stage
from pipelines.core.fingerprints import fingerprint, model_identity
from pipelines.core.lake import Lake
from pipelines.core.stage import Partition, reusable_results

# Bump when a change to how images are decoded or embedded changes the vectors of the same image.
EMBED_VERSION = "1"


@dataclass
class EmbeddedShard:
    rows: list[dict]
    embedded: int
    carried: int
    errors: int


def embedder_identity(config: EmbedderConfig) -> dict:
    """What makes a vector, besides its image: the model (by its identity, not its path), the
    pooling and the padding, under EMBED_VERSION."""
    model = config.model_label if config.synthetic else model_identity(config.model)
    return {"version": EMBED_VERSION, "model": model, "pooling": config.pooling, "pad": config.pad}


def _reusable_key(config: EmbedderConfig, identity: dict) -> Callable[[dict], str | None]:
    """An embeddings row's reuse key: its fingerprint; a row written before fingerprints were
    stored counts when its model label and pooling are the configuration's (as they were checked then)."""

    def key(row: dict) -> str | None:
        if not row["vector"]:
            return None
        if row["fingerprint"]:
            return row["fingerprint"]
        same = row["model"] == config.model_label and row["pooling"] == config.pooling
        return fingerprint({**identity, "sha256": row["sha256"]}) if same else None

    return key


def embed_shard(
    lake: Lake,
    release: str,
    shard: str,
    config: EmbedderConfig,
    batch_size: int = 32,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: Mapping[str, float] | None = None,
) -> EmbeddedShard:
    """Embed the partition's figure images, reusing every vector an earlier run made from the same
    image with the same embedder (the previous release, then this partition's own rows)."""
    refs = image_refs(lake, release, shard)
    identity = embedder_identity(config)
    reused = reusable_results(lake, "embeddings", Partition(release, shard), _reusable_key(config, identity))
    known = {fp: row for fp, (row, _) in reused.items()}
    fps = {r["sha256"]: fingerprint({**identity, "sha256": r["sha256"]}) for r in refs}
    refused = {(r["pmcid"], r["fig_id"], r["image_file"]): r["image_error"] for r in refs if r.get("image_error")}
    todo = [
        r for r in refs if fps[r["sha256"]] not in known and (r["pmcid"], r["fig_id"], r["image_file"]) not in refused
    ]
    fresh = embed_images(lake, todo, config, batch_size, actors, gpus_per_actor, address, actor_resources)
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for row in fresh:
        by_key[(row["pmcid"], row["fig_id"], row["image_file"])].append(row)
    rows = []
    for ref in refs:
        key = (ref["pmcid"], ref["fig_id"], ref["image_file"])
        if key in refused:  # decided when parsed: the same reason as every other stage
            source = {"dim": None, "vector": None, "error": refused[key]}
        else:
            source = known.get(fps[ref["sha256"]]) or by_key[key][0]
        rows.append(
            {
                "pmcid": ref["pmcid"],
                "fig_id": ref["fig_id"],
                "image_file": ref["image_file"],
                "sha256": ref["sha256"],
                "model": config.model_label,
                "synthetic": config.synthetic,
                "pooling": config.pooling,
                "dim": source["dim"],
                "vector": source["vector"],
                "error": source["error"],
                "fingerprint": fps[ref["sha256"]] if source["vector"] else None,
            }
        )
    errors = sum(1 for r in rows if r["error"])
    return EmbeddedShard(rows, embedded=len(todo), carried=len(refs) - len(todo), errors=errors)
