"""Acquisition assets: the release inventory and the raw articles of each (release, shard)."""

from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MultiToSingleDimensionPartitionMapping,
)

from assets.groups import ACQUISITION
from assets.partitions import open_release, release_shard_partitions, releases_partitions
from assets.report import error_rate_check, outage_of, run_stage
from assets.stage_asset import stage_asset
from pipelines.acquire.stages import AcquireStage, InventoryStage
from resources.lake import LakeResource
from resources.pmc_source import PmcSourceResource
from resources.quality import QualityResource


@stage_asset(
    InventoryStage,
    group_name=ACQUISITION,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description=InventoryStage.__doc__ + " Opens the release's shards as partitions.",
    check_specs=[error_rate_check("pmc_inventory", releases_partitions)],
)
def pmc_inventory(
    context: AssetExecutionContext, lake: LakeResource, pmc_source: PmcSourceResource, quality: QualityResource
) -> MaterializeResult:
    lk = lake.lake()
    with pmc_source.open() as source:
        stage = InventoryStage(source, lake.shards)
        result = run_stage(context, stage, lk, quality.max_error_rate, outage_of(pmc_source))
    # a release added by hand (the UI's "Add partition") gets its shards here, in the run
    open_release(context.instance, context.partition_key, len(lk.shards()))
    return result


@stage_asset(
    AcquireStage,
    deps=[AssetDep(pmc_inventory, partition_mapping=MultiToSingleDimensionPartitionMapping("release"))],
    group_name=ACQUISITION,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[
        AssetCheckSpec(
            "raw_articles_consistent",
            asset="pmc_raw_articles",
            partitions_def=release_shard_partitions,
            blocking=True,
            description="Every downloaded or carried article has its XML, and every indexed file's bytes are in its "
            "tar with the recorded size, md5 and sha256.",
        ),
        error_rate_check("pmc_raw_articles", release_shard_partitions),
    ],
)
def pmc_raw_articles(
    context: AssetExecutionContext, lake: LakeResource, pmc_source: PmcSourceResource, quality: QualityResource
) -> MaterializeResult:
    with pmc_source.open() as source:
        stage = AcquireStage(source, pmc_source.concurrency)
        return run_stage(context, stage, lake.lake(), quality.max_error_rate, outage_of(pmc_source))
