"""Small helpers for tests: run a whole release through the plain pipeline, open a source with
fast retries, copy a lake, write a WebDataset subset. Fixtures live in ``conftest.py``; test
modules import helpers from here, never from each other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipelines.acquire.source import open_source
from pipelines.core.lake import Lake
from pipelines.core.partitioning import shard_keys
from pipelines.net.retry import RetryPolicy
from testing.pipeline import acquire_release

REPO = Path(__file__).resolve().parents[1]
SAMPLE_IMAGES = sorted((REPO / "sample" / "images").glob("*/*.jpg"))
N_SHARDS = 4
SHARDS = shard_keys(N_SHARDS)
FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


def source_for(url: str, rate: float = 1000.0):
    """A source on ``url`` with fast retries and a rate limit of ``rate`` requests a second: high
    by default, since a release of the sample is 235 requests (1.2 s of slots at 200/s) and the
    tests that check the limit itself set their own rate (tests/stages/test_acquisition_scale.py,
    tests/unit/test_ratelimit.py)."""
    return open_source(url, rate_limit=rate, retry=FAST_RETRY)


def copy_lake(lake: Lake, dest: Path) -> Lake:
    """A private copy of ``lake`` at ``dest/lake`` (a lake is relocatable: a session-scoped lake
    is built once and each test that writes gets its own copy)."""
    shutil.copytree(lake.root, dest / "lake")
    return Lake(dest / "lake")


def write_subset(folder: Path, samples: list[dict]) -> Path:
    """One release-like WebDataset subset folder: panelforge-000000.tar and its sizes.json."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(folder / "panelforge-000000.tar")) as sink:
        for sample in samples:
            sink.write(sample)
    (folder / "sizes.json").write_text(json.dumps({"panelforge-000000.tar": len(samples)}))
    return folder


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
