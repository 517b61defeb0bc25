"""A loopback stand-in for Ray's job submission REST API (a Ray head's dashboard, port 8265).

The dashboard needs ``ray[default]`` (aiohttp and friends), which PanelForge's machines do not
install, so tests put the launcher's job submission client against this server: ``/api/version``,
``POST /api/jobs/`` (the entrypoint runs as a shell command on this machine with the
``runtime_env``'s ``env_vars`` added, as a Ray head runs its job drivers), ``GET /api/jobs/<id>``,
``GET /api/jobs/<id>/logs`` and ``POST /api/jobs/<id>/stop``. Other ``runtime_env`` fields
(pip, image_uri, working_dir) and resource requests (``entrypoint_num_gpus``) are recorded in
``submissions`` but not acted on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Self

from testing.loopback.base import LoopbackHttpServer

RAY_VERSION = "2.60.0"


class _Job:
    def __init__(self, submission_id: str, request: dict, cwd: str | None):
        self.submission_id, self.request = submission_id, request
        self.logs, self.status, self.message = "", "RUNNING", "running"
        self.start_time = int(time.time() * 1000)
        env = {**os.environ, **(request.get("runtime_env") or {}).get("env_vars", {})}
        self.proc = subprocess.Popen(
            request["entrypoint"],
            shell=True,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self.logs += line
        code = self.proc.wait()
        if self.status != "STOPPED":
            self.status = "SUCCEEDED" if code == 0 else "FAILED"
            self.message = f"entrypoint exited with code {code}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.status, self.message = "STOPPED", "stopped by request"
            os.killpg(self.proc.pid, signal.SIGTERM)  # the shell and the job it started

    def details(self) -> dict:
        return {
            "type": "SUBMISSION",
            "submission_id": self.submission_id,
            "job_id": None,
            "status": self.status,
            "entrypoint": self.request["entrypoint"],
            "message": self.message,
            "start_time": self.start_time,
            "metadata": self.request.get("metadata") or {},
            "runtime_env": self.request.get("runtime_env") or {},
        }


class RayJobsLoopbackServer(LoopbackHttpServer):
    """``address`` is the URL to give ``JobSubmissionClient``; ``submissions`` the requests seen."""

    def __init__(self, cwd: str | None = None):
        self.cwd = cwd
        self.jobs: dict[str, _Job] = {}
        self.submissions: list[dict] = []

    def start(self) -> Self:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def _json(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                parts = self.path.rstrip("/").split("/")  # '', 'api', 'jobs', id, 'logs'
                if self.path.rstrip("/") == "/api/version":
                    self._json(200, {"version": "4", "ray_version": RAY_VERSION, "ray_commit": "loopback"})
                elif parts[1:3] == ["api", "jobs"] and len(parts) >= 4 and parts[3] in server.jobs:
                    job = server.jobs[parts[3]]
                    self._json(200, {"logs": job.logs} if parts[4:] == ["logs"] else job.details())
                else:
                    self._json(404, {"error": f"no such path {self.path}"})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.rstrip("/").split("/")
                if parts[1:] == ["api", "jobs"]:
                    request = json.loads(body or b"{}")
                    submission_id = request.get("submission_id") or f"raysubmit_{len(server.jobs) + 1}"
                    server.submissions.append(request)
                    server.jobs[submission_id] = _Job(submission_id, request, server.cwd)
                    self._json(200, {"submission_id": submission_id, "job_id": None})
                elif parts[1:3] == ["api", "jobs"] and parts[4:] == ["stop"] and parts[3] in server.jobs:
                    server.jobs[parts[3]].stop()
                    self._json(200, {"stopped": True})
                else:
                    self._json(404, {"error": f"no such path {self.path}"})

        return self._serve(Handler, "ray-jobs-loopback")

    def stop(self) -> None:
        for job in self.jobs.values():
            job.stop()
        super().stop()
