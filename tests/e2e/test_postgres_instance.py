"""The cluster profile's Dagster instance on a real PostgreSQL server started by the test.

The server is Debian's PostgreSQL (``testing.system.postgres_bindir``): locally the tests skip
without it, under ``.ci/run`` they fail. One server serves the session (``tests/conftest.py``'s
``postgres``); each test here gets its own database, so nothing one test writes is seen by another.
``dagster dev`` on that server (the cluster profile's instance) is tested in ``test_e2e_dagster_dev.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from jobs.instance import CLUSTER_INSTANCE_FILE, INSTANCE_FILE
from testing.loopback.postgres import PostgresServer

REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PG_", "PANELFORGE_"))}


_databases = iter(range(1, 1000))


@pytest.fixture
def pg(postgres: PostgresServer) -> PostgresServer:
    """A fresh, empty database on the session's server."""
    name = f"test_{next(_databases)}"
    postgres.query(f"CREATE DATABASE {name}", fetch=False)
    return replace(postgres, db=name)


def setup_instance(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", "setup-instance"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_setup_instance_installs_the_postgres_file_and_sets_pools_there(pg, tmp_path):
    home = tmp_path / "dagster_home"
    env = {
        **CLEAN_ENV,
        **pg.dagster_env(),
        "DAGSTER_HOME": str(home),
        "PANELFORGE_PROFILE": "cluster",
        "PANELFORGE_GPU_SLOTS": "3",
    }
    done = setup_instance(env)
    assert done.returncode == 0, done.stderr
    assert (home / "dagster.yaml").read_text() == CLUSTER_INSTANCE_FILE.read_text()
    assert "pool gpu: 3" in done.stdout
    # the limits live in PostgreSQL, where every web server, daemon and run of the cluster reads them
    limits = dict(pg.query('SELECT concurrency_key, "limit" FROM concurrency_limits'))
    assert limits == {"pmc_source": 1, "ncbi_eutils": 1, "gpu": 3}
    assert pg.password not in done.stdout + done.stderr


def test_an_instance_file_already_there_is_kept_and_used(pg, tmp_path):
    """As in a pod of Dagster's Helm chart: the chart mounts its own dagster.yaml, with the host
    written in and only the password in the environment."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    chart_file = f"""storage:
  postgres:
    postgres_db:
      hostname: {pg.host}
      port: {pg.port}
      username: {pg.user}
      password: {{env: DAGSTER_PG_PASSWORD}}
      db_name: {pg.db}
      scheme: postgresql+psycopg2
"""
    (home / "dagster.yaml").write_text(chart_file)
    env = {**CLEAN_ENV, "DAGSTER_PG_PASSWORD": pg.password, "DAGSTER_HOME": str(home), "PANELFORGE_PROFILE": "cluster"}
    done = setup_instance(env)
    assert done.returncode == 0, done.stderr
    assert (home / "dagster.yaml").read_text() == chart_file
    assert pg.query('SELECT "limit" FROM concurrency_limits WHERE concurrency_key = %s', "gpu") == [(1,)]


def test_cluster_instance_file_reads_every_connection_setting_from_the_environment():
    config = yaml.safe_load(CLUSTER_INSTANCE_FILE.read_text())
    db = config["storage"]["postgres"]["postgres_db"]
    assert db == {
        "hostname": {"env": "DAGSTER_PG_HOST"},
        "port": {"env": "DAGSTER_PG_PORT"},
        "username": {"env": "DAGSTER_PG_USER"},
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "db_name": {"env": "DAGSTER_PG_DB"},
        "scheme": "postgresql+psycopg2",  # SQLAlchemy 2.1's bare postgresql:// wants psycopg 3
    }
    # the single-machine file's pools and run limit, plus room kept beside backfills
    single = yaml.safe_load(INSTANCE_FILE.read_text())["concurrency"]
    assert config["concurrency"]["pools"] == single["pools"]
    assert config["concurrency"]["runs"]["max_concurrent_runs"] == single["runs"]["max_concurrent_runs"]
    assert config["concurrency"]["runs"]["tag_concurrency_limits"] == [{"key": "dagster/backfill", "limit": 6}]


def test_the_instance_opens_all_three_storages_in_postgres(pg, tmp_path, monkeypatch):
    from dagster import DagsterInstance
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(CLUSTER_INSTANCE_FILE.read_text())
    for name, value in pg.dagster_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
    tables = {row[0] for row in pg.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"runs", "event_logs", "jobs", "job_ticks"} <= tables


def test_local_profile_keeps_sqlite(tmp_path):
    home = tmp_path / "dagster_home"
    done = setup_instance({**CLEAN_ENV, "DAGSTER_HOME": str(home), "PANELFORGE_PROFILE": "local"})
    assert done.returncode == 0, done.stderr
    installed = yaml.safe_load((home / "dagster.yaml").read_text())
    assert "storage" not in installed and "run_storage" not in installed
    assert (home / "history" / "runs.db").exists()  # Dagster's SQLite run storage


def test_missing_connection_settings_are_named_before_anything_is_installed(tmp_path):
    home = tmp_path / "dagster_home"
    env = {**CLEAN_ENV, "DAGSTER_HOME": str(home), "PANELFORGE_PROFILE": "cluster", "DAGSTER_PG_HOST": "db.internal"}
    done = setup_instance(env)
    assert done.returncode == 2
    assert "DAGSTER_PG_PORT, DAGSTER_PG_USER, DAGSTER_PG_PASSWORD, DAGSTER_PG_DB" in done.stderr
    assert not (home / "dagster.yaml").exists()


def test_a_refused_login_is_one_line_without_the_password(pg, tmp_path):
    wrong = "not-the-password-7f3a"
    env = {
        **CLEAN_ENV,
        **pg.dagster_env(),
        "DAGSTER_PG_PASSWORD": wrong,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "PANELFORGE_PROFILE": "cluster",
    }
    done = setup_instance(env)
    assert done.returncode == 1, done.stderr
    assert f"cannot open the instance's PostgreSQL at 127.0.0.1:{pg.port}" in done.stderr
    assert "password authentication failed" in done.stderr
    assert "Traceback" not in done.stderr
    assert wrong not in done.stdout + done.stderr
