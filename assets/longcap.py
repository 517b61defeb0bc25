"""Long captions (BIOMEDICA-LongCAP) and region hard negatives (RegionMed-CLIP)."""

from pathlib import Path

from dagster import AssetCheckSpec, AssetExecutionContext, BackfillPolicy, Config, MaterializeResult, asset

from assets.mining import pairs
from assets.partitions import release_shard_partitions
from assets.report import run_stage
from pipelines.longcap import negatives
from pipelines.longcap.stages import NEGATIVES_DIFFER, NegativesStage
from pipelines.vlm.engine import fingerprint
from resources.lake import LakeResource
from resources.vlm import VlmEngineResource


class NegativesSettings(Config):
    """``use_vlm``: also ask the VLM for negatives (each checked like the rule ones)."""

    use_vlm: bool = False
    max_per_type: int = 1
    vlm_per_pair: int = 2
    seed: int = 0


@asset(
    partitions_def=release_shard_partitions,
    deps=[pairs],
    group_name="longcap",
    kinds={"parquet"},
    code_version=fingerprint(Path(negatives.__file__).read_text()),  # the rules and the prompt
    backfill_policy=BackfillPolicy.multi_run(1),
    description=NegativesStage.__doc__,
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
        stage = NegativesStage(None, config.max_per_type, config.vlm_per_pair, config.seed)
        return run_stage(context, stage, lk)
    with vlm.engine(cache_dir=lk.path("models", "vlm")) as engine:
        stage = NegativesStage(engine, config.max_per_type, config.vlm_per_pair, config.seed)
        return run_stage(context, stage, lk)
