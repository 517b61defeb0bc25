"""The embedding stage on a two-node Ray cluster on loopback: a head with one CPU and no custom
resources, and a worker node with one CPU and two ``gpu_like`` units, each its own ``ray start``.

``PANELFORGE_RAY_ACTOR_RESOURCES='{"gpu_like": 1}'`` makes the model actors need what only the
worker has, as ``num_gpus`` does on a real GPU cluster, so Ray must place them there. The first
test backfills two partitions through the asset, as Dagster runs them, and reads from the GCS
actor table where the actors ran; the second loses the worker node in the middle of a partition,
and Dagster retries the step onto a replacement node. Vectors are compared with a run in this
process that uses no Ray at all.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from dagster import DagsterInstance, MultiPartitionKey

from assets.concepts import figure_embeddings
from pipelines.compute.ray_pool import ensure_ray
from pipelines.concepts.dinov2 import Embedder, EmbedderConfig, load_processor, prepare, resize_of
from pipelines.core.figures import image_refs
from pipelines.core.lake import Lake
from pipelines.core.rawstore import read_raw_file
from pipelines.core.schemas import Table
from pipelines.images.decode import decode_image
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.profiles import build_resources
from resources.quality import QualityResource
from resources.settings import Settings, SettingsError
from testing.ray_cluster import LocalRayCluster
from tests.helpers import N_SHARDS, SHARDS, materialize_one, open_test_release

ray = pytest.importorskip("ray")

RELEASE = "2025"
GPU_LIKE = {"gpu_like": 2.0}  # the worker node's; each actor asks for one
SYNTHETIC = EmbedderConfig(synthetic=True)
BACKFILL = SHARDS[:2]  # partitions, one run each; each run costs a fresh actor process (8-10 s of CPU)
ACTOR = "_EmbedActor"  # Ray Data names the pool's actors MapWorker(MapBatches(_EmbedActor))


@pytest.fixture
def parsed_lake(parsed_lake) -> Path:
    """The session's sample release 2025, acquired and parsed, 4 shards (a template each test copies)."""
    return parsed_lake.root


@pytest.fixture(scope="module")
def ray_cluster():
    """The two-node cluster, and this process as its driver (the same token as the nodes)."""
    if ray.is_initialized():  # an earlier test's local Ray in this process: it would be reused
        ray.shutdown()
    with LocalRayCluster(head_cpus=1) as cluster, cluster.driver():
        cluster.add_worker(num_cpus=1, resources=GPU_LIKE)
        ensure_ray(cluster.address)  # as a run connects (the stages call it again: a no-op)
        yield cluster


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    return ray_cluster


def _copy(template: Path, tmp_path: Path) -> Lake:
    shutil.copytree(template, tmp_path / "lake")
    return Lake(tmp_path / "lake")


def _local_vectors(lake: Lake, shard: str, config: EmbedderConfig) -> dict[tuple, bytes]:
    """Every image of the partition embedded in this process without Ray: read, decode, crop, embed."""
    refs = image_refs(lake, RELEASE, shard)
    resize, embedder = resize_of(config), Embedder(config)
    pixels = []
    for ref in refs:
        image, error = decode_image(read_raw_file(lake, ref))
        assert error is None, (ref["image_file"], error)  # the sample's images all decode
        pixels.append(prepare(image, resize, config.pad))
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


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("gpu_like=1", "must be a JSON object"),
        ('["gpu_like"]', "must be a JSON object"),
        ('{"GPU": 1}', "Ray's own resource 'GPU'"),
        ('{"gpu_like": 0}', "'gpu_like' must be a positive number"),
        ('{"gpu_like": true}', "'gpu_like' must be a positive number"),
        ('{"gpu_like": "1"}', "'gpu_like' must be a positive number"),
    ],
)
def test_actor_resources_setting_is_checked_when_the_code_location_loads(raw, error):
    with pytest.raises(SettingsError, match="PANELFORGE_RAY_ACTOR_RESOURCES") as refused:
        Settings.from_env({"PANELFORGE_RAY_ACTOR_RESOURCES": raw})
    assert error in str(refused.value)
    assert Settings.from_env({}).ray_actor_resources == {}  # production: num_gpus alone places actors
    settings = Settings.from_env({"PANELFORGE_RAY_ACTOR_RESOURCES": '{"a100": 1, "gpu_like": 0.5}'})
    assert build_resources(settings)["ray"].actor_resources == {"a100": 1.0, "gpu_like": 0.5}


@pytest.mark.e2e
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
    for shard in BACKFILL:  # one run per partition, as a backfill launches them (BackfillPolicy.multi_run(1))
        started = time.monotonic()
        result = materialize_one(figure_embeddings, MultiPartitionKey({"release": RELEASE, "shard": shard}),
                                 instance, resources)  # fmt: skip
        assert result.success
        (event,) = result.get_asset_materialization_events()
        images.append(event.materialization.metadata["images"].value)
        assert images[-1] == len(image_refs(lake, RELEASE, shard)) > 0  # the partition's figure images
        print(f"partition {shard}: {images[-1]} images in {time.monotonic() - started:.1f} s on the cluster")

    worker = cluster.wait_alive(cluster.worker)["NodeID"]
    head = next(n["NodeID"] for n in ray.nodes() if cluster.nodes[0].owns(n) and n["Alive"])
    actors = _embed_actors()
    assert len(actors) == len(BACKFILL)  # one pool of one actor per run
    assert {a["Address"]["NodeID"] for a in actors} == {worker} and worker != head
    for shard in BACKFILL:
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


def _files(lake: Lake) -> list[str]:
    tables = Path(lake.root) / "tables"
    return sorted(str(p.relative_to(tables)) for p in tables.rglob("*") if p.is_file())


def _lose_the_worker_while_embedding(cluster: LocalRayCluster, lake: Lake, shard: str, before: set, seen: dict,
                                     done: threading.Event) -> None:  # fmt: skip
    """Once a new embedding actor is alive (its model loaded, batches coming), lose the worker
    node; once the head knows, note what the lake holds, then bring up a replacement node."""
    lost = cluster.worker
    while not done.is_set():
        alive = [a for a in _embed_actors() if a["State"] == "ALIVE" and a["ActorID"] not in before]
        if alive:
            seen["actor"] = alive[0]
            cluster.kill(lost)
            cluster.wait_alive(lost, alive=False)
            seen["rows_after_loss"] = _written(lake, shard)
            seen["files_after_loss"] = _files(lake)
            cluster.add_worker(num_cpus=1, resources=GPU_LIKE)
            seen["replacement"] = cluster.wait_alive(cluster.worker)["NodeID"]
            return
        time.sleep(0.1)


@pytest.mark.e2e
def test_losing_the_worker_mid_partition_retries_the_run_on_a_new_node(cluster, parsed_lake, tmp_path, slow_model):
    lake = _copy(parsed_lake, tmp_path)
    shard = SHARDS[0]
    lost_id = cluster.wait_alive(cluster.worker)["NodeID"]
    files_before = _files(lake)
    resources = {
        "lake": LakeResource(home=str(lake.root), shards=N_SHARDS),
        "models": ModelsResource(dinov2=slow_model.model),
        "ray": RayResource(
            address=cluster.address,
            batch_size=4,
            actor_resources={"gpu_like": 1},
            outage_retries=3,
            outage_retry_delay_s=5,
        ),
        "quality": QualityResource(),
    }
    (tmp_path / "home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "home"))
    open_test_release(instance, RELEASE)
    before = {a["ActorID"] for a in _embed_actors()}

    seen: dict = {}
    done = threading.Event()
    loser = threading.Thread(target=_lose_the_worker_while_embedding, args=(cluster, lake, shard, before, seen, done))
    loser.start()
    try:
        key = MultiPartitionKey({"release": RELEASE, "shard": shard})
        result = materialize_one(figure_embeddings, key, instance, resources, raise_on_error=False)
    finally:
        done.set()
        loser.join()

    assert "actor" in seen, "the partition was embedded before an actor was seen alive: nothing was lost"
    assert seen["actor"]["Address"]["NodeID"] == lost_id
    # the attempt on the lost node wrote nothing: no table, not even a temporary file
    assert seen["rows_after_loss"] == [] and seen["files_after_loss"] == files_before
    # Dagster retried the step until it ran on the replacement: a retry may come before the head
    # has noticed the loss (its health checks take seconds) and start an actor on the dead node
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert result.success and 1 <= len(retries) <= 3
    warnings = [r.user_message for r in instance.all_logs(result.run_id) if "service unavailable" in r.user_message]
    assert len(warnings) == len(retries) and all("the Ray cluster lost part of the run" in w for w in warnings)
    actors = sorted((a for a in _embed_actors() if a["ActorID"] not in before), key=lambda a: a["StartTime"])
    assert {a["Address"]["NodeID"] for a in actors} <= {lost_id, seen["replacement"]}
    assert actors[-1]["Address"]["NodeID"] == seen["replacement"] != lost_id  # the attempt that wrote
    _assert_equals_local(lake, shard, slow_model)  # every image once, the vectors of a run without Ray
    table = Path(lake.table_path(Table.EMBEDDINGS, RELEASE, shard))
    assert sorted(p.name for p in table.parent.iterdir()) == ["data.parquet"]
