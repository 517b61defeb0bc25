"""Panel assets: figures split into panels with their captions split by label, the panels' crops,
synthetic compound figures for the detector, and the detector's training as a launched job."""

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    BackfillPolicy,
    Config,
    MaterializeResult,
    asset,
)

from assets.concepts import figure_concepts
from assets.parsing import parsed_articles
from assets.partitions import release_shard_partitions
from assets.report import error_rate_check, run_stage
from pipelines.panels.stages import (
    BOXES_INSIDE,
    COUNT_AGREEMENT,
    GPU_POOL,
    ZERO_PANELS,
    PanelCropsStage,
    PanelSettings,
    PanelStage,
)
from pipelines.panels.types import DETR, XYCUT
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource


class PanelRunSettings(Config):
    """``prefer``: the method whose panels are kept when layout and detector disagree; empty
    means the detector with real weights, the layout splitter with a random synthetic model."""

    prefer: str = ""
    consensus_min: float = 0.7
    batch_size: int = 8


@asset(
    partitions_def=release_shard_partitions,
    deps=[parsed_articles, figure_concepts],
    group_name="panels",
    kinds={"parquet", "ray", "pytorch"},
    pool=GPU_POOL,
    backfill_policy=BackfillPolicy.multi_run(1),
    description=PanelStage.__doc__,
    check_specs=[
        AssetCheckSpec(
            BOXES_INSIDE,
            asset="panels",
            partitions_def=release_shard_partitions,
            blocking=True,
            description="Every panel box lies inside its image with a positive area.",
        ),
        AssetCheckSpec(
            COUNT_AGREEMENT,
            asset="panels",
            partitions_def=release_shard_partitions,
            description="Split figures whose caption prints panel labels mostly have as many panels as labels.",
        ),
        AssetCheckSpec(
            ZERO_PANELS,
            asset="panels",
            partitions_def=release_shard_partitions,
            description="Few figure images end with no panel at all (uniform, unreadable, too small).",
        ),
        error_rate_check("panels", release_shard_partitions),
    ],
)
def panels(
    context: AssetExecutionContext,
    config: PanelRunSettings,
    lake: LakeResource,
    models: ModelsResource,
    ray: RayResource,
    quality: QualityResource,
) -> MaterializeResult:
    detector = models.detector_config()
    prefer = config.prefer or (XYCUT if detector is None or detector.synthetic else DETR)
    if detector is not None and detector.synthetic:
        context.log.info("panel detector: a tiny RANDOM DAB-DETR (synthetic); the layout splitter's panels are kept")
    settings = PanelSettings(
        detector=detector,
        prefer=prefer,
        consensus_min=config.consensus_min,
        batch_size=config.batch_size,
        actors=ray.actors,
        gpus_per_actor=ray.gpus_per_actor,
        address=ray.address,
    )
    return run_stage(context, PanelStage(settings), lake.lake(), quality.max_error_rate)


@asset(
    partitions_def=release_shard_partitions,
    deps=[panels],
    group_name="panels",
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description=PanelCropsStage.__doc__,
    check_specs=[error_rate_check("panel_crops", release_shard_partitions)],
)
def panel_crops(context: AssetExecutionContext, lake: LakeResource, quality: QualityResource) -> MaterializeResult:
    return run_stage(context, PanelCropsStage(), lake.lake(), quality.max_error_rate)
