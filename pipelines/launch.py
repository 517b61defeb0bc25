"""The job side of launched work: what a training or evaluation module uses to report back.

A training asset never trains in the Dagster process: ``resources/launcher.py`` launches
``python -m <module> --config <url>`` as an external job (a subprocess, a Ray job, a Kubernetes
job) through Dagster Pipes. The module calls the helpers here:

* :func:`main` is the whole entry point of a job module: ``main(ConfigClass, run)`` reads the
  JSON config (:func:`load_config`: a local path or any fsspec URL), splits off the ``launch``
  section the launcher adds (:class:`LaunchInfo`: ``run_id``, ``run_dir``, ``checkpoint_dir``,
  ``gpus``, ``dagster_run_id``), builds the config class strictly (:class:`JobConfig`: a key that
  is no field is an error naming it, so a typo never trains with a default), opens the Pipes
  session with its progress heartbeat, and calls ``run(config, launch)``.
* :func:`session` opens Dagster Pipes when the process was launched by Pipes (its
  ``DAGSTER_PIPES_*`` variables are set) and does nothing otherwise, so the same module runs by
  hand; under torchrun only rank 0 reports.
* :func:`log`, :func:`report_progress`, :func:`report_final` stream a log line, a step's metrics
  and the final report into the Dagster run (or print them when there is no Pipes session).
* :func:`checkpoint_dir`, :func:`save_checkpoint`, :func:`latest_checkpoint` keep checkpoints in
  the lake under the run id; every file appears atomically, so a preempted job leaves either the
  whole checkpoint or none, and the next launch resumes from the last whole one;
  :func:`prune_checkpoints` keeps the newest few.

Pipes messages travel the way the launcher's message reader asks: a local file (subprocess), an
fsspec directory of numbered chunks (Ray: ``fsspec_url``), or stdout (Kubernetes pod logs).
This module is plain Python (no Dagster; ``dagster-pipes`` is the dependency-free job-side
library), and it reads only the launch protocol's variables (Pipes' and torchrun's ``RANK``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import IO, Any, ClassVar, Self, TypeVar

import fsspec
from dagster_pipes import (
    PipesBlobStoreMessageWriter,
    PipesBlobStoreMessageWriterChannel,
    PipesContext,
    PipesDefaultMessageWriter,
    PipesEnvVarParamsLoader,
    PipesMessageWriter,
    PipesParams,
    open_dagster_pipes,
)
from fsspec.implementations.local import LocalFileSystem

from pipelines.core.lake import hold_lock, sweep_temporaries
from pipelines.core.stage import PROGRESS_INTERVAL_S, Progress

FSSPEC_URL_KEY = "fsspec_url"  # message params key: write numbered chunks under this fsspec URL
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{8})\.[A-Za-z0-9]+$")
REPORT_FILE = "report.json"
CONFIG_FILE = "config.json"
_job: dict[str, str | None] = {"tmp_dir": None}  # this launched process's staging folder (load_config)


# ----------------------------------------------------------------------------------- the run dir


def checkpoint_dir(workdir_url: str, run_id: str) -> str:
    """Where the checkpoints of run ``run_id`` live: ``<workdir_url>/<run_id>/checkpoints``."""
    return f"{run_dir(workdir_url, run_id)}/checkpoints"


def run_dir(workdir_url: str, run_id: str) -> str:
    """The run's folder in the lake: its config, checkpoints, report and Pipes messages."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise ValueError(f"run id must be a single path segment, got {run_id!r}")
    return f"{workdir_url.rstrip('/')}/{run_id}"


def atomic_write(url: str, data: bytes, tmp_dir: str | None = None) -> None:
    """Write ``data`` to ``url`` so that a reader sees the whole file or none: a local file is
    written in ``tmp_dir`` (default: the job's, from its config's ``launch.tmp_dir``: the lake's
    ``_tmp/``, never among the checkpoints) and renamed into place (``os.replace``; beside the
    target when no folder is known or it is on another file system); what killed writers of the
    same file left there is removed first. An object store gets one PUT of the complete bytes,
    which appears whole."""
    fs, path = fsspec.core.url_to_fs(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    folder, name = os.path.dirname(path), os.path.basename(path)
    os.makedirs(folder, exist_ok=True)
    staging = tmp_dir or _job["tmp_dir"]
    if staging:
        staging = fsspec.core.url_to_fs(staging)[1]
        os.makedirs(staging, exist_ok=True)
        sweep_temporaries(staging, name)
        if os.stat(staging).st_dev != os.stat(folder).st_dev:
            staging = None
    tmp = os.path.join(
        staging or folder, f"{name}.{uuid.uuid4().hex}.tmp" if staging else f".{name}.{uuid.uuid4().hex}.tmp"
    )
    with hold_lock(f"{tmp}.lock") if staging else contextlib.nullcontext():
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def read_bytes(url: str) -> bytes:
    with fsspec.open(url, "rb") as f:
        return f.read()


def save_checkpoint(directory: str, step: int, data: bytes, suffix: str = "pt", tmp_dir: str | None = None) -> str:
    """Write the checkpoint of ``step`` (after the step finished) atomically, staged in ``tmp_dir``
    (default: the job's, see :func:`atomic_write`); returns its URL."""
    if step < 0:
        raise ValueError(f"step must be at least 0, got {step}")
    url = f"{directory.rstrip('/')}/ckpt-{step:08d}.{suffix}"
    atomic_write(url, data, tmp_dir)
    return url


def checkpoint_step(url: str) -> int:
    """The step a checkpoint was written after (from its name ``ckpt-00000012.pt``)."""
    match = CHECKPOINT_RE.match(url.rstrip("/").rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"not a checkpoint name: {url!r}")
    return int(match.group(1))


def latest_checkpoint(directory: str) -> str | None:
    """The URL of the newest whole checkpoint in ``directory``, or None when there is none (a
    first launch). Partial files of a killed writer are hidden temporaries and never match."""
    fs, path = fsspec.core.url_to_fs(directory)
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return None
    found = [(int(m.group(1)), n) for n in names if (m := CHECKPOINT_RE.match(n.rstrip("/").rsplit("/", 1)[-1]))]
    if not found:
        return None
    _, name = max(found)
    base = directory.rstrip("/")
    return f"{base}/{name.rstrip('/').rsplit('/', 1)[-1]}"


def load_config(url: str) -> dict:
    """The job's JSON config (a path or fsspec URL), as the launcher wrote it. Its ``launch``
    section's ``tmp_dir`` becomes where this process's atomic writes stage their bytes."""
    config = json.loads(read_bytes(url))
    _job["tmp_dir"] = (config.get("launch") or {}).get("tmp_dir")
    return config


def prune_checkpoints(directory: str, keep: int, upto: int | None = None) -> list[str]:
    """Delete all but the newest ``keep`` whole checkpoints in ``directory`` (``keep`` < 1 keeps
    them all); returns the URLs removed. With ``upto`` (the step just saved) only checkpoints at
    or before that step count: those after it, left by an earlier run in the same folder, are not
    this run's to judge. Call it after saving the new one, so a crash in between leaves one
    checkpoint too many, never none."""
    if keep < 1:
        return []
    fs, path = fsspec.core.url_to_fs(directory)
    try:
        names = fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    found = sorted((int(m.group(1)), n) for n in names if (m := CHECKPOINT_RE.match(n.rstrip("/").rsplit("/", 1)[-1])))
    removed = []
    for _, name in [(step, n) for step, n in found if upto is None or step <= upto][:-keep]:
        fs.rm(name)
        removed.append(f"{directory.rstrip('/')}/{name.rstrip('/').rsplit('/', 1)[-1]}")
    return removed


# ------------------------------------------------------------------------------- the entry point


@dataclass(frozen=True)
class LaunchInfo:
    """The ``launch`` section ``resources/launcher.py`` adds to a job's config: the stable run id
    and the run's folders in the lake. A job run by hand has none (run id ``manual``, no run dir).
    Keys this version does not know are ignored: the section is written by the launcher, not by
    a person, and a newer launcher may add some."""

    run_id: str = "manual"
    run_dir: str | None = None
    checkpoint_dir: str | None = None
    tmp_dir: str | None = None  # where this job stages the files it writes (the lake's _tmp/; see atomic_write)
    gpus: int = 0
    backend: str | None = None
    dagster_run_id: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LaunchInfo:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known and v is not None})


class JobConfig:
    """The base of every launched job's config: subclass it as a ``@dataclass`` whose fields are
    the keys of the job's JSON config.

    :meth:`from_dict` is strict: a key that is no field raises ``ValueError`` naming it (and the
    nearest field), because a misspelt ``setps`` would otherwise run the default silently.
    ``LAUNCH_FIELDS`` maps config fields to keys of the launcher's ``launch`` section that fill
    them when the config leaves them unset (e.g. ``{"run_dir": "run_dir"}``); ``JOB`` names the
    job in messages. Subclasses with nested or preset values convert them in :meth:`coerce`."""

    JOB: ClassVar[str] = "job"
    LAUNCH_FIELDS: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def check_keys(cls, data: Mapping[str, Any]) -> None:
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(known))
        if unknown:
            hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            near = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in hints.items() if m)
            raise ValueError(f"unknown {cls.JOB} config keys: {unknown}" + (f" ({near})" if near else ""))

    @classmethod
    def coerce(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments from the config's (already checked) keys; identity here."""
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        cls.check_keys(data)
        return cls(**cls.coerce(dict(data)))

    @classmethod
    def from_job(cls, data: Mapping[str, Any], launch: LaunchInfo) -> Self:
        """The config of a launched run: ``LAUNCH_FIELDS`` the config leaves unset (missing or
        null) come from the launcher's section."""
        data = dict(data)
        for name, key in cls.LAUNCH_FIELDS.items():
            if data.get(name) is None and getattr(launch, key) is not None:
                data[name] = getattr(launch, key)
        return cls.from_dict(data)

    def heartbeat_interval(self) -> float:
        """Seconds between the heartbeat lines of the Pipes session."""
        return PROGRESS_INTERVAL_S


C = TypeVar("C", bound=JobConfig)


def main(
    config_cls: type[C],
    run: Callable[[C, LaunchInfo], Any],
    argv: list[str] | None = None,
    description: str | None = None,
    setup: Callable[[C], contextlib.AbstractContextManager[Any]] | None = None,
) -> Any:
    """The entry point of a launched job, ``python -m <module> --config <url>``: read the JSON
    config, split off the launcher's section, build ``config_cls`` strictly, open the Pipes
    session (rank 0; heartbeat every ``config.heartbeat_interval()`` seconds) and return ``run(config, launch)``.
    ``run`` reports its progress with :func:`report_progress` and its result with
    :func:`report_final`. An invalid config is raised inside the session, so Dagster shows the
    message, not only an exit code. ``setup(config)``, when given, is entered before the session
    opens and left after it closes: a trainer joins torchrun's process group there with its own
    backend, before the session asks for the rank."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--config", required=True, help=f"JSON file (local path or fsspec URL) of {config_cls.__name__}"
    )
    args = parser.parse_args(argv)
    data = load_config(args.config)
    launch = LaunchInfo.from_dict(data.pop("launch", None))
    try:
        config, error = config_cls.from_job(data, launch), None
    except (TypeError, ValueError) as exc:  # a missing field, an unknown key, a bad value
        config, error = None, exc
    around = setup(config) if setup is not None and config is not None else contextlib.nullcontext()
    with around, session(config.heartbeat_interval() if config is not None else PROGRESS_INTERVAL_S):
        if config is None:
            raise error  # type: ignore[misc]
        return run(config, launch)


# ----------------------------------------------------------------------------------- reporting


def job_rank() -> int:
    """This process's rank when launched by torchrun (torch.distributed joins the process group
    from torchrun's launch protocol), 0 when not distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_torchelastic_launched()):
        return 0
    if not dist.is_initialized():
        import torch

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


class FsspecMessageWriterChannel(PipesBlobStoreMessageWriterChannel):
    """Uploads Pipes message chunks as ``<url>/<index>.json`` (each chunk written atomically)."""

    def __init__(self, url: str, *, interval: float = 1.0):
        super().__init__(interval=interval)
        self.url = url.rstrip("/")

    def upload_messages_chunk(self, payload: IO, index: int) -> None:
        atomic_write(f"{self.url}/{index}.json", payload.read().encode())


class FsspecMessageWriter(PipesBlobStoreMessageWriter):
    def __init__(self, *, interval: float = 1.0):
        super().__init__(interval=interval)

    def make_channel(self, params: PipesParams) -> FsspecMessageWriterChannel:
        return FsspecMessageWriterChannel(params[FSSPEC_URL_KEY], interval=self.interval)


class LaunchMessageWriter(PipesMessageWriter):
    """Writes where the launcher's reader reads: fsspec chunks (Ray) or Pipes' default (a file
    for subprocesses, stdout for Kubernetes pod logs)."""

    @contextlib.contextmanager
    def open(self, params: PipesParams) -> Iterator[Any]:
        writer = FsspecMessageWriter() if FSSPEC_URL_KEY in params else PipesDefaultMessageWriter()
        with writer.open(params) as channel:
            yield channel


_steps: Progress | None = None  # the open session's step count, for its heartbeat lines
_log_lock = threading.Lock()


def _pipes() -> PipesContext | None:
    return PipesContext.get() if PipesContext.is_initialized() else None


@contextlib.contextmanager
def session(heartbeat_s: float = PROGRESS_INTERVAL_S) -> Iterator[PipesContext | None]:
    """Open Dagster Pipes for the job's lifetime when launched by Pipes and this is rank 0;
    yields the Pipes context or None. An exception inside is reported to Dagster, then raised.
    A line with the steps reported so far reaches the run log every ``heartbeat_s`` seconds."""
    global _steps
    if job_rank() != 0 or not PipesEnvVarParamsLoader().is_dagster_pipes_process():
        yield None
        return
    with open_dagster_pipes(message_writer=LaunchMessageWriter()) as pipes:
        # A step can outlast the run log's 30-second promise (a first CUDA compile, a checkpoint
        # upload): the heartbeat keeps writing while the job is alive.
        _steps = Progress("job", 0, "steps reported", sink=log, interval_s=heartbeat_s)
        try:
            with _steps.heartbeat():
                yield pipes
        finally:
            _steps = None


def log(msg: str, level: str = "info") -> None:
    """A line for the Dagster run log (printed when not launched by Pipes; rank 0 only)."""
    if job_rank() != 0:
        return
    pipes = _pipes()
    with _log_lock:  # the heartbeat thread writes too; not every Pipes channel is thread-safe
        if pipes is None:
            print(msg, flush=True)
        else:
            getattr(pipes.log, level)(msg)


def report_progress(step: int, metrics: Mapping[str, Any], kind: str | None = None) -> None:
    """One step's metrics: a log line in the run and a custom Pipes message ``{step, metrics}``
    (with ``kind`` when given: ``eval`` for an evaluation at that step, say)."""
    if job_rank() != 0:
        return
    values = ", ".join(f"{k}={v:.6g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in metrics.items())
    log(f"{kind + ' at ' if kind else ''}step {step}: {values}")
    if _steps is not None:
        _steps.advance()
    pipes = _pipes()
    if pipes is not None:
        pipes.report_custom_message({"step": step, **({"kind": kind} if kind else {}), "metrics": dict(metrics)})


def flat_metadata(report: Mapping[str, Any]) -> dict[str, Any]:
    """A report as asset metadata Dagster can plot across runs: nested mappings become
    ``<key>_<inner key>`` entries; None, lists and other non-scalars are left out."""
    out: dict[str, Any] = {}
    for key, value in report.items():
        if isinstance(value, Mapping):
            out.update({f"{key}_{k}": v for k, v in value.items() if isinstance(v, int | float | str)})
        elif isinstance(value, int | float | str):
            out[key] = value
    return out


def report_final(metadata: Mapping[str, Any], run_dir_url: str | None = None) -> None:
    """The final report: the asset's materialization metadata; also ``report.json`` in the run
    dir when ``run_dir_url`` is given."""
    if job_rank() != 0:
        return
    if run_dir_url is not None:
        atomic_write(f"{run_dir_url.rstrip('/')}/{REPORT_FILE}", json.dumps(dict(metadata), indent=2).encode())
    pipes = _pipes()
    if pipes is None:
        print(json.dumps({"report": dict(metadata)}), flush=True)
    else:
        pipes.report_asset_materialization(metadata=dict(metadata))
