"""A launched job in miniature, and the template for real training jobs.

``python -m pipelines.launch_selftest --config <url>`` counts ``steps`` steps from the last
checkpoint in the run dir (or from 0), writes a checkpoint after every step, reports a metric per
step and a final report. With ``fail_at_step: k`` it exits non-zero after checkpointing step
``k - 1``, once: a marker file in the run dir records the failure, so the next launch resumes at
step ``k`` and finishes, as a preempted training job would.

Config: ``{"steps": N, "fail_at_step": k | null, "sleep_s": 0.0, "heartbeat_s": 30, "launch": {...}}`` (the launcher
adds ``launch``: ``run_id``, ``run_dir``, ``gpus``, ``dagster_run_id``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import fsspec

from pipelines.launch import (
    atomic_write,
    checkpoint_step,
    latest_checkpoint,
    load_config,
    log,
    read_bytes,
    report_final,
    report_progress,
    save_checkpoint,
    session,
)
from pipelines.stage import PROGRESS_INTERVAL_S

FAILED_MARKER = "failed-once.marker"
EXIT_INJECTED = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the job's JSON config (path or fsspec URL)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    launch = config["launch"]
    run_dir, ckpt_dir = launch["run_dir"], f"{launch['run_dir']}/checkpoints"
    steps, fail_at = int(config.get("steps", 5)), config.get("fail_at_step")

    with session(float(config.get("heartbeat_s", PROGRESS_INTERVAL_S))):
        last = latest_checkpoint(ckpt_dir)
        if last is None:
            start, total = 0, 0.0
        else:
            state = json.loads(read_bytes(last))
            start, total = checkpoint_step(last) + 1, state["total"]
        log(f"selftest run {launch['run_id']} starts at step {start} of {steps} (resumed from {last})")
        marker = f"{run_dir}/{FAILED_MARKER}"
        for step in range(start, steps):
            if fail_at is not None and step == int(fail_at) and not fsspec.core.url_to_fs(marker)[0].exists(marker):
                atomic_write(marker, f"failed at step {step}\n".encode())
                log(f"injected failure at step {step}", level="error")
                return EXIT_INJECTED
            time.sleep(float(config.get("sleep_s", 0.0)))
            total += step
            save_checkpoint(ckpt_dir, step, json.dumps({"step": step, "total": total}).encode(), suffix="json")
            report_progress(step, {"loss": 1.0 / (step + 1), "total": total})
        report_final(
            {"start_step": start, "steps": steps, "total": total, "run_id": launch["run_id"]},
            run_dir_url=run_dir,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
