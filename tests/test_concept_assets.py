"""The concept assets through Dagster over two releases: embed, fit, review, annotate, propagate,
then label the next release through the same model without re-embedding unchanged images."""

import pytest
from dagster import DagsterInstance, MultiPartitionKey

from assets.concepts import cluster_labels, concept_model, concept_review, figure_concepts, figure_embeddings
from jobs.partitions import RELEASES, shard_partitions
from pipelines.lake import Lake
from pipelines.parse.shard import parse_shard
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from tests.conftest import source_for
from tests.helpers import materialize_one, run_release

MODEL = {"n_components": 8, "k": 4, "sample_size": 1000, "seed": 0}


def _parse(lake, release, previous=None):
    for shard in shard_partitions.get_partition_keys():
        parse_shard(lake, release, shard, previous)


@pytest.fixture(scope="module")
def concept_lake(tmp_path_factory, cloud_mirror):
    from testing.loopback.s3_server import S3LoopbackServer

    tmp = tmp_path_factory.mktemp("concepts")
    lake = Lake(tmp / "lake")
    with S3LoopbackServer(cloud_mirror) as server, source_for(server.url) as source:
        run_release(lake, source, "2025")
        _parse(lake, "2025")
        run_release(lake, source, "2026", previous="2025")
        _parse(lake, "2026", previous="2025")
    (tmp / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp / "home"))
    instance.add_dynamic_partitions(RELEASES, ["2025", "2026"])
    resources = {
        "lake": LakeResource(home=str(lake.root)),
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
    return [MultiPartitionKey({"release": release, "shard": s}) for s in shard_partitions.get_partition_keys()]


def test_two_releases_of_concepts(concept_lake):
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

    # two annotators label cluster 0 the same way; cluster 1 gets one vote each way (a tie)
    header = "cluster_id,panel_type,global_concept,local_concepts,notes\n"
    for name, concept in (("ann_a", "Plots and Charts"), ("ann_b", "Microscopy")):
        with lake.atomic_local_file(lake.path("annotations", version, f"{name}.csv")) as tmp, open(tmp, "w") as fh:
            fh.write(header + "0,single panel,Plots and Charts,bar chart,\n" + f"1,single panel,{concept},,\n")
    labels = run(cluster_labels, "2025")
    assert labels["annotated_clusters"].value == 2 and labels["clusters_with_ties"].value == 1
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
    second = run(concept_model, "2026", {**MODEL, "reuse_previous": True})
    assert second["version"].value == version and second["reused_previous_model"].value is True
    run(cluster_labels, "2026")
    for key in _shards("2026"):
        run(figure_concepts, key)
    later = {(r["pmcid"], r["image_file"]): r for r in lake.read_release("figure_concepts", "2026").to_pylist()}
    assert {k: (r["cluster_id"], r["global_concept"]) for k, r in later.items()} == {
        (r["pmcid"], r["image_file"]): (r["cluster_id"], r["global_concept"]) for r in concepts
    }
