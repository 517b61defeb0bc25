"""The sample (or any mirror) taken through the first stages the way the assets take it, for
tests and benchmarks that need a lake: the same stage objects, the same ``run``."""

from __future__ import annotations

from pathlib import Path

from pipelines.acquire.source import open_source
from pipelines.acquire.stages import AcquireStage, InventoryStage
from pipelines.core.lake import Lake
from pipelines.core.stage import Partition, StageResult
from pipelines.parse.stages import ParseStage
from testing.loopback.sample_mirror import build_cloud_mirror


def acquire_release(
    lake: Lake, source, release: str, n_shards: int, concurrency: int = 4
) -> tuple[StageResult, dict[str, StageResult]]:
    """Inventory + every shard of ``release`` (the previous release is the lake's)."""
    inventory = InventoryStage(source, n_shards).run(lake, Partition(release))
    shards = {s: AcquireStage(source, concurrency).run(lake, Partition(release, s)) for s in lake.shards()}
    return inventory, shards


def parse_release(lake: Lake, release: str) -> dict[str, StageResult]:
    return {shard: ParseStage().run(lake, Partition(release, shard)) for shard in lake.shards()}


def sample_lake(root: Path, release: str = "2026", n_shards: int = 4, parse: bool = True) -> Lake:
    """The bundled sample, acquired from a mirror on disk into ``root/lake`` (and parsed)."""
    lake = Lake(root / "lake")
    with open_source(build_cloud_mirror(root / "mirror").as_uri()) as source:
        acquire_release(lake, source, release, n_shards)
    if parse:
        parse_release(lake, release)
    return lake
