"""Parsing assets: articles, figures, mentions, other graphics and PubMed metadata per partition;
image duplicates per release."""

from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MultiToSingleDimensionPartitionMapping,
)

from assets.acquisition import pmc_raw_articles
from assets.config import config_from
from assets.groups import METADATA, PARSING
from assets.partitions import release_shard_partitions
from assets.report import error_rate_check, outage_of, run_stage
from assets.stage_asset import stage_asset
from pipelines.entrez.stage import PubmedStage
from pipelines.parse.shard import ParseLimits
from pipelines.parse.stages import DuplicatesStage, ParseStage
from resources.eutils import EutilsResource
from resources.lake import LakeResource
from resources.quality import QualityResource

ParseSettings = config_from(
    ParseLimits,
    "ParseSettings",
    """Caps on one article's inputs (over a cap: a recorded reason, never read) and the rows per
    Parquet batch, which bound the run's memory.""",
    module=__name__,
)


@stage_asset(
    ParseStage,
    deps=[pmc_raw_articles],
    group_name=PARSING,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[error_rate_check("parsed_articles", release_shard_partitions)],
)
def parsed_articles(
    context: AssetExecutionContext, config: ParseSettings, lake: LakeResource, quality: QualityResource
) -> MaterializeResult:
    return run_stage(context, ParseStage(config.to_settings()), lake.lake(), quality.max_error_rate)


@stage_asset(
    DuplicatesStage,
    deps=[AssetDep(parsed_articles, partition_mapping=MultiToSingleDimensionPartitionMapping("release"))],
    group_name=PARSING,
    kinds={"parquet"},
)
def image_duplicates(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    return run_stage(context, DuplicatesStage(), lake.lake())


@stage_asset(
    PubmedStage,
    deps=[parsed_articles],
    group_name=METADATA,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description="PubMed records (MeSH, publication types, dates, abstracts) and citing articles, by PMID. "
    "An unreachable NCBI fails the run (to be retried); per-PMID problems are rows.",
    check_specs=[error_rate_check("pubmed_metadata", release_shard_partitions)],
)
def pubmed_metadata(
    context: AssetExecutionContext, lake: LakeResource, eutils: EutilsResource, quality: QualityResource
) -> MaterializeResult:
    stage = PubmedStage(client_for=lambda lk, release: eutils.client(lk, namespace=release))
    return run_stage(context, stage, lake.lake(), quality.max_error_rate, outage_of(eutils))
