"""Partitions: releases (one per yearly refresh) x shards (hash buckets of the PMCID).

Both dimensions are dynamic, so nothing here depends on the environment when the code
location is imported: a release and its shards become partitions when the release is opened
(by the yearly schedule at tick time, by ``python -m jobs.cli add-release`` or by a test), from
the shard count the lake was created with (``lake.json``; ``PANELFORGE_SHARDS`` only chooses it
for a new lake).

Full PMC-OA (6.4M articles, 24M figures) in 256 shards is about 25k articles and 94k figures
per partition, and 10 yearly releases make 2,560 partitions per asset: far below Dagster's
recommended 100k, while one partition is still a few minutes of GPU work.
"""

from __future__ import annotations

from dagster import (
    AddDynamicPartitionsRequest,
    AssetExecutionContext,
    DagsterInstance,
    DynamicPartitionsDefinition,
    MultiPartitionKey,
    MultiPartitionsDefinition,
)

from pipelines.core.partitioning import shard_keys
from pipelines.core.stage import Partition

RELEASES = "releases"
SHARDS = "shards"
releases_partitions = DynamicPartitionsDefinition(name=RELEASES)
shard_partitions = DynamicPartitionsDefinition(name=SHARDS)
release_shard_partitions = MultiPartitionsDefinition({"release": releases_partitions, "shard": shard_partitions})


def open_release_requests(release: str, n_shards: int) -> list[AddDynamicPartitionsRequest]:
    """The dynamic-partition requests that open ``release`` with its shards; a schedule or
    sensor returns them with its run requests, so evaluating it has no side effect."""
    return [
        releases_partitions.build_add_request([release]),
        shard_partitions.build_add_request(shard_keys(n_shards)),
    ]


def open_release(instance: DagsterInstance, release: str, n_shards: int) -> None:
    """Add ``release`` and its shards to ``instance`` now (the command line, tests, the demo).

    The UI lists dynamic partitions in the order they were added, so an older release opened
    after a newer one (a back-fill of 2024 after 2026) would read out of order: the keys that
    must come after it are removed and added again behind it. Removing a dynamic partition key
    only removes the key; materializations and runs of that partition are kept and show again."""
    for request in open_release_requests(release, n_shards):
        name = request.partitions_def_name
        known = list(instance.get_dynamic_partitions(name))
        missing = [key for key in request.partition_keys if key not in known]
        if not missing:
            continue
        wanted = sorted({*known, *missing})
        in_place = 0
        while in_place < len(known) and known[in_place] == wanted[in_place]:
            in_place += 1
        for key in known[in_place:]:
            instance.delete_dynamic_partition(name, key)
        instance.add_dynamic_partitions(name, wanted[in_place:])


def release_shard_keys(release: str, shards: list[str]) -> list[MultiPartitionKey]:
    return [MultiPartitionKey({"release": release, "shard": shard}) for shard in shards]


def partition_of(context: AssetExecutionContext) -> Partition:
    """The stage partition of a run: a release, or a (release, shard)."""
    key = context.partition_key
    if isinstance(key, MultiPartitionKey):
        keys = key.keys_by_dimension
        return Partition(keys["release"], keys["shard"])
    return Partition(key)
