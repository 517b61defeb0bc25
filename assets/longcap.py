"""Long captions (BIOMEDICA-LongCAP) and region hard negatives (RegionMed-CLIP)."""

from dagster import AssetCheckSpec, AssetExecutionContext, BackfillPolicy, MaterializeResult

from assets.config import config_from
from assets.groups import LONG_CAPTIONS
from assets.mining import pairs
from assets.parsing import parsed_articles
from assets.partitions import release_shard_partitions
from assets.report import error_rate_check, needs_person, outage_of, run_stage, shard_check
from assets.stage_asset import stage_asset
from pipelines.longcap.negatives import NEGATIVES_PROMPT_VERSION, RULES_VERSION
from pipelines.longcap.prompts import PROMPT_VERSION
from pipelines.longcap.stages import (
    FEASIBILITY,
    GAINED_CONTEXT,
    GUARD_REJECTIONS,
    LONGCAP_CANARY,
    LONGCAP_VERSION,
    NEGATIVES_DIFFER,
    LongCapSettings,
    LongCapStage,
    NegativesStage,
)
from pipelines.longcap.tokens import TokenizerUnavailableError, load_tokenizer
from resources.compute import ModelsResource, RayResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.vlm import VlmEngineResource

_NegativesStageSettings = config_from(
    NegativesStage, "NegativesSettings", fields=("max_per_type", "vlm_per_pair", "seed"), module=__name__
)


class NegativesSettings(_NegativesStageSettings):
    """``use_vlm``: also ask the VLM for negatives (each checked like the rule ones)."""

    use_vlm: bool = False  # the asset's own: the stage is given an engine or None


@stage_asset(
    NegativesStage,
    deps=[pairs],
    group_name=LONG_CAPTIONS,
    kinds={"parquet"},
    code_version=f"{RULES_VERSION}-{NEGATIVES_PROMPT_VERSION}",  # the rules' and the prompt's versions
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[
        AssetCheckSpec(
            NEGATIVES_DIFFER,
            asset="pair_negatives",
            partitions_def=release_shard_partitions,
            blocking=True,
            description="No negative caption reads like its positive.",
        )
    ],
)
def pair_negatives(
    context: AssetExecutionContext, config: NegativesSettings, lake: LakeResource, vlm: VlmEngineResource
) -> MaterializeResult:
    lk = lake.lake()
    if not config.use_vlm:
        return run_stage(context, config.to_settings(engine=None), lk)
    with vlm.engine(cache_dir=lk.path("models", "vlm")) as engine:
        return run_stage(context, config.to_settings(engine=engine), lk, outage=outage_of(vlm))


LongCapRunSettings = config_from(
    LongCapSettings,
    "LongCapRunSettings",
    """``context_budget``: article context sent to the model, in the text encoder's tokens.""",
    fields=("context_budget", "figures_per_batch"),  # the tokenizer and its budget: the models resource
    module=__name__,
)


@stage_asset(
    LongCapStage,
    deps=[parsed_articles],
    group_name=LONG_CAPTIONS,
    kinds={"parquet", "vllm"},
    code_version=f"{LONGCAP_VERSION}-{PROMPT_VERSION}",
    backfill_policy=BackfillPolicy.multi_run(1),
    check_specs=[
        shard_check(
            "long_captions", FEASIBILITY, "The model judges a fair share of figures' context visible (FEASIBLE)."
        ),
        shard_check(
            "long_captions",
            GUARD_REJECTIONS,
            "Few feasible refinements fail the guards (invented numbers, entities, acronyms).",
        ),
        shard_check("long_captions", GAINED_CONTEXT, "A fair share of captions gain verified context."),
        shard_check(
            "long_captions",
            LONGCAP_CANARY,
            "The engine applies structured outputs (a canary request at the start).",
            True,
        ),
        error_rate_check("long_captions", release_shard_partitions),
    ],
)
def long_captions(
    context: AssetExecutionContext,
    config: LongCapRunSettings,
    lake: LakeResource,
    models: ModelsResource,
    vlm: VlmEngineResource,
    ray: RayResource,
    quality: QualityResource,
) -> MaterializeResult:
    lk = lake.lake()
    settings = config.to_settings(tokenizer=models.text_tokenizer, budget=models.text_context)
    try:  # before the VLM starts: a tokenizer that is not at hand fails now, in one line
        load_tokenizer(models.text_tokenizer, models.text_context)
    except TokenizerUnavailableError as exc:
        raise needs_person(exc) from None
    with vlm.engine(cache_dir=lk.path("models", "vlm")) as engine:
        stage = LongCapStage(engine, settings, actors=vlm.replicas, gpus_per_actor=ray.gpus_per_actor)
        return run_stage(context, stage, lk, quality.max_error_rate, outage_of(vlm))
