"""Panel2Patch mining: figure, panel and region image–text pairs from a vision-language model.

The asset's code version is the mining logic's version and the prompts' version: a changed
prompt or logic shows the asset as changed in the UI, and a rerun mines again only the figures a
change affects (the stage reuses every
figure whose engine, prompts, settings and inputs are unchanged). Its data version is a hash
of those fingerprints, so downstream assets go stale only when the pairs can have changed.
"""

from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult

from assets.config import config_from
from assets.groups import MINING
from assets.panels import panels
from assets.partitions import release_shard_partitions
from assets.report import error_rate_check, outage_of, run_stage, shard_check
from assets.stage_asset import stage_asset
from pipelines.mining.stages import (
    BOXES_INSIDE,
    CANARY,
    EXTRACTIVE,
    MINING_VERSION,
    PARSE_FAILURES,
    MiningSettings,
    MiningStage,
)
from pipelines.vlm.prompts import PROMPT_VERSION
from resources.compute import RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.vlm import VlmEngineResource

MiningRunSettings = config_from(
    MiningSettings,
    "MiningRunSettings",
    """``som_views`` 0 turns Set-of-Mark panel proposals off; ``region_concepts`` lists the global
    concepts whose panels get region mining (empty: the paper's gate, no charts, tables,
    diagrams, graphs or formulae).""",
    exclude=("require_canary",),  # always on in production: a server that ignores schemas is refused
    overrides={"region_concepts": (list[str], [])},
    module=__name__,
)


@stage_asset(
    MiningStage,
    deps=[panels],
    group_name=MINING,
    kinds={"parquet", "ray", "vllm"},
    code_version=f"{MINING_VERSION}-{PROMPT_VERSION}",
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[
        shard_check(
            "pairs",
            BOXES_INSIDE,
            "Panel boxes lie inside their figure, region boxes inside their panel.",
            blocking=True,
        ),
        shard_check("pairs", EXTRACTIVE, "Texts said to come from the caption occur in it verbatim.", blocking=True),
        shard_check("pairs", PARSE_FAILURES, "Few model answers are unusable (garbage, truncated, no box)."),
        shard_check(
            "pairs", CANARY, "The engine applies structured outputs (a canary request checked at the start).", True
        ),
        error_rate_check("pairs", release_shard_partitions),
    ],
)
def pairs(
    context: AssetExecutionContext,
    config: MiningRunSettings,
    lake: LakeResource,
    vlm: VlmEngineResource,
    ray: RayResource,
    quality: QualityResource,
) -> MaterializeResult:
    lk = lake.lake()
    settings = config.to_settings(region_concepts=tuple(config.region_concepts) or None)
    if vlm.synthetic:
        context.log.info("VLM: a tiny RANDOM Qwen2.5-VL (synthetic): its pairs are marked synthetic, no quality claim")
    with vlm.engine(cache_dir=lk.path("models", "vlm")) as engine:
        stage = MiningStage(engine, settings, actors=vlm.replicas, gpus_per_actor=ray.gpus_per_actor)
        return run_stage(context, stage, lk, quality.max_error_rate, outage_of(vlm))
