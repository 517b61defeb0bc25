"""A launched job in miniature, and the template for real training jobs.

``python -m pipelines.launch_selftest --config <url>`` counts ``steps`` steps from the last
checkpoint in the run dir (or from 0), writes a checkpoint after every step, reports a metric per
step and a final report. With ``fail_at_step: k`` it exits non-zero after checkpointing step
``k - 1``, once: a marker file in the run dir records the failure, so the next launch resumes at
step ``k`` and finishes, as a preempted training job would.

Config (:class:`SelftestConfig`, strict like every job's): ``{"steps": N, "fail_at_step": k | null,
"sleep_s": 0.0, "heartbeat_s": 30}``; the launcher adds its ``launch`` section (``run_id``,
``run_dir``, ...). The entry point is ``pipelines.launch.main``, as for every launched job.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import fsspec

from pipelines.core.stage import PROGRESS_INTERVAL_S
from pipelines.launch import (
    JobConfig,
    LaunchInfo,
    atomic_write,
    checkpoint_step,
    latest_checkpoint,
    log,
    main,
    read_bytes,
    report_final,
    report_progress,
    save_checkpoint,
)

FAILED_MARKER = "failed-once.marker"
EXIT_INJECTED = 3


@dataclass(frozen=True)
class SelftestConfig(JobConfig):
    steps: int = 5
    fail_at_step: int | None = None
    sleep_s: float = 0.0
    heartbeat_s: float = PROGRESS_INTERVAL_S

    JOB = "selftest"

    def heartbeat_interval(self) -> float:
        return self.heartbeat_s


def run(config: SelftestConfig, job: LaunchInfo) -> int:
    if job.run_dir is None:
        raise ValueError("the selftest runs under the job launcher: its config needs the launch section")
    run_dir, ckpt_dir = job.run_dir, f"{job.run_dir}/checkpoints"
    last = latest_checkpoint(ckpt_dir)
    if last is None:
        start, total = 0, 0.0
    else:
        state = json.loads(read_bytes(last))
        start, total = checkpoint_step(last) + 1, state["total"]
    log(f"selftest run {job.run_id} starts at step {start} of {config.steps} (resumed from {last})")
    marker = f"{run_dir}/{FAILED_MARKER}"
    for step in range(start, config.steps):
        fail = config.fail_at_step is not None and step == config.fail_at_step
        if fail and not fsspec.core.url_to_fs(marker)[0].exists(marker):
            atomic_write(marker, f"failed at step {step}\n".encode())
            log(f"injected failure at step {step}", level="error")
            return EXIT_INJECTED
        time.sleep(config.sleep_s)
        total += step
        save_checkpoint(ckpt_dir, step, json.dumps({"step": step, "total": total}).encode(), suffix="json")
        report_progress(step, {"loss": 1.0 / (step + 1), "total": total})
    report_final(
        {"start_step": start, "steps": config.steps, "total": total, "run_id": job.run_id}, run_dir_url=run_dir
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(SelftestConfig, run, description=__doc__.splitlines()[0]))
