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
from pathlib import Path

from pipelines.acquire.layouts import CloudLayout, InventoryProblem, InventoryRecord, LegacyLayout, StagedArticle
from pipelines.acquire.ratelimit import RateLimiter
from pipelines.acquire.retry import RetryPolicy
from pipelines.acquire.transports import FtpTransport, HttpTransport, LocalTransport, Transport

# Requests per second. NCBI's historical FTP limit is 3/s per IP. S3 itself serves thousands
# of GETs per second per prefix; 20/s is a courteous default for the free public bucket.
DEFAULT_RATE_LIMITS = {"ftp": 3.0, "http": 20.0, "https": 20.0, "s3": 20.0, "file": 1000.0}


class PmcSource:
    """A transport (how bytes move) paired with a layout (what the files mean)."""

    def __init__(self, url: str, transport: Transport, layout: CloudLayout | LegacyLayout):
        self.url = url
        self.transport = transport
        self.layout = layout

    @property
    def requests(self) -> int:
        return self.transport.requests

    @property
    def bytes(self) -> int:
        return self.transport.bytes

    def inventory(
        self, previous: dict[str, dict] | None = None
    ) -> tuple[list[InventoryRecord], list[InventoryProblem]]:
        return self.layout.inventory(self.transport, previous or {})

    def fetch(self, record: dict, staging: Path) -> StagedArticle:
        return self.layout.fetch(self.transport, record, staging)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> PmcSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_rate_limit(url: str) -> float:
    return DEFAULT_RATE_LIMITS.get(urllib.parse.urlsplit(url).scheme, 3.0)


def open_source(
    url: str,
    rate_limit: float | None = None,
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    rate_state_dir: str | None = None,
    ftp_user: str = "anonymous",
    ftp_password: str = "anonymous@",
) -> PmcSource:
    """Open the source at ``url`` with a host-wide rate limit (requests/s)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        raise ValueError("credentials in the source URL are not accepted; use PANELFORGE_FTP_USER/PASSWORD")
    retry = retry or RetryPolicy()
    rate = rate_limit or default_rate_limit(url)
    limiter = RateLimiter(rate, key=f"{parts.scheme}://{parts.hostname}:{parts.port}", state_dir=rate_state_dir)
    if parts.scheme == "s3":
        base = f"https://{parts.netloc}.s3.amazonaws.com" + parts.path.rstrip("/")
        return PmcSource(url, HttpTransport(base, limiter, retry, timeout), CloudLayout())
    if parts.scheme in ("http", "https"):
        return PmcSource(url, HttpTransport(url, limiter, retry, timeout), CloudLayout())
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
        return PmcSource(url, transport, LegacyLayout())
    if parts.scheme == "file":
        root = urllib.parse.unquote(parts.path)
        layout = LegacyLayout() if Path(root, "oa_file_list.csv").exists() else CloudLayout()
        return PmcSource(url, LocalTransport(root, limiter, retry), layout)
    raise ValueError(f"unsupported PMC source URL {url!r} (use s3://, https://, ftp:// or file://)")
