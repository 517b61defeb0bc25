"""A dead run gives its pool slot back, and a step waiting for a pool says who holds it.

Before: a run killed with -9 kept the ``gpu`` pool's slot for ever (marking it failed did not free
it), and the step waiting behind it logged only "Step blocked by limit for pool gpu" at DEBUG
every 5 minutes. The shipped instance file now turns on Dagster's run monitoring, whose daemon
frees the slots of runs that ended (``deploy/dagster.yaml``), and every job's executor writes at
INFO which run holds the pool (``jobs/pools.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, execute_job
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.events import DagsterEvent
from dagster._core.instance.ref import InstanceRef

from jobs.cli import main
from jobs.instance import INSTANCE_FILE, prepare_instance
from jobs.pools import RunStillActive, describe_wait, free_slots, holders, pools_report, with_pool_waits
from resources.settings import Settings
from testing.dagster_dev import DAGSTER, REPO, DagsterDev
from testing.gpu_pool import MARKER, count_polls, free_after_a_wait

GPU = "gpu"
WAIT_S = 3.0  # how long a step waits: another run keeps the slot that long after it asked


def _instance(home: Path) -> DagsterInstance:
    return DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def _started_run(instance: DagsterInstance, job: str = "pairs_job", partition: str = "2026|001") -> DagsterRun:
    """A run as the run storage records one that started (as its run worker reports it)."""
    run = instance.add_run(DagsterRun(job_name=job, tags={"dagster/partition": partition}))
    started = DagsterEvent(DagsterEventType.RUN_START.value, job_name=job)
    instance.report_dagster_event(started, run_id=run.run_id)
    return instance.get_run_by_id(run.run_id)


@pytest.fixture
def home(tmp_path) -> Path:
    """The shipped instance (run monitoring on) with the pool limits set up, gpu = 1."""
    prepare_instance(tmp_path / "dagster_home", Settings(gpu_slots=1))
    return tmp_path / "dagster_home"


def test_a_waiting_step_is_told_who_holds_the_slot_and_how_a_dead_holder_frees_it(home):
    with _instance(home) as instance:
        holder = _started_run(instance)
        waiting = _started_run(instance, "long_captions_job", "2026|002")
        assert instance.event_log_storage.claim_concurrency_slot(GPU, holder.run_id, "pairs").is_claimed
        assert not instance.event_log_storage.claim_concurrency_slot(GPU, waiting.run_id, "long_captions").is_claimed

        line = describe_wait(instance, GPU, waiting.run_id, "long_captions")
        assert line.startswith("long_captions waits for pool gpu (limit 1, 1 taken): held by run ")
        assert f"run {holder.run_id} (step pairs, partition 2026|001; STARTED for " in line
        assert "free-slots" not in line  # a live holder is not to be freed

        instance.report_run_failed(holder)  # what the code server does when the run worker died
        line = describe_wait(instance, GPU, waiting.run_id, "long_captions")
        assert f"run {holder.run_id} (step pairs, partition 2026|001; FAILURE, ended " in line
        # the shipped file's run monitoring: 60 s after the end, checked every 30 s
        assert "run monitoring frees it 60s after the run's end (checked every 30s" in line
        assert f"`python -m jobs.cli free-slots {holder.run_id}`" in line
        assert [h.run_id for h in holders(instance, GPU)] == [holder.run_id]


def test_free_slots_refuses_a_run_in_progress_unless_forced(home):
    with _instance(home) as instance:
        run = _started_run(instance)
        assert instance.event_log_storage.claim_concurrency_slot(GPU, run.run_id, "pairs").is_claimed
        with pytest.raises(RunStillActive, match="is STARTED: free its slots only if its process is dead"):
            free_slots(instance, run.run_id)
        assert [h.run_id for h in holders(instance, GPU)] == [run.run_id]
        # a command-line run killed with -9: nothing else would ever end it
        held = free_slots(instance, run.run_id, force=True)
        assert [(pool, h.step_key) for pool, h in held] == [(GPU, "pairs")]
        assert holders(instance, GPU) == []
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
        assert "pool gpu: limit 1, 0 taken, 0 waiting" in pools_report(instance)


def test_the_command_line_lists_holders_and_frees_a_dead_runs_slot(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with _instance(home) as instance:
        run = _started_run(instance)
        assert instance.event_log_storage.claim_concurrency_slot(GPU, run.run_id, "pairs").is_claimed
        instance.report_run_failed(run)
    assert main(["pools"]) == 0
    out = capsys.readouterr().out
    assert "pool gpu: limit 1, 1 taken, 0 waiting" in out
    assert f"held by run {run.run_id} (step pairs, partition 2026|001; FAILURE, ended " in out
    assert "<- ended: free with python -m jobs.cli free-slots" in out
    assert main(["free-slots", run.run_id]) == 0
    assert capsys.readouterr().out.strip() == f"run {run.run_id}: freed pairs in pool gpu"
    with _instance(home) as instance:
        assert holders(instance, GPU) == []


def _gpu_pool_env(tmp_path: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "DAGSTER_HOME": str(home), MARKER: str(tmp_path / "hold_gpu.pids"), "PYTHONPATH": str(REPO)}


@pytest.mark.e2e
def test_a_command_line_materialization_says_at_info_which_run_holds_the_pool(home, tmp_path):
    """``dagster asset materialize`` runs without the run queue: its step waits inside the run.
    It printed only Dagster's DEBUG "Step blocked by limit for pool gpu" (every 5 minutes)."""
    with _instance(home) as instance:
        holder = _started_run(instance, "long_captions_job", "2026|003")
        assert instance.event_log_storage.claim_concurrency_slot(GPU, holder.run_id, "long_captions").is_claimed
    cli = subprocess.Popen(
        [DAGSTER, "asset", "materialize", "-m", "testing.gpu_pool", "--select", "use_gpu"],
        cwd=REPO,
        env=_gpu_pool_env(tmp_path, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(cli.stdout), daemon=True)
    reader.start()
    try:
        _wait(lambda: any("use_gpu waits for pool gpu" in line for line in lines), 240, "no INFO line", lambda: lines)
        told = next(line for line in lines if "use_gpu waits for pool gpu" in line)
        assert " - INFO - " in told
        expected = f"use_gpu waits for pool gpu (limit 1, 1 taken): held by run {holder.run_id} (step long_captions"
        assert expected in told and "partition 2026|003; STARTED for " in told
        with _instance(home) as instance:  # the holder was a command-line run killed with -9: by hand
            assert [pool for pool, _ in free_slots(instance, holder.run_id, force=True)] == [GPU]
        assert cli.wait(timeout=240) == 0, "".join(lines[-40:])
    finally:
        if cli.poll() is None:
            cli.kill()
        reader.join(timeout=10)
    assert any("RUN_SUCCESS" in line for line in lines)


@pytest.mark.e2e
def test_a_multiprocess_run_waiting_for_the_slot_sleeps_until_it_is_free(home, monkeypatch):
    """The multiprocess executor (the cluster profile's: a process per step) asked for the slot in a
    loop with no pause at all; ``tests/assets/test_pool_waits.py`` runs the in-process one."""
    with_pool_waits()  # what every job's executor installs
    repository = ReconstructableRepository.for_module("testing.gpu_pool", "defs", str(REPO))
    with _instance(home) as instance:
        holder = _started_run(instance)
        assert instance.event_log_storage.claim_concurrency_slot(GPU, holder.run_id, "pairs").is_claimed
        polls = count_polls(monkeypatch)
        release = free_after_a_wait(instance, holder.run_id, WAIT_S)
        started = time.monotonic()
        with execute_job(
            repository.get_reconstructable_job("cpu_then_gpu_job"),
            instance,
            run_config={"execution": {"config": {"multiprocess": {}}}},
        ) as result:
            assert result.success
        took = time.monotonic() - started
        release.join()
        assert holders(instance, GPU) == []
    assert took >= WAIT_S
    # while gpu_after_cpu waited: a turn at most every NAP_S, and 50 a second (Dagster's queue
    # timeout) while cpu_first's process exited; without the pause ~100,000 turns a second
    assert 0 < polls[0] <= 10 * took, polls[0]


@pytest.mark.e2e
def test_a_run_killed_with_minus_9_gives_the_gpu_slot_to_the_waiting_runs(tmp_path):
    """``dagster dev`` on the shipped instance file, with run monitoring's intervals shortened to
    1 s: run A holds the gpu slot; run B (its only step in the pool) waits in the run queue; run C
    starts and its gpu step waits inside it, saying so at INFO; A's processes are killed with -9;
    B and C get the slot (before: both waited for ever)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = yaml.safe_load(INSTANCE_FILE.read_text())
    assert config["run_monitoring"]["enabled"] is True
    config["run_monitoring"].update(poll_interval_seconds=1, free_slots_after_run_end_seconds=1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    prepare_instance(home, Settings(gpu_slots=1))
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        yaml.safe_dump(
            {"load_from": [{"python_module": {"module_name": "testing.gpu_pool", "working_directory": str(REPO)}}]}
        )
    )
    marker = tmp_path / "hold_gpu.pids"
    location = {"repositoryLocationName": "testing.gpu_pool", "repositoryName": "__repository__"}
    dev = DagsterDev(
        _gpu_pool_env(tmp_path, home), tmp_path / "dagster_dev.log", workspace=workspace, location=location
    )
    try:
        dev.wait_ready()
        holder = dev.launch("hold_gpu_job")
        _wait(lambda: marker.exists() and len(marker.read_text().split()) == 2, 240, "hold_gpu never started", dev.tail)
        queued = dev.launch("use_gpu_job")
        waiting = dev.launch("cpu_then_gpu_job")

        def told() -> list[str]:
            return [m for level, m in dev.run_messages(waiting) if level == "INFO" and "waits for pool gpu" in m]

        _wait(told, 240, "the waiting run never said who holds the pool", dev.tail)
        assert told()[0].startswith(f"gpu_after_cpu waits for pool gpu (limit 1, 1 taken): held by run {holder} ")
        assert "(step hold_gpu; STARTED for " in told()[0]
        assert _status(dev, queued) == "QUEUED"  # the queue holds a run whose first step has no slot

        for pid in map(int, marker.read_text().split()):  # the step's process and its run worker
            os.kill(pid, signal.SIGKILL)
        killed = time.time()
        assert dev.wait_run(waiting, timeout=300) == "SUCCESS", dev.tail()
        assert dev.wait_run(queued, timeout=300) == "SUCCESS", dev.tail()
        print(f"both waiting runs finished {time.time() - killed:.1f}s after the kill")
        assert dev.wait_run(holder, timeout=60) == "FAILURE"
    finally:
        dev.stop()
    with _instance(home) as instance:
        assert holders(instance, GPU) == []


def _status(dev: DagsterDev, run_id: str) -> str:
    return dev.gql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=run_id)["runOrError"][
        "status"
    ]


def _wait(ready, timeout: float, what: str, tail) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert time.time() < deadline, f"{what}\n{tail()}"
        time.sleep(1)
