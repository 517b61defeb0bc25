"""A request-rate limit that holds across threads and processes of one host.

Every caller takes the next free slot from a small state file under an exclusive ``flock``:
slots are spaced ``1.02/rate`` seconds apart, so no one-second window ever holds more than
``rate`` requests, however many threads or processes (Dagster runs, Ray workers) share
the host. Across a cluster the limit is per host: the Dagster pool ``pmc_source`` caps how many
runs (hence hosts) download at once, so the cluster's rate is at most ``pool limit x rate``
(1 for FTP mirrors and HTTPS mirrors, ``PANELFORGE_CLOUD_HOSTS`` for the AWS bucket; see
``pipelines.acquire.source.SourcePolicy``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "panelforge-ratelimit"


class RateLimiter:
    """Spaces calls to :meth:`acquire` at least ``1/rate`` seconds apart host-wide, per ``key``."""

    def __init__(
        self,
        rate: float,
        key: str,
        state_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        # The slot file holds wall-clock times that other processes compare with their own
        # clock, so ``clock`` must be wall-clock time; tests inject a fake clock and sleep.
        if rate <= 0:
            raise ValueError(f"rate limit must be positive, got {rate}")
        self.rate = float(rate)
        # Slots are 2% wider than 1/rate: the time between taking a slot and the request
        # reaching the server jitters (scheduling, sockets), and without a margin that jitter
        # fits rate + 1 requests into one second at the server. Costs 2% of throughput.
        self.interval = 1.02 / self.rate
        state = Path(state_dir) if state_dir else _default_state_dir()
        state.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha1(key.encode()).hexdigest()[:16]
        self.path = state / f"{name}.slot"
        self._lock = threading.Lock()
        self._clock, self._sleep = clock, sleep
        self.count = 0

    def acquire(self) -> float:
        """Block until this caller's slot; return the (wall-clock) time of the slot."""
        with self._lock, open(self.path, "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.seek(0)
                data = fh.read(8)
                next_free = struct.unpack("d", data)[0] if len(data) == 8 else 0.0
                now = self._clock()
                slot = max(now, next_free)
                fh.seek(0)
                fh.truncate()
                fh.write(struct.pack("d", slot + self.interval))
                fh.flush()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        delay = slot - self._clock()
        if delay > 0:
            self._sleep(delay)
        self.count += 1
        return slot


def densest_window(times: list[float], width: float = 1.0) -> tuple[int, int]:
    """Return (count, index of the first event) of the half-open window ``[t, t + width)`` that
    holds the most of ``times`` (sorted): how tests and benchmarks check a request log."""
    times = sorted(times)
    best, best_start, start = 0, 0, 0
    for end, t in enumerate(times):
        while times[start] <= t - width:
            start += 1
        if end - start + 1 > best:
            best, best_start = end - start + 1, start
    return best, best_start
