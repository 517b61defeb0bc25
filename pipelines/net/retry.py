"""Retries with full-jitter exponential backoff for transient transfer failures."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pipelines.core.errors import ServiceUnavailableError

T = TypeVar("T")
log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 421, 425, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """A failure worth retrying: disconnect, timeout, 421/429/5xx. ``retry_after`` in seconds."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(Exception):
    """A failure that retrying cannot fix (404, bad checksum after retries, unsafe package...)."""


class SourceUnavailableError(ServiceUnavailableError):
    """The source itself cannot be used: connection refused, DNS failure, or every attempt at a
    request ended in a disconnect, timeout or 5xx answer.

    This says nothing about the article being fetched, so it is never recorded as an article's
    error: it stops the run, which fails and is retried later. ``host`` names the source,
    ``cause`` the last failure seen.
    """

    def __init__(self, host: str, cause: str):
        super().__init__(f"PMC source {host} is unavailable: {cause}")
        self.host = host
        self.cause = cause


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)], at least ``retry_after``."""
        backoff = random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))
        return max(backoff, min(retry_after or 0.0, self.max_delay))

    def call(self, fn: Callable[[], T], what: str, host: str | None = None) -> T:
        """Call ``fn`` until it succeeds, raises a non-transient error, or attempts run out.

        Running out of attempts raises :class:`SourceUnavailableError` for ``host`` when one is
        given (the host, not the item, is failing), else :class:`PermanentError`.
        """
        for attempt in range(self.attempts):
            try:
                return fn()
            except TransientError as exc:
                if attempt == self.attempts - 1:
                    gave_up = f"{what}: gave up after {self.attempts} attempts: {exc}"
                    if host is not None:
                        raise SourceUnavailableError(host, gave_up) from exc
                    raise PermanentError(gave_up) from exc
                wait = self.delay(attempt, exc.retry_after)
                log.info("%s: %s; retrying in %.2fs", what, exc, wait)
                time.sleep(wait)
        raise AssertionError("unreachable")
