"""The Dagster instance PanelForge expects: the shipped instance file of the profile and its pool limits.

``demo`` and ``local`` keep Dagster's SQLite storage under ``DAGSTER_HOME`` (``deploy/dagster.yaml``):
one machine, nothing to run beside it. ``cluster`` needs storage that the web server, the daemon
and run workers on other machines share, so its file (``deploy/dagster-cluster.yaml``) puts runs,
event logs and schedules in PostgreSQL, connected through ``DAGSTER_PG_*`` environment variables.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from dagster import DagsterInstance

from pipelines.acquire.stages import POOL as PMC_POOL
from pipelines.concepts.stages import GPU_POOL
from pipelines.entrez.stage import POOL as EUTILS_POOL
from resources.settings import REPO, Settings

INSTANCE_FILE = REPO / "deploy" / "dagster.yaml"
CLUSTER_INSTANCE_FILE = REPO / "deploy" / "dagster-cluster.yaml"
# What every Dagster process needs in its environment with the cluster file (never the file itself)
POSTGRES_ENV = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB")


def instance_file(profile: str) -> Path:
    """The shipped instance file of ``profile``: PostgreSQL for ``cluster``, SQLite otherwise."""
    return CLUSTER_INSTANCE_FILE if profile == "cluster" else INSTANCE_FILE


def pool_limits(settings: Settings) -> dict[str, int]:
    # pmc_source: one downloading host for mirrors, PANELFORGE_CLOUD_HOSTS for the AWS bucket
    return {PMC_POOL: settings.source_policy().hosts, EUTILS_POOL: 1, GPU_POOL: settings.gpu_slots}


def install_instance_file(dagster_home: Path, profile: str = "local") -> Path:
    """Put the profile's shipped file into ``dagster_home`` as ``dagster.yaml``.

    An existing file is kept: it may be the user's own (or the one a Helm chart mounts), and
    replacing it would silently move the instance to another database.
    """
    dagster_home.mkdir(parents=True, exist_ok=True)
    dest = dagster_home / "dagster.yaml"
    if not dest.exists():
        shutil.copyfile(instance_file(profile), dest)
    return dest


def missing_postgres_env(environ: Mapping[str, str]) -> list[str]:
    """The ``DAGSTER_PG_*`` variables the cluster instance file needs that ``environ`` lacks.

    Checked before opening the instance so the message names every missing variable at once,
    instead of Dagster's config error naming the first.
    """
    return [name for name in POSTGRES_ENV if not environ.get(name)]


def configure_pools(instance: DagsterInstance, settings: Settings) -> dict[str, int]:
    """Set every pool's limit on ``instance`` (idempotent); returns the limits."""
    limits = pool_limits(settings)
    for pool, limit in limits.items():
        instance.event_log_storage.set_concurrency_slots(pool, limit)
    return limits
