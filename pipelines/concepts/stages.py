"""Concept-labeling stages: embeddings (DINOv2 on Ray), the concept model, review sheets,
annotation resolution, and labels propagated to every figure image."""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipelines.concepts.annotations import AnnotationError, read_annotations, resolve, template_csv
from pipelines.concepts.dinov2 import EmbedderConfig
from pipelines.concepts.model import (
    ConceptModel,
    ConceptModelConfig,
    decode_vector,
    fit_concept_model,
    latest_version,
    load_model,
    model_dir,
    sample_vectors,
    save_model,
    scree_png,
)
from pipelines.concepts.propagate import propagate
from pipelines.concepts.review import (
    SHEET_SIZE,
    contact_sheet,
    group_members,
    index_html,
    seeded_sample,
)
from pipelines.concepts.shard import embed_shard
from pipelines.core.figures import raw_locations
from pipelines.core.fingerprints import fingerprint
from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import (
    GPU_POOL,
    RELEASE,
    Check,
    Compute,
    Markdown,
    Partition,
    Preview,
    Stage,
    StageInputError,
    StageResult,
)
from pipelines.core.taxonomy import load_taxonomy
from pipelines.images.previews import sheet_preview

ANNOTATIONS_MATCH = "annotations_match_model"


def _pointer(lake: Lake, release: str) -> str:
    return lake.path("models", "concepts", "current", f"release={release}.json")


def current_version(lake: Lake, release: str) -> str:
    """The concept-model version that labels ``release`` (set by the concept-model stage)."""
    pointer = _pointer(lake, release)
    if not lake.exists(pointer):
        raise StageInputError(f"no concept model for release {release}: materialize concept_model[{release}] first")
    return json.loads(lake.fs.cat(pointer))["version"]


def assigned_members(lake: Lake, release: str, model: ConceptModel) -> list[dict]:
    """Every embedded image of the release with its cluster and raw location, one shard at a time."""
    members = []
    for shard in lake.shards():
        embeddings = lake.read_table(Table.EMBEDDINGS, release, shard)
        rows = [r for r in (embeddings.to_pylist() if embeddings is not None else []) if r["vector"]]
        if not rows:
            continue
        where = raw_locations(lake, release, shard)
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


@dataclass
class EmbedStage(Stage):
    """A DINOv2 embedding (float16) of every figure image; vectors of unchanged images are reused."""

    config: EmbedderConfig
    batch_size: int = 32
    actors: int = 1
    gpus_per_actor: float = 0.0
    address: str | None = None
    actor_resources: dict[str, float] = field(default_factory=dict)  # Ray custom resources per actor

    name = "figure_embeddings"
    reads = (Table.FIGURES, Table.RAW_FILES, Table.EMBEDDINGS)
    writes = (Table.EMBEDDINGS,)

    compute = Compute(pool=GPU_POOL, kinds=("ray", "pytorch"))

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        embedded = embed_shard(
            lake,
            release,
            shard,
            self.config,
            self.batch_size,
            self.actors,
            self.gpus_per_actor,
            self.address,
            self.actor_resources,
        )
        lake.write_table(Table.EMBEDDINGS, release, shard, embedded.rows)
        errors = [r for r in embedded.rows if r["error"]]
        result = self.result(
            partition,
            ok=embedded.embedded - embedded.errors,
            error=embedded.errors,
            skipped=embedded.carried,
            carried=embedded.carried,
            counts={
                "model": self.config.model_label,
                "synthetic_model": self.config.synthetic,
                "pooling": self.config.pooling,
                "images": len(embedded.rows),
                "embedded": embedded.embedded,
                "carried": embedded.carried,
                "errors": embedded.errors,
                "dim": embedded.rows[0]["dim"] if embedded.rows else 0,
            },
            paths={"path": lake.table_path(Table.EMBEDDINGS, release, shard)},
            previews={"preview": Preview(embedded.rows, ["pmcid", "fig_id", "image_file", "dim", "error"])},
        )
        result.errors = [(f"{r['pmcid']} {r['image_file']}", r["error"]) for r in errors]
        return result


@dataclass
class ConceptModelStage(Stage):
    """PCA + k-means over a seeded sample of the release's embeddings, versioned in the lake;
    ``reuse_previous`` labels the release with the newest earlier model instead."""

    settings: ConceptModelConfig
    model_label: str
    reuse_previous: bool = False

    name = "concept_model"
    level = RELEASE
    reads = (Table.EMBEDDINGS,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        previous = latest_version(lake, before_release=release) if self.reuse_previous else None
        if previous:
            version, model, reused = previous, load_model(lake, previous), True
        else:
            vectors, keys = sample_vectors(lake, release, self.settings.sample_size, self.settings.seed)
            model = fit_concept_model(vectors, self.settings, keys)
            version, reused = self.settings.version(release, self.model_label), False
            save_model(lake, model, version)
        with lake.atomic_local_file(_pointer(lake, release)) as tmp:
            Path(tmp).write_text(json.dumps({"version": version}))
        info = model.info
        scree = base64.b64encode(scree_png(model)).decode()
        result = self.result(
            partition,
            ok=info["samples"],
            counts={
                "version": version,
                "reused_previous_model": reused,
                "samples": info["samples"],
                "k": info["k_used"],
                "n_components": info["n_components_used"],
                "components_for_99pct_variance": info["components_for_99pct_variance"],
                "variance_kept": info["variance_kept"],
                "kmeans_backend": info["kmeans_backend"],
                "inertia": info["inertia"],
                "scree_plot": Markdown(f"![scree](data:image/png;base64,{scree})"),
            },
            paths={"path": model_dir(lake, version)},
        )
        # the version names the settings; the clusters (their members' fingerprints) say what was fitted
        result.version = fingerprint({"version": version, "clusters": model.fingerprints(), "inertia": info["inertia"]})
        return result


@dataclass
class ConceptReviewStage(Stage):
    """Contact sheets (seeded sample per cluster), an HTML index and one CSV template per annotator."""

    annotators: list[str] = field(default_factory=lambda: ["annotator_1", "annotator_2", "annotator_3"])
    seed: int = 0

    name = "concept_review"
    level = RELEASE
    reads = (Table.EMBEDDINGS, Table.RAW_FILES)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        version = current_version(lake, partition.release)
        model = load_model(lake, version)
        clusters = group_members(assigned_members(lake, partition.release, model))
        sizes = {c: len(m) for c, m in clusters.items()}
        for c in range(model.info["k_used"]):
            sizes.setdefault(c, 0)
        directory = lake.path("review", version)
        samples = {c: seeded_sample(m, SHEET_SIZE, self.seed) for c, m in clusters.items()}
        written, largest = 0, None
        for cluster, members in samples.items():
            sheet = contact_sheet(lake, cluster, members, sizes[cluster])
            with lake.atomic_local_file(f"{directory}/cluster_{cluster:04d}.png") as tmp:
                Path(tmp).write_bytes(sheet)
            written += len(sheet)
            if largest is None or sizes[cluster] > sizes[largest[0]]:
                largest = (cluster, sheet)
        template = template_csv(sizes, version, model.fingerprints())
        outputs = {"index.html": index_html(version, samples, sizes), "annotations_template.csv": template}
        outputs.update({f"{name}.csv": template for name in self.annotators})
        for name, text in outputs.items():
            with lake.atomic_local_file(f"{directory}/{name}") as tmp:
                Path(tmp).write_text(text)
        result = self.result(
            partition,
            ok=len(samples),
            bytes=written,
            counts={
                "version": version,
                "clusters": len(sizes),
                "empty_clusters": sum(1 for n in sizes.values() if n == 0),
                **(
                    {"largest_cluster": largest[0], "contact_sheet": Markdown(sheet_preview(largest[1]))}
                    if largest
                    else {}
                ),
            },
            paths={"index": f"{directory}/index.html", "annotations_folder": lake.path("annotations", version)},
        )
        result.version = fingerprint(outputs)  # the sheets' index and templates people annotate from
        return result


@dataclass
class ClusterLabelsStage(Stage):
    """Every annotator's votes, validated and resolved per cluster by majority; ties flagged.
    ``directory`` empty means ``<lake>/annotations/<model version>/``; ``taxonomy`` an extra
    JSON taxonomy merged into the shipped one."""

    directory: str = ""
    taxonomy: str | None = None

    name = "cluster_labels"
    level = RELEASE
    writes = (Table.CLUSTER_LABELS,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        version = current_version(lake, release)
        model = load_model(lake, version)
        directory = self.directory or lake.path("annotations", version)
        files = {}
        if lake.fs.exists(directory):
            files = {
                p.rsplit("/", 1)[1]: lake.fs.cat(p).decode("utf-8") for p in sorted(lake.fs.glob(f"{directory}/*.csv"))
            }
        taxonomy = load_taxonomy(self.taxonomy)
        votes = read_annotations(files, taxonomy, model.info["k_used"], version, model.fingerprints())
        resolution = resolve(votes, taxonomy)
        rows = [{"model_version": version, **label} for label in resolution.labels.values()]
        stale = [r for r in rows if r["fingerprint_mismatch"]]
        lake.write_table(Table.CLUSTER_LABELS, release, "all", rows)
        stats = {f"disagreement_{f}_{k}": v for f, s in resolution.stats.items() for k, v in s.items()}
        return self.result(
            partition,
            ok=len(rows),
            counts={
                "version": version,
                "annotation_files": len(files),
                "annotated_clusters": len(rows),
                "clusters": model.info["k_used"],
                "clusters_with_ties": sum(1 for r in rows if r["ties"]),
                "clusters_with_fingerprint_mismatch": len(stale),
                **stats,
            },
            previews={
                "preview": Preview(rows, ["cluster_id", "panel_type", "global_concept", "local_concepts", "ties"])
            },
            checks=[
                Check(
                    ANNOTATIONS_MATCH,
                    passed=not stale,
                    description="; ".join(
                        f"cluster {r['cluster_id']} changed since it was annotated: {r['fingerprint_mismatch']}"
                        for r in stale
                    )
                    or "every annotated cluster is as annotated",
                    blocking=False,
                    metadata={"stale_clusters": [r["cluster_id"] for r in stale]},
                )
            ],
        )


@dataclass
class FigureConceptsStage(Stage):
    """Every figure image's cluster and the cluster's resolved labels; unannotated clusters flagged."""

    name = "figure_concepts"
    reads = (Table.EMBEDDINGS, Table.CLUSTER_LABELS)
    writes = (Table.FIGURE_CONCEPTS,)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        embeddings = lake.require(Table.EMBEDDINGS, release, shard)  # a shard without figures has an empty one
        version = current_version(lake, release)
        model = load_model(lake, version)
        labels_table = lake.read_table(Table.CLUSTER_LABELS, release, "all")  # none before the first review
        labels = {r["cluster_id"]: r for r in (labels_table.to_pylist() if labels_table is not None else [])}
        rows = propagate(embeddings.to_pylist(), model, version, labels)
        lake.write_table(Table.FIGURE_CONCEPTS, release, shard, rows)
        statuses = Counter(r["label_status"] for r in rows)
        concepts = Counter(r["global_concept"] for r in rows if r["global_concept"])
        labelled = statuses.get("labeled", 0) + statuses.get("partly_labeled", 0)
        return self.result(
            partition,
            ok=labelled,
            skipped=len(rows) - labelled,
            counts={
                "version": version,
                "images": len(rows),
                **{f"status_{k}": v for k, v in sorted(statuses.items())},
                **{f"concept_{k.replace(' ', '_')}": v for k, v in sorted(concepts.items())},
            },
            previews={"preview": Preview(rows, ["pmcid", "fig_id", "cluster_id", "global_concept", "label_status"])},
        )


__all__ = ["AnnotationError", "current_version"]
