"""NCBI E-utilities as a resource. The API key arrives as ``EnvVar("NCBI_API_KEY")``: Dagster
resolves it in the run's process and shows only the variable's name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource, InitResourceContext

from pipelines.core.lake import Lake
from pipelines.entrez.client import DEFAULT_EUTILS_URL, EntrezClient


class EutilsResource(ConfigurableResource):
    """``base_url`` from ``NCBI_EUTILS_URL``; ``email`` from ``NCBI_EMAIL``; 3 req/s, 10 with a key."""

    base_url: str = DEFAULT_EUTILS_URL
    email: str | None = None
    api_key: str | None = None
    tool: str = "panelforge"
    rate_limit: float | None = None
    outage_retries: int = 0  # runs are retried this often when the service is unreachable
    outage_retry_delay_s: float = 300.0
    # the demo profile without NCBI_EUTILS_URL: NCBI is never asked; the recorded answers that ship
    # with PanelForge (sample/entrez) are served on loopback for as long as a step uses this resource
    recorded: bool = False

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator[EutilsResource]:
        if not self.recorded:
            yield self
            return
        try:
            from testing.loopback.eutils_server import EutilsLoopbackServer
        except ImportError:  # an installed package without the repository's testing/ and sample/
            raise RuntimeError(
                "the demo profile answers E-utilities from the recordings of a PanelForge checkout "
                "(testing/loopback, sample/entrez), which this installation lacks: set NCBI_EUTILS_URL"
            ) from None
        with EutilsLoopbackServer() as server:
            if context.log is not None:
                context.log.info(f"E-utilities: recorded answers (sample/entrez) served at {server.url}, not NCBI")
            yield self.model_copy(update={"base_url": server.url, "recorded": False})

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
