"""The yearly PMC-OA refresh, without a person: a sensor opens the year's release at tick time
and requests its inventory; declarative automation carries the release through every stage.

Evaluating the sensor has no side effect: it returns the release's dynamic-partition requests
with its run request, and Dagster applies both at tick time only (``Test sensor`` in the UI
shows them without adding anything). A release whose inventory is materialized is never
requested again, so turning the sensor on does not re-launch the downloads of a complete
release; a release opened ahead of time (``python -m jobs.cli add-release``) but not listed yet
still gets its inventory. The run key (``inventory-<release>``) makes Dagster launch it once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from dagster import (
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    sensor,
)

from assets.acquisition import pmc_inventory, pmc_raw_articles
from assets.groups import RELEASE
from assets.partitions import RELEASES, open_release_requests, release_shard_partitions, releases_partitions

REFRESH_DAY = (1, 2, 2)  # 2 January, 02:00 UTC

pmc_inventory_job = define_asset_job(
    "pmc_inventory_job",
    selection=AssetSelection.assets(pmc_inventory),
    partitions_def=releases_partitions,
    description="List a PMC-OA release and diff it against the previous one.",
)
pmc_download_job = define_asset_job(
    "pmc_download_job",
    selection=AssetSelection.assets(pmc_raw_articles),
    partitions_def=release_shard_partitions,
    description="Fetch the new and changed articles of one (release, shard); carry over the rest.",
)
publish_release_job = define_asset_job(
    "publish_release_job",
    selection=AssetSelection.groups(RELEASE) - AssetSelection.assets("dataset_samples", "pair_samples", "hf_upload"),
    partitions_def=releases_partitions,
    description="Serialize a release whose samples are planned: shards, mixtures, Parquet, statistics, card.",
)


def release_key(when: datetime) -> str:
    """Releases are named by year: the refresh of January 2027 opens release ``2027``."""
    return f"{when.year:04d}"


def due_release(now: datetime) -> str | None:
    """The release the refresh should have opened by ``now`` (none before 2 January 02:00)."""
    month, day, hour = REFRESH_DAY
    opens = datetime(now.year, month, day, hour, tzinfo=UTC)
    return release_key(now) if now >= opens else None


def _utc_now() -> datetime:
    return datetime.now(UTC)


def yearly_refresh_sensor(n_shards: int, clock: Callable[[], datetime] = _utc_now):
    """The sensor, for a lake of ``n_shards`` shards per release (from the settings)."""

    @sensor(
        name="yearly_pmc_refresh",
        job=pmc_inventory_job,
        minimum_interval_seconds=3600,
        default_status=DefaultSensorStatus.STOPPED,
        description="Yearly refresh: on 2 January (02:00 UTC) opens the year's release with its shards "
        "and lists PMC-OA; automation takes the release through every stage.",
    )
    def yearly_pmc_refresh(context: SensorEvaluationContext):
        now = clock()
        release = due_release(now)
        if release is None:
            return SkipReason(f"no release is due before 2 January {now.year}")
        opened = context.instance.has_dynamic_partition(RELEASES, release)
        if opened and release in context.instance.get_materialized_partitions(pmc_inventory.key):
            return SkipReason(f"release {release} is already open and listed")
        return SensorResult(
            run_requests=[RunRequest(run_key=f"inventory-{release}", partition_key=release)],
            dynamic_partitions_requests=[] if opened else open_release_requests(release, n_shards),
        )

    return yearly_pmc_refresh
