"""A code location of assets in the ``gpu`` pool, for the tests of what happens to a pool's slot
when the run holding it dies (``tests/e2e/test_run_monitoring.py``): ``hold_gpu`` takes the slot and
sleeps until it is killed; ``use_gpu`` only needs the slot (a run of it alone waits in Dagster's
run queue); ``gpu_after_cpu`` needs it after a step outside the pool (its run starts, and the step
waits inside it, as a command-line materialization does). Nothing heavy is imported, so the code
server starts in seconds; the executor is the one ``jobs.definitions`` gives every job."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dagster import Definitions, asset, define_asset_job

from jobs.pools import with_pool_waits
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
