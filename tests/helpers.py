"""Small helpers for tests: run a whole release through the plain pipeline."""

from __future__ import annotations

from pipelines.acquire.download import acquire_shard
from pipelines.acquire.inventory import build_inventory
from pipelines.partitioning import shard_keys

N_SHARDS = 4
SHARDS = shard_keys(N_SHARDS)


def open_test_release(instance, *releases: str) -> None:
    """Add ``releases`` and the tests' shards to a Dagster instance, as the refresh sensor does."""
    from assets.partitions import open_release

    for release in releases:
        open_release(instance, release, N_SHARDS)


def run_release(lake, source, release: str, previous: str | None = None, n_shards: int = N_SHARDS):
    """Inventory + every shard of ``release``; returns (inventory result, {shard: ShardResult})."""
    prev_rows = lake.read_release("inventory", previous).to_pylist() if previous else []
    inventory = build_inventory(source, prev_rows, previous, n_shards)
    for shard in shard_keys(n_shards):
        lake.write_table("inventory", release, shard, inventory.rows_by_shard.get(shard, []))
    results = {
        shard: acquire_shard(lake, source, release, shard, inventory.rows_by_shard.get(shard, []), previous)
        for shard in shard_keys(n_shards)
    }
    return inventory, results


def manifest(lake, release: str) -> dict[str, dict]:
    return {r["pmcid"]: r for r in lake.read_release("raw_manifest", release).to_pylist()}


def files(lake, release: str) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for row in lake.read_release("raw_files", release).to_pylist():
        out.setdefault(row["pmcid"], {})[row["name"]] = row
    return out


def materialize_one(asset, key, instance, resources: dict, config: dict | None = None, raise_on_error: bool = True):
    """Materialize one partition of one asset, with ``config`` as its op config."""
    from dagster import materialize

    return materialize(
        [asset],
        partition_key=key,
        instance=instance,
        resources=resources,
        run_config={"ops": {asset.key.path[-1]: {"config": config}}} if config else None,
        raise_on_error=raise_on_error,
    )
