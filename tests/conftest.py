"""Shared fixtures: the sample mirrors, loopback servers, an isolated lake and rate-limit state."""

from __future__ import annotations

import copy
import os
import socket
from pathlib import Path

# The Dagster definitions read these at import: 4 shards keep the tests' partition counts small.
os.environ["PANELFORGE_SHARDS"] = "4"
os.environ.setdefault("PANELFORGE_PROFILE", "local")
# Ray reads its auth mode when it is imported, and the Ray clusters the tests start spawn their
# servers with the environment of ray.init: both must agree whatever imports Ray first (collecting
# tests/test_vlm_ray.py does). Token auth is Ray 2.60's default for a local cluster; RayResource
# says so too (resources/compute.py).
os.environ.setdefault("RAY_AUTH_MODE", "token")

import pytest

from pipelines.acquire.source import open_source
from pipelines.core.lake import Lake
from pipelines.net.retry import RetryPolicy
from testing.loopback.faults import FaultPlan
from testing.loopback.ftp_server import FtpLoopbackServer
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror, build_legacy_mirror, sample_rows

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


@pytest.fixture(autouse=True)
def _isolated_rate_state(tmp_path, monkeypatch):
    """Each test gets its own rate-limit slot files, so tests never wait on each other."""
    monkeypatch.setenv("PANELFORGE_RATE_DIR", str(tmp_path / "ratelimit"))


@pytest.fixture
def no_network(monkeypatch) -> list[str]:
    """No socket can connect or resolve a name: what loads here loads offline. Yields the list of
    attempts (each refused at once), so a test can also check that none was made."""
    attempts: list[str] = []

    def refuse(sock, address, *args):
        attempts.append(f"connect {address!r}")
        raise ConnectionRefusedError(f"no network in this test (connect to {address!r})")

    def no_dns(host, *args, **kwargs):
        attempts.append(f"resolve {host!r}")
        raise socket.gaierror(socket.EAI_NONAME, f"no network in this test (resolve {host!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    return attempts


@pytest.fixture(scope="session")
def rows() -> list[dict]:
    return sample_rows()


@pytest.fixture
def sample(rows) -> list[dict]:
    """A private copy of the sample release rows that a test may edit."""
    return copy.deepcopy(rows)


@pytest.fixture(scope="session")
def cloud_mirror(tmp_path_factory) -> Path:
    return build_cloud_mirror(tmp_path_factory.mktemp("cloud"))


@pytest.fixture(scope="session")
def legacy_mirror(tmp_path_factory) -> Path:
    return build_legacy_mirror(tmp_path_factory.mktemp("legacy"))


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path / "lake")


@pytest.fixture
def s3_server(cloud_mirror):
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan()) as server:
        yield server


@pytest.fixture
def ftp_server(legacy_mirror):
    with FtpLoopbackServer(legacy_mirror, plan=FaultPlan()) as server:
        yield server


def source_for(url: str, rate: float = 200.0):
    return open_source(url, rate_limit=rate, retry=FAST_RETRY)
