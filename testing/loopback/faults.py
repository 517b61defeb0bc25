"""Fault injection shared by the loopback servers: latency, error answers, dropped transfers."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Fault:
    """Answer requests whose path matches ``pattern`` with ``kind`` for the first ``times`` hits.

    kinds: ``status`` (HTTP ``status``/FTP reply code, with optional ``retry_after``),
    ``drop`` (send ``fraction`` of the body, then break the connection), ``body`` (answer
    ``status`` with ``body`` instead, e.g. NCBI's rate-limit JSON with status 200), ``trickle``
    (the whole answer, status line and headers included, one byte every ``interval`` seconds:
    a server that never trips a per-read timeout).
    """

    pattern: str
    kind: str = "status"
    status: int = 503
    times: int = 1
    retry_after: int | None = None
    fraction: float = 0.5
    body: bytes | None = None
    interval: float = 1.0
    hits: int = 0

    def matches(self, path: str) -> bool:
        return re.search(self.pattern, path) is not None


@dataclass
class FaultPlan:
    """The latency and faults of one server, plus a log of every request it answered."""

    latency: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    log: list[tuple[float, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, method: str, path: str, faulty: bool = True) -> Fault | None:
        """Log a request, wait the configured latency, return the fault to apply (if any)."""
        with self._lock:
            self.log.append((time.time(), method, path))
            candidates = self.faults if faulty else []
            fault = next((f for f in candidates if f.hits < f.times and f.matches(path)), None)
            if fault is not None:
                fault.hits += 1
        if self.latency:
            time.sleep(self.latency)
        return fault

    def count(self, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for _, m, _ in self.log if method is None or m == method)
