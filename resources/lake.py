"""The lake as a Dagster resource."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.core.lake import Lake
from pipelines.core.partitioning import DEFAULT_SHARDS


class LakeResource(ConfigurableResource):
    """Where every table, raw tar and the DuckDB catalog live (``PANELFORGE_HOME``). ``shards``
    (``PANELFORGE_SHARDS``) is used when a new lake opens its first release; an existing lake
    keeps the count it was created with and refuses another."""

    home: str
    shards: int = DEFAULT_SHARDS

    def lake(self) -> Lake:
        return Lake(self.home)
