"""The command line without the UI: ``python -m jobs.cli add-release`` opens a release in
``DAGSTER_HOME``'s instance (idempotent) and refuses a name that is not a year."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from assets.partitions import RELEASES, SHARDS
from jobs.cli import main
from pipelines.core.partitioning import shard_keys

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("PANELFORGE_HOME", str(tmp_path / "lake"))
    monkeypatch.setenv("PANELFORGE_SHARDS", "3")
    assert main(["setup-instance"]) == 0
    return home


def _partitions(home: Path) -> tuple[list[str], list[str]]:
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        return instance.get_dynamic_partitions(RELEASES), instance.get_dynamic_partitions(SHARDS)


def test_add_release_opens_the_release_and_its_shards(dagster_home):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "add-release", "2027"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "release 2027 is open with 3 shards" in done.stdout
    assert _partitions(dagster_home) == (["2027"], shard_keys(3))


def test_add_release_is_idempotent(dagster_home, capsys):
    assert main(["add-release", "2027"]) == 0
    assert main(["add-release", "2027"]) == 0
    assert main(["add-release", "2028"]) == 0
    assert _partitions(dagster_home) == (["2027", "2028"], shard_keys(3))
    assert capsys.readouterr().out.count("is open with 3 shards") == 3


@pytest.mark.parametrize("name", ["27", "2027a", "latest", "2027|000", ""])
def test_a_bad_release_name_is_refused(dagster_home, name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["add-release", name])
    assert exit_.value.code == 2
    assert "a release is named by its year" in capsys.readouterr().err
    assert _partitions(dagster_home) == ([], [])


def test_add_release_refuses_another_shard_count_than_the_lakes(dagster_home, tmp_path, capsys):
    from pipelines.core.lake import Lake

    Lake(tmp_path / "lake").ensure_layout(2)  # the lake was made with 2 shards; PANELFORGE_SHARDS is 3
    assert main(["add-release", "2027"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 2 shards per release, not 3" in err
    assert _partitions(dagster_home) == ([], [])  # nothing opened


def test_a_bad_setting_is_one_line_not_a_traceback(dagster_home, monkeypatch, capsys):
    monkeypatch.setenv("PANELFORGE_SHARDS", "many")
    assert main(["add-release", "2027"]) == 2
    err = capsys.readouterr().err
    assert err == "python -m jobs.cli add-release: PANELFORGE_SHARDS must be a whole number, got 'many'\n"


def test_an_instance_that_cannot_be_opened_is_one_line(tmp_path, monkeypatch):
    env = {**os.environ, "PANELFORGE_HOME": str(tmp_path / "lake"), "PANELFORGE_SHARDS": "3"}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "add-release", "2027"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert done.stderr.startswith("python -m jobs.cli add-release: ") and "DAGSTER_HOME" in done.stderr


def test_materializing_a_partition_that_is_not_open_says_to_add_the_release(dagster_home, capsys):
    assert main(["materialize", "pmc_inventory", "--partition", "2027"]) == 2
    assert capsys.readouterr().err == (
        "release 2027 is not open in this instance: run `python -m jobs.cli add-release 2027` first\n"
    )
    assert main(["add-release", "2027"]) == 0
    assert main(["materialize", "pmc_raw_articles", "--partition", "2027|007"]) == 2  # 3 shards: 000-002
    assert "shard 007 does not exist" in capsys.readouterr().err


def test_the_sensor_lists_a_release_opened_ahead_of_time(dagster_home):
    """``add-release`` in December does not stop the 2 January refresh from listing the release."""
    from datetime import UTC, datetime

    from dagster import build_sensor_context

    from jobs.definitions import defs
    from jobs.refresh import yearly_refresh_sensor

    assert main(["add-release", "2027"]) == 0
    sensor = yearly_refresh_sensor(3, clock=lambda: datetime(2027, 1, 2, 3, 0, tzinfo=UTC))
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home))) as instance:
        with build_sensor_context(instance=instance, definitions=defs) as context:
            result = sensor(context)
    assert [r.run_key for r in result.run_requests] == ["inventory-2027"]
    assert result.dynamic_partitions_requests == []  # already open


@pytest.mark.e2e  # six processes at once
def test_concurrent_setups_of_a_fresh_home_neither_crash_nor_fork_the_schema(tmp_path):
    """``make demo`` and ``make ui`` (or two ``setup-instance``) started together on a new SQLite
    home: without a lock one crashed in ``configure_pools`` (``UNIQUE constraint failed:
    concurrency_limits.concurrency_key``) or in creating the schema (``table run_tags already
    exists``) in 2 of 3 tries here, and the run storage was left with two Alembic revisions. The
    race is not deterministic, so three fresh homes are set up by two processes each, all at once."""
    import sqlite3

    env = {**os.environ, "PYTHONPATH": str(REPO), "PANELFORGE_PROFILE": "local", "PANELFORGE_GPU_SLOTS": "2"}
    homes = [tmp_path / f"home{n}" for n in range(3)]
    procs = [
        (
            home,
            subprocess.Popen(
                [sys.executable, "-m", "jobs.cli", "setup-instance"],
                cwd=REPO,
                env={**env, "DAGSTER_HOME": str(home)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for home in homes
        for _ in range(2)
    ]
    for _home, proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "pool gpu: 2" in out
    for home in homes:
        databases = sorted(home.rglob("*.db"))
        assert {db.name for db in databases} >= {"runs.db", "schedules.db"}
        for db in databases:
            with sqlite3.connect(db) as conn:
                revisions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
            assert len(revisions) == 1, (db, revisions)  # one head: later opens and migrations work
        assert _pool_limits(home) == {"pmc_source": 1, "ncbi_eutils": 1, "gpu": 2}


def _pool_limits(home: Path) -> dict[str, int]:
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        return {pool.name: pool.limit for pool in instance.event_log_storage.get_pool_limits()}
