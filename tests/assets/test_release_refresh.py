"""Two releases through the Dagster assets (``materialize``): the diff, carry-over and metadata."""

from datetime import UTC, datetime

import pytest
from dagster import (
    DagsterInstance,
    MultiPartitionKey,
    build_sensor_context,
    materialize,
)

from assets.acquisition import pmc_inventory, pmc_raw_articles
from assets.partitions import RELEASES
from assets.partitions import SHARDS as SHARDS_DIMENSION
from jobs.definitions import defs
from jobs.refresh import yearly_refresh_sensor
from pipelines.core.lake import Lake
from pipelines.core.rawstore import read_raw_file
from resources.lake import LakeResource
from resources.pmc_source import PmcSourceResource
from resources.quality import QualityResource
from testing.loopback.faults import FaultPlan
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror
from tests.helpers import N_SHARDS, SHARDS, files, manifest, open_test_release

CHANGED, REMOVED, RETRACTED, ADDED = "PMC3441633", "PMC3847091", "PMC6398430", "PMC900000009"


def _materialize_release(instance, release: str, url: str, home: str):
    resources = {
        "lake": LakeResource(home=home, shards=N_SHARDS),
        "quality": QualityResource(),
        "pmc_source": PmcSourceResource(url=url, rate_limit=500),
    }
    open_test_release(instance, release)
    inventory = materialize([pmc_inventory], partition_key=release, instance=instance, resources=resources)
    assert inventory.success
    shards = {}
    for shard in SHARDS:
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
    assert len(checks) == 2 * len(shards) and all(c.passed for c in checks)  # consistency, error rate


def _evaluate(sensor, instance):
    """The sensor's answer, as "Test sensor" in the UI computes it (the daemon test runs a real tick)."""
    with build_sensor_context(instance=instance, definitions=defs) as context:
        return sensor(context)


def test_yearly_sensor_opens_the_release_without_side_effects(two_releases):
    instance = two_releases["instance"]
    sensor = yearly_refresh_sensor(N_SHARDS, clock=lambda: datetime(2027, 1, 2, 2, 0, tzinfo=UTC))
    result = _evaluate(sensor, instance)
    assert [r.partition_key for r in result.run_requests] == ["2027"]
    assert [r.run_key for r in result.run_requests] == ["inventory-2027"]
    requests = {r.partitions_def_name: list(r.partition_keys) for r in result.dynamic_partitions_requests}
    assert requests == {RELEASES: ["2027"], SHARDS_DIMENSION: SHARDS}
    # evaluating (as "Test sensor" in the UI does) adds nothing: the daemon applies requests at tick time
    assert not instance.has_dynamic_partition(RELEASES, "2027")


def test_yearly_sensor_waits_for_the_day_and_never_reopens_a_release(two_releases):
    instance = two_releases["instance"]
    early = yearly_refresh_sensor(N_SHARDS, clock=lambda: datetime(2027, 1, 2, 1, 59, tzinfo=UTC))
    assert "no release is due" in _evaluate(early, instance).skip_message
    # release 2026 is open and complete: turning the sensor on in 2026 launches nothing
    later = yearly_refresh_sensor(N_SHARDS, clock=lambda: datetime(2026, 6, 1, tzinfo=UTC))
    assert "release 2026 is already open and listed" in _evaluate(later, instance).skip_message
