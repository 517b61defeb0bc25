"""Declarative automation: a release opened by the refresh sensor flows through every stage.

Each asset below the inventory materializes once all its parents are up to date and their
blocking checks passed (``eager`` waits while any parent is missing or in progress), so a new
release's shards go through parsing, PubMed, embeddings, concepts and samples on their own, and
the release-level serialization starts when every shard is done. A failed blocking check stops
everything below it, so the upload publishes a release only when all its partitions passed.
The upload is automated only where a Hub repository is configured.
"""

from __future__ import annotations

from dagster import AssetsDefinition, AutomationCondition

STARTED_BY_THE_SENSOR = "pmc_inventory"
UPLOAD = "hf_upload"


def with_automation(assets: list[AssetsDefinition], publish: bool) -> list[AssetsDefinition]:
    """``assets`` with their automation conditions; ``publish`` automates the upload too."""
    condition = AutomationCondition.eager() & AutomationCondition.all_deps_blocking_checks_passed()

    def attach(spec):
        name = spec.key.path[-1]
        if name == STARTED_BY_THE_SENSOR or (name == UPLOAD and not publish):
            return spec
        return spec.replace_attributes(automation_condition=condition)

    return [a.map_asset_specs(attach) for a in assets]
