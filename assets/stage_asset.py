"""The one way a stage becomes an asset: what the stage declares is not repeated in the decorator."""

from __future__ import annotations

from collections.abc import Iterable

from dagster import asset

from assets.partitions import release_shard_partitions, releases_partitions
from pipelines.core.stage import RELEASE, Stage


def stage_asset(stage: type[Stage], *, kinds: Iterable[str] = (), description: str | None = None, **kwargs):
    """``@asset`` for ``stage``: its name, its description (the class docstring unless given),
    its partitions (per release × shard, or per release: its ``level``), its Dagster pool and
    kinds (its ``compute``) come from the stage class; ``kinds`` adds the outputs' kinds
    (``parquet``, ``webdataset``) and ``kwargs`` the rest (deps, group, checks, code version)."""
    return asset(
        name=stage.name,
        description=description or stage.__doc__,
        partitions_def=releases_partitions if stage.level == RELEASE else release_shard_partitions,
        pool=stage.compute.pool,
        kinds={*kinds, *stage.compute.kinds},
        **kwargs,
    )
