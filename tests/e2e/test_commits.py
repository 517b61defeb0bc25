"""Outputs written together are published together: a stage's tables and files for a partition
become visible all at once or not at all, whatever moment a kill hits (issue 23 §2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipelines.core.lake import Lake

REPO = Path(__file__).resolve().parents[2]  # what the child processes import, whatever the cwd

RELEASE, SHARD = "2026", "001"
OLD = [{"pmcid": "PMC1", "image_file": "a.png", "status": "mined"}]
NEW = [{"pmcid": "PMC2", "image_file": "b.png", "status": "mined"}]


def _figure_rows(rows: list[dict]) -> list[dict]:
    from pipelines.core.schemas import TABLES, Table

    names = TABLES[Table.MINING_FIGURES].names
    return [dict.fromkeys(names) | row for row in rows]


def _pair_rows(rows: list[dict]) -> list[dict]:
    from pipelines.core.schemas import TABLES, Table

    names = TABLES[Table.PAIRS].names
    return [
        dict.fromkeys(names)
        | {"pair_id": r["pmcid"], "pmcid": r["pmcid"], "image_file": r["image_file"]}
        | {"level": "global", "x1": 0, "y1": 0, "x2": 1, "y2": 1}
        for r in rows
    ]


def _publish(lake: Lake, rows: list[dict], tar: bytes = b"") -> None:
    """What the pairs stage writes for a partition: two tables (and here a file) in one commit."""
    with lake.commit("pairs", RELEASE, SHARD) as commit:
        commit.write_table("mining_figures", _figure_rows(rows))
        commit.write_table("pairs", _pair_rows(rows))
        if tar:
            with commit.file(lake.path("panels", f"release={RELEASE}", f"shard={SHARD}", "crops.tar")) as tmp:
                with open(tmp, "wb") as fh:
                    fh.write(tar)


def _state(lake: Lake) -> tuple[list, list]:
    figures = lake.read_table("mining_figures", RELEASE, SHARD)
    pairs = lake.read_table("pairs", RELEASE, SHARD)
    return (
        [r["pmcid"] for r in figures.to_pylist()] if figures is not None else None,
        [r["pmcid"] for r in pairs.to_pylist()] if pairs is not None else None,
    )


def _on_disk(lake: Lake, table: str) -> list[str]:
    """The rows of a table file as they are on disk now, bypassing the lake (and its recovery)."""
    import pyarrow.parquet as pq

    return [r["pmcid"] for r in pq.read_table(lake.table_path(table, RELEASE, SHARD)).to_pylist()]


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def _run_killed(lake: Lake, kill: str) -> int:
    """Publish NEW over OLD in a child process that dies (os._exit, as a kill -9 would leave it)
    at ``kill``: inside the block after the first table, after the journal is written, or after
    the first of the journal's moves."""
    script = textwrap.dedent(
        f"""
        import os
        from pipelines.core import lake as lake_module
        from pipelines.core.lake import Lake
        from tests.e2e.test_commits import NEW, _publish

        kill = {kill!r}
        lake = Lake({lake.root!r})
        if kill == "journal":
            lake_module.Lake.apply_journal = lambda self, path, journal: os._exit(9)
        elif kill == "first move":
            real, calls = os.replace, []

            def replace(src, dst):
                if "/_tmp/commits/" in str(src):
                    if calls:
                        os._exit(9)
                    calls.append(dst)
                return real(src, dst)

            os.replace = replace
        elif kill == "block":
            real_write = lake_module.Commit.write_table

            def write_table(self, table, data, *args, **kwargs):
                path = real_write(self, table, data, *args, **kwargs)
                os._exit(9)

            lake_module.Commit.write_table = write_table
        _publish(lake, NEW, tar=b"new tar")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, timeout=120).returncode


def test_a_failed_block_publishes_nothing_and_leaves_nothing(lake):
    _publish(lake, OLD)
    with pytest.raises(RuntimeError, match="model died"):
        with lake.commit("pairs", RELEASE, SHARD) as commit:
            commit.write_table("mining_figures", _figure_rows(NEW))
            raise RuntimeError("model died")
    assert _state(lake) == (["PMC1"], ["PMC1"])
    assert [f for f in _files(lake.path("_tmp")) if "commits" in f] == []


@pytest.mark.parametrize("kill", ["journal", "first move"])
def test_a_kill_while_publishing_is_finished_by_the_next_reader(lake, kill):
    _publish(lake, OLD, tar=b"old tar")
    first = lake.commit_of("mining_figures", RELEASE, SHARD)
    assert _run_killed(lake, kill) == 9
    crops = lake.path("panels", f"release={RELEASE}", f"shard={SHARD}", "crops.tar")
    if kill == "journal":  # nothing moved yet: the old set is on disk
        assert _on_disk(lake, "mining_figures") == _on_disk(lake, "pairs") == ["PMC1"]
    else:  # one table moved, the other not: a mix on disk...
        assert (_on_disk(lake, "mining_figures"), _on_disk(lake, "pairs")) == (["PMC2"], ["PMC1"])
    # ... that no reader sees: reading the partition finishes the commit first
    assert _state(lake) == (["PMC2"], ["PMC2"])
    assert open(crops, "rb").read() == b"new tar"
    second = lake.commit_of("mining_figures", RELEASE, SHARD)
    assert second != first and lake.commit_of("pairs", RELEASE, SHARD) == second
    assert _files(lake.path("_commits")) == [] and [f for f in _files(lake.path("_tmp")) if "commits/" in f] == []


def test_a_kill_before_the_journal_leaves_the_old_set_and_the_next_commit_sweeps_its_files(lake):
    _publish(lake, OLD)
    assert _run_killed(lake, "block") == 9
    assert _state(lake) == (["PMC1"], ["PMC1"])
    staged = [f for f in _files(lake.path("_tmp")) if f.startswith("commits/pairs/release=2026/shard=001/")]
    assert any(f.endswith("mining_figures/release=2026/shard=001/data.parquet") for f in staged)
    # another partition's commit leaves them; the next commit of this stage and partition removes them
    with lake.commit("pairs", RELEASE, "002") as commit:
        commit.write_table("mining_figures", _figure_rows(OLD), shard="002")
    assert set(staged) <= set(_files(lake.path("_tmp")))
    _publish(lake, NEW)
    assert _state(lake) == (["PMC2"], ["PMC2"])
    assert [f for f in _files(lake.path("_tmp")) if f.startswith("commits/")] == []


def test_a_live_commit_is_not_swept_by_another(lake):
    script = textwrap.dedent(
        f"""
        import time
        from pipelines.core.lake import Lake
        from tests.e2e.test_commits import NEW, _figure_rows
        lake = Lake({lake.root!r})
        with lake.commit("pairs", "2026", "001") as commit:
            commit.write_table("mining_figures", _figure_rows(NEW))
            print("staged", flush=True)
            time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == b"staged"
        _publish(lake, OLD)
        staged = [f for f in _files(lake.path("_tmp")) if f.startswith("commits/") and f.endswith(".parquet")]
        assert len(staged) == 1  # the live one's file, untouched
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_every_table_file_names_its_commit(lake):
    _publish(lake, OLD)
    assert lake.commit_of("mining_figures", RELEASE, SHARD) == lake.commit_of("pairs", RELEASE, SHARD)
    lake.write_table("pairs", RELEASE, SHARD, _pair_rows(NEW))  # a write on its own is its own commit
    assert lake.commit_of("pairs", RELEASE, SHARD) != lake.commit_of("mining_figures", RELEASE, SHARD)
    assert lake.commit_of("pairs", RELEASE, "003") is None


def test_the_data_digest_follows_the_rows_not_the_commit(lake):
    _publish(lake, OLD)
    digest = lake.data_digest("pairs", RELEASE, SHARD)
    time.sleep(0.01)
    _publish(lake, OLD)  # same rows, another commit id in the footer
    assert lake.data_digest("pairs", RELEASE, SHARD) == digest
    _publish(lake, NEW)
    assert lake.data_digest("pairs", RELEASE, SHARD) != digest
    assert lake.data_digest("pairs", RELEASE, "003") is None


def test_commits_on_an_object_store_lake():
    lake = Lake(f"memory://panelforge-commits-{time.time_ns()}")
    _publish(lake, OLD, tar=b"old")
    _publish(lake, NEW, tar=b"new")
    assert _state(lake) == (["PMC2"], ["PMC2"])
    assert lake.fs.cat(lake.path("panels", f"release={RELEASE}", f"shard={SHARD}", "crops.tar")) == b"new"
    assert not lake.fs.exists(lake.path("_tmp", "commits", "pairs", f"release={RELEASE}", f"shard={SHARD}", "x"))
