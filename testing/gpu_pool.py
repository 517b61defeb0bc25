"""A code location of assets in the ``gpu`` pool, for the tests of what happens to a pool's slot
when the run holding it dies (``tests/e2e/test_run_monitoring.py``): ``hold_gpu`` takes the slot and
sleeps until it is killed; ``use_gpu`` only needs the slot (a run of it alone waits in Dagster's
run queue); ``gpu_after_cpu`` needs it after a step outside the pool (its run starts, and the step
waits inside it, as a command-line materialization does). Nothing heavy is imported, so the code
server starts in seconds; the executor is the one ``jobs.definitions`` gives every job.
``count_polls`` and ``free_after_a_wait`` check that a run whose step waits for the slot sleeps
instead of asking again at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from dagster import DagsterInstance, Definitions, asset, define_asset_job
from dagster._core.execution.plan.active import ActiveExecution

from jobs.pools import free_slots, with_pool_waits
from pipelines.core.stage import GPU_POOL

MARKER = "PANELFORGE_TEST_GPU_MARKER"  # where hold_gpu writes "<its pid> <its run worker's pid>"


@asset(pool=GPU_POOL)
def hold_gpu() -> None:
    """Holds the slot: says which processes to kill, then sleeps until they are killed."""
    Path(os.environ[MARKER]).write_text(f"{os.getpid()} {os.getppid()}")
    time.sleep(3600)


@asset(pool=GPU_POOL)
def use_gpu() -> int:
    return 1


@asset
def cpu_first() -> int:
    return 1


@asset(pool=GPU_POOL)
def gpu_after_cpu(cpu_first: int) -> int:
    return cpu_first + 1


defs = Definitions(
    assets=[hold_gpu, use_gpu, cpu_first, gpu_after_cpu],
    jobs=[
        define_asset_job("hold_gpu_job", [hold_gpu]),
        define_asset_job("use_gpu_job", [use_gpu]),
        define_asset_job("cpu_then_gpu_job", [cpu_first, gpu_after_cpu]),
    ],
    executor=with_pool_waits(),
)


def count_polls(monkeypatch) -> list[int]:
    """A one-item list counting the turns of an executor's loop in this process while a step of
    its run waits for a pool slot (Dagster's ``ActiveExecution._update`` runs once a turn)."""
    polls = [0]
    update = ActiveExecution._update

    def counted(self):
        claims = self._instance_concurrency_context
        polls[0] += bool(claims is not None and claims.has_pending_claims())
        return update(self)

    monkeypatch.setattr(ActiveExecution, "_update", counted)
    return polls


def free_after_a_wait(instance: DagsterInstance, holder: str, seconds: float) -> threading.Thread:
    """A started thread that frees ``holder``'s slots ``seconds`` after a step of another run has
    begun to wait for the gpu pool (so the step waits that long, however slow its run starts)."""

    def waiting() -> bool:
        pending = instance.event_log_storage.get_concurrency_info(GPU_POOL).pending_steps
        return any(p.run_id != holder and p.assigned_timestamp is None for p in pending)

    def run() -> None:
        deadline = time.monotonic() + 120
        while not waiting() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(seconds)
        free_slots(instance, holder, force=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
