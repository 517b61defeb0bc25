"""``make ui [PORT=3000]``: ``dagster dev`` on the demo's instance, offline, and nothing left
running when it stops.

Offline: the demo profile reads the sample mirror from disk (built here when ``make demo`` has not
run yet) and answers E-utilities from the recordings in ``sample/entrez``, served on loopback for
each step that asks (``resources/eutils.py``); the models are the tiny random ones. So the
command-line refresh of docs/partitions.md (``jobs.cli add-release 2027``, then materialize) runs here
without a network.

Nothing left behind: ``dagster dev`` leaves its code servers, and the run workers they started,
running after it exits while a run is in progress (the code server waits for the run, which may
wait for ever for a pool), and a closed terminal (SIGHUP) kills ``dagster dev`` alone. Here it
runs in a process group of its own: stopping this command (Ctrl-C, SIGTERM, SIGHUP) interrupts
the whole group as Ctrl-C would, kills what is left after a grace period, then marks the runs
that group was executing as failed and gives back their pool slots, so the next start finds no
run that can never end.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRACE_S = 60.0  # Dagster's own shutdown: a run worker reports its run interrupted, servers stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=3000, help="the web server's port (default 3000)")
    parser.add_argument("--host", default="127.0.0.1", help="the address it listens on (default 127.0.0.1)")
    parser.add_argument("--workspace", type=Path, default=REPO / "workspace.yaml", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    from resources.settings import DEMO_DIR

    os.environ.setdefault("PANELFORGE_PROFILE", "demo")
    os.environ.setdefault("DAGSTER_HOME", str(DEMO_DIR / "dagster_home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if (busy := _port_in_use(args.host, args.port)) is not None:
        print(f"port {args.port} on {args.host} is in use ({busy}): choose another, e.g. make ui PORT={args.port + 1}")
        return 2

    from jobs.instance import prepare_instance
    from resources.settings import Settings

    settings = Settings.from_env()
    home = Path(os.environ["DAGSTER_HOME"])
    limits = prepare_instance(home, settings)
    print(f"Dagster instance: {home} (pools: {', '.join(f'{k} {v}' for k, v in limits.items())})")
    for line in _what_is_served(settings):
        print(line)
    print(
        "From another terminal (the command-line refresh of docs/partitions.md):\n"
        f"  export DAGSTER_HOME={home} PANELFORGE_PROFILE={settings.profile} HF_HUB_OFFLINE=1"
    )
    session = UiSession(args.workspace, args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    session.start()
    print(f"Open http://{args.host}:{args.port} (Ctrl-C stops it)", flush=True)
    try:
        while not stop.wait(1.0):
            if session.proc.poll() is not None:
                print(f"dagster dev exited with code {session.proc.returncode}", file=sys.stderr)
                break
    finally:
        for line in session.stop():
            try:
                print(line, flush=True)
            except OSError:  # the terminal that started us is gone (SIGHUP)
                pass
    return 0 if stop.is_set() else 1


def _what_is_served(settings) -> list[str]:
    """Where the demo's external services come from; the sample mirror is built if missing."""
    from resources.settings import PROFILE_DEFAULTS

    lines = []
    if settings.pmc_source == PROFILE_DEFAULTS["PANELFORGE_PMC_SOURCE"]["demo"]:
        mirror = Path(settings.pmc_source.removeprefix("file://"))
        if not mirror.is_dir():
            from pipelines.core.atomic_dir import build_dir_once
            from testing.loopback.sample_mirror import build_cloud_mirror

            build_dir_once(mirror, build_cloud_mirror, Path.is_dir)  # whole or not at all
        lines.append(f"PMC source: the sample mirror on disk, {mirror}")
    else:
        lines.append(f"PMC source: {settings.pmc_source}")
    if settings.eutils_recorded:
        lines.append(
            "E-utilities: recorded answers (sample/entrez), served on loopback to each run; NCBI is never asked"
        )
    else:
        lines.append(f"E-utilities: {settings.eutils_url}")
    return lines


def _port_in_use(host: str, port: int) -> str | None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


class UiSession:
    """``dagster dev`` in a process group of its own, and everything it started stopped with it."""

    def __init__(self, workspace: Path, host: str, port: int):
        self.command = [
            str(Path(sys.executable).with_name("dagster")),
            *("dev", "-w", str(workspace), "-h", host, "-p", str(port)),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, cwd=REPO, start_new_session=True)

    def group(self) -> set[int]:
        """The pids of the group now (dagster dev, web server, daemon, code servers, run workers,
        step processes: none of them leaves the group)."""
        import psutil

        self.proc.poll()  # reap dagster dev once it has exited: a zombie is not a process left running
        members = set()
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == self.proc.pid and process.status() != psutil.STATUS_ZOMBIE:
                    members.add(process.pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return members

    def stop(self, grace_s: float = GRACE_S) -> list[str]:
        """Interrupt the group, kill what outlives ``grace_s``, then end the runs it was executing."""
        if self.proc is None:
            return []
        members = self.group()
        _signal_group(self.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = [_command(pid) for pid in self.group()]
        if killed:
            _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        lines = [f"killed, {grace_s:.0f}s after the interrupt: {'; '.join(killed)}"] if killed else []
        return lines + end_runs_of(members)


def _command(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:120] or str(pid)
    except psutil.Error:
        return str(pid)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def end_runs_of(pids: Iterable[int]) -> list[str]:
    """Runs whose events were written by one of ``pids`` (processes that are gone now) and that
    are still in progress or still hold pool slots: mark them failed and free their slots, as run
    monitoring would for a run it saw die. Runs of other processes (a command-line run in another
    terminal) are left alone."""
    from dagster import DagsterInstance, RunsFilter

    from jobs.pools import IN_PROGRESS, free_slots

    pids = set(pids)
    lines = []
    with DagsterInstance.get() as instance:
        in_progress = {r.dagster_run.run_id for r in instance.get_run_records(RunsFilter(statuses=list(IN_PROGRESS)))}
        holding = set(instance.event_log_storage.get_concurrency_run_ids())
        for run_id in sorted(in_progress | holding):
            writers = {entry.dagster_event.pid for entry in instance.all_logs(run_id) if entry.dagster_event}
            if not writers & pids:
                continue
            run = instance.get_run_by_id(run_id)
            failed = run is not None and run.status in IN_PROGRESS
            if failed:
                instance.report_run_failed(run, "`make ui` stopped while this run was in progress")
            freed = free_slots(instance, run_id)
            what = ["marked failed"] if failed else []
            what += [f"freed {len(freed)} pool slot(s)"] if freed else []
            if what:
                lines.append(f"run {run_id} ({run.job_name if run else 'unknown job'}): {', '.join(what)}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
