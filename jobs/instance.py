"""The Dagster instance PanelForge expects: the shipped instance file of the profile and its pool limits.

``demo`` and ``local`` keep Dagster's SQLite storage under ``DAGSTER_HOME`` (``deploy/dagster.yaml``):
one machine, nothing to run beside it. ``cluster`` needs storage that the web server, the daemon
and run workers on other machines share, so its file (``deploy/dagster-cluster.yaml``) puts runs,
event logs and schedules in PostgreSQL, connected through ``DAGSTER_PG_*`` environment variables.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from pipelines.acquire.stages import POOL as PMC_POOL
from pipelines.core.stage import GPU_POOL
from pipelines.entrez.stage import POOL as EUTILS_POOL
from resources.settings import REPO, Settings

INSTANCE_FILE = REPO / "deploy" / "dagster.yaml"
CLUSTER_INSTANCE_FILE = REPO / "deploy" / "dagster-cluster.yaml"
# Held while an instance is set up (see ``setup_lock``); beside the instance, never in the lake
SETUP_LOCK = ".panelforge-setup.lock"
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
    """Set every pool's limit on ``instance`` (idempotent); returns the limits.

    Two processes setting a pool that does not exist yet both insert its row, and the second
    insert fails on the key's unique constraint; the row is then there, so the second setting of
    the limit updates it. Retried once for that reason: it is how a storage shared by several
    machines (PostgreSQL), which ``setup_lock`` cannot serialise, stays safe to set up at once.
    """
    import sqlalchemy.exc

    limits = pool_limits(settings)
    for pool, limit in limits.items():
        try:
            instance.event_log_storage.set_concurrency_slots(pool, limit)
        except sqlalchemy.exc.IntegrityError:
            instance.event_log_storage.set_concurrency_slots(pool, limit)
    return limits


@contextmanager
def setup_lock(dagster_home: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``dagster_home`` while its instance is set up.

    Dagster creates a SQLite instance's databases the first time a process opens them; two
    processes doing it at once each stamp the schema's Alembic revision (two heads: every later
    open fails) and each insert the pool rows (``UNIQUE constraint failed``). ``make demo``,
    ``make ui`` and ``jobs.cli setup-instance`` started together therefore take this lock
    (``flock``: released by the kernel when a holder dies, so a killed set-up never blocks the next).
    """
    dagster_home.mkdir(parents=True, exist_ok=True)
    with open(dagster_home / SETUP_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_instance(dagster_home: Path, settings: Settings) -> dict[str, int]:
    """Everything a fresh ``dagster_home`` needs before any other Dagster process opens it, under
    ``setup_lock``: the profile's instance file (a file already there is kept), the storage
    created by opening it once, and the pool limits. Returns the limits."""
    with setup_lock(dagster_home):
        install_instance_file(dagster_home, settings.profile)
        with DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home))) as instance:
            return configure_pools(instance, settings)
