"""Acquisition over the real loopback servers: both sources, reruns, and every bad input."""

import hashlib
import io
import json
import os
import tarfile

import pytest

from pipelines.acquire.stages import AcquireStage
from pipelines.core.partitioning import shard_of
from pipelines.core.rawstore import read_raw_file
from pipelines.core.stage import Partition
from testing.loopback.faults import Fault, FaultPlan
from testing.loopback.ftp_server import FtpLoopbackServer
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import (
    DELETE,
    build_cloud_mirror,
    build_legacy_mirror,
    package_path,
)
from testing.loopback.sample_mirror import (
    SAMPLE_DIR as SAMPLE,
)
from tests.helpers import N_SHARDS, files, inventory_rows, manifest, run_release, source_for

# By hand from `ls sample/articles/*`: 17 articles with 157 image files; 21 nXML-only articles.
ARTICLES, IMAGES = 38, 157
ELIFE_46472, PONE_0056489, BIORXIV_469032 = "PMC900000009", "PMC900000013", "PMC900000002"


def _images(found: dict[str, dict]) -> dict[str, str]:
    return {name: row["md5"] for name, row in found.items() if row["kind"] == "image"}


def _check_sample_release(lake):
    rows = manifest(lake, "2026")
    assert len(rows) == ARTICLES and {r["status"] for r in rows.values()} == {"ok"}
    found = files(lake, "2026")
    assert sum(len(_images(f)) for f in found.values()) == IMAGES
    assert all(sum(r["kind"] == "xml" for r in f.values()) == 1 for f in found.values())
    assert sorted(_images(found[ELIFE_46472])) == [f"fig{i}.jpg" for i in range(1, 9)]
    assert sorted(_images(found[PONE_0056489])) == sorted(
        [f"pone.0056489.g00{i}.tif" for i in (1, 2, 3)]
        + [f"pone.0056489.{k}00{i}.PNG_M" for k in "gt" for i in (1, 2, 3)]
    )
    assert rows[PONE_0056489]["dropped"] == ["MANIFEST.xml"]
    assert len(_images(found[BIORXIV_469032])) == 14  # extension-less JPEGs, recognised by magic bytes
    assert _images(found["PMC7302504"]) == {}
    return found


def test_cloud_source_over_s3_server(lake, s3_server, cloud_mirror):
    with source_for(s3_server.url) as source:
        inventory, _ = run_release(lake, source, "2026")
    assert inventory.counts["change_added"] == ARTICLES and inventory.errors == []
    found = _check_sample_release(lake)
    # every byte in the raw tars is the byte the server holds
    fig = found[ELIFE_46472]["fig3.jpg"]
    data = read_raw_file(lake, fig)
    assert data == (cloud_mirror / f"{ELIFE_46472}.1" / "fig3.jpg").read_bytes()
    assert hashlib.sha256(data).hexdigest() == fig["sha256"]
    meta = json.loads((cloud_mirror / "PMC7302504.1" / "PMC7302504.1.json").read_text())
    assert found["PMC7302504"]["PMC7302504.1.xml"]["md5"] == meta["md5"]["PMC7302504.1.xml"]


def test_ftp_source_gives_the_same_files(lake, ftp_server, tmp_path):
    with source_for(ftp_server.url) as source:
        inventory, results = run_release(lake, source, "2026")
        ftp_requests = source.requests
    assert inventory.counts["change_added"] == ARTICLES
    found = _check_sample_release(lake)
    # RETR: the file list and one package per article; one SIZE per package;
    # logins: the listing thread + at most one per worker thread (4) of each shard
    assert ftp_server.plan.count("RETR") == ARTICLES + 1
    assert ftp_server.plan.count("SIZE") == ARTICLES and ftp_server.plan.count("LIST") == 0
    assert ftp_requests <= 2 * ARTICLES + 1 + 1 + 4 * N_SHARDS
    # the same articles through the cloud layout give identical images, byte for byte
    other = type(lake)(tmp_path / "cloud-lake")
    with S3LoopbackServer(build_cloud_mirror(tmp_path / "cloud")) as s3, source_for(s3.url) as source:
        run_release(other, source, "2026")
    cloud_found = files(other, "2026")
    assert {p: _images(f) for p, f in found.items()} == {p: _images(f) for p, f in cloud_found.items()}


def test_ftp_clients_changing_folders_at_once_leave_the_process_where_it_was(ftp_server, legacy_mirror):
    """Eight clients CWD at once, 25 times each, into folders of the mirror and into one that is not
    there. pyftpdlib's own CWD changes the process's working directory and back, so threads racing
    left the process in a mirror folder (which pytest later removed: every getcwd() after failed)."""
    import ftplib
    from concurrent.futures import ThreadPoolExecutor

    folders = sorted(p.name for p in legacy_mirror.iterdir() if p.is_dir())
    assert folders
    host, port = ftp_server._server.address[:2]

    def client(i: int) -> list[str]:
        replies = []
        with ftplib.FTP() as ftp:
            ftp.connect(host, port, timeout=30)
            ftp.login()
            for j in range(25):
                replies.append(ftp.cwd(f"/{folders[(i + j) % len(folders)]}")[:3])
                try:
                    ftp.cwd("/no-such-folder")
                except ftplib.error_perm as exc:
                    replies.append(str(exc)[:3])
        return replies

    before = os.getcwd()
    with ThreadPoolExecutor(8) as pool:
        replies = [r for rs in pool.map(client, range(8)) for r in rs]
    assert os.getcwd() == before
    assert replies.count("250") == replies.count("550") == 8 * 25


def test_rerun_of_complete_partitions_makes_no_request_and_changes_nothing(lake, s3_server):
    with source_for(s3_server.url) as source:
        inventory, _ = run_release(lake, source, "2026")
        before = {s: _stored(lake, s) for s in inventory_rows(lake, "2026")}
        served = s3_server.plan.count()
        for shard, rows in inventory_rows(lake, "2026").items():
            result = AcquireStage(source).run(lake, Partition("2026", shard))
            assert result.counts["source_requests"] == 0 and result.counts["new_tar"] == "none (nothing fetched)"
            assert result.counts["already_done"] == len(rows) == result.skipped
    assert s3_server.plan.count() == served
    after = {s: _stored(lake, s) for s in inventory_rows(lake, "2026")}
    assert after == before


def _stored(lake, shard: str) -> tuple:
    """What a partition's raw tables hold: their rows and the bytes of their data pages (the
    footer names the commit that wrote the file, so a rewrite of the same rows differs there only)."""
    return tuple(
        (lake.read_table(t, "2026", shard).to_pylist(), lake.data_digest(t, "2026", shard))
        for t in ("raw_manifest", "raw_files")
    )


def test_ftp_bad_inputs_are_recorded_and_the_rest_completes(lake, sample, tmp_path):
    """404, corrupt package, path traversal, 421 answers and a dropped transfer, in one release."""
    missing, corrupt, evil, busy, dropped = "PMC534114", "PMC1240052", "PMC1702562", "PMC2329613", ELIFE_46472
    mirror = build_legacy_mirror(tmp_path / "legacy", rows=sample)
    (mirror / package_path(missing)).unlink()
    good = (mirror / package_path(corrupt)).read_bytes()
    (mirror / package_path(corrupt)).write_bytes(good[: len(good) // 3])
    with tarfile.open(mirror / package_path(evil), "w:gz") as tar:
        info = tarfile.TarInfo(f"{evil}/../../../../tmp/owned.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    plan = FaultPlan(
        faults=[
            Fault(package_path(busy), status=421, times=2),
            Fault(package_path(dropped), kind="drop", times=1, fraction=0.4),
        ]
    )
    with FtpLoopbackServer(mirror, plan=plan) as server, source_for(server.url) as source:
        run_release(lake, source, "2026")
        rows = manifest(lake, "2026")
        errors = {p: r["error"] for p, r in rows.items() if r["status"] == "error"}
        assert set(errors) == {missing, corrupt, evil}
        assert "not found on server" in errors[missing]
        assert "corrupt or truncated package" in errors[corrupt]
        assert "path traversal in package" in errors[evil]
        assert rows[busy]["status"] == "ok" and rows[dropped]["status"] == "ok"
        # the dropped transfer was resumed, not restarted, and is byte-identical to the mirror
        retrs = [p for _, m, p in plan.log if m == "RETR" and p.endswith(f"{dropped}.tar.gz")]
        assert len(retrs) == 2
        found = files(lake, "2026")
        assert (
            read_raw_file(lake, found[dropped]["fig8.jpg"]) == (SAMPLE / "articles/elife-46472/fig8.jpg").read_bytes()
        )
        assert not list(tmp_path.rglob("owned.jpg")) and not os.path.exists("/tmp/owned.jpg")
        assert sum(r["status"] == "ok" for r in rows.values()) == ARTICLES - 3

        # fix the server, rerun: only the three failed articles are requested again
        build_legacy_mirror(tmp_path / "legacy", rows=sample)  # restores the three packages
        before = plan.count("RETR")
        run_release(lake, source, "2026")
        assert plan.count("RETR") - before == 1 + 3  # the file list + the three packages
    rows = manifest(lake, "2026")
    assert len(rows) == ARTICLES and {r["status"] for r in rows.values()} == {"ok"}
    # after the repair the release equals a clean run's, article for article and byte for byte
    clean = type(lake)(tmp_path / "clean")
    with FtpLoopbackServer(build_legacy_mirror(tmp_path / "pristine", rows=sample)) as server:
        with source_for(server.url) as source:
            run_release(clean, source, "2026")
    assert rows == manifest(clean, "2026")
    content = ("pmcid", "version", "name", "kind", "size", "md5", "sha256")
    assert {p: {n: tuple(f[k] for k in content) for n, f in fs.items()} for p, fs in files(lake, "2026").items()} == {
        p: {n: tuple(f[k] for k in content) for n, f in fs.items()} for p, fs in files(clean, "2026").items()
    }


def test_cloud_bad_inputs_are_recorded_and_the_rest_completes(lake, sample, tmp_path):
    no_xml_url, bad_md5, gone, throttled, flaky, dropped = (
        "PMC534114",
        "PMC1240052",
        "PMC1702562",
        "PMC2329613",
        "PMC3166277",
        ELIFE_46472,
    )
    for row in sample:
        if row["pmcid"] == "PMC3261204":
            row["license"] = "Publisher's own terms"
        if row["pmcid"] == "PMC3441633":
            row["pmid"] = ""
    mirror = build_cloud_mirror(
        tmp_path / "cloud",
        rows=sample,
        metadata_overrides={no_xml_url: {"xml_url": DELETE}, bad_md5: {"md5": {f"{bad_md5}.1.xml": "0" * 32}}},
    )
    (mirror / f"{gone}.1" / f"{gone}.1.xml").unlink()
    plan = FaultPlan(
        faults=[
            Fault(f"{throttled}.1/{throttled}.1.xml", status=429, retry_after=0, times=2),
            Fault(f"{flaky}.1/{flaky}.1.xml", status=503, times=1),
            Fault(f"{dropped}.1/fig8.jpg", kind="drop", times=1, fraction=0.5),
        ]
    )
    with S3LoopbackServer(mirror, plan=plan) as server, source_for(server.url) as source:
        inventory, _ = run_release(lake, source, "2026")
    rows = manifest(lake, "2026")
    errors = {p: r["error"] for p, r in rows.items() if r["status"] == "error"}
    assert set(errors) == {no_xml_url, bad_md5, gone}
    assert errors[no_xml_url] == "metadata JSON missing field 'xml_url'"
    assert "md5 mismatch" in errors[bad_md5]
    assert "HTTP 404" in errors[gone]
    assert {rows[p]["status"] for p in (throttled, flaky, dropped)} == {"ok"}
    ranged = [p for _, m, p in plan.log if m == "GET-RANGE" and p.endswith("fig8.jpg")]
    assert len(ranged) == 1  # the dropped transfer resumed with a Range request
    found = files(lake, "2026")
    assert read_raw_file(lake, found[dropped]["fig8.jpg"]) == (mirror / f"{dropped}.1" / "fig8.jpg").read_bytes()
    inv = {r["pmcid"]: r for rows_ in inventory_rows(lake, "2026").values() for r in rows_}
    assert inv["PMC3261204"]["license_group"] == "other" and "unknown license string" in inv["PMC3261204"]["warning"]
    assert rows["PMC3261204"]["status"] == "ok"
    assert inv["PMC3441633"]["pmid"] is None and rows["PMC3441633"]["status"] == "ok"
    assert sum(r["status"] == "ok" for r in rows.values()) == ARTICLES - 3


@pytest.mark.parametrize("layout", ["cloud", "legacy"])
def test_local_file_sources(lake, tmp_path, layout):
    builder = build_cloud_mirror if layout == "cloud" else build_legacy_mirror
    mirror = builder(tmp_path / layout)
    with source_for(mirror.as_uri()) as source:
        assert source.layout.name == layout
        run_release(lake, source, "2026")
    _check_sample_release(lake)


def test_every_article_lands_in_its_hash_shard(lake, s3_server):
    with source_for(s3_server.url) as source:
        inventory, _ = run_release(lake, source, "2026")
    assert sum(len(rows) for rows in inventory_rows(lake, "2026").values()) == ARTICLES
    for shard, rows in inventory_rows(lake, "2026").items():
        assert all(shard_of(r["pmcid"], N_SHARDS) == shard for r in rows)
