"""NCBI E-utilities as a resource. The API key arrives as ``EnvVar("NCBI_API_KEY")``: Dagster
resolves it in the run's process and shows only the variable's name."""

from __future__ import annotations

from dagster import ConfigurableResource

from pipelines.entrez.client import DEFAULT_EUTILS_URL, EntrezClient
from pipelines.lake import Lake


class EutilsResource(ConfigurableResource):
    """``base_url`` from ``NCBI_EUTILS_URL``; ``email`` from ``NCBI_EMAIL``; 3 req/s, 10 with a key."""

    base_url: str = DEFAULT_EUTILS_URL
    email: str | None = None
    api_key: str | None = None
    tool: str = "panelforge"
    rate_limit: float | None = None
    outage_retries: int = 0  # runs are retried this often when the service is unreachable
    outage_retry_delay_s: float = 300.0

    def client(self, cache: Lake, namespace: str) -> EntrezClient:
        return EntrezClient(
            base_url=self.base_url,
            email=self.email,
            api_key=self.api_key or None,
            tool=self.tool,
            cache=cache,
            cache_namespace=namespace,
            rate_limit=self.rate_limit,
        )
