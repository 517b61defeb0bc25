"""The parse step over a lake: one broken article among good ones, carry-over, and duplicates."""

import hashlib
import io
import zlib

from PIL import Image

from pipelines.parse.duplicates import find_duplicates
from pipelines.parse.images import image_info
from pipelines.parse.shard import parse_shard
from testing.loopback.sample_mirror import SAMPLE_DIR, build_legacy_mirror, package_path, write_package
from tests.conftest import source_for
from tests.helpers import N_SHARDS, run_release

BROKEN, BOMB = "PMC534114", "PMC900000012"  # an nXML-only article; elife-54296 (one figure)


def _parse_all(lake, release, previous=None):
    results = {}
    for shard in [f"{i:03d}" for i in range(N_SHARDS)]:
        results[shard] = parse_shard(lake, release, shard, previous)
        for table, rows in results[shard].tables.items():
            lake.write_table(table, release, shard, rows)
    return results


def _rows(results, table):
    return [r for res in results.values() for r in res.tables[table]]


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
    articles = {a["pmcid"]: a for a in _rows(results, "articles")}
    assert len(articles) == len(sample)
    assert articles[BROKEN]["parse_status"] == "error" and "not well-formed" in articles[BROKEN]["parse_error"]
    assert sum(a["parse_status"] == "ok" for a in articles.values()) == len(sample) - 1
    (fig,) = [f for f in _rows(results, "figures") if f["pmcid"] == BOMB]
    assert fig["phash"] == [None] and fig["image_files"] == ["elife-54296-fig1.jpeg"]
    assert fig["image_errors"][0].startswith("decompression bomb refused")
    assert "3600000000 pixels" in fig["image_errors"][0]  # 60,000 x 60,000


def test_unchanged_articles_carry_their_parse_rows(lake, s3_server, tmp_path):
    with source_for(s3_server.url) as source:
        run_release(lake, source, "2025")
        first = _parse_all(lake, "2025")
        run_release(lake, source, "2026", previous="2025")
    second = _parse_all(lake, "2026", previous="2025")
    assert sum(r.parsed for r in first.values()) == 38 and sum(r.carried for r in first.values()) == 0
    assert sum(r.carried for r in second.values()) == 38 and sum(r.parsed for r in second.values()) == 0
    for table in ("articles", "figures", "mentions", "other_graphics"):
        assert lake.read_release(table, "2026").to_pylist() == lake.read_release(table, "2025").to_pylist()


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
