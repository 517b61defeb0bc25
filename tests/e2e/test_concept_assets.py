"""The concept assets through Dagster over two releases: embed, fit, review, annotate, propagate,
then label the next release through the same model without re-embedding unchanged images;
and the demo's shipped annotations still describe the demo's clusters."""

import csv
import io

import pytest
from dagster import DagsterInstance, MultiPartitionKey

from assets.concepts import cluster_labels, concept_model, concept_review, figure_concepts, figure_embeddings
from jobs.demo import DEMO_CONCEPT_MODEL, DEMO_RELEASE
from pipelines.concepts.annotations import read_annotations, resolve
from pipelines.concepts.dinov2 import EmbedderConfig
from pipelines.concepts.model import ConceptModelConfig, fit_concept_model, sample_vectors
from pipelines.core.lake import Lake
from pipelines.core.stage import Partition
from pipelines.core.taxonomy import load_taxonomy
from pipelines.parse.stages import ParseStage
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.settings import REPO
from tests.helpers import N_SHARDS, SHARDS, materialize_one, open_test_release, run_release, source_for

MODEL = {"n_components": 8, "k": 4, "sample_size": 1000, "seed": 0}


def _parse(lake, release, previous=None):
    for shard in SHARDS:
        ParseStage().run(lake, Partition(release, shard))


@pytest.fixture(scope="module")
def concept_lake(tmp_path_factory, cloud_mirror):
    from testing.loopback.s3_server import S3LoopbackServer

    tmp = tmp_path_factory.mktemp("concepts")
    lake = Lake(tmp / "lake")
    with S3LoopbackServer(cloud_mirror) as server, source_for(server.url) as source:
        run_release(lake, source, "2025")
        _parse(lake, "2025")
        run_release(lake, source, "2026")
        _parse(lake, "2026", previous="2025")
    (tmp / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp / "home"))
    open_test_release(instance, "2025", "2026")
    resources = {
        "lake": LakeResource(home=str(lake.root), shards=N_SHARDS),
        "quality": QualityResource(),
        "models": ModelsResource(synthetic=True),
        "ray": RayResource(batch_size=16),
    }

    def run(asset, key, config=None):
        result = materialize_one(asset, key, instance, resources, config)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        return event.materialization.metadata

    return lake, run


def _shards(release):
    return [MultiPartitionKey({"release": release, "shard": s}) for s in SHARDS]


def test_two_releases_of_concepts(concept_lake, local_ray):
    lake, run = concept_lake
    embedded = [run(figure_embeddings, key) for key in _shards("2025")]
    assert sum(m["images"].value for m in embedded) == 128 and sum(m["errors"].value for m in embedded) == 0
    assert all(m["synthetic_model"].value for m in embedded) and embedded[0]["model"].value == "synthetic-tiny-dinov2"

    first = run(concept_model, "2025", MODEL)
    version = first["version"].value
    assert first["k"].value == 4 and first["reused_previous_model"].value is False
    review = run(concept_review, "2025")
    folder = lake.path("review", version)
    assert lake.exists(f"{folder}/index.html") and lake.exists(f"{folder}/annotator_1.csv")
    assert len(lake.fs.glob(f"{folder}/cluster_*.png")) == 4 - review["empty_clusters"].value
    # the largest cluster's sheet, shown in the UI's metadata panel as a Markdown image
    assert review["contact_sheet"].value.startswith("![contact sheet](data:image/jpeg;base64,")

    # the template names the model version and each cluster's fingerprint (members in the sample)
    template = list(csv.DictReader(io.StringIO(lake.fs.cat(f"{folder}/annotations_template.csv").decode())))
    assert {r["model_version"] for r in template} == {version} and len(template) == 4
    fingerprint = {int(r["cluster_id"]): r["fingerprint"] for r in template}
    assert sum(int(f.split(":")[0]) for f in fingerprint.values()) == 128  # the whole sample, once

    # two annotators label cluster 0 the same way; cluster 1 gets one vote each way (a tie)
    header = "cluster_id,panel_type,global_concept,local_concepts,notes,model_version,fingerprint\n"

    def annotate(name, text):
        with lake.atomic_local_file(lake.path("annotations", version, f"{name}.csv")) as tmp, open(tmp, "w") as fh:
            fh.write(header + text)

    for name, concept in (("ann_a", "Plots and Charts"), ("ann_b", "Microscopy")):
        annotate(
            name,
            f"0,single panel,Plots and Charts,bar chart,,{version},{fingerprint[0]}\n"
            f"1,single panel,{concept},,,{version},{fingerprint[1]}\n",
        )
    labels = run(cluster_labels, "2025")
    assert labels["annotated_clusters"].value == 2 and labels["clusters_with_ties"].value == 1
    assert labels["clusters_with_fingerprint_mismatch"].value == 0
    assert labels["disagreement_global_concept_max"].value == 0.5
    for key in _shards("2025"):
        run(figure_concepts, key)
    concepts = lake.read_release("figure_concepts", "2025").to_pylist()
    by_cluster = {}
    for row in concepts:
        by_cluster.setdefault(row["cluster_id"], set()).add((row["global_concept"], row["label_status"]))
    assert by_cluster[0] == {("Plots and Charts", "labeled")}
    assert by_cluster[1] == {(None, "partly_labeled")}
    assert all(s == {(None, "unannotated_cluster")} for c, s in by_cluster.items() if c not in (0, 1))

    # the next release: nothing re-embedded, the same model and annotations label it
    again = [run(figure_embeddings, key) for key in _shards("2026")]
    assert sum(m["embedded"].value for m in again) == 0 and sum(m["carried"].value for m in again) == 128
    # a rerun of a partition reuses its own rows (the one reuse rule: previous release, then the partition)
    key = _shards("2026")[0]
    before = lake.read_table("embeddings", "2026", SHARDS[0]).to_pylist()
    rerun = run(figure_embeddings, key)
    assert rerun["embedded"].value == 0 and rerun["carried"].value == len(before)
    assert lake.read_table("embeddings", "2026", SHARDS[0]).to_pylist() == before
    second = run(concept_model, "2026", {**MODEL, "reuse_previous": True})
    assert second["version"].value == version and second["reused_previous_model"].value is True
    run(cluster_labels, "2026")
    for key in _shards("2026"):
        run(figure_concepts, key)
    later = {(r["pmcid"], r["image_file"]): r for r in lake.read_release("figure_concepts", "2026").to_pylist()}
    assert {k: (r["cluster_id"], r["global_concept"]) for k, r in later.items()} == {
        (r["pmcid"], r["image_file"]): (r["cluster_id"], r["global_concept"]) for r in concepts
    }

    # an annotator who saw cluster 2 with one image more than the model has: labelled, but flagged
    size, digest = fingerprint[2].split(":")
    annotate("ann_c", f"2,single panel,Tables,table,,{version},{int(size) + 1}:{digest}\n")
    flagged = run(cluster_labels, "2026")
    assert flagged["clusters_with_fingerprint_mismatch"].value == 1
    (row,) = [r for r in lake.read_table("cluster_labels", "2026", "all").to_pylist() if r["cluster_id"] == 2]
    assert row["global_concept"] == "Tables"
    assert row["fingerprint_mismatch"] == (
        f"ann_c: annotated a cluster of {int(size) + 1} sample images ({int(size) + 1}:{digest}), "
        f"the model's has {size} ({fingerprint[2]})"
    )


def test_shipped_demo_annotations_describe_the_demo_model(concept_lake):
    """The demo model rebuilt from the sample's embeddings (as ``make demo`` builds it: the same
    images, synthetic DINOv2, DEMO_CONCEPT_MODEL) has exactly the clusters
    sample/annotations/panelforge_dev.csv was written for."""
    lake, run = concept_lake
    for key in _shards(DEMO_RELEASE):
        if lake.read_table("embeddings", DEMO_RELEASE, key.keys_by_dimension["shard"]) is None:
            run(figure_embeddings, key)
    settings = ConceptModelConfig(**DEMO_CONCEPT_MODEL)
    vectors, keys = sample_vectors(lake, DEMO_RELEASE, settings.sample_size, settings.seed)
    model = fit_concept_model(vectors, settings, keys)
    version = settings.version(DEMO_RELEASE, EmbedderConfig(synthetic=True).model_label)
    assert version == "2026-864d3d5a96bf6f37" and model.info["kmeans_backend"] == "scikit-learn"
    files = {p.name: p.read_text() for p in sorted((REPO / "sample" / "annotations").glob("*.csv"))}
    taxonomy = load_taxonomy()
    labels = resolve(read_annotations(files, taxonomy, 8, version, model.fingerprints()), taxonomy).labels
    assert {c: label["fingerprint_mismatch"] for c, label in labels.items()} == dict.fromkeys(range(7))
    # what the contact sheets showed: charts in 0 and 5, brain MRI in 1, 4 and 6, microscopy in 2 and 3
    assert {c: label["global_concept"] for c, label in labels.items()} == {
        0: "Plots and Charts",
        1: "Clinical Imaging",
        2: "Microscopy",
        3: "Microscopy",
        4: "Clinical Imaging",
        5: "Plots and Charts",
        6: "Clinical Imaging",
    }
    assert [int(f.split(":")[0]) for _, f in sorted(model.fingerprints().items())] == [81, 6, 3, 8, 1, 22, 2, 5]
