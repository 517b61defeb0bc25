"""Two releases through the Dagster assets (``materialize``): the diff, carry-over and metadata."""

from datetime import UTC, datetime

import pytest
from dagster import (
    DagsterInstance,
    MultiPartitionKey,
    build_schedule_context,
    build_sensor_context,
    materialize,
    partition_loading_context,
)

from assets.acquisition import pmc_inventory, pmc_raw_articles
from jobs.definitions import defs
from jobs.partitions import RELEASES, shard_partitions
from jobs.refresh import release_shards_sensor, yearly_pmc_refresh
from pipelines.acquire.rawstore import read_raw_file
from pipelines.lake import Lake
from resources.lake import LakeResource
from resources.pmc_source import PmcSourceResource
from testing.loopback.faults import FaultPlan
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror
from tests.helpers import files, manifest

CHANGED, REMOVED, RETRACTED, ADDED = "PMC3441633", "PMC3847091", "PMC6398430", "PMC900000009"


def _materialize_release(instance, release: str, url: str, home: str):
    resources = {"lake": LakeResource(home=home), "pmc_source": PmcSourceResource(url=url, rate_limit=500)}
    if not instance.has_dynamic_partition(RELEASES, release):
        instance.add_dynamic_partitions(RELEASES, [release])
    inventory = materialize([pmc_inventory], partition_key=release, instance=instance, resources=resources)
    assert inventory.success
    shards = {}
    for shard in shard_partitions.get_partition_keys():
        key = MultiPartitionKey({"release": release, "shard": shard})
        result = materialize([pmc_raw_articles], partition_key=key, instance=instance, resources=resources)
        assert result.success
        shards[shard] = result
    return inventory, shards


def _metadata(result, key: str):
    (event,) = result.get_asset_materialization_events()
    return event.materialization.metadata[key].value


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory, rows):
    """Release 2025: the sample without ADDED. Release 2026: CHANGED at version 2, REMOVED gone,
    RETRACTED retracted, ADDED new; everything else unchanged."""
    tmp = tmp_path_factory.mktemp("refresh")
    home = str(tmp / "lake")
    old = [dict(r) for r in rows if r["pmcid"] != ADDED]
    new = []
    for row in rows:
        row = dict(row)
        if row["pmcid"] == REMOVED:
            continue
        if row["pmcid"] == CHANGED:
            row["version"], row["last_updated"] = "2", "2026-06-01 00:00:00"
        if row["pmcid"] == RETRACTED:
            row["retracted"] = "yes"
        new.append(row)
    (tmp / "dagster_home").mkdir()
    instance = DagsterInstance.local_temp(str(tmp / "dagster_home"))
    with S3LoopbackServer(build_cloud_mirror(tmp / "m2025", rows=old)) as server:
        first = _materialize_release(instance, "2025", server.url, home)
    plan = FaultPlan()
    with S3LoopbackServer(build_cloud_mirror(tmp / "m2026", rows=new), plan=plan) as server:
        second = _materialize_release(instance, "2026", server.url, home)
    return {"lake": Lake(home), "first": first, "second": second, "plan": plan, "rows": rows, "instance": instance}


def test_inventory_diff_is_reported(two_releases):
    inventory, _ = two_releases["second"]
    n = len(two_releases["rows"])
    assert _metadata(inventory, "previous_release") == "2025"
    assert _metadata(inventory, "change_added") == 1
    assert _metadata(inventory, "change_changed") == 1
    assert _metadata(inventory, "change_retracted") == 1
    assert _metadata(inventory, "change_removed") == 1
    assert _metadata(inventory, "change_unchanged") == n - 4
    changes = {r["pmcid"]: r for r in two_releases["lake"].read_release("release_changes", "2026").to_pylist()}
    assert {p: c["change"] for p, c in changes.items()} == {
        ADDED: "added",
        CHANGED: "changed",
        RETRACTED: "retracted",
        REMOVED: "removed",
    }
    assert (changes[CHANGED]["previous_version"], changes[CHANGED]["version"]) == (1, 2)
    assert changes[REMOVED]["reason"] == "no longer listed in the OA subset"


def test_only_new_and_changed_articles_are_fetched(two_releases):
    plan = two_releases["plan"]
    fetched_prefixes = {p.split("/")[2] for _, m, p in plan.log if m.startswith("GET") and p.count("/") >= 3}
    # article files were requested only under the new and the changed article's prefixes;
    # metadata JSON was read for those two and for the retraction
    assert fetched_prefixes == {f"{ADDED}.1", f"{CHANGED}.2", f"{RETRACTED}.1"}
    json_reads = [p for _, _, p in plan.log if p.endswith(".json")]
    assert sorted(json_reads) == sorted(
        f"/pmc-oa-opendata/{p}/{p}.json" for p in (f"{ADDED}.1", f"{CHANGED}.2", f"{RETRACTED}.1")
    )


def test_carried_articles_point_at_the_previous_release(two_releases):
    lake = two_releases["lake"]
    rows = manifest(lake, "2026")
    assert RETRACTED not in rows and REMOVED not in rows
    assert rows[ADDED]["status"] == "ok" and rows[CHANGED]["status"] == "ok"
    assert (rows[CHANGED]["version"], rows[CHANGED]["fetched_in_release"]) == (2, "2026")
    carried = {p: r for p, r in rows.items() if r["status"] == "carried"}
    assert len(carried) == len(two_releases["rows"]) - 4
    assert {r["fetched_in_release"] for r in carried.values()} == {"2025"}
    old_files, new_files = files(lake, "2025"), files(lake, "2026")
    for pmcid in carried:
        assert new_files[pmcid] == old_files[pmcid]
        for row in new_files[pmcid].values():
            assert row["tar_path"].startswith("raw/release=2025/")
            assert len(read_raw_file(lake, row)) == row["size"]


def test_download_metadata_counts_requests(two_releases):
    _, shards = two_releases["second"]
    total = sum(_metadata(r, "source_requests") for r in shards.values())
    plan_gets = sum(
        1
        for _, m, p in two_releases["plan"].log
        if m.startswith("GET") and not p.endswith(".json") and "list-type" not in p
    )
    assert total == plan_gets > 0
    checks = [e for r in shards.values() for e in r.get_asset_check_evaluations()]
    assert len(checks) == len(shards) and all(c.passed for c in checks)


def test_yearly_schedule_opens_the_release(two_releases):
    instance = two_releases["instance"]
    context = build_schedule_context(instance=instance, scheduled_execution_time=datetime(2027, 1, 2, 2, 0, tzinfo=UTC))
    request = yearly_pmc_refresh(context)
    assert request.partition_key == "2027"
    assert instance.has_dynamic_partition(RELEASES, "2027")


def test_sensor_requests_every_shard_of_a_new_inventory(two_releases):
    instance = two_releases["instance"]
    context = build_sensor_context(instance=instance, definitions=defs)
    with partition_loading_context(dynamic_partitions_store=instance):  # as the sensor daemon does
        requests = release_shards_sensor.evaluate_tick(context).run_requests
    # the latest inventory materialization is release 2026: one download run per shard
    assert sorted(str(r.partition_key) for r in requests) == [
        f"2026|{s}" for s in shard_partitions.get_partition_keys()
    ]
