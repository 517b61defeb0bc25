"""Concept-labeling assets: embeddings (DINOv2 on Ray), the concept model, review sheets,
annotation resolution, and labels propagated to every figure image."""

import base64
import json
from collections import Counter
from pathlib import Path

import numpy as np
from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from assets.metadata import preview, previous_release
from assets.parsing import parsed_articles
from jobs.partitions import release_shard_partitions, releases_partitions, shard_partitions
from pipelines.concepts.annotations import AnnotationError, load_taxonomy, read_annotations, resolve, template_csv
from pipelines.concepts.model import (
    ConceptModelConfig,
    decode_vector,
    fit_concept_model,
    latest_version,
    model_dir,
    sample_vectors,
    save_model,
    scree_png,
)
from pipelines.concepts.model import load_model as load_concept_model
from pipelines.concepts.propagate import propagate
from pipelines.concepts.review import SHEET_SIZE, contact_sheet, group_members, index_html, seeded_sample
from pipelines.concepts.shard import embed_shard
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource


@asset(
    partitions_def=release_shard_partitions,
    deps=[parsed_articles],
    group_name="concepts",
    kinds={"parquet", "ray", "pytorch"},
    pool="gpu",
    backfill_policy=BackfillPolicy.multi_run(1),
    description="A DINOv2 embedding (float16) of every figure image; vectors of unchanged images are reused.",
)
def figure_embeddings(
    context: AssetExecutionContext, lake: LakeResource, models: ModelsResource, ray: RayResource
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    config = models.dinov2_config()
    if config.synthetic:
        context.log.warning("embedding with a tiny RANDOM DINOv2 (synthetic): vectors are marked synthetic=True")
    result = embed_shard(
        lk,
        release,
        shard,
        previous_release(lk.releases("embeddings"), release),
        config,
        ray.batch_size,
        ray.actors,
        ray.gpus_per_actor,
        ray.address,
    )
    lk.write_table("embeddings", release, shard, result.rows)
    lk.refresh_catalog()
    for row in result.rows:
        if row["error"]:
            context.log.warning(f"{row['pmcid']} {row['image_file']}: {row['error']}")
    return MaterializeResult(
        metadata={
            "model": config.model_label,
            "synthetic_model": config.synthetic,
            "pooling": config.pooling,
            "images": len(result.rows),
            "embedded": result.embedded,
            "carried": result.carried,
            "errors": result.errors,
            "dim": result.rows[0]["dim"] if result.rows else 0,
            "path": MetadataValue.path(lk.table_path("embeddings", release, shard)),
            "preview": preview(result.rows, ["pmcid", "fig_id", "image_file", "dim", "error"]),
        }
    )


class ConceptModelSettings(Config):
    """PCA and k-means settings; ``reuse_previous`` labels this release with the last model."""

    n_components: int = 25
    k: int = 2000
    sample_size: int = 200_000
    seed: int = 0
    kmeans_backend: str = "auto"  # auto (faiss when installed), faiss or sklearn
    reuse_previous: bool = False


def current_version(lk, release: str) -> str:
    pointer = lk.path("models", "concepts", "current", f"release={release}.json")
    if not lk.exists(pointer):
        raise Failure(f"no concept model for release {release}: materialize concept_model[{release}] first")
    with lk.fs.open(pointer, "rb") as fh:
        return json.loads(fh.read())["version"]


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(figure_embeddings, partition_mapping=MultiToSingleDimensionPartitionMapping("release"))],
    group_name="concepts",
    kinds={"numpy"},
    description="PCA + k-means over a seeded sample of the release's embeddings (versioned in the lake).",
)
def concept_model(
    context: AssetExecutionContext, config: ConceptModelSettings, lake: LakeResource, models: ModelsResource
) -> MaterializeResult:
    release, lk = context.partition_key, lake.lake()
    settings = ConceptModelConfig(
        config.n_components, config.k, config.sample_size, config.seed, backend=config.kmeans_backend
    )
    previous = latest_version(lk, before_release=release) if config.reuse_previous else None
    if previous:
        version, model, reused = previous, load_concept_model(lk, previous), True
    else:
        vectors, keys = sample_vectors(lk, release, settings.sample_size, settings.seed)
        model = fit_concept_model(vectors, settings, keys)
        version, reused = settings.version(release, models.dinov2_config().model_label), False
        save_model(lk, model, version)
    with lk.atomic_local_file(lk.path("models", "concepts", "current", f"release={release}.json")) as tmp:
        Path(tmp).write_text(json.dumps({"version": version}))
    scree = base64.b64encode(scree_png(model)).decode()
    info = model.info
    return MaterializeResult(
        metadata={
            "version": version,
            "reused_previous_model": reused,
            "samples": info["samples"],
            "k": info["k_used"],
            "n_components": info["n_components_used"],
            "components_for_99pct_variance": info["components_for_99pct_variance"],
            "variance_kept": info["variance_kept"],
            "kmeans_backend": info["kmeans_backend"],
            "inertia": info["inertia"],
            "scree_plot": MetadataValue.md(f"![scree](data:image/png;base64,{scree})"),
            "path": MetadataValue.path(model_dir(lk, version)),
        }
    )


def _assigned_members(lk, release: str, model) -> list[dict]:
    """Every embedded image of the release with its cluster, read one shard at a time."""
    members = []
    for shard in shard_partitions.get_partition_keys():
        embeddings, files = lk.read_table("embeddings", release, shard), lk.read_table("raw_files", release, shard)
        if embeddings is None or files is None:
            continue
        where = {(f["pmcid"], f["name"]): f for f in files.to_pylist()}
        rows = [r for r in embeddings.to_pylist() if r["vector"]]
        if not rows:
            continue
        clusters, distances = model.assign(np.stack([decode_vector(r["vector"], r["dim"]) for r in rows]))
        for row, cluster, distance in zip(rows, clusters, distances, strict=True):
            raw = where[(row["pmcid"], row["image_file"])]
            members.append(
                {
                    **row,
                    "cluster_id": int(cluster),
                    "distance": float(distance),
                    "tar_path": raw["tar_path"],
                    "offset": raw["offset"],
                    "size": raw["size"],
                }
            )
    return members


class ReviewSettings(Config):
    annotators: list[str] = ["annotator_1", "annotator_2", "annotator_3"]
    seed: int = 0


@asset(
    partitions_def=releases_partitions,
    deps=[concept_model],
    group_name="concepts",
    kinds={"html"},
    description="Contact sheets (30 seeded images per cluster), an HTML index and one CSV template per annotator.",
)
def concept_review(context: AssetExecutionContext, config: ReviewSettings, lake: LakeResource) -> MaterializeResult:
    release, lk = context.partition_key, lake.lake()
    version = current_version(lk, release)
    model = load_concept_model(lk, version)
    clusters = group_members(_assigned_members(lk, release, model))
    sizes = {c: len(m) for c, m in clusters.items()}
    for c in range(model.info["k_used"]):
        sizes.setdefault(c, 0)
    directory = lk.path("review", version)
    samples = {c: seeded_sample(m, SHEET_SIZE, config.seed) for c, m in clusters.items()}
    for cluster, members in samples.items():
        with lk.atomic_local_file(f"{directory}/cluster_{cluster:04d}.png") as tmp:
            Path(tmp).write_bytes(contact_sheet(lk, cluster, members, sizes[cluster]))
    template = template_csv(sizes, version, model.fingerprints())
    outputs = {"index.html": index_html(version, samples, sizes), "annotations_template.csv": template}
    outputs.update({f"{name}.csv": template for name in config.annotators})
    for name, text in outputs.items():
        with lk.atomic_local_file(f"{directory}/{name}") as tmp:
            Path(tmp).write_text(text)
    return MaterializeResult(
        metadata={
            "version": version,
            "clusters": len(sizes),
            "empty_clusters": sum(1 for n in sizes.values() if n == 0),
            "index": MetadataValue.path(f"{directory}/index.html"),
            "annotations_folder": MetadataValue.path(lk.path("annotations", version)),
        }
    )


class AnnotationSettings(Config):
    """Where the filled CSVs are; empty means ``<lake>/annotations/<model version>/``."""

    directory: str = ""


@asset(
    partitions_def=releases_partitions,
    deps=[concept_review],
    group_name="concepts",
    kinds={"parquet"},
    description="Every annotator's votes, validated and resolved per cluster by majority; ties flagged.",
)
def cluster_labels(context: AssetExecutionContext, config: AnnotationSettings, lake: LakeResource) -> MaterializeResult:
    release, lk = context.partition_key, lake.lake()
    version = current_version(lk, release)
    model = load_concept_model(lk, version)
    directory = config.directory or lk.path("annotations", version)
    files = {}
    if lk.fs.exists(directory):
        files = {p.rsplit("/", 1)[1]: lk.fs.cat(p).decode("utf-8") for p in sorted(lk.fs.glob(f"{directory}/*.csv"))}
    taxonomy = load_taxonomy()
    try:
        votes = read_annotations(files, taxonomy, model.info["k_used"], version, model.fingerprints())
        resolution = resolve(votes, taxonomy)
    except AnnotationError as exc:
        raise Failure(str(exc)) from exc
    rows = [{"model_version": version, **label} for label in resolution.labels.values()]
    for row in rows:
        if row["fingerprint_mismatch"]:
            context.log.warning(
                f"cluster {row['cluster_id']} changed since it was annotated: {row['fingerprint_mismatch']}"
            )
    lk.write_table("cluster_labels", release, "all", rows)
    lk.refresh_catalog()
    stats = {f"disagreement_{field}_{k}": v for field, s in resolution.stats.items() for k, v in s.items()}
    return MaterializeResult(
        metadata={
            "version": version,
            "annotation_files": len(files),
            "annotated_clusters": len(rows),
            "clusters": model.info["k_used"],
            "clusters_with_ties": sum(1 for r in rows if r["ties"]),
            "clusters_with_fingerprint_mismatch": sum(1 for r in rows if r["fingerprint_mismatch"]),
            **stats,
            "preview": preview(rows, ["cluster_id", "panel_type", "global_concept", "local_concepts", "ties"]),
        }
    )


@asset(
    partitions_def=release_shard_partitions,
    deps=[
        figure_embeddings,
        AssetDep(cluster_labels, partition_mapping=MultiToSingleDimensionPartitionMapping("release")),
    ],
    group_name="concepts",
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description="Every figure image's cluster and the cluster's resolved labels; unannotated clusters flagged.",
)
def figure_concepts(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    version = current_version(lk, release)
    model = load_concept_model(lk, version)
    labels_table = lk.read_table("cluster_labels", release, "all")
    labels = {r["cluster_id"]: r for r in (labels_table.to_pylist() if labels_table is not None else [])}
    embeddings = lk.read_table("embeddings", release, shard)
    rows = propagate(embeddings.to_pylist() if embeddings is not None else [], model, version, labels)
    lk.write_table("figure_concepts", release, shard, rows)
    lk.refresh_catalog()
    statuses = Counter(r["label_status"] for r in rows)
    concepts = Counter(r["global_concept"] for r in rows if r["global_concept"])
    return MaterializeResult(
        metadata={
            "version": version,
            "images": len(rows),
            **{f"status_{k}": v for k, v in sorted(statuses.items())},
            **{f"concept_{k.replace(' ', '_')}": v for k, v in sorted(concepts.items())},
            "preview": preview(rows, ["pmcid", "fig_id", "cluster_id", "global_concept", "label_status"]),
        }
    )
