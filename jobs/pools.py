"""Who holds a pool's slots: said in the run log of a step that waits, by ``jobs.cli pools``, and
freed by ``jobs.cli free-slots`` when the holder is dead.

Dagster records a step that waits for a pool only as a DEBUG engine event ("Step blocked by limit
for pool gpu"), at the first refusal and then every 5 minutes, naming neither the run that holds
the slot nor whether that run is still alive: a run killed with -9 keeps its slot until run
monitoring (``deploy/dagster.yaml``) or a person frees it, and the waiting run looked stuck for
no reason. :func:`with_pool_waits` wraps the executor of every job so that each of those events
is followed by an INFO line that says who holds the pool and what to do about a dead holder.

While it waits, the step's run also no longer spins a core (:func:`pace_waiting_runs`): Dagster's
executors poll for the slot in a loop that never sleeps.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance, ExecutorDefinition, Field
from dagster._core.definitions.executor_definition import multi_or_in_process_executor
from dagster._core.events import DagsterEvent
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster._core.execution.plan.active import ActiveExecution
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.executor.base import Executor
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG

FREE_SLOTS = "python -m jobs.cli free-slots"
IN_PROGRESS = {DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING}


@dataclass(frozen=True)
class Holder:
    """A slot of a pool and the run that holds it, as the run storage knows it."""

    run_id: str
    step_key: str
    status: str | None  # None: the run is not in this instance's run storage
    partition: str | None
    started: float | None
    ended: float | None

    @property
    def dead(self) -> bool:
        """The run ended (or is unknown) and still holds the slot: nothing will give it back but
        run monitoring or a person."""
        return self.status is None or DagsterRunStatus(self.status) not in IN_PROGRESS

    def describe(self, now: float) -> str:
        where = ", ".join(p for p in (f"step {self.step_key}", self.partition and f"partition {self.partition}") if p)
        if self.status is None:
            return f"run {self.run_id} ({where}; not in this instance's runs)"
        if self.dead:
            ended = f", ended {_ago(now - self.ended)}" if self.ended else ""
            return f"run {self.run_id} ({where}; {self.status}{ended})"
        since = f" for {_ago(now - self.started, suffix='')}" if self.started else ""
        return f"run {self.run_id} ({where}; {self.status}{since})"


def holders(instance: DagsterInstance, pool: str) -> list[Holder]:
    """Every claimed slot of ``pool`` with its run's status."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    found = []
    for slot in info.claimed_slots:
        record = instance.get_run_record_by_id(slot.run_id)
        run = record.dagster_run if record else None
        found.append(
            Holder(
                run_id=slot.run_id,
                step_key=slot.step_key,
                status=run.status.value if run else None,
                partition=run.tags.get(PARTITION_NAME_TAG) if run else None,
                started=record.start_time if record else None,
                ended=record.end_time if record else None,
            )
        )
    return found


def describe_wait(instance: DagsterInstance, pool: str, run_id: str, step_key: str) -> str:
    """One line for the run log of a step of ``run_id`` waiting for ``pool``: the limit, who holds
    the slots, how many steps queue ahead, and how a dead holder's slot comes back."""
    now = time.time()
    info = instance.event_log_storage.get_concurrency_info(pool)
    taken = holders(instance, pool)
    line = f"{step_key} waits for pool {pool} (limit {info.slot_count}, {len(taken)} taken)"
    if info.slot_count == 0:
        return f"{line}: the limit is 0, so nothing in this pool runs; set it with `python -m jobs.cli setup-instance`"
    line += (": held by " + "; ".join(h.describe(now) for h in taken)) if taken else ": no run holds a slot now"
    ahead = _queued_ahead(info.pending_steps, run_id, step_key)
    if ahead:
        line += f"; {len(ahead)} waiting step(s) ahead of this one"
    dead = [h for h in taken if h.dead]
    if dead:
        line += ". " + dead_holder_advice(instance, dead)
    return line


def _queued_ahead(pending: list, run_id: str, step_key: str) -> list:
    """Waiting steps that get a freed slot before this one: higher priority, or the same and
    enqueued earlier (Dagster's order)."""

    def order(p) -> tuple[int, float]:
        return -(p.priority or 0), p.enqueued_timestamp.timestamp()

    mine = next((p for p in pending if (p.run_id, p.step_key) == (run_id, step_key)), None)
    waiting = [p for p in pending if p.assigned_timestamp is None and p is not mine]
    return waiting if mine is None else [p for p in waiting if order(p) < order(mine)]


def dead_holder_advice(instance: DagsterInstance, dead: list[Holder]) -> str:
    """How the slots of runs that ended come back: by run monitoring, or by hand now."""
    settings = instance.run_monitoring_settings
    after = settings.get("free_slots_after_run_end_seconds") if instance.run_monitoring_enabled else None
    commands = " and ".join(f"`{FREE_SLOTS} {h.run_id}`" for h in dead)
    if after:
        poll = instance.run_monitoring_poll_interval_seconds
        return (
            f"A run that ended still holds a slot: run monitoring frees it {after}s after the run's end "
            f"(checked every {poll}s, while the daemon runs); to free it now: {commands}"
        )
    return (
        "A run that ended still holds a slot and this instance does not free such slots by itself "
        f"(run_monitoring.free_slots_after_run_end_seconds is not set; deploy/dagster.yaml sets it): {commands}"
    )


def pools_report(instance: DagsterInstance) -> str:
    """Every pool: its limit, the runs holding its slots, the steps waiting (``jobs.cli pools``)."""
    now = time.time()
    lines = []
    for limit in sorted(instance.event_log_storage.get_pool_limits(), key=lambda p: p.name):
        info = instance.event_log_storage.get_concurrency_info(limit.name)
        taken = holders(instance, limit.name)
        waiting = [p for p in info.pending_steps if p.assigned_timestamp is None]
        lines.append(f"pool {limit.name}: limit {info.slot_count}, {len(taken)} taken, {len(waiting)} waiting")
        lines += [
            f"  held by {h.describe(now)}" + ("  <- ended: free with " + FREE_SLOTS if h.dead else "") for h in taken
        ]
        lines += [
            f"  waiting: run {p.run_id} step {p.step_key} since {_ago(now - p.enqueued_timestamp.timestamp())}"
            for p in sorted(waiting, key=lambda p: p.enqueued_timestamp)
        ]
    return "\n".join(lines) if lines else "no pools are set: run `python -m jobs.cli setup-instance`"


class RunStillActive(RuntimeError):  # noqa: N818 (a refusal, said to the person)
    """The run is in progress as far as the instance knows: freeing its slots needs ``force``."""


def free_slots(instance: DagsterInstance, run_id: str, force: bool = False) -> list[tuple[str, Holder]]:
    """Free every pool slot ``run_id`` holds; returns what was held, as (pool, holder).

    A run in progress keeps its slots unless ``force``: then it is first marked failed, because
    its process is gone (a command-line run killed with -9 is never noticed by Dagster: no run
    launcher watches it), so nothing else would ever end it.
    """
    pools = [limit.name for limit in instance.event_log_storage.get_pool_limits()]
    held = [(pool, h) for pool in pools for h in holders(instance, pool) if h.run_id == run_id]
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status in IN_PROGRESS:
        if not force:
            raise RunStillActive(
                f"run {run_id} is {run.status.value}: free its slots only if its process is dead (kill -9, an OOM "
                "kill, a lost node); --force marks it failed and frees them"
            )
        instance.report_run_failed(run, f"marked failed by `{FREE_SLOTS} --force`: its process was gone")
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return held


# ---- the run log line -----------------------------------------------------------------------


def _blocked_pool(event: DagsterEvent) -> str | None:
    """The pool of Dagster's "Step (still) blocked by limit for pool ..." engine event, else None."""
    if event.event_type != DagsterEventType.ENGINE_EVENT or not event.step_key:
        return None
    pool = event.engine_event_data.metadata.get("pool") if event.engine_event_data else None
    return getattr(pool, "value", None) if pool is not None else None


class PoolWaitReporter(Executor):
    """Runs ``inner`` and writes :func:`describe_wait` at INFO into the run log after each of its
    pool-blocked events (at the first refusal, then every 5 minutes while the step waits)."""

    def __init__(self, inner: Executor):
        self.inner = inner

    @property
    def retries(self):
        return self.inner.retries

    @property
    def step_dependency_config(self):
        return self.inner.step_dependency_config

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        for event in self.inner.execute(plan_context, execution_plan):
            yield event
            pool = _blocked_pool(event)
            if pool is None:
                continue
            try:
                line = describe_wait(plan_context.instance, pool, plan_context.run_id, event.step_key)
            except Exception as exc:  # noqa: BLE001 - a log line must never fail the run
                line = f"{event.step_key} waits for pool {pool} (its holders could not be read: {exc})"
            plan_context.log.info(line)


# ---- waiting without spinning ------------------------------------------------------------------

NAP_S = 1.0  # the longest pause: a run's termination and Dagster's "still blocked" events stay prompt


def _seconds_until_a_step_may_go(active: ActiveExecution) -> float:
    """How long nothing can start: until the first pool claim Dagster will try again (it backs off
    from 1 s to 15 s and does not ask before) or the first step retry's delay ends. 0 when no
    step waits on either (the run is finishing, or a step is ready)."""
    due = list(getattr(active, "_waiting_to_retry", {}).values())
    claims = getattr(active, "_instance_concurrency_context", None)
    if claims is not None and claims.has_pending_claims():
        due += list(getattr(claims, "_pending_timeouts", {}).values())
    return max(0.0, min(due) - time.time()) if due else 0.0


def pace_waiting_runs() -> None:
    """Make a run whose steps all wait (for a pool slot, or a retry's delay) sleep until one may go.

    Dagster 1.13's executors poll in a loop that never sleeps while a step waits for a pool slot:
    the multiprocess executor has no pause at all, and the in-process one pauses for
    ``interval_to_next_pending_claim_check()``, which is ``min([0, ...])``, always 0. So a run
    waiting behind another run's GPU step held a whole core for as long as it waited (20.0 s of CPU
    in 20 s, measured on a command-line materialization), and a backfill's waiting runs starved
    the CPU work of the runs that held the GPUs. The slot is asked for again only when Dagster's
    own back-off says so, so a pause until then (at most ``NAP_S``) loses nothing.

    Installed once per process by :func:`with_pool_waits` (every job's executor), on Dagster's
    ``ActiveExecution``, which both executors use; a step in flight or a step ready is never
    delayed. ``tests/assets/test_pool_waits.py`` (in-process) and ``tests/e2e/test_run_monitoring.py``
    (multiprocess) fail if a Dagster upgrade bypasses it."""
    get_steps = ActiveExecution.get_steps_to_execute
    if getattr(get_steps, "paced", False):
        return

    @functools.wraps(get_steps)
    def get_steps_to_execute(self: ActiveExecution, limit: int | None = None):
        steps = get_steps(self, limit)
        if not steps and not self.has_in_flight_steps:
            pause = min(NAP_S, _seconds_until_a_step_may_go(self))
            if pause > 0:
                time.sleep(pause)
        return steps

    get_steps_to_execute.paced = True
    ActiveExecution.get_steps_to_execute = get_steps_to_execute


def with_pool_waits(mode: str = "multiprocess") -> ExecutorDefinition:
    """Dagster's default executor (a process per step, or every step in the run's process) whose
    runs say at INFO who holds the pool a step waits for; same name, config and requirements.
    ``mode`` is what a run without executor config gets (``PANELFORGE_EXECUTOR``): on one small
    machine a process per step costs an import of torch and Dagster each (~5 s on 2 cores), more
    than most of the demo's steps compute; a run config may still choose either."""
    base = multi_or_in_process_executor  # ``mode`` was validated with the settings (PANELFORGE_EXECUTOR)
    pace_waiting_runs()

    def create(init_context) -> Executor:
        return PoolWaitReporter(base.executor_creation_fn(init_context))

    return ExecutorDefinition(
        name=base.name,
        config_schema=Field(base.config_schema.config_type, default_value={mode: {}}),
        requirements=base.get_requirements,
        executor_creation_fn=create,
        description=base.description,
    )


def _ago(seconds: float, suffix: str = " ago") -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s{suffix}"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min{suffix}"
    return f"{seconds / 3600:.1f} h{suffix}"
