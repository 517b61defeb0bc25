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
    AutomationContext,
    AutomationResult,
    DagsterEventType,
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


class OlderThanAParent(AutomationCondition):
    """True for a partition that is missing or whose latest materialization is older than the
    latest of one of its parent partitions: never materialize again what is already newer than
    everything it was built from.

    ``eager`` alone re-ran a finished partition (CI, 2026-11-26: ``pairs`` of one shard, mined a
    second time seconds after its run wrote it). Two Dagster behaviours meet there. A parent
    updated by the very run that also materializes the child is ignored only when the parent's
    latest materialization, over all its partitions, is of that partition (the other shard's run
    had just written its own), so the child's "parent updated" memory was set while it was in
    progress. That memory is cleared when the child's materialization is seen, which a tick counts
    only up to the event id it read when it began, while "in progress" is read live: a child that
    finished during the tick's evaluation looked neither in progress nor updated, and was requested.
    Read live here too, the finished child is newer than its parent and is not requested.
    """

    @property
    def name(self) -> str:
        return "older_than_a_parent"

    def evaluate(self, context: AutomationContext) -> AutomationResult:
        candidates = context.candidate_subset
        if not candidates.is_partitioned:  # every automated asset is partitioned; eager decides alone otherwise
            return AutomationResult(context, true_subset=candidates)
        storage = context.asset_graph_view.instance.event_log_storage
        keys = set(candidates.expensively_compute_partition_keys())
        own = storage.get_latest_storage_id_by_partition(context.key, DagsterEventType.ASSET_MATERIALIZATION, keys)
        stale = {key for key in keys if key not in own or _newest_parent(context, storage, key) > own[key]}
        return AutomationResult(context, true_subset=candidates.compute_intersection_with_partition_keys(stale))


def _newest_parent(context: AutomationContext, storage, partition: str) -> int:
    """The largest storage id among the latest materializations of ``partition``'s parent partitions."""
    view = context.asset_graph_view
    subset = context.candidate_subset.compute_intersection_with_partition_keys({partition})
    newest = -1
    for parent in view.asset_graph.get(context.key).parent_keys:
        parent_subset = subset.compute_parent_subset(parent)
        if parent_subset.is_empty:
            continue
        keys = set(parent_subset.expensively_compute_partition_keys()) if parent_subset.is_partitioned else None
        latest = storage.get_latest_storage_id_by_partition(parent, DagsterEventType.ASSET_MATERIALIZATION, keys)
        newest = max([newest, *latest.values()])
    return newest


def release_condition() -> AutomationCondition:
    """Materialize when the parents are all there, up to date and not in progress, no partition
    of any parent failed a blocking check, and the partition is older than one of its parents
    (:class:`OlderThanAParent`, checked last: only for what the rest would request)."""
    return AutomationCondition.eager() & no_dep_partition_failed_a_blocking_check() & OlderThanAParent()


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
        # evaluated in the code server, as a custom condition (OlderThanAParent) must be: the
        # daemon evaluates only Dagster's own conditions (at most 500 assets and checks this way)
        use_user_code_server=True,
        description="Carries every open release through every stage (eager, after blocking checks passed).",
    )
