"""The lake: schema-checked atomic Parquet writes, kill-safety, and the DuckDB catalog."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.lake import Lake
from pipelines.schemas import TABLES

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


def test_a_killed_writer_leaves_the_old_file_intact(lake, tmp_path):
    lake.write_table("raw_manifest", "2026", "001", [ROW])
    dest = lake.table_path("raw_manifest", "2026", "001")
    before = open(dest, "rb").read()
    script = textwrap.dedent(
        f"""
        import sys, time
        from pipelines.lake import Lake
        lake = Lake({str(lake.root)!r})
        with lake.atomic_local_file({dest!r}) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(b"PAR1" + b"x" * 1_000_000)
                fh.flush()
                print("writing", flush=True)
                time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout.readline().strip() == b"writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert open(dest, "rb").read() == before
    leftovers = [n for n in os.listdir(os.path.dirname(dest)) if n != "data.parquet"]
    assert leftovers and all(n.startswith(".data.parquet.") and n.endswith(".tmp") for n in leftovers)
    # readers only ever glob data.parquet, so the half-written temporary file is invisible
    assert lake.read_release("raw_manifest", "2026").num_rows == 1


def test_catalog_has_a_view_per_table_with_release_and_shard(lake):
    lake.write_table("raw_manifest", "2025", "000", [ROW])
    lake.write_table("raw_manifest", "2026", "003", [{**ROW, "pmcid": "PMC2"}, {**ROW, "pmcid": "PMC3"}])
    lake.write_table("inventory_errors", "2026", "all", [{"location": "x:1", "raw": "a,b", "error": "bad"}])
    catalog = lake.refresh_catalog()
    con = duckdb.connect(catalog, read_only=True)
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views == {"raw_manifest", "inventory_errors"}
    rows = con.execute("SELECT release, shard, pmcid FROM raw_manifest ORDER BY pmcid").fetchall()
    assert rows == [("2025", "000", "PMC1"), ("2026", "003", "PMC2"), ("2026", "003", "PMC3")]
    con.close()


def test_lake_root_may_be_an_fsspec_url():
    lake = Lake(f"memory://panelforge-test-{time.time_ns()}")
    assert not lake.is_local
    lake.write_table("raw_manifest", "2026", "000", [ROW])
    assert lake.read_table("raw_manifest", "2026", "000").to_pylist() == [ROW]
