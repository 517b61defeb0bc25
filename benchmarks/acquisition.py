"""Acquisition benchmark: rate-limit fidelity against a loopback FTP mirror with latency.

Two processes x ``--concurrency`` threads download every shard of the sample release from a
pyftpdlib server that adds ``--latency`` seconds to every command, sharing one host-wide
limit. The server's own log of requests (logins, SIZE, RETR) is the measurement. Baseline
in the same run: the configured limit itself (``achieved / limit``) and the same download
with the limit lifted (what the mirror and the client could do unthrottled).

    python -m benchmarks.acquisition [--rate 3] [--latency 0.05] [--concurrency 4] [--out PATH]

Writes ``benchmarks/results/acquisition.json`` (``--out``); ``make bench`` also runs it at 20 requests/s
with 8 threads per process into ``acquisition-rate20.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.record import write_results
from pipelines.acquire.source import open_source
from pipelines.acquire.stages import AcquireStage, InventoryStage
from pipelines.core.lake import Lake
from pipelines.core.partitioning import shard_keys
from pipelines.core.stage import Partition
from pipelines.net.ratelimit import densest_window
from testing.loopback.faults import FaultPlan
from testing.loopback.ftp_server import FtpLoopbackServer
from testing.loopback.sample_mirror import build_legacy_mirror

RESULTS = Path(__file__).parent / "results" / "acquisition.json"
N_SHARDS = 8


def _download(url: str, lake_root: str, shards: list[str], rate: float, concurrency: int, rate_dir: str, queue) -> None:
    lake = Lake(lake_root)
    with open_source(url, rate_limit=rate, rate_state_dir=rate_dir) as source:
        stage = AcquireStage(source, concurrency)
        fetched = sum(stage.run(lake, Partition("bench", shard)).counts.get("fetched", 0) for shard in shards)
        queue.put((source.requests, source.bytes, fetched, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def run(mirror: Path, rate: float, latency: float, concurrency: int, workdir: Path) -> dict:
    """One full download of the mirror by two processes; returns the server-side measurements."""
    rate_dir = str(workdir / "ratelimit")
    plan = FaultPlan(latency=latency)
    lake = Lake(workdir / "lake")
    with FtpLoopbackServer(mirror, plan=plan) as server:
        with open_source(server.url, rate_limit=rate, rate_state_dir=rate_dir) as source:
            InventoryStage(source, N_SHARDS).run(lake, Partition("bench"))
        plan.log.clear()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        halves = [shard_keys(N_SHARDS)[0::2], shard_keys(N_SHARDS)[1::2]]
        started = time.time()
        procs = [
            ctx.Process(target=_download, args=(server.url, str(lake.root), h, rate, concurrency, rate_dir, queue))
            for h in halves
        ]
        for p in procs:
            p.start()
        reports = [queue.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.time() - started
        events = sorted(plan.log)
        times = [t for t, _, _ in events]
        densest, first = densest_window(times)
        # rerun: everything is complete and verified, so no request may reach the server
        plan.log.clear()
        with open_source(server.url, rate_limit=rate, rate_state_dir=rate_dir) as source:
            for shard in shard_keys(N_SHARDS):
                AcquireStage(source, concurrency).run(lake, Partition("bench", shard))
        rerun_requests = len(plan.log)
    client_requests = sum(r[0] for r in reports)
    articles = sum(r[2] for r in reports)
    span = max(times) - min(times)
    return {
        "configured_rate": rate,
        "server_requests": len(times),
        "client_counted_requests": client_requests,
        "articles": articles,
        "requests_per_article": round(len(times) / articles, 3),
        "achieved_rate": round((len(times) - 1) / span, 3) if span else None,
        "max_requests_in_any_1s_window": densest,
        "densest_window": [f"+{t - times[first]:.3f}s {m} {p}" for t, m, p in events[first : first + densest]],
        "megabytes": round(sum(r[1] for r in reports) / 1e6, 3),
        "mb_per_s": round(sum(r[1] for r in reports) / 1e6 / elapsed, 3),
        "elapsed_s": round(elapsed, 2),
        "peak_rss_mb_per_process": round(max(r[3] for r in reports) / 1024, 1),
        "rerun_requests": rerun_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3.0)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mirror = build_legacy_mirror(Path(tmp) / "mirror")
        limited = run(mirror, args.rate, args.latency, args.concurrency, Path(tmp) / "limited")
        unlimited = run(mirror, 10_000.0, args.latency, args.concurrency, Path(tmp) / "unlimited")
    result = {
        "benchmark": "acquisition rate limit (loopback FTP, legacy layout, sample release)",
        "setup": {
            "processes": 2,
            "threads_per_process": args.concurrency,
            "latency_s_per_command": args.latency,
            "shards": N_SHARDS,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "baseline": "the configured limit (ideal) and the same download with no limit",
        "limited": limited,
        "unlimited": unlimited,
        "ratios": {
            "achieved_over_limit": round(limited["achieved_rate"] / args.rate, 3),
            "max_window_over_limit": round(limited["max_requests_in_any_1s_window"] / args.rate, 3),
            "unlimited_rate_over_limit": round(unlimited["achieved_rate"] / args.rate, 2),
        },
        "passes": {
            "never_over_limit": limited["max_requests_in_any_1s_window"] <= args.rate,
            "at_least_90_percent": limited["achieved_rate"] >= 0.9 * args.rate,
            "rerun_makes_zero_requests": limited["rerun_requests"] == 0 and unlimited["rerun_requests"] == 0,
        },
    }
    write_results(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
