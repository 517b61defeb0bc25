"""The lake as a Dagster resource."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.lake import Lake


class LakeResource(ConfigurableResource):
    """Where every table, raw tar and the DuckDB catalog live (``PANELFORGE_HOME``)."""

    home: str

    def lake(self) -> Lake:
        return Lake(self.home)
