"""Launching GPU work: training and evaluation run as external jobs, never in the Dagster process.

:class:`JobLauncherResource` writes the job's JSON config to the lake, launches
``python -m <module> --config <url>`` through a Dagster Pipes client and returns what the job
reported (materialization metadata, one custom message per step); the job's log lines stream
into the Dagster run log while it runs. The job side is ``pipelines/launch.py``.

One switch, ``backend`` (``PANELFORGE_LAUNCHER``):

``subprocess``
    Dagster's ``PipesSubprocessClient`` on this machine (demo, local profiles, tests).
``ray``
    :class:`PipesRayClient`, on the Ray cluster at ``ray_address`` (``PANELFORGE_RAY_ADDRESS``).
    An ``http(s)://head:8265`` address submits a **Ray job** through Ray's job submission REST
    API (the dashboard of a ``ray[default]`` cluster; this side needs only ``requests``, the job's
    ``entrypoint_num_gpus`` reserve its GPUs); any other address (``ray://head:10001``,
    ``auto``, or none for a Ray started on this machine) runs the entrypoint in a Ray task that
    holds the job's GPUs. Either way the context goes in environment variables and the messages
    come back as numbered chunks under the run dir in the lake (fsspec), so the cluster needs
    only the lake, not a path on this machine.
``kubernetes``
    ``dagster_k8s.PipesK8sClient`` (a pod per launch, messages from the pod's logs); needs
    ``pip install 'panelforge[k8s]'`` and ``k8s_image``.

``gpus`` (``PANELFORGE_JOB_GPUS``) is per job: above 1 the module runs under torchrun
(``python -m torch.distributed.run --standalone --nproc-per-node=<gpus>``); Ray reserves that
many GPUs for the job, Kubernetes sets the pod's ``nvidia.com/gpu`` limit.

Checkpoints and reports live in ``<workdir_url>/<run id>/``. The run id is stable for one
training (asset, partition and a hash of the job config), not the Dagster run's id, so a failed
or preempted run that Dagster retries, or that someone re-materializes, finds the last
checkpoint and resumes; each attempt's Dagster run id is in the config and the metadata.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec
import requests
from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    MaterializeResult,
    OpExecutionContext,
    PipesBlobStoreMessageReader,
    PipesClient,
    PipesClientCompletedInvocation,
    PipesEnvContextInjector,
    PipesSubprocessClient,
    open_pipes_session,
)
from dagster._core.definitions.resource_annotation import TreatAsResourceParam
from dagster._core.errors import DagsterExecutionInterruptedError, DagsterPipesExecutionError
from dagster_pipes import PipesExtras, PipesParams
from pydantic import Field

from pipelines.core.errors import StageInputError
from pipelines.core.fingerprints import fingerprint
from pipelines.launch import CONFIG_FILE, FSSPEC_URL_KEY, atomic_write, checkpoint_dir, run_dir

BACKENDS = ("subprocess", "ray", "kubernetes")
RAY_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")  # a Ray job's final states
TORCHRUN = ("-m", "torch.distributed.run")  # what the torchrun script runs, with the job's own interpreter


class LauncherUnavailableError(StageInputError):
    """The chosen backend cannot launch here (a missing optional package, a missing setting)."""


def build_command(python: str, module: str, config_url: str, gpus: int = 0) -> list[str]:
    """The job's command line: ``python -m <module> --config <url>``, under torchrun when the job
    has more than one GPU (one process per GPU on one node; rank 0 reports)."""
    if gpus < 0:
        raise ValueError(f"gpus must be at least 0, got {gpus}")
    job = ["-m", module, "--config", config_url]
    if gpus > 1:
        return [python, *TORCHRUN, "--standalone", f"--nproc-per-node={gpus}", *job]
    return [python, *job]


def job_run_id(context: AssetExecutionContext | OpExecutionContext, config: Mapping[str, Any]) -> str:
    """A training's stable id: the asset (or op), the partition, and the job config's fingerprint
    (its first 12 characters, as the ids of earlier versions: a training under way still resumes).
    The same asset, partition and config resume one training; a changed config starts anew."""
    if context.has_assets_def:
        name = "__".join(context.assets_def.key.path)
    else:
        name = context.op.name
    if context.has_partition_key:
        name += f"__{context.partition_key}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", f"{name}__{fingerprint(config)[:12]}")


class PipesFsspecMessageReader(PipesBlobStoreMessageReader):
    """Reads the chunks ``<url>/<n>.json`` that ``pipelines.launch.FsspecMessageWriter`` writes
    (n = 1, 2, ...). Works wherever the job and Dagster both reach the URL: a shared disk, S3."""

    def __init__(self, url: str, *, interval: float = 1.0, include_stdio_in_messages: bool = True):
        super().__init__(interval=interval)
        self.url = url.rstrip("/")
        self.include_stdio_in_messages = include_stdio_in_messages

    @contextmanager
    def get_params(self) -> Iterator[PipesParams]:
        yield {FSSPEC_URL_KEY: self.url, "include_stdio_in_messages": self.include_stdio_in_messages}

    def messages_are_readable(self, params: PipesParams) -> bool:
        return True  # chunks that are not there yet read as None

    def download_messages_chunk(self, index: int, params: PipesParams) -> str | None:
        fs, path = fsspec.core.url_to_fs(f"{params[FSSPEC_URL_KEY]}/{index}.json")
        try:
            return fs.cat_file(path).decode()
        except FileNotFoundError:
            return None

    def no_messages_debug_text(self) -> str:
        return f"Attempted to read message chunks from {self.url}/<n>.json."


class PipesRayClient(PipesClient, TreatAsResourceParam):
    """Runs a command on Ray within a Pipes session: as a Ray job (job submission API) when
    ``address`` is the dashboard's ``http(s)://`` URL, else in a Ray task on a Ray cluster
    (``ray://``, ``auto``) or on a Ray started here (None). Context in environment variables,
    messages through :class:`PipesFsspecMessageReader` at ``message_url``."""

    def __init__(
        self,
        address: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        poll_interval: float = 1.0,
        job_timeout_s: float | None = None,
    ):
        self.address = address
        self.runtime_env = dict(runtime_env or {})
        self.poll_interval = poll_interval
        self.job_timeout_s = job_timeout_s

    @property
    def uses_job_submission(self) -> bool:
        return bool(self.address) and self.address.startswith(("http://", "https://"))

    def run(  # type: ignore[override]
        self,
        *,
        context: AssetExecutionContext | OpExecutionContext,
        command: Sequence[str],
        message_url: str,
        extras: PipesExtras | None = None,
        env: Mapping[str, str] | None = None,
        gpus: int = 0,
        cwd: str | None = None,
    ) -> PipesClientCompletedInvocation:
        reader = PipesFsspecMessageReader(message_url)
        with open_pipes_session(
            context=context, context_injector=PipesEnvContextInjector(), message_reader=reader, extras=extras
        ) as session:
            job_env = {**(env or {}), **session.get_bootstrap_env_vars()}
            if self.uses_job_submission:
                ray_id = self._submit_job(context, list(command), job_env, gpus)
            else:
                ray_id = self._run_task(context, list(command), job_env, gpus, cwd)
        return PipesClientCompletedInvocation(session, metadata={"ray_job": ray_id})

    # -- Ray job submission: the REST API of a Ray head's dashboard ------------------------------
    # Spoken with requests: Ray's JobSubmissionClient needs ray[default] (aiohttp) in this process.
    def _jobs_api(self, method: str, path: str, body: dict | None = None) -> dict:
        response = requests.request(method, f"{self.address.rstrip('/')}{path}", json=body, timeout=30)
        if response.status_code != 200:
            raise DagsterPipesExecutionError(
                f"Ray job submission API {method} {path}: HTTP {response.status_code} {response.text[:500]}"
            )
        return response.json()

    def _submit_job(self, context, command: list[str], env: dict[str, str], gpus: int) -> str:
        runtime_env = {**self.runtime_env, "env_vars": {**self.runtime_env.get("env_vars", {}), **env}}
        request = {
            "entrypoint": shlex.join(command),
            "submission_id": f"panelforge-{context.run_id[:8]}-{uuid.uuid4().hex[:8]}",
            "runtime_env": runtime_env,
            "metadata": {"dagster_run_id": context.run_id},
        }
        if gpus:
            request["entrypoint_num_gpus"] = gpus
        job_id = self._jobs_api("POST", "/api/jobs/", request)["submission_id"]
        context.log.info(f"[launcher] submitted Ray job {job_id} to {self.address}: {shlex.join(command)}")
        started = time.monotonic()
        try:
            while (details := self._jobs_api("GET", f"/api/jobs/{job_id}"))["status"] not in RAY_TERMINAL:
                if self.job_timeout_s is not None and time.monotonic() - started > self.job_timeout_s:
                    self._jobs_api("POST", f"/api/jobs/{job_id}/stop")
                    raise DagsterPipesExecutionError(f"Ray job {job_id} ran past {self.job_timeout_s} s; stopped")
                time.sleep(self.poll_interval)
        except DagsterExecutionInterruptedError:
            context.log.info(f"[launcher] run interrupted: stopping Ray job {job_id}")
            self._jobs_api("POST", f"/api/jobs/{job_id}/stop")
            raise
        if details["status"] != "SUCCEEDED":
            tail = self._jobs_api("GET", f"/api/jobs/{job_id}/logs")["logs"][-2000:]
            raise DagsterPipesExecutionError(
                f"External execution process failed: Ray job {job_id} {details['status']}: "
                f"{details.get('message')}; its last lines:\n{tail}"
            )
        return job_id

    # -- a Ray task that holds the GPUs and runs the entrypoint --------------------------------
    def _run_task(self, context, command: list[str], env: dict[str, str], gpus: int, cwd: str | None) -> str:
        import ray

        if not ray.is_initialized():
            ray.init(
                address=self.address or "local",  # None: a Ray of our own, never a neighbour's
                include_dashboard=False,
                ignore_reinit_error=True,
                log_to_driver=False,
                configure_logging=False,
            )
        options: dict[str, Any] = {"num_cpus": 1, "num_gpus": gpus, "max_retries": 0}
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        ref = ray.remote(_entrypoint_task()).options(**options).remote(command, env, cwd)
        task_id = ref.task_id().hex()
        context.log.info(f"[launcher] Ray task {task_id} ({gpus} GPU): {shlex.join(command)}")
        started = time.monotonic()
        try:
            while not ray.wait([ref], timeout=self.poll_interval)[0]:
                if self.job_timeout_s is not None and time.monotonic() - started > self.job_timeout_s:
                    ray.cancel(ref, force=True)
                    raise DagsterPipesExecutionError(f"Ray task {task_id} ran past {self.job_timeout_s} s; cancelled")
        except DagsterExecutionInterruptedError:
            context.log.info(f"[launcher] run interrupted: cancelling Ray task {task_id}")
            ray.cancel(ref, force=True)
            raise
        code, tail = ray.get(ref)
        if code != 0:
            raise DagsterPipesExecutionError(
                f"External execution process failed with code {code} (Ray task {task_id}); its last lines:\n{tail}"
            )
        return task_id


def _entrypoint_task():
    """The function a Ray task runs: the command with ``env`` added to the worker's environment;
    returns its exit code and last output lines (the output also goes to the worker's log, and to
    Dagster through Pipes' stdio capture once the job has opened its session). Made by a factory
    so that Ray ships it by value: a worker needs the job's code, not this module or Dagster."""

    def run_entrypoint(command: list[str], env: dict[str, str], cwd: str | None) -> tuple[int, str]:
        import collections
        import os
        import subprocess
        import sys

        tail: collections.deque[str] = collections.deque(maxlen=40)
        proc = subprocess.Popen(
            command, env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)
        sys.stdout.flush()
        return proc.wait(), "".join(tail)

    return run_entrypoint


@dataclass
class LaunchResult:
    """What a launched job reported, Pipes-style, plus where its files are."""

    invocation: PipesClientCompletedInvocation
    run_id: str
    run_dir: str
    backend: str
    command: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def get_materialize_result(self) -> MaterializeResult:
        """The job's reported materialization, with the launch's own metadata added."""
        result = self.invocation.get_materialize_result()
        return result._replace(metadata={**(result.metadata or {}), **self.metadata})

    def get_custom_messages(self) -> Sequence[Any]:
        """One ``{"step", "metrics"}`` per ``report_progress`` call, in order."""
        return self.invocation.get_custom_messages()


class JobLauncherResource(ConfigurableResource):
    """Launches a training or evaluation module as an external job through Dagster Pipes; see the
    module's docstring for the backends. Settings: ``PANELFORGE_LAUNCHER``, ``PANELFORGE_JOB_GPUS``,
    ``PANELFORGE_RAY_ADDRESS``."""

    backend: str = Field(default="subprocess", description="subprocess | ray | kubernetes")
    gpus: int = Field(default=0, description="GPUs per job; above 1 the module runs under torchrun")
    python: str | None = Field(
        default=None, description="interpreter; default: this one for subprocess, `python` on Ray and Kubernetes"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the job")
    cwd: str | None = None
    ray_address: str | None = Field(default=None, description="http(s)://head:8265 (Ray jobs), ray://..., or None")
    ray_runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Ray runtime_env for the job: image_uri, pip, working_dir, env_vars"
    )
    k8s_image: str | None = None
    k8s_namespace: str | None = None
    k8s_service_account: str | None = None
    k8s_pod_spec: dict[str, Any] = Field(default_factory=dict, description="base pod spec (node selector, volumes)")
    timeout_s: float | None = Field(default=None, description="stop a Ray job running longer than this")

    def command(self, module: str, config_url: str) -> list[str]:
        """The command line this launcher runs for ``module`` (torchrun when ``gpus`` > 1)."""
        default = sys.executable if self.backend == "subprocess" else "python"
        return build_command(self.python or default, module, config_url, self.gpus)

    def run(
        self,
        context: AssetExecutionContext | OpExecutionContext,
        module: str,
        config: Mapping[str, Any],
        workdir_url: str,
        run_id: str | None = None,
        tmp_url: str | None = None,
    ) -> LaunchResult:
        """Write ``config`` (plus a ``launch`` section) to ``<workdir_url>/<run id>/config.json``,
        run ``python -m <module> --config <that url>`` on the backend, and return what it reported.
        ``tmp_url`` (the lake's ``_tmp/``) is where the job stages the files it writes, so a
        killed job's partial checkpoints never sit among the checkpoints.
        Raises ``DagsterPipesExecutionError`` when the job fails (its checkpoints stay for the
        next launch)."""
        self.check_available()
        run_id = run_id or job_run_id(context, config)
        folder = run_dir(workdir_url, run_id)
        launch = {
            "run_id": run_id,
            "run_dir": folder,
            "checkpoint_dir": checkpoint_dir(workdir_url, run_id),
            "tmp_dir": f"{tmp_url.rstrip('/')}/{run_id}" if tmp_url else None,
            "gpus": self.gpus,
            "backend": self.backend,
            "dagster_run_id": context.run_id,
        }
        config_url = f"{folder}/{CONFIG_FILE}"
        atomic_write(config_url, json.dumps({**config, "launch": launch}, indent=2, default=str).encode())
        command = self.command(module, config_url)
        context.log.info(f"[launcher] {self.backend}: run {run_id} in {folder}")
        if self.backend == "subprocess":
            invocation = PipesSubprocessClient(cwd=self.cwd).run(context=context, command=command, env=self.env)
        elif self.backend == "ray":
            client = PipesRayClient(self.ray_address, self.ray_runtime_env, job_timeout_s=self.timeout_s)
            message_url = f"{folder}/pipes/{context.run_id}-{uuid.uuid4().hex[:8]}"
            invocation = client.run(
                context=context, command=command, message_url=message_url, env=self.env, gpus=self.gpus, cwd=self.cwd
            )
        else:
            invocation = self._run_k8s(context, command)
        metadata = {"launch_run_id": run_id, "launch_run_dir": folder, "launch_backend": self.backend}
        return LaunchResult(invocation, run_id, folder, self.backend, command, metadata)

    def check_available(self) -> None:
        """Raise :class:`LauncherUnavailableError`, saying what to do, if the backend cannot launch."""
        if self.backend not in BACKENDS:
            raise LauncherUnavailableError(f"launcher backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "kubernetes":
            if importlib.util.find_spec("dagster_k8s") is None:
                raise LauncherUnavailableError(
                    "PANELFORGE_LAUNCHER=kubernetes needs dagster-k8s: pip install 'panelforge[k8s]' "
                    "(or set PANELFORGE_LAUNCHER to subprocess or ray)"
                )
            if not self.k8s_image:
                raise LauncherUnavailableError("the kubernetes launcher needs k8s_image: the job's container image")

    def _run_k8s(self, context, command: list[str]) -> PipesClientCompletedInvocation:
        from dagster_k8s import PipesK8sClient

        spec = dict(self.k8s_pod_spec)
        if self.k8s_service_account:
            spec.setdefault("service_account_name", self.k8s_service_account)
        if self.gpus:
            container = dict((spec.get("containers") or [{}])[0])
            resources = dict(container.get("resources") or {})
            resources["limits"] = {**resources.get("limits", {}), "nvidia.com/gpu": str(self.gpus)}
            container["resources"] = resources
            spec["containers"] = [container, *(spec.get("containers") or [])[1:]]
        return PipesK8sClient().run(
            context=context,
            image=self.k8s_image,
            command=command,
            namespace=self.k8s_namespace,
            env=self.env,
            base_pod_spec=spec or None,
        )
