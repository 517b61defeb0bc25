"""Small helpers for tests: run a whole release through the plain pipeline."""

from __future__ import annotations

from pipelines.core.partitioning import shard_keys
from testing.pipeline import acquire_release

N_SHARDS = 4
SHARDS = shard_keys(N_SHARDS)


def open_test_release(instance, *releases: str) -> None:
    """Add ``releases`` and the tests' shards to a Dagster instance, as the refresh sensor does."""
    from assets.partitions import open_release

    for release in releases:
        open_release(instance, release, N_SHARDS)


def run_release(lake, source, release: str, n_shards: int = N_SHARDS):
    """Inventory + every shard of ``release``, as the assets run them (the previous release is
    the lake's); returns (inventory StageResult, {shard: StageResult})."""
    return acquire_release(lake, source, release, n_shards)


def inventory_rows(lake, release: str) -> dict[str, list[dict]]:
    """The release's inventory rows by shard."""
    return {shard: lake.read_table("inventory", release, shard).to_pylist() for shard in lake.shards()}


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
