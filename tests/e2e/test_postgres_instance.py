"""The cluster profile's Dagster instance on a real PostgreSQL server started by the test.

The server is Debian's PostgreSQL (``testing.system.postgres_bindir``): locally the tests skip
without it, under ``.ci/run`` they fail. One server serves the module; each test gets its own
database, so nothing one test writes is seen by another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from jobs.instance import CLUSTER_INSTANCE_FILE, INSTANCE_FILE
from pipelines.core.lake import Lake
from testing.dagster_dev import DagsterDev
from testing.loopback.postgres import PostgresServer, postgres_server
from testing.loopback.s3_server import S3LoopbackServer
from testing.system import postgres_bindir, require

REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PG_", "PANELFORGE_"))}


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    bindir = postgres_bindir()
    require(bindir, "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    with postgres_server(bindir) as pg:
        yield pg


@pytest.fixture(scope="module")
def server(postgres: PostgresServer) -> PostgresServer:
    return postgres


_databases = iter(range(1, 1000))


@pytest.fixture
def pg(server: PostgresServer) -> PostgresServer:
    """A fresh, empty database on the module's server."""
    name = f"test_{next(_databases)}"
    query(server, f"CREATE DATABASE {name}", fetch=False)
    return replace(server, db=name)


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


# --- dagster dev on PostgreSQL: launch, stop, read the database, restart, read it back ---------


def start(env: dict, log: Path) -> DagsterDev:
    dev = DagsterDev(env, log)
    try:
        dev.wait_ready()
    except BaseException:
        dev.stop()
        raise
    return dev


@pytest.mark.e2e
def test_a_partition_materialized_through_the_web_server_lives_in_postgres(pg, tmp_path, cloud_mirror):
    """The cluster profile as it is, except what needs a cluster: a local lake instead of S3, the
    loopback S3 server as the PMC source, 4 shards. The launcher (Ray) and the VLM backend are
    not used by the inventory and load without a cluster. The automation sensor is slowed to once
    an hour so it does not start the download stage behind the inventory run."""
    home = tmp_path / "dagster_home"
    with S3LoopbackServer(cloud_mirror) as source:
        env = {
            **CLEAN_ENV,
            **pg.dagster_env(),
            "DAGSTER_HOME": str(home),
            "PANELFORGE_PROFILE": "cluster",
            "PANELFORGE_HOME": str(tmp_path / "lake"),
            "PANELFORGE_PMC_SOURCE": source.url,
            "PANELFORGE_SHARDS": "4",
            "PANELFORGE_RATE_LIMIT": "100",
            "PANELFORGE_AUTOMATION_INTERVAL": "3600",
        }
        done = setup_instance(env)
        assert done.returncode == 0, done.stderr

        dev = start(env, tmp_path / "first.log")
        try:
            dev.add_release("2026")
            run_id = dev.launch("pmc_inventory_job", "2026")
            assert dev.wait_run(run_id, timeout=240) == "SUCCESS", dev.tail()
        finally:
            dev.stop()

    # the web server and daemon are gone: what they recorded is in PostgreSQL
    assert query(pg, "SELECT status, pipeline_name FROM runs WHERE run_id = %s", run_id) == [
        ("SUCCESS", "pmc_inventory_job")
    ]
    materialized = query(
        pg,
        "SELECT asset_key, partition FROM event_logs"
        " WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        run_id,
    )
    assert materialized == [('["pmc_inventory"]', "2026")]
    assert query(pg, "SELECT partition FROM dynamic_partitions WHERE partitions_def_name = 'releases'") == [("2026",)]
    assert Lake(tmp_path / "lake").read_release("inventory", "2026").num_rows == 38  # the sample mirror's articles

    dev = start(env, tmp_path / "second.log")
    try:
        run = dev.gql(
            """query($id: ID!) { runOrError(runId: $id) { ... on Run { status jobName tags { key value } } } }""",
            id=run_id,
        )["runOrError"]
        assert run["status"] == "SUCCESS" and run["jobName"] == "pmc_inventory_job"
        assert {"key": "dagster/partition", "value": "2026"} in run["tags"]
        events = dev.gql(
            """query { assetOrError(assetKey: {path: ["pmc_inventory"]}) { ... on Asset {
                 assetMaterializations(limit: 5) { partition runId } } } }"""
        )["assetOrError"]["assetMaterializations"]
        assert events == [{"partition": "2026", "runId": run_id}]
    finally:
        dev.stop()
    # the password reached every process through the environment and no log line
    logs = [tmp_path / "first.log", tmp_path / "second.log", *sorted((home / "storage").rglob("*.*"))]
    assert not [log for log in logs if log.is_file() and pg.password in log.read_text(errors="replace")]
