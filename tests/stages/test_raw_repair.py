"""Repair of the raw layer and outages of the source, over the real loopback servers.

A rerun verifies what it trusts (tars present, member bytes as recorded) and fetches again only
the articles whose bytes are gone or damaged; tar names are never reused; an unreachable source
fails the run instead of recording articles as errors.
"""

import hashlib
import os
import socket
from collections import Counter

import pytest

from pipelines.acquire.download import acquire_shard
from pipelines.acquire.inventory import build_inventory
from pipelines.acquire.stages import raw_consistency
from pipelines.core import rawstore
from pipelines.core.partitioning import shard_of
from pipelines.core.rawstore import next_part_path, read_raw_file, verify_raw, write_part
from pipelines.net.retry import SourceUnavailableError
from testing.loopback.faults import Fault, FaultPlan
from testing.loopback.ftp_server import FtpLoopbackServer
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror, build_legacy_mirror, package_path, sample_rows
from tests.helpers import (  # FAST_RETRY: 4 attempts, ms delays
    FAST_RETRY,
    N_SHARDS,
    files,
    inventory_rows,
    manifest,
    run_release,
    source_for,
)

# By hand from sample/release.csv: 38 articles, hashed into shards 000: 4, 001: 12, 002: 13, 003: 9.
SHARD, SHARD_ARTICLES = "002", 13
PMCIDS = sorted(r["pmcid"] for r in sample_rows() if shard_of(r["pmcid"], N_SHARDS) == SHARD)
FIRST, REST = PMCIDS[:5], PMCIDS[5:]


@pytest.fixture
def mirror(tmp_path):
    """A private cloud mirror (some tests stop its server or break it)."""
    return build_cloud_mirror(tmp_path / "cloud")


def _inventory(source) -> list[dict]:
    return build_inventory(source, [], None, N_SHARDS).rows_by_shard[SHARD]


def _two_tars(lake, source) -> list[dict]:
    """Shard 002 of release 2026 in two runs: part-00000 holds FIRST, part-00001 holds REST."""
    rows = _inventory(source)
    assert [r["pmcid"] for r in rows] == PMCIDS and len(rows) == SHARD_ARTICLES
    first = acquire_shard(lake, source, "2026", SHARD, [r for r in rows if r["pmcid"] in FIRST])
    second = acquire_shard(lake, source, "2026", SHARD, rows)
    assert first.new_tar.endswith("part-00000.tar") and second.new_tar.endswith("part-00001.tar")
    found = files(lake, "2026")
    assert {f["tar_path"].rsplit("/", 1)[1] for p in FIRST for f in found[p].values()} == {"part-00000.tar"}
    assert {f["tar_path"].rsplit("/", 1)[1] for p in REST for f in found[p].values()} == {"part-00001.tar"}
    return rows


def _requested_articles(plan: FaultPlan, since: int) -> set[str]:
    """PMCIDs whose objects the S3 server was asked for after the first ``since`` requests."""
    return {path.split("/")[2].split(".")[0] for _, _, path in plan.log[since:] if path.count("/") >= 3}


def _assert_bytes_are_the_mirrors(lake, release: str, mirror) -> None:
    """Every raw_files row reads back the file the server holds, with the recorded digests."""
    rows = lake.read_release("raw_files", release).to_pylist()
    assert rows
    for row in rows:
        data = read_raw_file(lake, row)
        assert data == (mirror / f"{row['pmcid']}.{row['version']}" / row["name"]).read_bytes(), row
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
        assert hashlib.md5(data, usedforsecurity=False).hexdigest() == row["md5"]


def _consistent(lake, release: str) -> bool:
    m = lake.read_release("raw_manifest", release).to_pylist()
    f = lake.read_release("raw_files", release).to_pylist()
    assert verify_raw(lake, m, f).ok == raw_consistency(lake, m, f).passed
    return verify_raw(lake, m, f).ok


def test_deleted_tar_is_refetched_and_never_collides(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = _two_tars(lake, source)
        raw = lake.raw_dir("2026", SHARD)
        kept = open(f"{raw}/part-00001.tar", "rb").read()
        kept_stat = os.stat(f"{raw}/part-00001.tar")
        os.remove(f"{raw}/part-00000.tar")
        assert not _consistent(lake, "2026")
        m = lake.read_release("raw_manifest", "2026").to_pylist()
        f = lake.read_release("raw_files", "2026").to_pylist()
        found = verify_raw(lake, m, f)
        assert found.missing_tars == [f"raw/release=2026/shard={SHARD}/part-00000.tar"]
        assert found.bad_pmcids == set(FIRST)

        served = len(server.plan.log)
        result = acquire_shard(lake, source, "2026", SHARD, rows)
        assert _requested_articles(server.plan, served) == set(FIRST)
    assert result.counts["repaired"] == len(FIRST) and result.counts["fetched"] == len(FIRST)
    assert result.counts["already_done"] == len(REST)
    assert result.new_tar == f"raw/release=2026/shard={SHARD}/part-00002.tar"  # not part-00001 again
    assert open(f"{raw}/part-00001.tar", "rb").read() == kept
    assert os.stat(f"{raw}/part-00001.tar").st_mtime_ns == kept_stat.st_mtime_ns
    found = files(lake, "2026")
    assert {f["tar_path"].rsplit("/", 1)[1] for p in FIRST for f in found[p].values()} == {"part-00002.tar"}
    assert {f["tar_path"].rsplit("/", 1)[1] for p in REST for f in found[p].values()} == {"part-00001.tar"}
    assert {r["status"] for r in manifest(lake, "2026").values()} == {"ok"}
    _assert_bytes_are_the_mirrors(lake, "2026", mirror)
    assert _consistent(lake, "2026")


def test_part_names_skip_every_number_ever_used_and_never_overwrite(lake, mirror, tmp_path, monkeypatch):
    raw = lake.raw_dir("2026", SHARD)
    os.makedirs(raw)
    for n in (0, 3):
        open(f"{raw}/part-0000{n}.tar", "wb").write(b"x")
    open(f"{raw}/.part-00007.tar.abc.tmp", "wb").write(b"x")  # an abandoned temporary file
    assert next_part_path(lake, "2026", SHARD) == f"{raw}/part-00004.tar"
    os.remove(f"{raw}/part-00000.tar")
    assert next_part_path(lake, "2026", SHARD) == f"{raw}/part-00004.tar"  # not part-00001 (one file left)
    os.remove(f"{raw}/part-00003.tar")
    assert next_part_path(lake, "2026", SHARD) == f"{raw}/part-00000.tar"
    # a deleted part still named by rows of this partition is not handed out again
    referenced = [f"raw/release=2026/shard={SHARD}/part-00005.tar", "raw/release=2025/shard=002/part-00009.tar"]
    assert next_part_path(lake, "2026", SHARD, referenced) == f"{raw}/part-00006.tar"

    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        record = _inventory(source)[0]
        staged = source.fetch(record, tmp_path / "staging")
    # whatever the naming picks, an existing tar is never replaced: the old `part-{count}` rule
    # named the next tar part-00001 while part-00001 still held another article
    open(f"{raw}/part-00001.tar", "wb").write(b"another article")
    monkeypatch.setattr(rawstore, "next_part_path", lambda lake, release, shard, referenced=(): f"{raw}/part-00001.tar")
    with pytest.raises(FileExistsError, match="refusing to overwrite .*part-00001.tar"):
        write_part(lake, "2026", SHARD, [(record, staged)])
    assert open(f"{raw}/part-00001.tar", "rb").read() == b"another article"
    assert sorted(os.listdir(raw)) == [".part-00007.tar.abc.tmp", "part-00001.tar"]


def test_corrupt_member_is_reported_and_repaired(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = _two_tars(lake, source)
        victim = REST[2]
        row = max(files(lake, "2026")[victim].values(), key=lambda r: r["size"])
        with open(lake.path(row["tar_path"]), "r+b") as fh:  # flip three bytes inside the member
            fh.seek(row["offset"] + row["size"] // 2)
            middle = fh.read(3)
            fh.seek(row["offset"] + row["size"] // 2)
            fh.write(bytes(b ^ 0xFF for b in middle))
        m = lake.read_release("raw_manifest", "2026").to_pylist()
        f = lake.read_release("raw_files", "2026").to_pylist()
        found = verify_raw(lake, m, f)
        assert found.checksum_mismatches == [f"{row['tar_path']}:{victim}/{row['name']}"]
        assert found.missing_tars == [] and found.size_mismatches == [] and found.bad_pmcids == {victim}
        assert found.files_checked == len(f)
        check = raw_consistency(lake, m, f)
        assert not check.passed
        assert check.metadata["checksum_mismatches"] == [f"{row['tar_path']}:{victim}/{row['name']}"]
        # stat-level checks alone cannot see flipped bytes
        assert verify_raw(lake, m, f, checksums=False).ok

        served = len(server.plan.log)
        result = acquire_shard(lake, source, "2026", SHARD, rows)
        assert _requested_articles(server.plan, served) == {victim}
    assert result.counts["repaired"] == 1 and result.new_tar.endswith("part-00002.tar")
    _assert_bytes_are_the_mirrors(lake, "2026", mirror)
    assert _consistent(lake, "2026")


def test_truncated_tar_is_a_size_mismatch(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        _two_tars(lake, source)
    f = lake.read_release("raw_files", "2026").to_pylist()
    m = lake.read_release("raw_manifest", "2026").to_pylist()
    last = max((r for r in f if r["tar_path"].endswith("part-00001.tar")), key=lambda r: r["offset"])
    os.truncate(lake.path(last["tar_path"]), last["offset"] + 1)
    found = verify_raw(lake, m, f)
    assert found.size_mismatches == [f"{last['tar_path']}:{last['pmcid']}/{last['name']}"]
    assert found.bad_pmcids == {last["pmcid"]} and found.checksum_mismatches == []


def test_carried_articles_whose_tar_vanished_are_fetched_again(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        run_release(lake, source, "2026")
        inventory, results = run_release(lake, source, "2027")
        assert inventory.counts["change_unchanged"] == 38
        assert all(r.counts["new_tar"] == "none (nothing fetched)" for r in results.values())
        assert {r["status"] for r in manifest(lake, "2027").values()} == {"carried"}
        for name in os.listdir(lake.raw_dir("2026", SHARD)):
            os.remove(os.path.join(lake.raw_dir("2026", SHARD), name))
        assert not _consistent(lake, "2027")
        served = len(server.plan.log)
        result = acquire_shard(lake, source, "2027", SHARD, inventory_rows(lake, "2027")[SHARD])
        assert _requested_articles(server.plan, served) == set(PMCIDS)
    assert result.counts["repaired"] == SHARD_ARTICLES and result.new_tar.endswith(
        "release=2027/shard=002/part-00000.tar"
    )
    rows = manifest(lake, "2027")
    assert Counter(r["status"] for r in rows.values()) == {"ok": SHARD_ARTICLES, "carried": 38 - SHARD_ARTICLES}
    assert {rows[p]["fetched_in_release"] for p in PMCIDS} == {"2027"}
    _assert_bytes_are_the_mirrors(lake, "2027", mirror)
    assert _consistent(lake, "2027")


# ---- outages ----------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_http_source_raises_and_records_nothing(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = _inventory(source)
    url = f"http://127.0.0.1:{_closed_port()}/pmc-oa-opendata"
    with source_for(url) as source:
        with pytest.raises(SourceUnavailableError, match=f"gave up after {FAST_RETRY.attempts} attempts") as exc:
            build_inventory(source, [], None, N_SHARDS)
        assert exc.value.host.startswith("127.0.0.1:") and "ConnectionError" in exc.value.cause
        with pytest.raises(SourceUnavailableError) as exc:
            acquire_shard(lake, source, "2026", SHARD, rows)
        assert "ConnectionError" in exc.value.cause
    assert lake.read_table("raw_manifest", "2026", SHARD) is None
    assert lake.read_table("raw_files", "2026", SHARD) is None
    assert not os.path.exists(lake.raw_dir("2026", SHARD))


def test_stopped_ftp_server_raises_and_records_nothing(lake, legacy_mirror):
    server = FtpLoopbackServer(legacy_mirror).start()
    with source_for(server.url) as source:
        rows = build_inventory(source, [], None, N_SHARDS).rows_by_shard[SHARD]
        source.transport.close()  # no pooled connection survives the outage
        server.stop()
        with pytest.raises(SourceUnavailableError, match="cannot connect to ftp://127.0.0.1"):
            acquire_shard(lake, source, "2026", SHARD, rows)
        with pytest.raises(SourceUnavailableError):
            build_inventory(source, [], None, N_SHARDS)
    assert lake.read_table("raw_manifest", "2026", SHARD) is None


def test_missing_local_source_directory_raises(tmp_path):
    with source_for((tmp_path / "not-mounted").as_uri()) as source:
        with pytest.raises(SourceUnavailableError, match="does not exist"):
            build_inventory(source, [], None, N_SHARDS)


def test_5xx_on_every_request_raises_after_retries(lake, mirror):
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = _inventory(source)
        server.plan.faults.append(Fault(".*", status=503, times=10**6))
        with pytest.raises(SourceUnavailableError, match="HTTP 503") as exc:
            acquire_shard(lake, source, "2026", SHARD, rows)
        assert exc.value.host == server.url.split("/")[2]
        with pytest.raises(SourceUnavailableError, match="HTTP 503"):
            build_inventory(source, [], None, N_SHARDS)
    assert lake.read_table("raw_manifest", "2026", SHARD) is None


def test_outage_mid_run_keeps_what_was_staged(lake, mirror):
    """Articles fetched before the outage stay staged: the rerun asks only for the others."""
    down = PMCIDS[4]
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = _inventory(source)
        server.plan.faults.append(Fault(f"/{down}\\.", status=502, times=10**6))
        served = len(server.plan.log)
        with pytest.raises(SourceUnavailableError, match="HTTP 502"):
            acquire_shard(lake, source, "2026", SHARD, rows, concurrency=1)
        assert _requested_articles(server.plan, served) == set(PMCIDS[:5])
        assert lake.read_table("raw_manifest", "2026", SHARD) is None
        server.plan.faults.clear()  # the service is back
        served = len(server.plan.log)
        result = acquire_shard(lake, source, "2026", SHARD, rows, concurrency=1)
        assert _requested_articles(server.plan, served) == set(PMCIDS[4:])
    assert result.counts["fetched"] == SHARD_ARTICLES
    assert {r["status"] for r in manifest(lake, "2026").values()} == {"ok"}
    _assert_bytes_are_the_mirrors(lake, "2026", mirror)


def test_one_missing_article_is_its_error_and_the_run_succeeds(lake, mirror):
    gone = PMCIDS[3]
    (mirror / f"{gone}.1" / f"{gone}.1.xml").unlink()
    with S3LoopbackServer(mirror) as server, source_for(server.url) as source:
        result = acquire_shard(lake, source, "2026", SHARD, _inventory(source))
    rows = manifest(lake, "2026")
    assert {p for p, r in rows.items() if r["status"] == "error"} == {gone}
    assert "HTTP 404" in rows[gone]["error"] and result.counts["fetched"] == SHARD_ARTICLES - 1
    assert _consistent(lake, "2026")


def test_ftp_550_is_the_articles_error(lake, tmp_path):
    gone = PMCIDS[0]
    mirror = build_legacy_mirror(tmp_path / "legacy")
    (mirror / package_path(gone)).unlink()
    with FtpLoopbackServer(mirror) as server, source_for(server.url) as source:
        rows = build_inventory(source, [], None, N_SHARDS).rows_by_shard[SHARD]
        acquire_shard(lake, source, "2026", SHARD, rows)
    found = manifest(lake, "2026")
    assert {p for p, r in found.items() if r["status"] == "error"} == {gone}
    assert "not found on server" in found[gone]["error"]
