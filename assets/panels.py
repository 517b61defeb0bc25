"""Panel assets: figures split into panels with their captions split by label, the panels' crops,
synthetic compound figures for the detector, and the detector's training as a launched job."""

from dataclasses import asdict

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
from assets.groups import PANELS
from assets.parsing import parsed_articles
from assets.partitions import release_shard_partitions, releases_partitions
from assets.report import OutageRetry, error_rate_check, needs_person, run_stage
from assets.stage_asset import stage_asset
from assets.synthetic import synthetic_settings
from pipelines.core.panel_methods import DECISION, DETR
from pipelines.core.stage import StageInputError
from pipelines.panels.detector import DetectorConfig
from pipelines.panels.stages import (
    BOXES_INSIDE,
    COUNT_AGREEMENT,
    GPU_POOL,
    ZERO_PANELS,
    PanelCropsStage,
    PanelSettings,
    PanelStage,
)
from pipelines.panels.train import TrainConfig
from pipelines.panels.training import SyntheticSetStage, latest_training_set
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource
from resources.quality import QualityResource
from resources.settings import REPO

_whole_release = MultiToSingleDimensionPartitionMapping("release")


PanelRunSettings = config_from(
    PanelSettings,
    "PanelRunSettings",
    """``prefer``: the method whose panels are kept when the figure decision and the detector
    disagree; empty means the detector with real weights, the decision with a random synthetic
    model. ``ocr``: the engine reading printed panel labels (tesseract, or rapidocr: needs its wheel).""",
    fields=("prefer", "consensus_min", "batch_size", "figures_per_batch", "ocr"),  # detector, Ray pool: resources
    overrides={"prefer": (str, "")},
    module=__name__,
)


@stage_asset(
    PanelStage,
    deps=[parsed_articles, figure_concepts],
    group_name=PANELS,
    kinds={"parquet", "ray", "pytorch"},
    backfill_policy=BackfillPolicy.multi_run(1),
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
    prefer = config.prefer or (DECISION if detector is None or detector.synthetic else DETR)
    if detector is not None and detector.synthetic:
        context.log.info("panel detector: a tiny RANDOM DAB-DETR (synthetic); the figure decision's panels are kept")
    settings = config.to_settings(
        detector=detector,
        prefer=prefer,
        actors=ray.actors,
        gpus_per_actor=ray.gpus_per_actor,
        address=ray.address,
        actor_resources=dict(ray.actor_resources),
    )
    retry = OutageRetry(ray.outage_retries, ray.outage_retry_delay_s)  # a Ray node lost mid-partition
    return run_stage(context, PanelStage(settings), lake.lake(), quality.max_error_rate, retry)


@stage_asset(
    PanelCropsStage,
    deps=[panels],
    group_name=PANELS,
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[error_rate_check("panel_crops", release_shard_partitions)],
)
def panel_crops(context: AssetExecutionContext, lake: LakeResource, quality: QualityResource) -> MaterializeResult:
    return run_stage(context, PanelCropsStage(), lake.lake(), quality.max_error_rate)


SYNTHETIC_TRAINING_SET = {"figures": 32}
SYNTHETIC_DETECTOR_TRAINING = {"steps": 10, "batch_size": 2, "checkpoint_every": 5}


TrainingSetSettings = config_from(SyntheticSetStage, "TrainingSetSettings", module=__name__)  # the stage's own fields


@stage_asset(
    SyntheticSetStage,
    deps=[AssetDep(figure_concepts, partition_mapping=_whole_release)],
    group_name=PANELS,
    kinds={"coco"},
)
def panel_training_set(
    context: AssetExecutionContext, config: TrainingSetSettings, lake: LakeResource, models: ModelsResource
) -> MaterializeResult:
    if models.synthetic:  # the demo: a set a few CPU steps can train on
        config = synthetic_settings(config, SYNTHETIC_TRAINING_SET)
    stage = config.to_settings()
    return run_stage(context, stage, lake.lake())


_DetectorJobSettings = config_from(
    TrainConfig,
    "DetectorTrainingSettings",
    fields=("steps", "batch_size", "lr", "checkpoint_every", "real_eval"),
    overrides={
        # a release's training at full size (the job's own defaults are a short run)
        "steps": (int, 20_000),
        "batch_size": (int, 16),
        "checkpoint_every": (int, 500),
        # hand-boxed real figures, evaluated after training; relative to the repository, empty: none
        "real_eval": (str, "sample/panels/boxes.json"),
    },
    module=__name__,
)


class DetectorTrainingSettings(_DetectorJobSettings):
    """Training of DAB-DETR on the release's synthetic set, launched as an external job (the
    ``launcher`` resource: a subprocess here, a Ray job or a Kubernetes job on a cluster)."""

    training_set_version: str = ""  # the asset's own: which set to train on; empty: the newest of the release


@asset(
    partitions_def=releases_partitions,
    deps=[panel_training_set],
    group_name=PANELS,
    kinds={"pytorch"},
    pool=GPU_POOL,
    description="DAB-DETR trained on the release's synthetic compound figures, as a launched GPU job: "
    "checkpoints and the exported model in the lake (resumed after a failure), COCO mAP on the synthetic "
    "val split and panel recall/precision on the hand-boxed real figures as metadata.",
)
def panel_detector(
    context: AssetExecutionContext,
    config: DetectorTrainingSettings,
    lake: LakeResource,
    models: ModelsResource,
    launcher: JobLauncherResource,
) -> MaterializeResult:
    lk = lake.lake()
    release = context.partition_key
    if models.synthetic:  # the demo: the tiny random detector, a few CPU steps
        config = synthetic_settings(config, SYNTHETIC_DETECTOR_TRAINING)
    try:
        dataset = latest_training_set(lk, release, config.training_set_version)
    except StageInputError as exc:
        raise needs_person(exc) from exc
    detector = models.detector_config() or DetectorConfig(synthetic=models.synthetic)
    real_eval = REPO / config.real_eval if config.real_eval else None
    job = {
        "train_dir": f"{dataset}/train",
        "val_dir": f"{dataset}/val",
        **config.values(),
        "real_eval": str(real_eval) if real_eval and real_eval.exists() else None,
        "detector": asdict(detector),
    }
    if detector.synthetic:
        context.log.info("training a tiny RANDOMLY initialised DAB-DETR (synthetic): its numbers are no quality claim")
    result = launcher.run(
        context, "pipelines.panels.train", job, lk.path("models", "panels", "runs"), tmp_url=lk.job_tmp_dir()
    )
    return result.get_materialize_result()
