"""The Dagster instance PanelForge expects: the shipped ``deploy/dagster.yaml`` and its pool limits."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import DagsterInstance

from pipelines.acquire.stages import POOL as PMC_POOL
from pipelines.concepts.stages import GPU_POOL
from pipelines.entrez.stage import POOL as EUTILS_POOL
from resources.settings import REPO, Settings

INSTANCE_FILE = REPO / "deploy" / "dagster.yaml"


def pool_limits(settings: Settings) -> dict[str, int]:
    # pmc_source: one downloading host for mirrors, PANELFORGE_CLOUD_HOSTS for the AWS bucket
    return {PMC_POOL: settings.source_policy().hosts, EUTILS_POOL: 1, GPU_POOL: settings.gpu_slots}


def install_instance_file(dagster_home: Path) -> Path:
    """Put the shipped ``dagster.yaml`` into ``dagster_home`` (kept when one is already there)."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    dest = dagster_home / "dagster.yaml"
    if not dest.exists():
        shutil.copyfile(INSTANCE_FILE, dest)
    return dest


def configure_pools(instance: DagsterInstance, settings: Settings) -> dict[str, int]:
    """Set every pool's limit on ``instance`` (idempotent); returns the limits."""
    limits = pool_limits(settings)
    for pool, limit in limits.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    return limits
