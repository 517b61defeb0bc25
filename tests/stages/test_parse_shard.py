"""The parse step over a lake: one broken article among good ones, carry-over, and duplicates;
size caps, unreadable raw files, and tables streamed to the lake in batches."""

import hashlib
import io
import os
import zlib

import pyarrow.parquet as pq
import pytest
from PIL import Image

import pipelines.parse.shard as shard_module
from pipelines.core.stage import Partition
from pipelines.images.duplicates import find_duplicates
from pipelines.images.info import image_info
from pipelines.parse.shard import PARSE_TABLES, ParseLimits, parse_shard
from pipelines.parse.stages import ParseStage
from testing import pipeline
from testing.loopback.sample_mirror import SAMPLE_DIR, build_legacy_mirror, package_path, write_package
from tests.helpers import N_SHARDS, files, run_release, source_for
from tests.unit.test_parse import ARTICLE_FACTS

BROKEN, BOMB = "PMC534114", "PMC900000012"  # an nXML-only article; elife-54296 (one figure)
SHARDS = [f"{i:03d}" for i in range(N_SHARDS)]


def _parse_all(lake, release, limits=ParseLimits()):
    return {shard: parse_shard(lake, release, shard, limits) for shard in SHARDS}


def _rows(lake, release, table):
    return lake.read_release(table, release).to_pylist()


@pytest.fixture
def sample_lake(tmp_path):
    """The sample acquired (not parsed) as release 2026, in a lake of this test's own: a copy of
    the one acquisition this process makes (``testing.pipeline.sample_lake``)."""
    return pipeline.sample_lake(tmp_path / "acquired", "2026", parse=False)


def test_broken_xml_and_a_decompression_bomb_are_recorded(lake, sample, tmp_path):
    mirror = build_legacy_mirror(tmp_path / "legacy", rows=sample)
    xml = (SAMPLE_DIR / "nxml" / BROKEN / f"{BROKEN}.nxml").read_bytes()
    write_package(mirror / package_path(BROKEN), BROKEN, {f"{BROKEN}.nxml": xml[: len(xml) // 2]})
    # a PNG header claiming 60,000 x 60,000 pixels in place of elife-54296's figure
    header = io.BytesIO()
    Image.new("L", (1, 1)).save(header, "PNG")
    bomb = bytearray(header.getvalue())
    bomb[16:24] = (60000).to_bytes(4, "big") * 2  # IHDR width and height
    bomb[29:33] = zlib.crc32(bytes(bomb[12:29])).to_bytes(4, "big")  # the IHDR chunk's CRC
    elife = SAMPLE_DIR / "articles" / "elife-54296"
    write_package(
        mirror / package_path(BOMB),
        BOMB,
        {"manuscript.xml": (elife / "manuscript.xml").read_bytes(), "elife-54296-fig1.jpeg": bytes(bomb)},
    )
    with source_for(mirror.as_uri()) as source:
        run_release(lake, source, "2026")
    results = _parse_all(lake, "2026")
    articles = {a["pmcid"]: a for a in _rows(lake, "2026", "articles")}
    assert len(articles) == len(sample)
    assert articles[BROKEN]["parse_status"] == "error" and "not well-formed" in articles[BROKEN]["parse_error"]
    assert sum(a["parse_status"] == "ok" for a in articles.values()) == len(sample) - 1
    assert sum(r.errors for r in results.values()) == 1
    assert [e for r in results.values() for e in r.first_errors] == [(BROKEN, articles[BROKEN]["parse_error"])]
    (fig,) = [f for f in _rows(lake, "2026", "figures") if f["pmcid"] == BOMB]
    assert fig["phash"] == [None] and fig["image_files"] == ["elife-54296-fig1.jpeg"]
    assert fig["image_errors"] == ["too large: 60000x60000 px = 3,600,000,000 px, over the cap of 89,478,485 px"]


def test_unchanged_articles_carry_their_parse_rows(lake, s3_server, tmp_path):
    with source_for(s3_server.url) as source:
        run_release(lake, source, "2025")
        first = _parse_all(lake, "2025")
        run_release(lake, source, "2026")
    second = _parse_all(lake, "2026")
    assert sum(r.parsed for r in first.values()) == 38 and sum(r.carried for r in first.values()) == 0
    assert sum(r.carried for r in second.values()) == 38 and sum(r.parsed for r in second.values()) == 0
    for table in ("articles", "figures", "mentions", "other_graphics"):
        assert lake.read_release(table, "2026").to_pylist() == lake.read_release(table, "2025").to_pylist()
    for name in ("figures", "child_figures", "images", "mentions", "other_graphics"):  # carried rows are counted
        assert sum(getattr(r, name) for r in second.values()) == sum(getattr(r, name) for r in first.values()) > 0


def test_the_written_tables_hold_every_article_in_batches(sample_lake):
    results = _parse_all(sample_lake, "2026")
    articles = _rows(sample_lake, "2026", "articles")
    figures = _rows(sample_lake, "2026", "figures")
    assert len(articles) == 38 and all(a["parse_status"] == "ok" for a in articles)
    assert sum(r.parsed for r in results.values()) == 38 and sum(r.articles for r in results.values()) == 38
    for pmcid, n_fig, n_child, _, _ in ARTICLE_FACTS:  # counted by hand from the XML (tests/unit/test_parse.py)
        mine = [f for f in figures if f["pmcid"] == pmcid]
        assert (len(mine), sum(f["is_child"] for f in mine)) == (n_fig, n_child), pmcid
    # PMC900000009 is elife-46472: 8 figures, one JPEG each, 600 px wide
    elife = [f for f in figures if f["pmcid"] == "PMC900000009"]
    assert [f["image_files"] for f in elife] == [[f"fig{i}.jpg"] for i in range(1, 9)]
    assert all(f["widths"] == [600] and f["image_errors"] == [None] and f["phash"][0] for f in elife)
    # the counters add up to the tables, and the preview is the first figure rows of each shard
    assert sum(r.figures for r in results.values()) == len(figures)
    assert sum(r.images for r in results.values()) == sum(len(f["image_files"]) for f in figures)
    assert sum(r.mentions for r in results.values()) == len(_rows(sample_lake, "2026", "mentions"))
    assert sum(r.other_graphics for r in results.values()) == len(_rows(sample_lake, "2026", "other_graphics"))
    for shard, result in results.items():
        shard_figures = sample_lake.read_table("figures", "2026", shard).to_pylist()
        assert result.preview == shard_figures[:10]
    # row groups of 3 rows hold the same rows as row groups of 256
    before = {t: _rows(sample_lake, "2026", t) for t in PARSE_TABLES}
    _parse_all(sample_lake, "2026", limits=ParseLimits(batch_rows=3))
    assert {t: _rows(sample_lake, "2026", t) for t in PARSE_TABLES} == before
    path = sample_lake.table_path("figures", "2026", "003")
    groups = pq.ParquetFile(path).metadata
    assert groups.num_rows == results["003"].figures and groups.num_row_groups == -(-groups.num_rows // 3)


@pytest.fixture
def parsed_calls(monkeypatch):
    """The PMCIDs ``parse_article`` is called for (an article parsed, not reused)."""
    calls = []
    original = shard_module.parse_article
    monkeypatch.setattr(shard_module, "parse_article", lambda *a, **kw: calls.append(kw["pmcid"]) or original(*a, **kw))
    return calls


def _tables(lake, release):
    return {t: _rows(lake, release, t) for t in PARSE_TABLES}


def test_a_rerun_reuses_every_article_and_writes_the_same_tables(sample_lake, parsed_calls):
    stage = ParseStage()
    first = {s: stage.run(sample_lake, Partition("2026", s)) for s in SHARDS}
    assert len(parsed_calls) == 38 and len(set(parsed_calls)) == 38  # the sample's 38 articles, each once
    tables = _tables(sample_lake, "2026")
    assert all(a["fingerprint"] for a in tables["articles"])
    parsed_calls.clear()
    second = {s: stage.run(sample_lake, Partition("2026", s)) for s in SHARDS}
    assert parsed_calls == []  # nothing parsed again
    assert _tables(sample_lake, "2026") == tables  # the same rows, in the same order
    for shard in SHARDS:
        assert second[shard].counts["carried"] == first[shard].counts["parsed"] and second[shard].ok == 0
        assert second[shard].carried == second[shard].skipped == first[shard].ok  # carried items count as tried
        for name in ("articles", "figures", "child_figures", "images", "mentions", "other_graphics"):
            assert second[shard].counts[name] == first[shard].counts[name], (shard, name)
        assert second[shard].version == first[shard].version is not None


def test_changed_limits_or_parser_version_parse_again(sample_lake, parsed_calls, monkeypatch):
    _parse_all(sample_lake, "2026")
    parsed_calls.clear()
    _parse_all(sample_lake, "2026", ParseLimits(batch_rows=7))  # only how rows are grouped in the file
    assert parsed_calls == []
    # elife-46472's fig1.jpg (PMC900000009) is 71,657 bytes: a limit below it changes its figure row
    results = _parse_all(sample_lake, "2026", ParseLimits(max_image_bytes=71_656))
    assert len(parsed_calls) == 38 and sum(r.carried for r in results.values()) == 0
    figures = _rows(sample_lake, "2026", "figures")
    (fig1,) = [f for f in figures if f["pmcid"] == "PMC900000009" and f["image_files"] == ["fig1.jpg"]]
    assert fig1["image_errors"] == ["image not read: 71657 bytes, over the 71656-byte limit"]
    parsed_calls.clear()
    monkeypatch.setattr(shard_module, "PARSE_VERSION", "a new parser")
    _parse_all(sample_lake, "2026", ParseLimits(max_image_bytes=71_656))
    assert len(parsed_calls) == 38


def test_an_error_row_is_parsed_again_and_old_rows_without_a_fingerprint_are_not_reused(sample_lake, parsed_calls):
    tar = sample_lake.path("raw/release=2026/shard=001/part-00000.tar")
    os.rename(tar, f"{tar}.away")
    first = _parse_all(sample_lake, "2026")
    assert first["001"].errors == 12 and first["001"].parsed == 0  # shard 001's 12 articles are in that tar
    os.rename(f"{tar}.away", tar)
    parsed_calls.clear()
    second = _parse_all(sample_lake, "2026")
    assert (second["001"].parsed, second["001"].errors, second["001"].carried) == (12, 0, 0)
    assert len(parsed_calls) == 12 and sum(r.carried for r in second.values()) == 26
    assert all(a["parse_status"] == "ok" for a in _rows(sample_lake, "2026", "articles"))
    # shard 002's rows as a lake written before fingerprints were stored holds them: parsed again
    old = {t: sample_lake.read_table(t, "2026", "002").to_pylist() for t in PARSE_TABLES}
    with sample_lake.commit("parsed_articles", "2026", "002") as commit:
        for table, rows in old.items():
            commit.write_table(table, [{**r, "fingerprint": None} if table == "articles" else r for r in rows])
    parsed_calls.clear()
    third = parse_shard(sample_lake, "2026", "002")
    n = len(old["articles"])  # the articles of shard 002
    assert n > 0 and third.parsed == n and third.carried == 0 and len(parsed_calls) == n
    assert {t: sample_lake.read_table(t, "2026", "002").to_pylist() for t in PARSE_TABLES} == old


def test_an_xml_over_the_size_limit_is_an_error_and_never_read(sample_lake, monkeypatch):
    read = []
    original = shard_module._RawFiles.read
    spy = lambda self, row: read.append(row["pmcid"]) or original(self, row)  # noqa: E731
    monkeypatch.setattr(shard_module._RawFiles, "read", spy)
    # the largest XML of the sample is bioRxiv 030213's, 390,994 bytes; the next is 315,512
    results = _parse_all(sample_lake, "2026", limits=ParseLimits(max_xml_bytes=390_993))
    articles = {a["pmcid"]: a for a in _rows(sample_lake, "2026", "articles")}
    assert articles["PMC900000001"]["parse_status"] == "error"
    assert articles["PMC900000001"]["parse_error"] == "article XML not read: 390994 bytes, over the 390993-byte limit"
    assert sum(a["parse_status"] == "ok" for a in articles.values()) == 37
    assert "PMC900000001" not in read and len(set(read)) == 37
    assert not [f for f in _rows(sample_lake, "2026", "figures") if f["pmcid"] == "PMC900000001"]
    assert [e for r in results.values() for e in r.first_errors] == [
        ("PMC900000001", articles["PMC900000001"]["parse_error"])
    ]


def test_an_image_over_the_size_limit_is_an_image_error_and_never_decoded(sample_lake, monkeypatch):
    decoded = []
    original = shard_module.image_info
    monkeypatch.setattr(shard_module, "image_info", lambda stream, px: decoded.append(stream) or original(stream, px))
    # elife-46472's images (PMC900000009): fig1 71,657 bytes, fig5 63,078, fig7 49,640, the others larger
    parse_shard(sample_lake, "2026", "000", ParseLimits(max_image_bytes=71_656))
    figures = {f["image_files"][0]: f for f in _rows(sample_lake, "2026", "figures") if f["pmcid"] == "PMC900000009"}
    assert figures["fig1.jpg"]["image_errors"] == ["image not read: 71657 bytes, over the 71656-byte limit"]
    assert figures["fig1.jpg"]["widths"] == [None] and figures["fig1.jpg"]["phash"] == [None]
    assert figures["fig1.jpg"]["sha256"] == [files(sample_lake, "2026")["PMC900000009"]["fig1.jpg"]["sha256"]]
    refused = {n for n, f in figures.items() if f["image_errors"][0]}
    assert refused == {"fig1.jpg", "fig2.jpg", "fig3.jpg", "fig4.jpg", "fig6.jpg", "fig8.jpg"}
    assert figures["fig5.jpg"]["widths"] == [600] and figures["fig7.jpg"]["widths"] == [600]
    articles = sample_lake.read_table("articles", "2026", "000").to_pylist()
    assert all(a["parse_status"] == "ok" for a in articles)
    images = sum(len(f["image_files"]) for f in sample_lake.read_table("figures", "2026", "000").to_pylist())
    assert len(decoded) < images


def test_a_deleted_or_truncated_raw_tar_is_a_per_article_error(sample_lake):
    tar = "raw/release=2026/shard=001/part-00000.tar"
    os.unlink(sample_lake.path(tar))
    # cut shard 000's tar just after PMC900000009's XML (offset 617,984 + 208,247 bytes): its
    # images and every article stored after it are short; the articles before it parse
    tar0 = sample_lake.path("raw/release=2026/shard=000/part-00000.tar")
    os.truncate(tar0, 617_984 + 208_247)
    results = _parse_all(sample_lake, "2026")
    articles = _rows(sample_lake, "2026", "articles")
    in_tar = {r["pmcid"] for r in sample_lake.read_table("raw_files", "2026", "001").to_pylist()}
    assert len(in_tar) == 12 and results["001"].errors == 12 and results["001"].parsed == 0
    for a in articles:
        if a["pmcid"] in in_tar:
            assert (a["parse_status"], a["parse_error"]) == ("error", f"raw file missing: {tar}")
        elif a["pmcid"] not in {r["pmcid"] for r in sample_lake.read_table("raw_files", "2026", "000").to_pylist()}:
            assert a["parse_status"] == "ok"
    assert len(articles) == 38
    rows = sample_lake.read_table("raw_files", "2026", "000").to_pylist()
    short = {r["pmcid"] for r in rows if r["offset"] + r["size"] > 617_984 + 208_247}
    assert "PMC900000009" in short and len(short) < 4
    for a in sample_lake.read_table("articles", "2026", "000").to_pylist():
        assert (a["parse_status"] == "error") == (a["pmcid"] in short)
        if a["pmcid"] == "PMC900000009":
            assert a["parse_error"] == (
                "raw file short: fig1.jpg needs bytes 826880-898537 of "
                "raw/release=2026/shard=000/part-00000.tar, which has 826231"
            )


def test_a_failure_mid_shard_publishes_nothing(sample_lake, monkeypatch):
    parse_shard(sample_lake, "2026", "003")
    monkeypatch.setattr(shard_module, "PARSE_VERSION", "a new parser")  # parse again, not reuse
    before = {t: open(sample_lake.table_path(t, "2026", "003"), "rb").read() for t in PARSE_TABLES}
    calls = []
    original = shard_module.parse_article

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("disk on fire")
        return original(*args, **kwargs)

    monkeypatch.setattr(shard_module, "parse_article", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        parse_shard(sample_lake, "2026", "003", ParseLimits(batch_rows=2))  # row groups were written
    for table in PARSE_TABLES:
        path = sample_lake.table_path(table, "2026", "003")
        assert open(path, "rb").read() == before[table]
        assert os.listdir(os.path.dirname(path)) == ["data.parquet"]  # no temporary file left
    calls.clear()
    with pytest.raises(RuntimeError, match="disk on fire"):
        parse_shard(sample_lake, "2026", "002")  # never written before: still no file
    for table in PARSE_TABLES:
        assert not os.path.exists(os.path.dirname(sample_lake.table_path(table, "2026", "002")))
    # nothing of either attempt is left in the lake's _tmp/ either
    assert [f for _, _, files in os.walk(sample_lake.path("_tmp", "commits")) for f in files] == []


def _figure(pmcid, name, data):
    info = image_info(data)
    return {
        "pmcid": pmcid,
        "fig_id": "F1",
        "image_files": [name],
        "sha256": [hashlib.sha256(data).hexdigest()],
        "phash": [info["phash"]],
    }


def test_exact_and_near_duplicates_across_articles():
    original = (SAMPLE_DIR / "articles" / "elife-46472" / "fig1.jpg").read_bytes()
    other = (SAMPLE_DIR / "articles" / "elife-46472" / "fig2.jpg").read_bytes()
    smaller = io.BytesIO()
    with Image.open(io.BytesIO(original)) as im:
        im.resize((im.width // 2, im.height // 2)).save(smaller, "JPEG", quality=70)
    figures = [
        _figure("PMC1", "a.jpg", original),
        _figure("PMC2", "b.jpg", original),  # the same bytes in another article
        _figure("PMC3", "c.jpg", smaller.getvalue()),  # re-encoded at half size
        _figure("PMC4", "d.jpg", other),  # a different figure
        _figure("PMC1", "e.jpg", original),  # the same article again: not a cross-article duplicate
    ]
    rows = find_duplicates(figures)
    pairs = {(r["pmcid"], r["image_file"], r["other_pmcid"], r["other_image_file"], r["kind"]) for r in rows}
    assert ("PMC1", "a.jpg", "PMC2", "b.jpg", "exact") in pairs and ("PMC2", "b.jpg", "PMC1", "a.jpg", "exact") in pairs
    assert ("PMC1", "a.jpg", "PMC3", "c.jpg", "near") in pairs and ("PMC2", "b.jpg", "PMC3", "c.jpg", "near") in pairs
    assert not any("PMC4" in (p[0], p[2]) for p in pairs)
    assert not any(p[0] == p[2] for p in pairs)
