"""The embedding stage on a two-node Ray cluster on loopback: a head with one CPU and no custom
resources, and a worker node with one CPU and two ``gpu_like`` units, each its own ``ray start``.

``PANELFORGE_RAY_ACTOR_RESOURCES='{"gpu_like": 1}'`` makes the model actors need what only the
worker has, as ``num_gpus`` does on a real GPU cluster, so Ray must place them there. The first
test backfills four partitions through the asset, as Dagster runs them, and asks Ray's state API
where the actors ran; the second loses the worker node in the middle of a partition and reruns
it on a new worker. Vectors are compared with a run in this process that uses no Ray at all.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from dagster import DagsterInstance, MultiPartitionKey

from assets.concepts import figure_embeddings
from pipelines.acquire.rawstore import read_raw_file
from pipelines.concepts.decode import decode_image
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, load_processor, prepare
from pipelines.concepts.shard import image_refs
from pipelines.concepts.stages import EmbedStage
from pipelines.lake import Lake
from pipelines.parse.stages import ParseStage
from pipelines.schemas import Table
from pipelines.stage import Partition
from resources.profiles import build_resources
from resources.settings import Settings
from testing.loopback.s3_server import S3LoopbackServer
from testing.ray_cluster import LocalRayCluster, RayNode
from tests.conftest import source_for
from tests.helpers import N_SHARDS, SHARDS, materialize_one, open_test_release, run_release

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.e2e

RELEASE = "2025"
GPU_LIKE = {"gpu_like": 2.0}  # the worker node's; each actor asks for one
SYNTHETIC = EmbedderConfig(synthetic=True)
ACTOR = "_EmbedActor"  # Ray Data names the pool's actors MapWorker(MapBatches(_EmbedActor))


@pytest.fixture(scope="module")
def parsed_lake(tmp_path_factory, cloud_mirror) -> Path:
    """The sample release acquired and parsed: 4 shards of 32 figure images (a template, copied per test)."""
    root = tmp_path_factory.mktemp("multinode") / "lake"
    lake = Lake(root)
    with S3LoopbackServer(cloud_mirror) as server, source_for(server.url) as source:
        run_release(lake, source, RELEASE)
    for shard in SHARDS:
        ParseStage().run(lake, Partition(RELEASE, shard))
    return root


@pytest.fixture(scope="module")
def cluster():
    """The two-node cluster, and this process as its driver (the same token as the nodes)."""
    if ray.is_initialized():  # an earlier test's local Ray in this process: it would be reused
        ray.shutdown()
    with LocalRayCluster(head_cpus=1) as cluster, pytest.MonkeyPatch.context() as env:
        for name, value in cluster.env.items():
            env.setenv(name, value)
        cluster.worker = cluster.add_worker(num_cpus=1, resources=GPU_LIKE)
        try:
            yield cluster
        finally:
            ray.shutdown()


def _copy(template: Path, tmp_path: Path) -> Lake:
    shutil.copytree(template, tmp_path / "lake")
    return Lake(tmp_path / "lake")


def _local_vectors(lake: Lake, shard: str, config: EmbedderConfig) -> dict[tuple, bytes]:
    """Every image of the partition embedded in this process without Ray: read, decode, crop, embed."""
    refs = image_refs(lake, RELEASE, shard)
    processor, embedder = load_processor(config), Embedder(config)
    pixels = []
    for ref in refs:
        image, error = decode_image(read_raw_file(lake, ref))
        assert error is None, (ref["image_file"], error)  # the sample's images all decode
        pixels.append(prepare(image, processor, config.pad))
    vectors = embedder.embed(np.stack(pixels))
    return {(r["pmcid"], r["fig_id"], r["image_file"]): v.tobytes() for r, v in zip(refs, vectors, strict=True)}


def _written(lake: Lake, shard: str) -> list[dict]:
    table = lake.read_table(Table.EMBEDDINGS, RELEASE, shard)
    return [] if table is None else table.to_pylist()


def _assert_equals_local(lake: Lake, shard: str, config: EmbedderConfig) -> None:
    rows = _written(lake, shard)
    keys = [(r["pmcid"], r["fig_id"], r["image_file"]) for r in rows]
    expected = _local_vectors(lake, shard, config)
    assert len(keys) == len(set(keys)) == len(expected) > 0  # nothing duplicated, nothing lost
    assert all(r["error"] is None for r in rows)
    for key, row in zip(keys, rows, strict=True):
        assert row["vector"] == expected[key], key  # float16 bytes, bit for bit


def _embed_actors() -> list[dict]:
    """The embedding actors the cluster has run, alive or dead, from the GCS actor table.

    ``ray.util.state.list_actors`` (``ray list actors``) asks the dashboard, which needs
    ``ray[default]``; PanelForge installs plain ``ray``, so this reads the same table from the GCS."""
    from ray._private import state

    return [a for a in state.actors().values() if ACTOR in a["ActorClassName"]]


def test_backfill_places_the_actors_on_the_worker_node(cluster, parsed_lake, tmp_path):
    lake = _copy(parsed_lake, tmp_path)
    settings = Settings.from_env(
        {
            "PANELFORGE_HOME": str(lake.root),
            "PANELFORGE_SHARDS": str(N_SHARDS),
            "PANELFORGE_SYNTHETIC": "1",
            "PANELFORGE_RAY_ADDRESS": cluster.address,
            "PANELFORGE_RAY_ACTOR_RESOURCES": '{"gpu_like": 1}',
        }
    )
    assert settings.ray_actor_resources == {"gpu_like": 1.0}
    every = build_resources(settings)
    resources = {name: every[name] for name in ("lake", "models", "ray", "quality")}
    assert resources["ray"].address == cluster.address
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)

    images = []
    for shard in SHARDS:  # a backfill: one run per partition, as BackfillPolicy.multi_run(1) launches them
        started = time.monotonic()
        result = materialize_one(figure_embeddings, MultiPartitionKey({"release": RELEASE, "shard": shard}),
                                 instance, resources)  # fmt: skip
        assert result.success
        (event,) = result.get_asset_materialization_events()
        images.append(event.materialization.metadata["images"].value)
        print(f"partition {shard}: {images[-1]} images in {time.monotonic() - started:.1f} s on the cluster")
    assert sum(images) == 128  # the sample release's figure images, every one embedded once

    worker = cluster.wait_alive(cluster.worker)["NodeID"]
    head = next(n["NodeID"] for n in ray.nodes() if cluster.nodes[0].owns(n) and n["Alive"])
    actors = _embed_actors()
    assert len(actors) == len(SHARDS)  # one pool of one actor per run
    assert {a["Address"]["NodeID"] for a in actors} == {worker} and worker != head
    for shard in SHARDS:
        _assert_equals_local(lake, shard, SYNTHETIC)


@pytest.fixture
def slow_model(tmp_path) -> EmbedderConfig:
    """A random DINOv2 of width 192 and 6 layers in a local directory (as production loads real
    weights): about 0.1 s an image on one CPU, so a 32-image partition embeds for seconds and the
    worker can be lost while it does."""
    import torch
    from transformers import Dinov2Config, Dinov2Model

    directory = tmp_path / "dinov2-slow"
    config = Dinov2Config(hidden_size=192, num_hidden_layers=6, num_attention_heads=3, intermediate_size=768)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        Dinov2Model(config).save_pretrained(directory)
    load_processor(SYNTHETIC).save_pretrained(directory)  # DINOv2's preprocessing, as in the real weights
    return EmbedderConfig(model=str(directory))


def _kill_once_embedding(cluster: LocalRayCluster, node: RayNode, before: set, seen: dict) -> None:
    """Wait until a new embedding actor is alive (its model loaded, batches coming), then lose ``node``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        alive = [a for a in _embed_actors() if a["State"] == "ALIVE" and a["ActorID"] not in before]
        if alive:
            seen["actor"] = alive[0]
            cluster.kill(node)
            return
        time.sleep(0.1)


def test_losing_the_worker_mid_partition_fails_the_run_and_the_rerun_completes(
    cluster, parsed_lake, tmp_path, slow_model
):
    lake = _copy(parsed_lake, tmp_path)
    shard = SHARDS[0]
    worker_id = cluster.wait_alive(cluster.worker)["NodeID"]
    stage = EmbedStage(slow_model, batch_size=4, address=cluster.address, actor_resources={"gpu_like": 1})
    before = {a["ActorID"] for a in _embed_actors()}

    seen: dict = {}
    killer = threading.Thread(target=_kill_once_embedding, args=(cluster, cluster.worker, before, seen))
    killer.start()
    try:
        with pytest.raises(Exception) as failure:  # noqa: B017 - whatever Ray raises, the run fails
            stage.run(lake, Partition(RELEASE, shard))
    finally:
        killer.join()
    assert "actor" in seen, "the run ended before an embedding actor was alive"
    assert seen["actor"]["Address"]["NodeID"] == worker_id
    print(f"the run failed with {type(failure.value).__name__}: {str(failure.value)[:300]}")
    # nothing written for the partition: no table, no half-written file beside it
    assert _written(lake, shard) == []
    partition_dir = Path(lake.table_path(Table.EMBEDDINGS, RELEASE, shard)).parent
    assert not partition_dir.exists() or not any(partition_dir.iterdir())
    cluster.wait_alive(cluster.worker, alive=False)

    cluster.worker = cluster.add_worker(num_cpus=1, resources=GPU_LIKE)  # a replacement node
    new_id = cluster.wait_alive(cluster.worker)["NodeID"]
    result = stage.run(lake, Partition(RELEASE, shard))
    assert (result.ok, result.error) == (len(image_refs(lake, RELEASE, shard)), 0)
    rerun = [a for a in _embed_actors() if a["ActorID"] not in before | {seen["actor"]["ActorID"]}]
    assert {a["Address"]["NodeID"] for a in rerun} == {new_id} and new_id != worker_id
    _assert_equals_local(lake, shard, slow_model)
    assert os.listdir(Path(lake.table_path(Table.EMBEDDINGS, RELEASE, shard)).parent) == ["data.parquet"]
