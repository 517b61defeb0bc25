"""The sample (or any mirror) taken through the first stages the way the assets take it, for
tests and benchmarks that need a lake: the same stage objects, the same ``run``."""

from __future__ import annotations

import atexit
import shutil
import tempfile
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


def build_sample_lake(root: Path, release: str = "2026", n_shards: int = 4, parse: bool = True) -> Lake:
    """The bundled sample, acquired from a mirror on disk into ``root/lake`` (and parsed)."""
    lake = Lake(root / "lake")
    with open_source(build_cloud_mirror(root / "mirror").as_uri()) as source:
        acquire_release(lake, source, release, n_shards)
    if parse:
        parse_release(lake, release)
    return lake


_TEMPLATES: dict[tuple, Path] = {}  # built sample lakes of this process, by what they hold


def _template(release: str, n_shards: int, parse: bool, panels: tuple[str, ...] = ()) -> Path:
    key = (release, n_shards, parse, panels)
    if key not in _TEMPLATES:
        root = Path(tempfile.mkdtemp(prefix="panelforge-sample-lake-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        if panels:
            from pipelines.panels.stages import PanelSettings, PanelStage

            lake = _copy(_template(release, n_shards, parse), root)
            for shard in panels:
                PanelStage(PanelSettings()).run(lake, Partition(release, shard))
        else:
            build_sample_lake(root, release, n_shards, parse)
        _TEMPLATES[key] = root
    return _TEMPLATES[key]


def _copy(template: Path, root: Path) -> Lake:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(template / "mirror", root / "mirror")
    shutil.copytree(template / "lake", root / "lake")
    return Lake(root / "lake")


def sample_lake(
    root: Path, release: str = "2026", n_shards: int = 4, parse: bool = True, panels: tuple[str, ...] = ()
) -> Lake:
    """The bundled sample acquired (and parsed) into ``root/lake``, its mirror at ``root/mirror``;
    with ``panels``, those shards split into panels by the panels stage (default settings).

    Built once per process for each (release, shards, parse, panels) and copied here after: a lake
    is relocatable (every path in it is relative to its root), so the copy is the lake a fresh
    build would write, and a dozen test modules and benchmarks pay for one acquisition, one parse
    and one panel split of a shard (a second of OCR per ten figures)."""
    return _copy(_template(release, n_shards, parse, tuple(panels)), root)
