"""Concept-labeling assets: embeddings (DINOv2 on Ray), the concept model, review sheets,
annotation resolution, and labels propagated to every figure image."""

from dagster import (
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MultiToSingleDimensionPartitionMapping,
)

from assets.config import config_from
from assets.groups import CONCEPTS
from assets.parsing import parsed_articles
from assets.partitions import release_shard_partitions, releases_partitions
from assets.report import OutageRetry, error_rate_check, run_stage
from assets.stage_asset import stage_asset
from pipelines.concepts.model import ConceptModelConfig
from pipelines.concepts.stages import (
    ANNOTATIONS_MATCH,
    ClusterLabelsStage,
    ConceptModelStage,
    ConceptReviewStage,
    EmbedStage,
    FigureConceptsStage,
)
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource

_whole_release = MultiToSingleDimensionPartitionMapping("release")


@stage_asset(
    EmbedStage,
    deps=[parsed_articles],
    group_name=CONCEPTS,
    kinds={"parquet", "ray", "pytorch"},
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[error_rate_check("figure_embeddings", release_shard_partitions)],
)
def figure_embeddings(
    context: AssetExecutionContext,
    lake: LakeResource,
    models: ModelsResource,
    ray: RayResource,
    quality: QualityResource,
) -> MaterializeResult:
    config = models.dinov2_config(check=True)
    if config.synthetic:
        context.log.info("embedding with a tiny RANDOM DINOv2 (synthetic): vectors are marked synthetic=True")
    stage = EmbedStage(config, ray.batch_size, ray.actors, ray.gpus_per_actor, ray.address, dict(ray.actor_resources))
    retry = OutageRetry(ray.outage_retries, ray.outage_retry_delay_s)  # a Ray node lost mid-partition
    return run_stage(context, stage, lake.lake(), quality.max_error_rate, retry)


_ConceptModelConfigSettings = config_from(
    ConceptModelConfig,
    "ConceptModelSettings",
    fields=("n_components", "k", "sample_size", "seed", "backend"),
    rename={"backend": "kmeans_backend"},  # auto (faiss when installed), faiss or sklearn
    module=__name__,
)


class ConceptModelSettings(_ConceptModelConfigSettings):
    """PCA and k-means settings. ``reuse_previous`` (the default, so a yearly refresh needs no
    new annotations) labels the release with the newest earlier model when one exists; set it
    to false to fit a new model, which then needs annotating."""

    reuse_previous: bool = True  # the stage's switch, on by default here (a refresh keeps its annotations)


@stage_asset(
    ConceptModelStage,
    deps=[AssetDep(figure_embeddings, partition_mapping=_whole_release)],
    group_name=CONCEPTS,
    kinds={"numpy"},
)
def concept_model(
    context: AssetExecutionContext, config: ConceptModelSettings, lake: LakeResource, models: ModelsResource
) -> MaterializeResult:
    stage = ConceptModelStage(config.to_settings(), models.dinov2_config().model_label, config.reuse_previous)
    return run_stage(context, stage, lake.lake())


ReviewSettings = config_from(ConceptReviewStage, "ReviewSettings", "", module=__name__)  # the stage's own fields


@stage_asset(
    ConceptReviewStage,
    deps=[concept_model],
    group_name=CONCEPTS,
    kinds={"html"},
)
def concept_review(context: AssetExecutionContext, config: ReviewSettings, lake: LakeResource) -> MaterializeResult:
    return run_stage(context, config.to_settings(), lake.lake())


AnnotationSettings = config_from(
    ClusterLabelsStage,
    "AnnotationSettings",
    """Where the filled CSVs are; empty means ``<lake>/annotations/<model version>/``.""",
    fields=("directory",),  # the taxonomy: the quality resource
    module=__name__,
)


@stage_asset(
    ClusterLabelsStage,
    deps=[concept_review],
    group_name=CONCEPTS,
    kinds={"parquet"},
    check_specs=[
        AssetCheckSpec(
            ANNOTATIONS_MATCH,
            asset="cluster_labels",
            partitions_def=releases_partitions,
            description="Every annotated cluster still has the size and members it had when it was annotated "
            "(its fingerprint); a changed cluster keeps its labels, flagged stale.",
        )
    ],
)
def cluster_labels(
    context: AssetExecutionContext, config: AnnotationSettings, lake: LakeResource, quality: QualityResource
) -> MaterializeResult:
    return run_stage(context, config.to_settings(taxonomy=quality.taxonomy), lake.lake())


@stage_asset(
    FigureConceptsStage,
    deps=[figure_embeddings, AssetDep(cluster_labels, partition_mapping=_whole_release)],
    group_name=CONCEPTS,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
)
def figure_concepts(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    return run_stage(context, FigureConceptsStage(), lake.lake())
