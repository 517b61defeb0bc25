"""A run whose step waits for a pool slot sleeps while it waits (``jobs.pools.pace_waiting_runs``).

Before, Dagster's executors asked "can a step go?" in a loop that never slept: a run waiting behind
another run's GPU step held a whole core for as long as it waited. The in-process executor is run
here (what the demo profile and ``materialize`` use); the multiprocess one, which starts a process
per step, in ``tests/e2e/test_run_monitoring.py``.
"""

from __future__ import annotations

import time

from dagster import DagsterInstance, materialize
from dagster._core.instance.ref import InstanceRef

from jobs.instance import prepare_instance
from jobs.pools import NAP_S, holders, with_pool_waits
from resources.settings import Settings
from testing.gpu_pool import count_polls, cpu_first, free_after_a_wait, gpu_after_cpu

WAIT_S = 3.0  # how long the step waits: another run keeps the slot that long after it asked


def test_a_step_waiting_for_the_gpu_slot_sleeps_until_it_is_free(tmp_path, monkeypatch):
    with_pool_waits("in_process")  # what every job's executor installs
    home = tmp_path / "dagster_home"
    prepare_instance(home, Settings(gpu_slots=1))
    with DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert instance.event_log_storage.claim_concurrency_slot("gpu", "another-run", "pairs").is_claimed
        polls = count_polls(monkeypatch)
        release = free_after_a_wait(instance, "another-run", WAIT_S)
        started = time.monotonic()
        result = materialize([cpu_first, gpu_after_cpu], instance=instance)
        took = time.monotonic() - started
        release.join()
        assert result.success
        assert holders(instance, "gpu") == []  # the step got the slot, then gave it back
    assert took >= WAIT_S
    # a turn of the executor's loop at most every NAP_S while the step waited (Dagster asks for
    # the slot after 1 s, 1.1 s, 1.21 s, ...); without the pause it turned ~100,000 times a second
    assert 0 < polls[0] <= took / NAP_S + 5, polls[0]
