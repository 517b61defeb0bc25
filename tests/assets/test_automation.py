"""The automation conditions, evaluated as the daemon evaluates them (``evaluate_automation_conditions``)
on a simulated refresh: every requested partition is reported materialized with its checks, and the
conditions are evaluated again, until nothing more is requested. Fast; the daemon test
(``test_refresh_daemon.py``) runs the real thing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    DefaultSensorStatus,
    evaluate_automation_conditions,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluation,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.context import partition_loading_context

from assets.partitions import open_release
from jobs.automation import AUTOMATION_SENSOR, STARTED_BY_A_PERSON, STARTED_BY_THE_SENSOR, UPLOAD
from jobs.definitions import build_definitions, materialization_order, per_shard
from pipelines.concepts.stages import ANNOTATIONS_MATCH
from resources.settings import Settings

RELEASE = "2027"
SHARDS = ("000", "001")
# every asset automation carries (all but what the sensor or a person starts, and the upload),
# per shard or per release: the graph as Definitions has it, not listed again here
_AUTOMATED = [
    a
    for a in materialization_order(build_definitions(Settings(shards=len(SHARDS))))
    if a.key.path[-1] not in {STARTED_BY_THE_SENSOR, UPLOAD, *STARTED_BY_A_PERSON}
]
SHARD_LEVEL = {a.key.path[-1] for a in _AUTOMATED if per_shard(a)}
RELEASE_LEVEL = {a.key.path[-1] for a in _AUTOMATED if not per_shard(a)}


def _cache_partition_keys(instance: DagsterInstance) -> None:
    """Read each dynamic partitions definition's keys from the instance's storage once, until one
    is added or deleted. Dagster's evaluation reads them again for every subset it serializes into
    the cursor: some 800 queries a tick, over half of these tests' time, for keys that only
    ``open_release`` changes."""
    read, keys = instance.get_dynamic_partitions, {}

    def cached(partitions_def_name: str):
        if partitions_def_name not in keys:
            keys[partitions_def_name] = list(read(partitions_def_name))
        return list(keys[partitions_def_name])

    def forgetting(write):
        def forget_then_write(*args, **kwargs):
            keys.clear()
            return write(*args, **kwargs)

        return forget_then_write

    instance.get_dynamic_partitions = cached
    instance.add_dynamic_partitions = forgetting(instance.add_dynamic_partitions)
    instance.delete_dynamic_partition = forgetting(instance.delete_dynamic_partition)


class Refresh:
    """A release opened in an ephemeral instance, and the daemon's loop simulated tick by tick."""

    def __init__(self, publish: bool, failing: dict[tuple[str, str], str] | None = None):
        self.defs = build_definitions(Settings(shards=len(SHARDS), hf_repo="org/panelforge" if publish else None))
        self.graph = self.defs.resolve_asset_graph()
        self.instance = DagsterInstance.ephemeral()
        self.failing = failing or {}  # (asset, partition) -> the check that fails there
        self.cursor = None
        self.ticks: list[set[tuple[str, str]]] = []
        self.done: set[tuple[str, str]] = set()
        open_release(self.instance, RELEASE, len(SHARDS))
        _cache_partition_keys(self.instance)

    def evaluate(self) -> set[tuple[str, str]]:
        result = evaluate_automation_conditions(defs=self.defs, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        with partition_loading_context(datetime.now(UTC), self.instance):
            return {
                (r.key.to_user_string(), str(p))
                for r in result.results
                if isinstance(r.key, AssetKey)
                for p in r.true_subset.expensively_compute_partition_keys()
            }

    def materialize(self, asset: str, partition: str) -> None:
        key = AssetKey(asset)
        self.instance.report_runless_asset_event(AssetMaterialization(key, partition=partition))
        filter_ = AssetRecordsFilter(asset_key=key, asset_partitions=[partition])
        (record,) = self.instance.fetch_materializations(filter_, limit=1).records
        target = AssetCheckEvaluationTargetMaterializationData(
            storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
        )
        for check in self.graph.get(key).check_keys:
            spec = self.graph.get_check_spec(check)
            passed = self.failing.get((asset, partition)) != check.name
            self.instance.report_runless_asset_event(
                AssetCheckEvaluation(
                    asset_key=key,
                    check_name=check.name,
                    passed=passed,
                    partition=partition,
                    blocking=spec.blocking,
                    target_materialization_data=target,
                )
            )
        self.done.add((asset, partition))

    def run(self, max_ticks: int = 20) -> None:
        """Materialize the inventory by hand (as ``dg launch`` does), then tick until quiet."""
        self.evaluate()  # the sensor's first tick, before the release's inventory exists
        self.materialize(STARTED_BY_THE_SENSOR, RELEASE)
        for _ in range(max_ticks):
            requested = self.evaluate()
            assert not requested & self.done, f"requested again: {requested & self.done}"
            if not requested:
                return
            self.ticks.append(requested)
            for asset, partition in requested:
                self.materialize(asset, partition)
        raise AssertionError(f"still requesting after {max_ticks} ticks: {self.ticks[-1]}")

    def tick_of(self, asset: str, partition: str) -> int | None:
        return next((i for i, t in enumerate(self.ticks) if (asset, partition) in t), None)


def _every_partition(publish: bool) -> set[tuple[str, str]]:
    shard_keys = {f"{RELEASE}|{s}" for s in SHARDS}
    out = {(a, k) for a in SHARD_LEVEL for k in shard_keys} | {(a, RELEASE) for a in RELEASE_LEVEL}
    return out | ({(UPLOAD, RELEASE)} if publish else set())


def test_the_automation_sensor_is_on_by_default():
    sensor = build_definitions(Settings(shards=2)).resolve_sensor_def(AUTOMATION_SENSOR)
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    names = [s.name for s in build_definitions(Settings(shards=2)).get_repository_def().sensor_defs]
    assert "default_automation_condition_sensor" not in names  # ours covers every asset


@pytest.mark.parametrize("publish", [False, True])
def test_a_new_release_flows_through_every_stage(publish):
    refresh = Refresh(publish)
    refresh.run()
    assert refresh.done == _every_partition(publish) | {(STARTED_BY_THE_SENSOR, RELEASE)}
    # a release-level stage starts only after every shard of its parents is done
    for asset, parent in (
        ("image_duplicates", "parsed_articles"),
        ("concept_model", "figure_embeddings"),
        ("webdataset_shards", "dataset_samples"),
        ("release_parquet", "dataset_samples"),
        ("webdataset_pairs", "long_captions"),
    ):
        assert refresh.tick_of(asset, RELEASE) > max(refresh.tick_of(parent, f"{RELEASE}|{s}") for s in SHARDS)
    if publish:
        assert refresh.tick_of(UPLOAD, RELEASE) == len(refresh.ticks) - 1  # last, after the card


def test_a_failed_blocking_check_in_one_shard_holds_the_release_back():
    refresh = Refresh(publish=True, failing={("figure_embeddings", f"{RELEASE}|001"): "error_rate"})
    refresh.run()
    not_done = _every_partition(True) - refresh.done
    assert ("figure_concepts", f"{RELEASE}|001") in not_done
    assert {"concept_model", "dataset_card", UPLOAD} <= {a for a, p in not_done if p == RELEASE}
    # the other stages of the release go on
    assert ("pubmed_metadata", f"{RELEASE}|001") in refresh.done and ("image_duplicates", RELEASE) in refresh.done


def test_a_failed_check_before_the_card_never_publishes():
    refresh = Refresh(publish=True, failing={("pubmed_metadata", f"{RELEASE}|000"): "error_rate"})
    refresh.run()
    assert ("dataset_samples", f"{RELEASE}|000") not in refresh.done
    assert (UPLOAD, RELEASE) not in refresh.done and ("webdataset_shards", RELEASE) not in refresh.done


def test_a_stale_annotation_warning_does_not_stop_the_release():
    refresh = Refresh(publish=True, failing={("cluster_labels", RELEASE): ANNOTATIONS_MATCH})
    refresh.run()
    assert (UPLOAD, RELEASE) in refresh.done


def test_a_partition_newer_than_all_its_parents_is_never_requested_again():
    """``OlderThanAParent``, the last term of every automated asset's condition, on its own: true
    for a missing partition or one older than a parent partition, false once it is newer than all
    of them (what ``eager`` missed when a child finished during a tick: CI, 2026-11-26)."""
    from dagster import Definitions, StaticPartitionsDefinition, asset

    from jobs.automation import OlderThanAParent

    parts = StaticPartitionsDefinition(["a", "b"])

    @asset(partitions_def=parts)
    def up() -> None: ...

    @asset(partitions_def=parts, deps=[up], automation_condition=OlderThanAParent())
    def down() -> None: ...

    defs, instance, cursor = Definitions(assets=[up, down]), DagsterInstance.ephemeral(), None

    def report(key: str, partition: str) -> None:
        instance.report_runless_asset_event(AssetMaterialization(asset_key=key, partition=partition))

    def requested() -> set[str]:
        nonlocal cursor
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        cursor = result.cursor
        return {
            pk
            for r in result.results
            if r.key == AssetKey("down")
            for pk in r.true_subset.expensively_compute_partition_keys()
        }

    assert requested() == {"a", "b"}  # missing
    for partition in ("a", "b"):
        report("up", partition)
        report("down", partition)
    assert requested() == set()  # each newer than its parent
    report("up", "a")
    assert requested() == {"a"}  # its parent changed after it
    report("down", "a")
    assert requested() == set()
