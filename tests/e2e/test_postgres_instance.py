"""The cluster profile's Dagster instance on a real PostgreSQL server started by the test.

The server is Debian's PostgreSQL (``testing.system.postgres_bindir``): locally the tests skip
without it, under ``.ci/run`` they fail. One server serves the session (``tests/conftest.py``'s
``postgres``); each test here gets its own database, so nothing one test writes is seen by another.
The web server test uses the session's ``dagster_dev``, which runs the cluster profile on its own
database of that server.
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
from pipelines.core.lake import Lake
from testing.loopback.postgres import PostgresServer

REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PG_", "PANELFORGE_"))}


_databases = iter(range(1, 1000))


@pytest.fixture
def pg(postgres: PostgresServer) -> PostgresServer:
    """A fresh, empty database on the session's server."""
    name = f"test_{next(_databases)}"
    query(postgres, f"CREATE DATABASE {name}", fetch=False)
    return replace(postgres, db=name)


def query(pg: PostgresServer, sql: str, *args, fetch: bool = True) -> list[tuple]:
    conn = pg.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if fetch else []
    finally:
        conn.close()


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
    limits = dict(query(pg, 'SELECT concurrency_key, "limit" FROM concurrency_limits'))
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
    assert query(pg, 'SELECT "limit" FROM concurrency_limits WHERE concurrency_key = %s', "gpu") == [(1,)]


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
    tables = {row[0] for row in query(pg, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
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


# --- dagster dev on PostgreSQL: launch, read the database, read it back in another process -----

RELEASE = "2032"  # this test's own release on the session's instance (test_e2e_dagster_dev opens 2031)


@pytest.mark.e2e
def test_a_partition_materialized_through_the_web_server_lives_in_postgres(dagster_dev, monkeypatch):
    """The session's ``dagster dev`` (tests/conftest.py): the cluster profile as it is, except what
    needs a cluster: a local lake instead of S3, the loopback S3 server as the PMC source, 4 shards.
    The launcher (Ray) and the VLM backend are not used by the inventory and load without a
    cluster. The automation sensor is slowed to once an hour so it does not start the download
    stage behind the inventory run. What the web server, daemon and run recorded is read from
    PostgreSQL, then back through an instance opened here, in another process than the server's."""
    from dagster import AssetKey, DagsterInstance

    dev, pg = dagster_dev.dev, dagster_dev.pg
    assert (dagster_dev.home / "dagster.yaml").read_text() == CLUSTER_INSTANCE_FILE.read_text()
    dev.add_release(RELEASE)
    run_id = dev.launch("pmc_inventory_job", RELEASE)
    assert dev.wait_run(run_id, timeout=240) == "SUCCESS", dev.tail()

    assert query(pg, "SELECT status, pipeline_name FROM runs WHERE run_id = %s", run_id) == [
        ("SUCCESS", "pmc_inventory_job")
    ]
    materialized = query(
        pg,
        "SELECT asset_key, partition FROM event_logs"
        " WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        run_id,
    )
    assert materialized == [('["pmc_inventory"]', RELEASE)]
    releases = query(pg, "SELECT partition FROM dynamic_partitions WHERE partitions_def_name = 'releases'")
    assert (RELEASE,) in releases
    assert Lake(dagster_dev.lake_dir).read_release("inventory", RELEASE).num_rows == 38  # the sample mirror's articles

    run = dev.gql(
        """query($id: ID!) { runOrError(runId: $id) { ... on Run { status jobName tags { key value } } } }""",
        id=run_id,
    )["runOrError"]
    assert run["status"] == "SUCCESS" and run["jobName"] == "pmc_inventory_job"
    assert {"key": "dagster/partition", "value": RELEASE} in run["tags"]

    # an instance opened from the same dagster.yaml, as another web server, daemon or pod would
    for name in ("DAGSTER_HOME", *pg.dagster_env()):
        monkeypatch.setenv(name, dagster_dev.env[name])
    with DagsterInstance.get() as instance:
        stored = instance.get_run_by_id(run_id)
        assert stored.status.value == "SUCCESS" and stored.tags["dagster/partition"] == RELEASE
        events = instance.fetch_materializations(AssetKey("pmc_inventory"), limit=100).records
        assert [(e.partition_key, e.run_id) for e in events if e.partition_key == RELEASE] == [(RELEASE, run_id)]
        assert RELEASE in instance.get_dynamic_partitions("releases")

    # the password reached every process through the environment and no log line
    logs = [dev.log_path, *sorted((dagster_dev.home / "storage").rglob("*.*"))]
    assert not [log for log in logs if log.is_file() and pg.password in log.read_text(errors="replace")]
