"""The limiter's slots, taken by several processes and threads at once, never exceed the rate."""

import multiprocessing as mp
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipelines.net.ratelimit import RateLimiter, densest_window

RATE = 10.0


def _take(state_dir: str, n: int, queue) -> None:
    limiter = RateLimiter(RATE, key="test-host", state_dir=state_dir)
    with ThreadPoolExecutor(3) as pool:
        slots = list(pool.map(lambda _: limiter.acquire(), range(n)))
    queue.put(slots)


def test_slots_hold_across_processes_and_threads(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_take, args=(str(tmp_path), 8, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    slots = [s for _ in procs for s in queue.get(timeout=60)]
    for p in procs:
        p.join(timeout=60)
    assert len(slots) == 24
    ordered = sorted(slots)
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    assert min(gaps) >= 1 / RATE - 1e-6
    assert densest_window(slots)[0] <= RATE


def test_window_counter_counts_half_open_windows():
    assert densest_window([0.0, 0.5, 0.99, 1.0, 1.5]) == (3, 0)  # [0, 1) holds 0, 0.5, 0.99
    assert densest_window([0.0, 0.6, 0.7, 0.8, 1.65]) == (4, 0)  # [0, 1) holds four
    assert densest_window([0.2, 0.0, 0.1]) == (3, 0)


def test_rate_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        RateLimiter(0, key="x", state_dir=tmp_path)


def test_ftp_logins_are_requests_the_mirror_sees_at_the_rate(tmp_path):
    """Three threads each need a connection (ftputil also opens a child session, a second login,
    for every transfer): six logins and six transfers. At the mirror, a login is the connection
    (then USER/PASS); before logins took their slot ahead of connecting, the first four
    connections arrived within milliseconds. No one-second window at the server may hold more
    than the rate of requests, logins included."""
    from pipelines.acquire.transports import FtpTransport
    from pipelines.net.retry import RetryPolicy
    from testing.loopback.faults import FaultPlan
    from testing.loopback.ftp_server import FtpLoopbackServer

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for i in range(6):
        (mirror / f"f{i}.bin").write_bytes(bytes([i]) * 1000)
    plan = FaultPlan()
    with FtpLoopbackServer(mirror, plan=plan) as server:
        host, port = server.url.removeprefix("ftp://").rstrip("/").rsplit(":", 1)
        limiter = RateLimiter(3, key="ftp-logins", state_dir=tmp_path / "slots")
        transport = FtpTransport(host, int(port), "/", limiter, RetryPolicy(attempts=1))
        with ThreadPoolExecutor(3) as pool:
            data = list(pool.map(lambda i: transport.read_bytes(f"f{i}.bin"), range(6)))
        transport.close()
    assert data == [bytes([i]) * 1000 for i in range(6)]
    kinds = [method for _, method, _ in plan.log]
    assert kinds.count("LOGIN") == 6 and kinds.count("RETR") == 6
    assert transport.requests == 12  # every request the mirror saw took a slot
    # the server logs a request when its thread handles it, up to a scheduling delay after the slot
    # (on a loaded machine, a fraction of a second): no 0.75 s window holds more than the rate, which
    # the bug this guards against (four connections within milliseconds) breaks by far
    assert densest_window([t for t, _, _ in plan.log], width=0.75)[0] <= 3
