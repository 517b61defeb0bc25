"""The lake's kill-safety against a real second process: a writer killed with -9 midway leaves the
old file whole and its leftover is swept by the next write of that file; a live writer's
temporary file is never swept. (The rest of the lake's tests: tests/unit/test_lake.py.)"""

import os
import signal
import subprocess
import sys
import textwrap

from pipelines.core.lake import Lake
from tests.unit.test_lake import ROW, _tmp_files


def _killed_writer(lake: Lake, dest: str) -> subprocess.Popen:
    """A process writing ``dest`` through ``atomic_local_file``, stopped midway (kill it, or let
    the test kill it): returns once a megabyte is on disk."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pipelines.core.lake import Lake
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
    return proc


def test_a_killed_writer_leaves_the_old_file_intact_and_the_next_write_sweeps_its_leftover(lake, tmp_path):
    lake.write_table("raw_manifest", "2026", "001", [ROW])
    dest = lake.table_path("raw_manifest", "2026", "001")
    before = open(dest, "rb").read()
    proc = _killed_writer(lake, dest)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert open(dest, "rb").read() == before
    # the half-written file is left in the lake's _tmp/ under the path it would have replaced,
    # never beside the data
    assert os.listdir(os.path.dirname(dest)) == ["data.parquet"]
    folder = "files/tables/raw_manifest/release=2026/shard=001/"
    (leftover,) = [f for f in _tmp_files(lake) if not f.endswith(".lock")]
    assert leftover.startswith(folder + "data.parquet.") and leftover.endswith(".tmp")
    assert os.path.getsize(lake.path("_tmp", leftover)) == 1_000_004
    assert lake.read_release("raw_manifest", "2026").num_rows == 1
    # another shard's write leaves it; the next write of the same file removes it
    lake.write_table("raw_manifest", "2026", "002", [ROW])
    assert leftover in _tmp_files(lake)
    lake.write_table("raw_manifest", "2026", "001", [ROW, {**ROW, "pmcid": "PMC2"}])
    assert _tmp_files(lake) == []


def test_a_live_writers_temporary_file_is_never_swept(lake):
    dest = lake.table_path("raw_manifest", "2026", "001")
    proc = _killed_writer(lake, dest)  # alive, sleeping inside its block
    try:
        lake.write_table("raw_manifest", "2026", "001", [ROW])
        alive = [f for f in _tmp_files(lake) if f.endswith(".tmp")]
        assert len(alive) == 1 and os.path.getsize(lake.path("_tmp", alive[0])) == 1_000_004
    finally:
        proc.kill()
        proc.wait(timeout=30)
