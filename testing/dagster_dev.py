"""``dagster dev`` (web server + daemon) started on a free loopback port for end-to-end tests,
loading this checkout's code location, with GraphQL and the server's log at hand."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DagsterDev:
    """``dagster dev`` (web server + daemon) on a free port, loading this checkout's code."""

    def __init__(self, env: dict, log: Path):
        self.port = free_port()
        self.log_path = log
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster")),
                "dev",
                "-w",
                "workspace.yaml",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}/graphql"

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

    def tail(self, n: int = 4000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
