"""``make ui``: a port of your choosing, a busy port refused in one line, and nothing left running
when it stops, not even with a run in progress.

Before: ``make ui`` ran ``dagster dev`` on port 3000 only; interrupted while a run was in
progress, ``dagster dev`` exited in 10 s and left its two code servers, the run worker and the
step's process running (still there a minute later), and the run STARTED for ever, holding its
pool slot. A closed terminal (SIGHUP) killed ``dagster dev`` alone and left all of its children.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from jobs.pools import holders
from testing.dagster_dev import REPO, free_port
from testing.gpu_pool import MARKER


def test_make_ui_takes_a_port():
    """Dry runs (``make -n``): the commands ``make ui`` would run, nothing is run."""

    def ui(*args: str) -> str:
        done = subprocess.run(["make", "-n", "ui", *args], cwd=REPO, capture_output=True, text=True, check=True)
        # on a fresh clone ``make -n`` also lists the install recipe (and make's directory lines)
        return next(line for line in done.stdout.splitlines() if "-m jobs.ui" in line)

    assert ui().endswith("-m jobs.ui --port 3000")
    assert ui("PORT=3001").endswith("-m jobs.ui --port 3001")
    assert "PANELFORGE_PROFILE=demo" in ui() and "HF_HUB_OFFLINE=1" in ui()


def test_a_busy_port_is_refused_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "jobs.ui", "--port", str(port)],
            cwd=REPO,
            env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f"port {port} on 127.0.0.1 is in use (Address already in use): choose another, e.g. make ui PORT={port + 1}"
    ]
    assert not (tmp_path / "home").exists()  # refused before anything was set up


@pytest.mark.e2e
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "terminal-closed"])
def test_stopping_the_ui_leaves_no_process_and_no_run_in_progress(tmp_path, stop_signal):
    home = tmp_path / "dagster_home"
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {"load_from": [{"python_module": {"module_name": "testing.gpu_pool", "working_directory": str(REPO)}}]}
        )
    )
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    marker = tmp_path / "hold_gpu.pids"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DAGSTER_HOME": str(home),
        "PANELFORGE_PROFILE": "demo",
        "PANELFORGE_PMC_SOURCE": mirror.as_uri(),
        MARKER: str(marker),
    }
    port = free_port()
    log = open(tmp_path / "ui.log", "wb")
    ui = subprocess.Popen(
        [sys.executable, "-m", "jobs.ui", "--port", str(port), "--workspace", str(workspace)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the test's own terminal: signals reach only what it sends them to
    )
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        log.flush()
        return (tmp_path / "ui.log").read_text(errors="replace")[-4000:]

    try:
        _wait(lambda: _up(url), 300, "the UI never answered", tail)
        launched = requests.post(
            f"{url}/graphql",
            json={
                "query": """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
                    __typename ... on LaunchRunSuccess { run { runId } } } }""",
                "variables": {
                    "p": {
                        "selector": {
                            "repositoryLocationName": "testing.gpu_pool",
                            "repositoryName": "__repository__",
                            "jobName": "hold_gpu_job",
                        }
                    }
                },
            },
            timeout=60,
        ).json()["data"]["launchRun"]
        run_id = launched["run"]["runId"]
        _wait(lambda: marker.exists() and len(marker.read_text().split()) == 2, 240, "the run never started", tail)
        started = psutil.Process(ui.pid).children(recursive=True)
        commands = " ".join(" ".join(p.cmdline()) for p in started)
        assert "dagster code-server" in commands and "dagster api grpc" in commands  # what used to stay
        assert {int(pid) for pid in marker.read_text().split()} <= {p.pid for p in started}

        ui.send_signal(stop_signal)
        assert ui.wait(timeout=240) == 0, tail()
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
        log.close()
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [" ".join(p.cmdline()) for p in alive]
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert instance.get_run_by_id(run_id).status.value == "FAILURE"
        assert holders(instance, "gpu") == []


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/server_info", timeout=5).ok
    except requests.ConnectionError:
        return False


def _wait(ready, timeout: float, what: str, tail) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert time.time() < deadline, f"{what}\n{tail()}"
        time.sleep(1)
