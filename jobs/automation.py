"""Declarative automation: a release opened by the refresh sensor flows through every stage.

Each asset below the inventory materializes once all its parents are up to date and their
blocking checks passed (``eager`` waits while any parent is missing or in progress), so a new
release's shards go through parsing, PubMed, embeddings, concepts and samples on their own, and
the release-level stages start when every shard of the release is done (a release-level asset's
parents are all the release's shards: one missing or in progress shard holds it back). A failed
blocking check stops everything below it, so the upload publishes a release only when all its
partitions passed. The upload is automated only where a Hub repository is configured.

The conditions are evaluated by ``panelforge_automation``, a sensor that is **on by default**:
Dagster's implicit ``default_automation_condition_sensor`` starts stopped, so without it a new
release would stop after its inventory until someone turned automation on in the UI.
"""

from __future__ import annotations

from dagster import (
    AssetsDefinition,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
)

STARTED_BY_THE_SENSOR = "pmc_inventory"
UPLOAD = "hf_upload"
# GPU training is a decision (weeks of GPU time, a new model version): started by a person
STARTED_BY_A_PERSON = {
    "panel_training_set",
    "panel_detector",
    "clip_continual_pretraining",
    "clip_evaluation",
    "multilevel_training",
}
AUTOMATION_SENSOR = "panelforge_automation"


def no_dep_partition_failed_a_blocking_check() -> AutomationCondition:
    """True when no partition of any parent has a failed blocking check (one requested again in
    this tick does not count: a failure in the run stops the child there).

    Dagster's ``all_deps_blocking_checks_passed`` is not this: a dependency condition maps the
    parent's matching partitions down, so a release-level asset passes it when ANY ONE shard of
    each parent passed. A shard whose blocking check failed still records its materialization, so
    with that condition the release (and its upload) went on without the failed shard's fix.
    The checks are partitioned like their assets (``assets/report.py``), so a result is known per
    partition; a run over a partition range (a UI backfill with a multi-run policy) records its
    results without a partition, and those are not known here (the run itself still stops at a
    failed check).
    """
    failed = AutomationCondition.check_failed() & ~AutomationCondition.will_be_requested()
    failed_somewhere = AutomationCondition.any_deps_match(
        AutomationCondition.any_checks_match(failed, blocking_only=True)
    )
    return (~failed_somewhere).with_label("no_dep_partition_failed_a_blocking_check")


def release_condition() -> AutomationCondition:
    """Materialize when the parents are all there, up to date and not in progress, and no
    partition of any parent failed a blocking check."""
    return AutomationCondition.eager() & no_dep_partition_failed_a_blocking_check()


def with_automation(assets: list[AssetsDefinition], publish: bool) -> list[AssetsDefinition]:
    """``assets`` with their automation conditions; ``publish`` automates the upload too."""
    condition = release_condition()

    def attach(spec):
        name = spec.key.path[-1]
        if name == STARTED_BY_THE_SENSOR or name in STARTED_BY_A_PERSON or (name == UPLOAD and not publish):
            return spec
        return spec.replace_attributes(automation_condition=condition)

    return [a.map_asset_specs(attach) for a in assets]


def automation_sensor(interval_s: int = 30) -> AutomationConditionSensorDefinition:
    """The sensor that evaluates every asset's condition every ``interval_s`` seconds (on by
    default; it requests nothing for an asset without a condition, e.g. the inventory)."""
    return AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=interval_s,
        # one run per partition, tagged with it, so checks record their partition (runs emitted
        # as backfills carry a partition range instead, and their check results no partition)
        emit_backfills=False,
        description="Carries every open release through every stage (eager, after blocking checks passed).",
    )
