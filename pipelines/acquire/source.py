"""One interface over every PMC-OA source, chosen by URL (``PANELFORGE_PMC_SOURCE``).

==================================  =======================  ======================
URL                                 transport                layout
==================================  =======================  ======================
``s3://pmc-oa-opendata``            HTTPS, S3 REST API       cloud
``https://host/bucket``             HTTP(S), S3 REST API     cloud
``ftp://host[:port]/path``          FTP (ftputil)            legacy
``file:///path``                    local files              legacy if it has
                                                             ``oa_file_list.csv``,
                                                             else cloud
==================================  =======================  ======================

FTP credentials, when a mirror needs them, come only from ``PANELFORGE_FTP_USER`` and
``PANELFORGE_FTP_PASSWORD`` in the environment; credentials inside the URL are refused so
they never reach run configuration or logs.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pipelines.acquire.layouts import CloudLayout, InventoryProblem, InventoryRecord, LegacyLayout, StagedArticle
from pipelines.acquire.transports import FtpTransport, HttpTransport, LocalTransport, Transport
from pipelines.net.ratelimit import RateLimiter
from pipelines.net.retry import RetryPolicy

# AWS documents "at least 5,500 GET/HEAD requests per second per partitioned prefix" for S3
# (docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html).
S3_GET_PER_PREFIX = 5_500


@dataclass(frozen=True)
class SourcePolicy:
    """How hard one host may drive a source: ``rate`` requests/s (shared by every process of
    the host through the limiter's lock file), ``concurrency`` requests in flight per run
    process, and ``hosts``, the runs allowed to download at once (the ``pmc_source`` pool
    limit). Whatever the placement, the cluster sends at most ``hosts x rate`` requests/s."""

    rate: float
    concurrency: int
    hosts: int = 1

    @property
    def cluster_rate(self) -> float:
        return self.rate * self.hosts


# The AWS bucket: every article version is its own prefix and one article's requests are
# sequential, so even the worst case (all requests of the cluster in one partitioned prefix)
# stays under S3's 5,500 GET/s when hosts x rate <= 5,500: 340/s per host allows 16 hosts.
# 64 in flight keep 340/s going up to ~190 ms per request (Little's law: 340 x 0.19 = 64).
CLOUD_POLICY = SourcePolicy(rate=340.0, concurrency=64)
# Everything else keeps its strict limit and one downloading host: NCBI's FTP limit is 3/s per
# IP; an HTTPS endpoint is someone's S3-compatible mirror of unknown capacity (20/s, courteous).
DEFAULT_POLICIES = {
    "s3": CLOUD_POLICY,
    "http": SourcePolicy(rate=20.0, concurrency=4),
    "https": SourcePolicy(rate=20.0, concurrency=4),
    "ftp": SourcePolicy(rate=3.0, concurrency=4),
    "file": SourcePolicy(rate=1000.0, concurrency=4),
}
DEFAULT_RATE_LIMITS = {scheme: policy.rate for scheme, policy in DEFAULT_POLICIES.items()}


class PmcSource:
    """A transport (how bytes move) paired with a layout (what the files mean)."""

    def __init__(
        self,
        url: str,
        transport: Transport,
        layout: CloudLayout | LegacyLayout,
        policy: SourcePolicy | None = None,
    ):
        self.url = url
        self.transport = transport
        self.layout = layout
        self.policy = policy or source_policy(url)

    @property
    def concurrency(self) -> int:
        return self.policy.concurrency

    @property
    def requests(self) -> int:
        return self.transport.requests

    @property
    def bytes(self) -> int:
        return self.transport.bytes

    def inventory(
        self, previous: dict[str, dict] | None = None
    ) -> tuple[list[InventoryRecord], list[InventoryProblem]]:
        return self.layout.inventory(self.transport, previous or {}, self.policy.concurrency)

    def fetch(self, record: dict, staging: Path) -> StagedArticle:
        return self.layout.fetch(self.transport, record, staging)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> PmcSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_rate_limit(url: str) -> float:
    return source_policy(url).rate


def source_policy(
    url: str, rate: float | None = None, concurrency: int | None = None, hosts: int | None = None
) -> SourcePolicy:
    """The scheme's default policy with the given overrides. Only the AWS bucket (``s3://``)
    may have more than one downloading host: a mirror's limit is the mirror's, not per host."""
    scheme = urllib.parse.urlsplit(url).scheme
    default = DEFAULT_POLICIES.get(scheme, DEFAULT_POLICIES["ftp"])
    if hosts is not None and hosts > 1 and scheme != "s3":
        raise ValueError(f"only an s3:// source may be downloaded by several hosts at once, not {scheme}://")
    policy = SourcePolicy(
        rate=rate or default.rate, concurrency=concurrency or default.concurrency, hosts=hosts or default.hosts
    )
    if policy.rate <= 0 or policy.concurrency < 1 or policy.hosts < 1:
        raise ValueError(f"rate, concurrency and hosts must be positive, got {policy}")
    return policy


def open_source(
    url: str,
    rate_limit: float | None = None,
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    rate_state_dir: str | None = None,
    ftp_user: str = "anonymous",
    ftp_password: str = "anonymous@",
    concurrency: int | None = None,
    hosts: int | None = None,
) -> PmcSource:
    """Open the source at ``url`` with a host-wide rate limit (requests/s) and at most
    ``concurrency`` HTTP requests in flight (defaults: :func:`source_policy`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        raise ValueError("credentials in the source URL are not accepted; use PANELFORGE_FTP_USER/PASSWORD")
    retry = retry or RetryPolicy()
    policy = source_policy(url, rate_limit, concurrency, hosts)
    key = f"{parts.scheme}://{parts.hostname}:{parts.port}"
    limiter = RateLimiter(policy.rate, key=key, state_dir=rate_state_dir)
    if parts.scheme in ("s3", "http", "https"):
        base = f"https://{parts.netloc}.s3.amazonaws.com" + parts.path.rstrip("/") if parts.scheme == "s3" else url
        transport = HttpTransport(base, limiter, retry, timeout, max_in_flight=policy.concurrency)
        return PmcSource(url, transport, CloudLayout(), policy)
    if parts.scheme == "ftp":
        transport = FtpTransport(
            parts.hostname or "localhost",
            parts.port or 21,
            parts.path or "/",
            limiter,
            retry,
            user=ftp_user,
            password=ftp_password,
            timeout=timeout,
        )
        return PmcSource(url, transport, LegacyLayout(), policy)
    if parts.scheme == "file":
        root = urllib.parse.unquote(parts.path)
        layout = LegacyLayout() if Path(root, "oa_file_list.csv").exists() else CloudLayout()
        return PmcSource(url, LocalTransport(root, limiter, retry), layout, policy)
    raise ValueError(f"unsupported PMC source URL {url!r} (use s3://, https://, ftp:// or file://)")
