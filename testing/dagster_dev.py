"""``dagster dev`` (web server + daemon) started on a free loopback port for end-to-end tests,
loading this checkout's code location, with GraphQL and the server's log at hand; and the
environment of a fresh instance and lake those tests (and ``make screenshots``) start it in."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
LOCATION = {"repositoryLocationName": "jobs.definitions", "repositoryName": "__repository__"}
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def instance_env(tmp: Path, pmc_source: str, **overrides: str) -> dict[str, str]:
    """The environment of a user's fresh instance under ``tmp``: its own ``DAGSTER_HOME`` and lake,
    the PMC source at ``pmc_source``, 4 shards; ``overrides`` win. Every end-to-end test starts
    from this, so they differ only in what they override."""
    home = tmp / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PANELFORGE_HOME": str(tmp / "lake"),
        "PANELFORGE_PMC_SOURCE": pmc_source,
        "PANELFORGE_SHARDS": "4",
        "PANELFORGE_RATE_LIMIT": "100",
        **overrides,
    }


def cli(env: dict[str, str], *args: str) -> str:
    """``python -m jobs.cli ARGS`` as a user runs it (a separate process, the instance of ``env``);
    its output, or an AssertionError with its stderr."""
    done = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"jobs.cli {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


class DagsterDev:
    """``dagster dev`` (web server + daemon) on a free port, loading this checkout's code.
    ``daemon=False`` starts the web server alone: enough to look at an instance, and it launches
    nothing on its own (no sensors, no automation ticks). ``workspace`` and ``location`` load
    another code location of this checkout instead (a test's own, e.g. ``testing.gpu_pool``)."""

    def __init__(
        self,
        env: dict,
        log: Path,
        daemon: bool = True,
        workspace: Path = REPO / "workspace.yaml",
        location: dict = LOCATION,
    ):
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "wb")
        self.location = location
        command = [DAGSTER, "dev"] if daemon else [str(Path(sys.executable).with_name("dagster-webserver"))]
        self.proc = subprocess.Popen(
            [*command, "-w", str(workspace), "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base_url}/graphql"

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/server_info", timeout=5).ok:
                    return
            except requests.ConnectionError:
                pass
            assert self.proc.poll() is None, self.tail()
            assert time.time() < deadline, "dagster dev did not start\n" + self.tail()
            time.sleep(1)

    def gql(self, query: str, **variables) -> dict:
        response = requests.post(self.url, json={"query": query, "variables": variables}, timeout=60)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body
        return body["data"]

    def add_release(self, release: str) -> None:
        """Open ``release`` as the refresh sensor would (a dynamic partition)."""
        added = self.gql(
            """mutation($sel: RepositorySelector!, $key: String!) {
                 addDynamicPartition(repositorySelector: $sel, partitionsDefName: "releases", partitionKey: $key) {
                   __typename ... on PythonError { message } } }""",
            sel=self.location,
            key=release,
        )["addDynamicPartition"]
        assert added["__typename"] == "AddDynamicPartitionSuccess", added

    def launch(self, job: str, partition: str | None = None) -> str:
        """Launch ``job`` (for ``partition``) through GraphQL, as the UI's launchpad does; its run id."""
        tags = [{"key": "dagster/partition", "value": partition}] if partition else []
        launched = self.gql(
            """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
                 __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
            params={"selector": {**self.location, "jobName": job}, "executionMetadata": {"tags": tags}},
        )["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]["runId"]

    def wait_run(self, run_id: str, timeout: float = 300) -> str:
        """The run's final status (SUCCESS, FAILURE or CANCELED)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            run = self.gql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=run_id)
            if run["runOrError"]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                return run["runOrError"]["status"]
            time.sleep(1)
        raise TimeoutError(f"run {run_id} did not finish")

    def run_messages(self, run_id: str) -> list[tuple[str, str]]:
        """(level, message) of every event of the run's log so far, oldest first."""
        events = self.gql(
            """query($id: ID!) { logsForRun(runId: $id, limit: 10000) { __typename
                 ... on EventConnection { events { ... on MessageEvent { level message } } } } }""",
            id=run_id,
        )["logsForRun"]["events"]
        return [(e["level"], e["message"]) for e in events if e]

    def tail(self, n: int = 4000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self, grace: float = 120) -> list[str]:
        """SIGTERM to ``dagster dev`` and its process group (it was started in a session of its own);
        returns what is left of its processes (the group and every descendant: code servers, run
        workers) ``grace`` seconds later, as ``pid command line``, then kills them. An orphan never
        ends by itself; a shutdown on a loaded 2-core machine once took over 60 s, hence the grace."""
        processes = set(_group(self.proc.pid)) | set(_descendants(self.proc.pid))
        commands = {pid: _command(pid) for pid in processes}
        os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.time() + grace
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        left = _alive(processes)
        while left and time.time() < deadline:
            time.sleep(0.5)
            left = _alive(processes)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()
        return [f"{pid} {commands[pid]}" for pid in sorted(left)]


def _stats() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, process group) of every process, read from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(stat.parent.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return found


def _group(pgid: int) -> list[int]:
    return [pid for pid, (_, _, group) in _stats().items() if group == pgid]


def _descendants(pid: int) -> list[int]:
    stats, found, todo = _stats(), [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, (_, ppid, _) in stats.items() if ppid == parent]
        found += children
        todo += children
    return found


def _command(pid: int) -> str:
    """The command line of ``pid`` (shortened), to say what a process left running was."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def _alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended; its parent has not reaped it yet)."""
    stats = _stats()
    return [pid for pid in pids if pid in stats and stats[pid][0] != "Z"]


@dataclass
class SharedDagsterDev:
    """The ``dagster dev`` of ``tests/conftest.py``'s ``dagster_dev`` fixture: the cluster profile
    on PostgreSQL as a cluster runs it, but a local lake and the loopback S3 server as the PMC
    source. ``pg`` is its database; ``env`` the environment it and its command line run in."""

    dev: DagsterDev
    env: dict[str, str]
    pg: object  # testing.loopback.postgres.PostgresServer, on the instance's own database
    lake_dir: Path
    home: Path
    setup_output: str

    @classmethod
    @contextmanager
    def start(cls, tmp: Path, postgres, mirror: Path, db: str = "shared_dev") -> Iterator[SharedDagsterDev]:
        from testing.loopback.s3_server import S3LoopbackServer

        postgres.query(f"CREATE DATABASE {db}", fetch=False)
        pg = replace(postgres, db=db)
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PG_", "PANELFORGE_"))}
        with S3LoopbackServer(mirror) as source:
            home = tmp / "dagster_home"
            env = {
                **clean,
                **pg.dagster_env(),
                "DAGSTER_HOME": str(home),
                "PANELFORGE_PROFILE": "cluster",
                "PANELFORGE_HOME": str(tmp / "lake"),
                "PANELFORGE_PMC_SOURCE": source.url,
                "PANELFORGE_SHARDS": "4",
                "PANELFORGE_RATE_LIMIT": "100",
                "PANELFORGE_RATE_DIR": str(tmp / "ratelimit"),
                "PANELFORGE_AUTOMATION_INTERVAL": "3600",
                "HF_HUB_OFFLINE": "1",
            }
            setup = cli(env, "setup-instance")
            dev = DagsterDev(env, tmp / "dagster_dev.log")
            shared = cls(dev, env, pg, tmp / "lake", home, setup)
            try:
                dev.wait_ready()
                yield shared
            finally:
                left = dev.stop()
            assert not left, f"stopping dagster dev left processes {left} (code servers, run workers)"
