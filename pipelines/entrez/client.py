"""A client for NCBI E-utilities that shares NCBI's limit host-wide, retries, and caches.

* One limit for every thread and process of the host (the file-locked :class:`RateLimiter`):
  3 requests/s without an API key, 10/s with one, as NCBI asks.
* HTTP 429, 5xx, disconnects and NCBI's ``{"error":"API rate limit exceeded"}`` body (which
  can come with status 200) are retried with jittered backoff.
* An outage is no answer about the articles: when NCBI cannot be reached, retries run out, or
  the endpoint refuses us (401/403/404, a rejected API key), :class:`EntrezUnavailableError` is
  raised so the run fails and is retried later. An answer that arrives but cannot be used (HTML,
  an ``<ERROR>``, 400) is a problem of its batch's PMIDs only.
* Every answer is cached under the lake's ``cache/eutils/`` keyed by the request without its
  credentials, so a rerun makes no request that was already answered. Only answers that parsed
  are cached: an error answer is never written, so a rerun asks again.
* Large id lists go by POST (NCBI's advice above ~200 ids); the API key is sent as a
  parameter, as NCBI requires, but never appears in a cache key, a log line or an error.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import requests

from pipelines.core.errors import ServiceUnavailableError
from pipelines.core.lake import Lake
from pipelines.entrez.records import EntrezAnswerError, parse_citedin, parse_pubmed_articles
from pipelines.net.ratelimit import RateLimiter
from pipelines.net.retry import RETRYABLE_STATUS, PermanentError, RetryPolicy, TransientError

T = TypeVar("T")
log = logging.getLogger(__name__)
DEFAULT_EUTILS_URL = "https://eutils.ncbi.nlm.nih.gov/entrez/eutils"
EFETCH_BATCH = 2_000  # PubMed efetch answers up to 10,000 ids per POST; 2,000 keeps answers ~10 MB
ELINK_BATCH = 500
UNUSABLE_ENDPOINT_STATUS = frozenset({401, 403, 404})  # E-utilities answers a bad id with 200, never these
_TRANSPORT_ERRORS = (
    requests.ConnectionError,  # refused, DNS, reset
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,  # the connection broke inside the body
    requests.exceptions.ContentDecodingError,
)


class EntrezUnavailableError(ServiceUnavailableError):
    """E-utilities could not be used at all: unreachable, retries exhausted on disconnects,
    timeouts, 429 or 5xx, or the endpoint refused us. Says nothing about any article: callers
    let it propagate (the run fails and is retried later) and never record it per article."""


def batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class EntrezClient:
    def __init__(
        self,
        base_url: str = DEFAULT_EUTILS_URL,
        email: str | None = None,
        api_key: str | None = None,
        tool: str = "panelforge",
        cache: Lake | None = None,
        cache_namespace: str = "default",
        retry: RetryPolicy | None = None,
        timeout: float = 120.0,
        rate_limit: float | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.email, self._api_key, self.tool = email, api_key, tool
        self.cache = cache
        self.cache_namespace = cache_namespace  # e.g. the release: a new release asks afresh
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        rate = rate_limit or (10.0 if api_key else 3.0)
        self.limiter = RateLimiter(rate, key=f"eutils@{urllib.parse.urlsplit(self.base_url).netloc}")
        self.session = requests.Session()
        self.requests = 0
        self.cache_hits = 0

    # ---- transport -------------------------------------------------------------------------
    def _cache_path(self, endpoint: str, params: list[tuple[str, str]]) -> str | None:
        if self.cache is None:
            return None
        key = hashlib.sha256(f"{endpoint}?{urllib.parse.urlencode(sorted(params))}".encode()).hexdigest()
        return self.cache.path("cache", "eutils", self.cache_namespace, endpoint.split(".")[0], f"{key}.xml")

    def _post_once(self, endpoint: str, params: list[tuple[str, str]]) -> bytes:
        credentials = [("tool", self.tool)] + ([("email", self.email)] if self.email else [])
        credentials += [("api_key", self._api_key)] if self._api_key else []
        self.limiter.acquire()
        self.requests += 1
        try:
            response = self.session.post(f"{self.base_url}/{endpoint}", data=params + credentials, timeout=self.timeout)
        except _TRANSPORT_ERRORS as exc:
            raise TransientError(f"{endpoint}: {type(exc).__name__}") from exc  # no URL: it may hold the key
        body = response.content
        if response.status_code in RETRYABLE_STATUS:
            retry_after = response.headers.get("Retry-After")
            raise TransientError(
                f"{endpoint}: HTTP {response.status_code}",
                retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
            )
        if b"API rate limit exceeded" in body[:200]:
            raise TransientError(f"{endpoint}: API rate limit exceeded (HTTP {response.status_code})", retry_after=1.0)
        if b"API key invalid" in body[:200]:  # the body echoes the key: never quote it
            raise EntrezUnavailableError(f"{endpoint}: NCBI rejected the API key (HTTP {response.status_code})")
        if response.status_code in UNUSABLE_ENDPOINT_STATUS:
            raise EntrezUnavailableError(f"{endpoint}: HTTP {response.status_code} (check the URL and access)")
        if response.status_code >= 400:
            raise PermanentError(f"{endpoint}: HTTP {response.status_code}")
        return body

    def call(self, endpoint: str, params: list[tuple[str, str]], parse: Callable[[bytes], T]) -> T:
        """POST ``params`` to ``endpoint`` (``efetch.fcgi``...) and ``parse`` the answer, from the
        cache when answered before. An answer is cached only after it parsed; a cached answer
        that no longer parses is dropped and asked again.

        Raises :class:`EntrezUnavailableError` when E-utilities cannot be used, ``PermanentError``
        for a refused request (400...) and ``EntrezAnswerError`` for an unusable answer.
        """
        path = self._cache_path(endpoint, params)
        if path is not None and self.cache.exists(path):
            with self.cache.fs.open(path, "rb") as fh:
                body = fh.read()
            try:
                parsed = parse(body)
            except EntrezAnswerError:
                self.cache.fs.rm(path)
            else:
                self.cache_hits += 1
                return parsed
        try:
            body = self.retry.call(lambda: self._post_once(endpoint, params), endpoint)
        except PermanentError as exc:
            if isinstance(exc.__cause__, TransientError):  # attempts ran out: an outage, not an answer
                raise EntrezUnavailableError(f"NCBI E-utilities unavailable: {exc}") from exc
            raise
        parsed = parse(body)
        if path is not None:
            with self.cache.atomic_local_file(path) as tmp, open(tmp, "wb") as fh:
                fh.write(body)
        return parsed

    # ---- queries ---------------------------------------------------------------------------
    def pubmed_records(self, pmids: Iterable[str], batch: int = EFETCH_BATCH) -> tuple[dict[str, dict], dict[str, str]]:
        """PubMed records for ``pmids``: ``({pmid: record}, {pmid: problem})``; every requested
        PMID ends up in exactly one of the two."""
        wanted = sorted({p for p in pmids if p})
        records: dict[str, dict] = {}
        problems: dict[str, str] = {}
        for chunk in batches(wanted, batch):
            params = [("db", "pubmed"), ("retmode", "xml"), ("id", ",".join(chunk))]
            try:
                found, issues = self.call("efetch.fcgi", params, parse_pubmed_articles)
            except (PermanentError, EntrezAnswerError) as exc:  # this batch's answer; EntrezUnavailableError propagates
                problems.update({p: str(exc) for p in chunk})
                continue
            asked = set(chunk)
            records.update({p: r for p, r in found.items() if p in asked})
            problems.update({p: m for p, m in issues.items() if p in asked})
            for pmid in chunk:
                if pmid not in records and pmid not in problems:
                    problems[pmid] = "not found in PubMed"
        return records, problems

    def citing_pmids(
        self, pmids: Iterable[str], batch: int = ELINK_BATCH
    ) -> tuple[dict[str, list[str]], dict[str, str]]:
        """PMIDs citing each of ``pmids`` (``pubmed_pubmed_citedin``), one ``id=`` per PMID so
        each gets its own link set."""
        wanted = sorted({p for p in pmids if p})
        links: dict[str, list[str]] = {}
        problems: dict[str, str] = {}
        for chunk in batches(wanted, batch):
            params = [("dbfrom", "pubmed"), ("db", "pubmed"), ("linkname", "pubmed_pubmed_citedin")]
            params += [("id", pmid) for pmid in chunk]
            try:
                found, issues = self.call("elink.fcgi", params, parse_citedin)
            except (PermanentError, EntrezAnswerError) as exc:  # this batch's answer; EntrezUnavailableError propagates
                problems.update({p: str(exc) for p in chunk})
                continue
            for pmid in chunk:
                if pmid in found:
                    links[pmid] = found[pmid]
                else:
                    problems[pmid] = issues.get(pmid, "no link set returned")
        return links, problems
