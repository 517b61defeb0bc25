"""Release assets: the sample plan per partition, WebDataset subsets and training mixtures, the
Parquet tables and statistics, the dataset card, and the upload to the Hugging Face Hub."""

from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from assets.concepts import figure_concepts
from assets.config import config_from
from assets.groups import RELEASE
from assets.longcap import long_captions, pair_negatives
from assets.mining import pairs
from assets.panels import panel_crops, panels
from assets.parsing import parsed_articles, pubmed_metadata
from assets.partitions import releases_partitions
from assets.report import needs_person, run_stage
from assets.stage_asset import stage_asset
from pipelines.core.stage import StageInputError
from pipelines.release.stages import (
    BIOMEDICA_FILTERED_CONCEPTS,
    NO_MACHINE_PATHS,
    SHARD_NAME,
    DatasetCardStage,
    HubUploadStage,
    PairPlanStage,
    PairWebDatasetStage,
    ReleaseTablesStage,
    SamplePlanStage,
    WebDatasetStage,
    concept_balanced_subsets,
    concept_filtered_subsets,
    license_subsets,
)
from pipelines.release.webdataset import ShardLimits
from resources.hub import HuggingFaceHubResource
from resources.lake import LakeResource
from resources.quality import QualityResource

_whole_release = MultiToSingleDimensionPartitionMapping("release")


SamplePlanSettings = config_from(
    SamplePlanStage,
    "SamplePlanSettings",
    """``shuffle_seed`` fixes the release's sample order; every shard of a release must use one seed.""",
    module=__name__,
)


@stage_asset(
    SamplePlanStage,
    deps=[parsed_articles, pubmed_metadata, figure_concepts],
    group_name=RELEASE,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
)
def dataset_samples(
    context: AssetExecutionContext, config: SamplePlanSettings, lake: LakeResource
) -> MaterializeResult:
    return run_stage(context, config.to_settings(), lake.lake())


_ShardLimitSettings = config_from(
    ShardLimits,
    "ShardSettings",
    # the launchpad's names since the first release; ShardLimits's are those of every subset's manifest.json
    rename={"max_samples": "max_samples_per_shard", "max_bytes": "max_shard_bytes"},
    module=__name__,
)


class ShardSettings(_ShardLimitSettings):
    """At most ``max_samples_per_shard`` samples or ``max_shard_bytes`` bytes per tar."""

    shard_name: str = SHARD_NAME  # the stages' own default: the tars' name

    def limits(self) -> ShardLimits:
        return self.to_settings()


def _write_subsets(context, lake: LakeResource, name: str, subsets, config: ShardSettings, mixture=None):
    stage = WebDatasetStage(subsets, config.limits(), config.shard_name, mixture, name=name)
    return run_stage(context, stage, lake.lake())


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name=RELEASE,
    kinds={"webdataset"},
    description="The release as WebDataset shards, one subset per license group, shuffled across clusters and "
    "articles, with a Parquet sidecar per shard and sizes.json for OpenCLIP.",
)
def webdataset_shards(context: AssetExecutionContext, config: ShardSettings, lake: LakeResource) -> MaterializeResult:
    return _write_subsets(context, lake, "webdataset_shards", license_subsets(), config)


class ConceptFilterSettings(ShardSettings):
    concepts: list[str] = BIOMEDICA_FILTERED_CONCEPTS


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name=RELEASE,
    kinds={"webdataset"},
    description="BIOMEDICA's concept-filtered training mixture: only the chosen global concepts, per license group.",
)
def webdataset_concept_filtered(
    context: AssetExecutionContext, config: ConceptFilterSettings, lake: LakeResource, quality: QualityResource
) -> MaterializeResult:
    try:
        subsets = concept_filtered_subsets(list(config.concepts), quality.taxonomy)
    except StageInputError as exc:
        raise needs_person(exc) from exc
    return _write_subsets(context, lake, "webdataset_concept_filtered", subsets, config, "concept-filtered")


class ConceptBalanceSettings(ShardSettings):
    cap_per_concept: int = 100_000


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(dataset_samples, partition_mapping=_whole_release)],
    group_name=RELEASE,
    kinds={"webdataset"},
    description="BIOMEDICA's concept-balanced training mixture: at most cap_per_concept samples of each global "
    "concept (a random subset, in shuffle order), per license group.",
)
def webdataset_concept_balanced(
    context: AssetExecutionContext, config: ConceptBalanceSettings, lake: LakeResource
) -> MaterializeResult:
    subsets = concept_balanced_subsets(config.cap_per_concept)
    return _write_subsets(context, lake, "webdataset_concept_balanced", subsets, config, "concept-balanced")


PairPlanSettings = config_from(
    PairPlanStage,
    "PairPlanSettings",
    """``include_vlm_text``: also ship panel samples whose text the VLM associated with the panel
    (``text_match`` ``vlm``); by default only caption-matched texts (printed label, reading order).""",
    fields=("include_vlm_text",),  # the gate's settings: the stage's defaults
    module=__name__,
)


@stage_asset(
    PairPlanStage,
    deps=[dataset_samples, pairs, panel_crops, pair_negatives, long_captions],
    group_name=RELEASE,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
)
def pair_samples(context: AssetExecutionContext, config: PairPlanSettings, lake: LakeResource) -> MaterializeResult:
    return run_stage(context, config.to_settings(), lake.lake())


class PairShardSettings(ShardSettings):
    """``token_sample``: texts per level whose CLIP tokens the statistics count."""

    token_sample: int = PairWebDatasetStage.token_sample


@stage_asset(
    PairWebDatasetStage,
    deps=[AssetDep(pair_samples, partition_mapping=_whole_release)],
    group_name=RELEASE,
    kinds={"webdataset"},
)
def webdataset_pairs(
    context: AssetExecutionContext, config: PairShardSettings, lake: LakeResource
) -> MaterializeResult:
    stage = PairWebDatasetStage(config.limits(), config.shard_name, config.token_sample)
    return run_stage(context, stage, lake.lake())


StatsSettings = config_from(ReleaseTablesStage, "StatsSettings", "", module=__name__)  # the stage's own fields


@stage_asset(
    ReleaseTablesStage,
    deps=[
        AssetDep(upstream, partition_mapping=_whole_release)
        for upstream in (dataset_samples, panels, pairs, long_captions, pair_negatives)
    ],
    group_name=RELEASE,
    kinds={"parquet"},
)
def release_parquet(context: AssetExecutionContext, config: StatsSettings, lake: LakeResource) -> MaterializeResult:
    return run_stage(context, config.to_settings(), lake.lake())


@stage_asset(
    DatasetCardStage,
    deps=[
        webdataset_shards,
        webdataset_concept_filtered,
        webdataset_concept_balanced,
        webdataset_pairs,
        release_parquet,
    ],
    group_name=RELEASE,
    kinds={"markdown"},
    check_specs=[
        AssetCheckSpec(
            NO_MACHINE_PATHS,
            asset="dataset_card",
            partitions_def=releases_partitions,
            blocking=True,
            description="No released file holds a path of the machine that built it (JSON, Markdown, sidecars, "
            "Parquet tables, the text members of each subset's first shard; article text aside).",
        )
    ],
)
def dataset_card(context: AssetExecutionContext, lake: LakeResource, hub: HuggingFaceHubResource) -> MaterializeResult:
    return run_stage(context, DatasetCardStage(hub.repo_id), lake.lake())


UploadSettings = config_from(
    HubUploadStage,
    "UploadSettings",
    """``dry_run`` checks and lists everything that would be uploaded without any network call.""",
    fields=("dry_run",),  # the repository, its client and privacy: the hub resource
    module=__name__,
)


@stage_asset(
    HubUploadStage,
    deps=[dataset_card],
    group_name=RELEASE,
    kinds={"huggingface"},
    description="Upload the release to the Hugging Face dataset repository PANELFORGE_HF_REPO (private by "
    "default, resumable), after checking the Hub's limits.",
)
def hf_upload(
    context: AssetExecutionContext, config: UploadSettings, lake: LakeResource, hub: HuggingFaceHubResource
) -> MaterializeResult:
    stage = HubUploadStage(hub.repo_id, None if config.dry_run else hub.client(), hub.private, config.dry_run)
    result = run_stage(context, stage, lake.lake())
    for warning in stage.warnings:
        context.log.warning(warning)
    if config.dry_run:
        context.log.info(f"dry run: would upload {result.metadata['items_ok']} files")
    return result
