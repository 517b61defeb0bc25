"""``jobs.ui.end_runs_of``: when ``make ui`` had to kill its processes, the runs they were executing
are marked failed and give back their pool slots; a run another process executes is left alone.

Before, the function read a ``pid`` off each event-log entry, which Dagster keeps on the entry's
``dagster_event``: every stop that found a run still in progress failed with an AttributeError and
left that run STARTED, holding its GPU slot (seen only when the run outlived the grace period).
"""

from __future__ import annotations

import os

from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.events import DagsterEvent, DagsterEventType, EngineEventData
from dagster._core.events.log import EventLogEntry
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.dagster_run import DagsterRun

from jobs.instance import prepare_instance
from jobs.pools import holders
from jobs.ui import end_runs_of
from resources.settings import Settings

OURS, THEIRS = 4242, 4343  # pids of a killed `make ui` process and of a terminal's run


def _started_run(instance: DagsterInstance, run_id: str, pid: int) -> None:
    """A run STARTED by process ``pid`` that holds a ``gpu`` slot, as a run worker leaves it."""
    instance.add_run(DagsterRun(job_name="hold_gpu_job", run_id=run_id, status=DagsterRunStatus.STARTED))
    event = DagsterEvent(
        event_type_value=DagsterEventType.ENGINE_EVENT.value,
        job_name="hold_gpu_job",
        event_specific_data=EngineEventData(),
        pid=pid,
    )
    instance.store_event(
        EventLogEntry(
            error_info=None,
            level="INFO",
            user_message="started",
            run_id=run_id,
            timestamp=1.0,
            job_name="hold_gpu_job",
            dagster_event=event,
        )
    )
    assert instance.event_log_storage.claim_concurrency_slot("gpu", run_id, "hold_gpu").is_claimed


def test_the_runs_of_the_killed_processes_fail_and_free_their_slots(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    prepare_instance(home, Settings(gpu_slots=2))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        _started_run(instance, "run-of-the-ui", OURS)
        _started_run(instance, "run-of-a-terminal", THEIRS)

    lines = end_runs_of({OURS, os.getpid()})

    assert lines == ["run run-of-the-ui (hold_gpu_job): marked failed, freed 1 pool slot(s)"]
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert instance.get_run_by_id("run-of-the-ui").status == DagsterRunStatus.FAILURE
        assert instance.get_run_by_id("run-of-a-terminal").status == DagsterRunStatus.STARTED
        assert [h.run_id for h in holders(instance, "gpu")] == ["run-of-a-terminal"]
