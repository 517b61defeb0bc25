"""The PMC-OA source (cloud bucket, HTTPS mirror, FTP mirror or local copy) as a resource."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.acquire.source import PmcSource, open_source
from pipelines.net.retry import RetryPolicy


class PmcSourceResource(ConfigurableResource):
    """``url`` picks transport and layout; ``rate_limit`` (requests/s) holds host-wide through
    the slot files in ``rate_dir``; ``concurrency`` bounds the requests in flight per run;
    unset, both come from the source's policy (``pipelines.acquire.source.DEFAULT_POLICIES``).
    ``hosts`` is the ``pmc_source`` pool limit the instance was set up with (s3:// only).
    ``ftp_password`` arrives as ``EnvVar``."""

    url: str
    rate_limit: float | None = None
    outage_retries: int = 0  # runs are retried this often when the service is unreachable
    outage_retry_delay_s: float = 300.0
    concurrency: int | None = None
    hosts: int = 1
    timeout_s: float = 60.0
    attempts: int = 5
    backoff_base_s: float = 0.5
    rate_dir: str | None = None
    ftp_user: str = "anonymous"
    ftp_password: str | None = None

    def open(self) -> PmcSource:
        retry = RetryPolicy(attempts=self.attempts, base_delay=self.backoff_base_s)
        return open_source(
            self.url,
            rate_limit=self.rate_limit,
            timeout=self.timeout_s,
            retry=retry,
            rate_state_dir=self.rate_dir,
            ftp_user=self.ftp_user,
            ftp_password=self.ftp_password or "anonymous@",
            concurrency=self.concurrency,
            hosts=self.hosts,
        )
