"""A multi-node Ray cluster on this machine: a head and worker nodes, each its own ``ray start``.

Ray's own ``cluster_utils.Cluster`` runs every node inside the test process; here each node is a
separate process group started by the ``ray`` command line, as on a real cluster, so a test can
lose a node the way a cluster does (its raylet, object store and workers killed at once) while
the head and the driver live on. Every port is chosen free, so clusters of tests running beside
each other never meet, and the nodes and the driver share one authentication token
(``RAY_AUTH_MODE=token``, Ray's default for a new cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testing.dagster_dev import REPO, free_port

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # small: every node's store is shared memory on one machine


@dataclass
class RayNode:
    name: str
    temp_dir: Path
    pgid: int
    log: Path

    def owns(self, node: dict) -> bool:
        """Whether ``node`` (an entry of ``ray.nodes()``) is this node: its sockets lie in our temp dir."""
        return str(node.get("ObjectStoreSocketName", "")).startswith(str(self.temp_dir) + os.sep)


class LocalRayCluster:
    """``with LocalRayCluster() as cluster:`` a head with ``head_cpus`` CPUs and no custom resources;
    ``add_worker`` adds nodes; ``kill`` loses one; ``driver`` connects this process."""

    def __init__(self, head_cpus: int = 1, startup_timeout_s: float = 90.0):
        # Short and under /tmp: Ray's Unix sockets live in the session dir, and a socket path
        # longer than 107 bytes (as under pytest's tmp_path) cannot be bound.
        self.root = Path(tempfile.mkdtemp(prefix="pfray-", dir="/tmp"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.timeout = startup_timeout_s
        self.env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": uuid.uuid4().hex,
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.nodes: list[RayNode] = []
        self.worker: RayNode | None = None  # the newest worker node
        self.head_cpus = head_cpus

    def __enter__(self) -> LocalRayCluster:
        try:
            self._start("head", ["--head", f"--port={self.port}", f"--num-cpus={self.head_cpus}", "--resources={}"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_worker(self, num_cpus: int = 1, resources: dict[str, float] | None = None) -> RayNode:
        name = f"worker{len(self.nodes)}"
        self.worker = self._start(
            name, [f"--address={self.address}", f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources or {})}"]
        )
        return self.worker

    def _start(self, name: str, args: list[str]) -> RayNode:
        temp_dir = self.root / name
        log = self.root / f"{name}.log"
        ports = [
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
        if "--head" in args:
            ports += [
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
            ]
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        with open(log, "wb") as out:
            # its own session, so the node's daemons (which stay in this process group after
            # ``ray start`` returns) can be killed together and nothing else with them
            proc = subprocess.Popen(
                [RAY, "start", *args, *ports, "--node-ip-address=127.0.0.1",
                 f"--temp-dir={temp_dir}", f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            node = RayNode(name, temp_dir, proc.pid, log)
            self.nodes.append(node)
            try:
                code = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                code = None
        if code != 0:
            raise RuntimeError(f"ray start for {name} failed ({code}):\n{log.read_text()[-3000:]}")
        return node

    @contextmanager
    def driver(self) -> Iterator[None]:
        """This process as a driver of the cluster (``ray.init(address)`` inside): the cluster's
        token in the environment meanwhile. Ray keeps the first token it read for the life of the
        process, so the cache is cleared before connecting (an earlier test's local Ray) and again
        after, when Ray is shut down and the environment restored (a later one)."""
        import ray
        from ray._raylet import AuthenticationTokenLoader

        saved = {name: os.environ.get(name) for name in self.env}
        ray.shutdown()  # a local Ray an earlier test left running in this process
        _unbind_ray_data_logs()
        os.environ.update(self.env)
        AuthenticationTokenLoader.instance().reset_cache()  # and the token it cached
        try:
            yield
        finally:
            ray.shutdown()
            _unbind_ray_data_logs()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            AuthenticationTokenLoader.instance().reset_cache()

    def kill(self, node: RayNode) -> None:
        """Lose ``node`` as a crashed machine is lost: SIGKILL to all its processes at once."""
        _killpg(node.pgid, signal.SIGKILL)

    def wait_alive(self, node: RayNode, alive: bool = True) -> dict:
        """The ``ray.nodes()`` entry of ``node`` once the head sees it (not) alive; needs ``ray.init``."""
        import ray

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            entries = [n for n in ray.nodes() if node.owns(n)]
            if any(n["Alive"] == alive for n in entries):
                return next(n for n in entries if n["Alive"] == alive)
            time.sleep(0.2)
        raise TimeoutError(f"the head never saw {node.name} {'alive' if alive else 'dead'}")

    def close(self) -> None:
        for node in reversed(self.nodes):
            _killpg(node.pgid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for node in self.nodes:
            while _exists(node.pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _killpg(node.pgid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def _unbind_ray_data_logs() -> None:
    """Fresh Ray Data log handlers, which bind to the session of the next Ray this process joins.

    Ray Data's handlers open ``ray-data.log`` in the session directory of the Ray the process is
    connected to when they first write, and keep that path across ``ray.shutdown()``: after this
    cluster's driver left (and :meth:`LocalRayCluster.close` deleted its directory), a Ray Data
    job on the next local Ray in the same process failed on the deleted session's ``ray-data.log``
    (CI, ``test_vlm_ray`` after ``test_ray_multinode`` on one worker)."""
    from ray.data._internal.logging import configure_logging, reset_logging

    reset_logging()
    configure_logging()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
