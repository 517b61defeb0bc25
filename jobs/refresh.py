"""The yearly PMC-OA refresh: a schedule opens the release, a sensor fans out its shards."""

from datetime import datetime

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    EventLogEntry,
    MultiPartitionKey,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    asset_sensor,
    define_asset_job,
    schedule,
)

from assets.acquisition import pmc_inventory, pmc_raw_articles
from jobs.partitions import RELEASES, release_shard_partitions, releases_partitions, shard_partitions

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
    selection=AssetSelection.groups("release") - AssetSelection.assets("dataset_samples", "hf_upload"),
    partitions_def=releases_partitions,
    description="Serialize a release whose samples are planned: shards, mixtures, Parquet, statistics, card.",
)


def release_key(when: datetime) -> str:
    """Releases are named by year: the yearly refresh of January 2027 opens release ``2027``."""
    return f"{when.year:04d}"


@schedule(
    cron_schedule="0 2 2 1 *",
    job=pmc_inventory_job,
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Yearly refresh (2 January, 02:00 UTC): opens the year's release and lists PMC-OA.",
)
def yearly_pmc_refresh(context: ScheduleEvaluationContext) -> RunRequest:
    release = release_key(context.scheduled_execution_time)
    if not context.instance.has_dynamic_partition(RELEASES, release):
        context.instance.add_dynamic_partitions(RELEASES, [release])
    return RunRequest(run_key=f"inventory-{release}", partition_key=release)


@asset_sensor(
    asset_key=pmc_inventory.key,
    job=pmc_download_job,
    default_status=DefaultSensorStatus.STOPPED,
    description="When a release's inventory is materialized, request the download of every shard.",
)
def release_shards_sensor(context: SensorEvaluationContext, asset_event: EventLogEntry):
    release = asset_event.dagster_event.partition
    for shard in shard_partitions.get_partition_keys():
        yield RunRequest(
            run_key=f"download-{release}-{shard}-{asset_event.run_id}",
            partition_key=MultiPartitionKey({"release": release, "shard": shard}),
        )
