"""Embeddings of one (release, shard): every resolved figure image, reusing earlier vectors.

An image embedded before (same sha256, same model and settings) in the previous release is
not embedded again; its vector is carried over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from pipelines.concepts.dinov2 import EmbedderConfig
from pipelines.concepts.embed import embed_images
from pipelines.lake import Lake


@dataclass
class EmbeddedShard:
    rows: list[dict]
    embedded: int
    carried: int
    errors: int


def raw_locations(lake: Lake, release: str, shard: str) -> dict[tuple[str, str], dict]:
    """Where each raw file of the partition lies, by (pmcid, file name)."""
    files = lake.read_table("raw_files", release, shard)
    return {(f["pmcid"], f["name"]): f for f in (files.to_pylist() if files is not None else [])}


def image_refs(lake: Lake, release: str, shard: str, figures: list[dict] | None = None) -> list[dict]:
    """One reference per resolved figure image of the partition (where it lies in the raw tars);
    ``figures``: the partition's figure rows when the caller has them already."""
    if figures is None:
        table = lake.read_table("figures", release, shard)
        if table is None:
            raise FileNotFoundError(f"release {release} shard {shard} is not parsed yet")
        figures = table.to_pylist()
    by_name = raw_locations(lake, release, shard)
    refs = []
    for fig in figures:
        for name in fig["image_files"] or []:
            raw = by_name[(fig["pmcid"], name)]
            refs.append(
                {
                    "pmcid": fig["pmcid"],
                    "fig_id": fig["fig_id"],
                    "image_file": name,
                    "sha256": raw["sha256"],
                    "tar_path": raw["tar_path"],
                    "offset": raw["offset"],
                    "size": raw["size"],
                }
            )
    return refs


def embed_shard(
    lake: Lake,
    release: str,
    shard: str,
    previous_release: str | None,
    config: EmbedderConfig,
    batch_size: int = 32,
    actors: int = 1,
    gpus_per_actor: float = 0,
    address: str | None = None,
    actor_resources: Mapping[str, float] | None = None,
) -> EmbeddedShard:
    refs = image_refs(lake, release, shard)
    known: dict[str, dict] = {}
    if previous_release:
        old = lake.read_table("embeddings", previous_release, shard)
        for row in old.to_pylist() if old is not None else []:
            if row["vector"] and row["model"] == config.model_label and row["pooling"] == config.pooling:
                known.setdefault(row["sha256"], row)
    todo = [r for r in refs if r["sha256"] not in known]
    fresh = embed_images(lake, todo, config, batch_size, actors, gpus_per_actor, address, actor_resources)
    by_key: dict[tuple, list[dict]] = defaultdict(list)
    for row in fresh:
        by_key[(row["pmcid"], row["fig_id"], row["image_file"])].append(row)
    rows = []
    for ref in refs:
        key = (ref["pmcid"], ref["fig_id"], ref["image_file"])
        source = known.get(ref["sha256"]) or by_key[key][0]
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
            }
        )
    errors = sum(1 for r in rows if r["error"])
    return EmbeddedShard(rows, embedded=len(todo), carried=len(refs) - len(todo), errors=errors)
