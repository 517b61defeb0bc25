"""The lake: schema-checked atomic Parquet writes, kill-safety, and the DuckDB catalog."""

import os
import shutil
import subprocess
import sys
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.core.lake import Lake
from pipelines.core.schemas import TABLES

ROW = {
    "pmcid": "PMC1",
    "version": 1,
    "source": "ftp",
    "status": "ok",
    "error": None,
    "warning": None,
    "n_files": 2,
    "bytes": 10,
    "files": ["a.xml", "b.jpg"],
    "md5": ["0" * 32, "1" * 32],
    "dropped": [],
    "fetched_in_release": "2026",
    "fingerprint": None,
}


def test_write_and_read_back_with_the_table_schema(lake):
    lake.write_table("raw_manifest", "2026", "001", [ROW])
    table = lake.read_table("raw_manifest", "2026", "001")
    assert table.schema == TABLES["raw_manifest"]
    assert table.to_pylist() == [ROW]
    assert lake.read_table("raw_manifest", "2026", "002") is None
    assert lake.releases("raw_manifest") == ["2026"]


def test_rows_that_break_the_schema_are_refused(lake):
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        lake.write_table("raw_manifest", "2026", "001", [{**ROW, "n_files": "many"}])
    with pytest.raises(ValueError, match=r"fields differ from the schema: \['md5'\]"):
        lake.write_table("raw_manifest", "2026", "001", [{k: v for k, v in ROW.items() if k != "md5"}])
    assert not os.path.exists(lake.table_path("raw_manifest", "2026", "001"))


def test_table_writer_streams_row_groups_of_batch_rows(lake):
    rows = [{**ROW, "pmcid": f"PMC{i}"} for i in range(5)]
    with lake.table_writer("raw_manifest", "2026", "001", batch_rows=2) as writer:
        writer.write(rows[:3])
        writer.write(rows[3:])
        assert not os.path.exists(writer.path)  # published only when the block ends
    assert writer.rows == 5
    meta = pq.ParquetFile(lake.table_path("raw_manifest", "2026", "001")).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [2, 2, 1]
    assert lake.read_table("raw_manifest", "2026", "001").to_pylist() == rows
    assert [t.num_rows for t in lake.iter_batches("raw_manifest", "2026", "001", batch_rows=2)] == [2, 2, 1]
    assert list(lake.iter_batches("raw_manifest", "2026", "009")) == []


def test_table_writer_publishes_nothing_when_the_block_raises(lake):
    lake.write_table("raw_manifest", "2026", "001", [ROW])
    dest = lake.table_path("raw_manifest", "2026", "001")
    before = open(dest, "rb").read()
    with pytest.raises(RuntimeError, match="midway"):
        with lake.table_writer("raw_manifest", "2026", "001", batch_rows=2) as writer:
            writer.write([{**ROW, "pmcid": f"PMC{i}"} for i in range(5)])  # two row groups on disk
            raise RuntimeError("midway")
    assert open(dest, "rb").read() == before and os.listdir(os.path.dirname(dest)) == ["data.parquet"]
    with pytest.raises(RuntimeError, match="midway"):
        with lake.table_writer("raw_manifest", "2026", "002") as writer:
            writer.write([ROW])
            raise RuntimeError("midway")
    assert os.listdir(os.path.dirname(lake.table_path("raw_manifest", "2026", "002"))) == []
    # a bad row in the last batch fails at the end of the block, and publishes nothing either
    with pytest.raises(ValueError, match=r"fields differ from the schema: \['md5'\]"):
        with lake.table_writer("raw_manifest", "2026", "003") as writer:
            writer.write([ROW, {k: v for k, v in ROW.items() if k != "md5"}])
    assert os.listdir(os.path.dirname(lake.table_path("raw_manifest", "2026", "003"))) == []


def _tmp_files(lake: Lake) -> list[str]:
    """Every file under the lake's _tmp/, relative to it."""
    root = lake.path("_tmp")
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def test_catalog_has_a_view_per_table_with_release_and_shard(lake):
    lake.write_table("raw_manifest", "2025", "000", [ROW])
    lake.write_table("raw_manifest", "2026", "003", [{**ROW, "pmcid": "PMC2"}, {**ROW, "pmcid": "PMC3"}])
    lake.write_table("inventory_errors", "2026", "all", [{"location": "x:1", "raw": "a,b", "error": "bad"}])
    assert lake.refresh_catalog() == lake.path("catalog.duckdb")
    con = lake.connect()
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views == {"raw_manifest", "inventory_errors"}
    rows = con.execute("SELECT release, shard, pmcid FROM raw_manifest ORDER BY pmcid").fetchall()
    assert rows == [("2025", "000", "PMC1"), ("2026", "003", "PMC2"), ("2026", "003", "PMC3")]
    con.close()


def test_a_moved_lake_keeps_its_catalog(tmp_path):
    first = Lake(tmp_path / "A" / "data")
    first.write_table("raw_manifest", "2026", "000", [ROW, {**ROW, "pmcid": "PMC2"}])
    first.refresh_catalog()
    os.rename(tmp_path / "A", tmp_path / "B")  # the old path is gone: nothing can read through it
    moved = tmp_path / "B" / "data"
    query = "SELECT pmcid, release FROM raw_manifest ORDER BY pmcid"
    expected = [("PMC1", "2026"), ("PMC2", "2026")]

    con = Lake(moved).connect()  # from Python, wherever the process runs
    assert con.execute(query).fetchall() == expected
    con.close()
    # the DuckDB CLI the README documents, from the lake root and, with file_search_path, from its parent
    cli = os.path.join(os.path.dirname(sys.executable), "duckdb")
    for cwd, args in (
        (moved, ["catalog.duckdb"]),
        (moved.parent, ["-cmd", "SET file_search_path = 'data'", "data/catalog.duckdb"]),
    ):
        out = subprocess.run([cli, "-csv", *args, query], cwd=cwd, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["pmcid,release", "PMC1,2026", "PMC2,2026"]
    # opened from anywhere else the relative paths find nothing: an error, not another lake's rows
    con = duckdb.connect(str(moved / "catalog.duckdb"), read_only=True)
    with pytest.raises(duckdb.IOException, match="No files found"):
        con.execute(query)
    con.close()


def test_a_copied_lake_reads_its_own_files(tmp_path):
    original = Lake(tmp_path / "original")
    original.write_table("raw_manifest", "2026", "000", [ROW])
    original.refresh_catalog()
    shutil.copytree(original.root, tmp_path / "copy")
    copy = Lake(tmp_path / "copy")
    copy.write_table("raw_manifest", "2026", "001", [{**ROW, "pmcid": "PMC9"}])  # no refresh_catalog
    con = copy.connect()
    assert con.execute("SELECT pmcid, shard FROM raw_manifest ORDER BY pmcid").fetchall() == [
        ("PMC1", "000"),
        ("PMC9", "001"),
    ]
    con.close()
    con = original.connect()
    assert con.execute("SELECT pmcid FROM raw_manifest").fetchall() == [("PMC1",)]
    con.close()


def test_lake_root_may_be_an_fsspec_url():
    lake = Lake(f"memory://panelforge-test-{time.time_ns()}")
    assert not lake.is_local
    lake.write_table("raw_manifest", "2026", "000", [ROW])
    assert lake.read_table("raw_manifest", "2026", "000").to_pylist() == [ROW]
