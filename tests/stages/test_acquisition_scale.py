"""Acquisition at PMC scale: the cloud policy's rate and in-flight bounds hold at the loopback S3
server, the strict sources keep their limits, and concurrency never changes what lands in the lake."""

from __future__ import annotations

import hashlib
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.instance import pool_limits
from pipelines.acquire.source import open_source, source_policy
from pipelines.acquire.stages import AcquireStage, InventoryStage
from pipelines.acquire.transports import HttpTransport
from pipelines.core.lake import Lake
from pipelines.core.partitioning import shard_keys
from pipelines.core.stage import Partition
from pipelines.entrez.client import EntrezClient
from pipelines.net.ratelimit import RateLimiter, densest_window
from pipelines.net.retry import RetryPolicy
from resources.settings import Settings, SettingsError
from testing.loopback.faults import FaultPlan
from testing.loopback.s3_server import S3LoopbackServer
from tests.helpers import FAST_RETRY, N_SHARDS

# By hand from `ls sample/articles/*` (see tests/stages/test_acquisition.py): 38 articles, 157 images.
ARTICLES = 38


class FakeClock:
    """Time that passes only when a thread sleeps: each thread wakes at the time it read plus its
    delay, as with a real clock, so slots can be checked without waiting for them."""

    def __init__(self, start: float):
        self.now = start
        self._lock = threading.Lock()
        self._read = threading.local()

    def time(self) -> float:
        with self._lock:
            self._read.at = self.now
            return self.now

    def sleep(self, delay: float) -> None:
        with self._lock:
            self.now = max(self.now, self._read.at + delay)


def test_limiter_slots_never_exceed_the_rate_in_any_window(tmp_path):
    clock = FakeClock(1000.0)
    limiter = RateLimiter(500.0, key="cloud", state_dir=tmp_path, clock=clock.time, sleep=clock.sleep)
    with ThreadPoolExecutor(8) as pool:
        slots = list(pool.map(lambda _: limiter.acquire(), range(1200)))
    assert limiter.count == 1200
    assert densest_window(slots)[0] <= 500
    # slots 1.02/500 s apart from the first call's time: the last is 1000 + 1199 x 0.00204
    assert sorted(slots)[0] == 1000.0
    assert sorted(slots)[-1] == pytest.approx(1002.44596, abs=1e-6)


def test_every_request_takes_a_slot_and_slots_hold_the_rate_under_load(tmp_path, cloud_mirror):
    """80/s with 16 articles at once: every request the server answered took a slot, and no
    one-second window holds 81 slots. (The server's own clock sees each request shifted by its
    send delay, up to ~0.1 s here with 16 threads and the server sharing one GIL; the benchmark
    reports that excess, the limiter cannot remove it.)"""
    lake = Lake(tmp_path / "lake")
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan(latency=0.01)) as server:
        with open_source(server.url, rate_limit=2000, retry=FAST_RETRY, rate_state_dir=str(tmp_path)) as source:
            InventoryStage(source, N_SHARDS).run(lake, Partition("2026"))
        server.plan.log.clear()
        with open_source(
            server.url, rate_limit=80, concurrency=16, retry=FAST_RETRY, rate_state_dir=str(tmp_path)
        ) as source:
            slots: list[float] = []
            take = source.transport.limiter.acquire
            source.transport.limiter.acquire = lambda: slots.append(take()) or slots[-1]
            for shard in shard_keys(N_SHARDS):
                AcquireStage(source).run(lake, Partition("2026", shard))
        served = server.plan.count()
    # enough requests to fill two seconds at the limit (the 38 articles take 196 requests)
    assert served == len(slots) > 160
    assert densest_window(slots)[0] <= 80


def test_transport_keeps_at_most_max_in_flight_requests_at_the_server(tmp_path, cloud_mirror):
    limiter = RateLimiter(10_000, key="inflight", state_dir=tmp_path)
    keys = sorted(p.relative_to(cloud_mirror).as_posix() for p in cloud_mirror.glob("*/*.json"))[:12]
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan(latency=0.05)) as server:
        transport = HttpTransport(server.url, limiter, RetryPolicy(attempts=1), max_in_flight=2)
        with ThreadPoolExecutor(12) as pool:
            bodies = list(pool.map(transport.read_bytes, keys))
        peak = server.max_in_flight
    assert bodies == [(cloud_mirror / key).read_bytes() for key in keys]
    assert peak == 2  # twelve callers, two places: never more, and both used


def test_the_server_counts_a_request_until_its_body_goes_out_not_until_its_handler_returns(
    tmp_path, cloud_mirror, monkeypatch
):
    # CI once saw 3 at the server for 2 places: the client had read a body and sent its next
    # request before the first handler got round to counting itself out. A handler slow to
    # return after its body went out must not show the client more requests than it had open.
    import testing.loopback.s3_server as s3_server

    sent = s3_server.send_body

    def slow_after_sending(handler, body, fault=None):
        sent(handler, body, fault)
        threading.Event().wait(0.05)

    monkeypatch.setattr(s3_server, "send_body", slow_after_sending)
    limiter = RateLimiter(10_000, key="handover", state_dir=tmp_path)
    keys = sorted(p.relative_to(cloud_mirror).as_posix() for p in cloud_mirror.glob("*/*.json"))[:12]
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan(latency=0.05)) as server:
        transport = HttpTransport(server.url, limiter, RetryPolicy(attempts=1), max_in_flight=2)
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(transport.read_bytes, keys))
        assert server.max_in_flight == 2


def test_requests_of_a_thread_reuse_one_connection(tmp_path, cloud_mirror):
    limiter = RateLimiter(10_000, key="keepalive", state_dir=tmp_path)
    keys = sorted(p.relative_to(cloud_mirror).as_posix() for p in cloud_mirror.glob("*/*.json"))[:12]
    with S3LoopbackServer(cloud_mirror) as server:
        transport = HttpTransport(server.url, limiter, RetryPolicy(attempts=1), max_in_flight=2)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(transport.read_bytes, keys))
        for i, key in enumerate(keys[:3]):  # streamed downloads too
            transport.download(key, tmp_path / f"object-{i}")
        assert server.plan.count() == 15
        assert 1 <= server.connections <= 3  # two pool threads and the main thread, one each


def test_download_stage_respects_the_source_concurrency(tmp_path, cloud_mirror):
    lake = Lake(tmp_path / "lake")
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan(latency=0.02)) as server:
        with open_source(
            server.url, rate_limit=10_000, concurrency=3, retry=FAST_RETRY, rate_state_dir=str(tmp_path)
        ) as source:
            InventoryStage(source, N_SHARDS).run(lake, Partition("2026"))
            fetched = sum(
                AcquireStage(source).run(lake, Partition("2026", shard)).counts["fetched"]
                for shard in shard_keys(N_SHARDS)
            )
        peak = server.max_in_flight
    assert fetched == ARTICLES
    assert 1 <= peak <= 3


def _raw_bytes(lake: Lake) -> dict[str, str]:
    """sha256 of every file under the lake's raw tables and tars, by relative path: a tar's bytes,
    a table's rows (a Parquet footer also names the commit that published it, an id that differs
    between any two runs)."""
    root = Path(lake.root)
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(
            pq.read_table(p).to_pandas().to_json().encode() if p.suffix == ".parquet" else p.read_bytes()
        ).hexdigest()
        for sub in ("tables/raw_manifest", "tables/raw_files", "raw")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


def test_high_concurrency_download_is_byte_identical_to_one_at_a_time(tmp_path, cloud_mirror):
    first = Lake(tmp_path / "one")
    with S3LoopbackServer(cloud_mirror, plan=FaultPlan()) as server:
        with open_source(server.url, rate_limit=10_000, retry=FAST_RETRY, rate_state_dir=str(tmp_path)) as source:
            InventoryStage(source, N_SHARDS).run(first, Partition("2026"))
        shutil.copytree(first.root, tmp_path / "many")
        many = Lake(tmp_path / "many")
        for lake, concurrency in ((first, 1), (many, 32)):
            with open_source(
                server.url, rate_limit=10_000, concurrency=concurrency, retry=FAST_RETRY, rate_state_dir=str(tmp_path)
            ) as source:
                for shard in shard_keys(N_SHARDS):
                    AcquireStage(source).run(lake, Partition("2026", shard))
    one, thirty_two = _raw_bytes(first), _raw_bytes(many)
    assert any(path.startswith("raw/") for path in one) and any("raw_files" in path for path in one)
    assert thirty_two == one
    statuses = [r["status"] for r in first.read_release("raw_manifest", "2026").to_pylist()]
    assert statuses == ["ok"] * ARTICLES


def test_strict_sources_keep_their_limits_and_one_host():
    assert open_source("ftp://127.0.0.1:2121/pub").transport.limiter.rate == 3.0
    assert open_source("https://mirror.example.org/pmc").transport.limiter.rate == 20.0
    assert EntrezClient().limiter.rate == 3.0
    assert EntrezClient(api_key="k").limiter.rate == 10.0
    with pytest.raises(ValueError, match="only an s3:// source"):
        source_policy("ftp://127.0.0.1/pub", hosts=2)
    assert pool_limits(Settings(pmc_source="ftp://mirror.example.org/pub"))["pmc_source"] == 1
    assert pool_limits(Settings(pmc_source="https://mirror.example.org/pmc"))["pmc_source"] == 1


def test_cloud_settings_set_the_pool_and_stay_under_the_s3_prefix_limit():
    settings = Settings.from_env({"PANELFORGE_CLOUD_HOSTS": "16", "PANELFORGE_CLOUD_CONCURRENCY": "32"})
    policy = settings.source_policy()
    assert (policy.rate, policy.concurrency, policy.hosts) == (340.0, 32, 16)
    assert pool_limits(settings)["pmc_source"] == 16
    with pytest.raises(SettingsError, match="17 x 340 = 5780 requests/s exceeds S3's 5500"):
        Settings.from_env({"PANELFORGE_CLOUD_HOSTS": "17"})
    with pytest.raises(SettingsError, match="PANELFORGE_CLOUD_HOSTS=2 applies only to an s3:// source"):
        Settings.from_env({"PANELFORGE_CLOUD_HOSTS": "2", "PANELFORGE_PMC_SOURCE": "ftp://mirror.example.org/pub"})
    with pytest.raises(SettingsError, match="PANELFORGE_CLOUD_CONCURRENCY must be at least 1"):
        Settings.from_env({"PANELFORGE_CLOUD_CONCURRENCY": "0"})
    assert (
        Settings.from_env({"PANELFORGE_CLOUD_RPS": "1000", "PANELFORGE_CLOUD_HOSTS": "5"}).source_policy().rate == 1000
    )
