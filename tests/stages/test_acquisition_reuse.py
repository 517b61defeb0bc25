"""Acquisition under the one reuse rule, over the real S3 loopback server: a stored article is
reused by the key of the listing it was fetched for (``raw_manifest.fingerprint``), from the
previous release or this partition; a lake written before the key was stored refreshes without
fetching anything again."""

from collections import Counter

from pipelines.acquire.stages import AcquireStage, InventoryStage
from pipelines.core.stage import Partition
from testing.loopback.faults import FaultPlan
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror
from tests.helpers import N_SHARDS, SHARDS, files, manifest, source_for
from tests.stages.test_raw_repair import _requested_articles

ARTICLES = 38  # by hand from sample/release.csv
VERSION_BUMPED, UPDATED = "PMC3441633", "PMC900000013"


def _acquire(lake, url: str, release: str, plan: FaultPlan) -> tuple[dict, set[str]]:
    """The inventory, then every shard; returns the shards' results and the articles whose objects
    acquisition (not the inventory) asked the server for."""
    with source_for(url) as source:
        InventoryStage(source, N_SHARDS).run(lake, Partition(release))
        served = len(plan.log)
        results = {s: AcquireStage(source).run(lake, Partition(release, s)) for s in SHARDS}
    return results, _requested_articles(plan, served)


def _strip_keys(lake, release: str) -> None:
    """Make the release's raw tables look written before ``raw_manifest.fingerprint`` existed."""
    for shard in SHARDS:
        rows = lake.read_table("raw_manifest", release, shard).to_pylist()
        raw = lake.read_table("raw_files", release, shard).to_pylist()
        with lake.commit("pmc_raw_articles", release, shard) as commit:
            commit.write_table("raw_files", raw)
            commit.write_table("raw_manifest", [{**r, "fingerprint": None} for r in rows])


def _changed(sample: list[dict]) -> list[dict]:
    """The sample with VERSION_BUMPED at version 2 and UPDATED updated at the same version."""
    edits = {
        VERSION_BUMPED: {"version": "2", "last_updated": "2027-03-01 00:00:00"},
        UPDATED: {"last_updated": "2027-03-02 00:00:00"},
    }
    return [{**row, **edits.get(row["pmcid"], {})} for row in sample]


def test_a_refresh_fetches_only_the_articles_whose_listing_changed(lake, sample, tmp_path):
    plan = FaultPlan()
    with S3LoopbackServer(build_cloud_mirror(tmp_path / "m2026", rows=sample), plan=plan) as server:
        first, requested = _acquire(lake, server.url, "2026", plan)
        assert len(requested) == ARTICLES
        keys_2026 = {p: r["fingerprint"] for p, r in manifest(lake, "2026").items()}
        assert all(keys_2026.values()) and len(set(keys_2026.values())) == ARTICLES
        rerun, requested = _acquire(lake, server.url, "2026", plan)  # this partition's own rows
        assert requested == set()
        assert sum(r.counts.get("already_done", 0) for r in rerun.values()) == ARTICLES
        assert sum(r.carried for r in rerun.values()) == ARTICLES  # stored before: tried items of the error rate
        assert all(rerun[s].version == first[s].version is not None for s in SHARDS)  # the same tables
    plan = FaultPlan()
    with S3LoopbackServer(build_cloud_mirror(tmp_path / "m2027", rows=_changed(sample)), plan=plan) as server:
        second, requested = _acquire(lake, server.url, "2027", plan)
    assert requested == {VERSION_BUMPED, UPDATED}  # a new last update at the same version is a change
    rows = manifest(lake, "2027")
    assert Counter(r["status"] for r in rows.values()) == {"ok": 2, "carried": ARTICLES - 2}
    for pmcid, row in rows.items():
        if pmcid in (VERSION_BUMPED, UPDATED):
            assert row["fetched_in_release"] == "2027" and row["fingerprint"] != keys_2026[pmcid]
        else:
            assert row["fetched_in_release"] == "2026" and row["fingerprint"] == keys_2026[pmcid]
    stored = files(lake, "2027")
    for pmcid, found in stored.items():
        release = "2027" if pmcid in (VERSION_BUMPED, UPDATED) else "2026"
        assert {f["tar_path"].split("/")[1] for f in found.values()} == {f"release={release}"}, pmcid


def test_a_lake_written_before_the_key_refreshes_without_fetching_again(lake, sample, tmp_path):
    plan = FaultPlan()
    with S3LoopbackServer(build_cloud_mirror(tmp_path / "m2026", rows=sample), plan=plan) as server:
        _acquire(lake, server.url, "2026", plan)
        _strip_keys(lake, "2026")
    before = files(lake, "2026")
    plan = FaultPlan()
    with S3LoopbackServer(build_cloud_mirror(tmp_path / "m2027", rows=_changed(sample)), plan=plan) as server:
        _, requested = _acquire(lake, server.url, "2027", plan)
        # the previous release's rows take their key from the 2026 listing: only the changed two are fetched
        assert requested == {VERSION_BUMPED, UPDATED}
        rows = manifest(lake, "2027")
        assert Counter(r["status"] for r in rows.values()) == {"ok": 2, "carried": ARTICLES - 2}
        assert all(r["fingerprint"] for r in rows.values())  # stored from now on
        after = files(lake, "2027")
        assert all(after[p] == before[p] for p in rows if p not in (VERSION_BUMPED, UPDATED))
        # this partition's own rows without a key: from this release's listing, nothing fetched
        _strip_keys(lake, "2027")
        rerun, requested = _acquire(lake, server.url, "2027", plan)
    assert requested == set()
    assert sum(r.counts.get("already_done", 0) for r in rerun.values()) == ARTICLES
    assert manifest(lake, "2027") == rows and files(lake, "2027") == after
