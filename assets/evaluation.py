"""Evaluation of CLIP checkpoints on what the release produced, as a launched GPU job."""

from typing import Any

from dagster import AssetExecutionContext, Config, MaterializeResult, asset

from assets.groups import TRAINING
from assets.partitions import releases_partitions
from assets.release import webdataset_pairs
from resources.compute import ModelsResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource

GPU_POOL = "gpu"


class EvaluationSettings(Config):
    """``model``: an OpenCLIP name (with ``pretrained``), ``hf-hub:<id>`` or ``local-dir:<dir>``
    (a training run's exported ``model/``); ``baseline``: a checkpoint evaluated in the same run
    for comparison; ``share``: record a new article-disjoint held-out split of that share first
    (0: use the release's recorded split); ``benchmarks``: extra datasets, each
    ``{kind: vqa-rad | slake | medmnist | hf | image-folder | manifest, path: ..., <options>}``
    (paths as the job's machine sees them)."""

    model: str = "ViT-L-14"
    pretrained: str = "commonpool_xl_s13b_b90k"
    baseline: str = ""
    baseline_pretrained: str = ""
    license_group: str = "commercial"
    share: float = 0.0
    limit: int = 5000
    batch_size: int = 64
    n_resamples: int = 1000
    seed: int = 0
    benchmarks: list[dict[str, Any]] = []


@asset(
    partitions_def=releases_partitions,
    deps=[webdataset_pairs],
    group_name=TRAINING,
    kinds={"pytorch"},
    pool=GPU_POOL,
    description="Retrieval at figure, panel, region and long-caption level on the release's article-disjoint "
    "held-out split, plus benchmark datasets, with bootstrap 95% intervals and a baseline compared in the same "
    "run; launched as a GPU job.",
)
def clip_evaluation(
    context: AssetExecutionContext,
    config: EvaluationSettings,
    lake: LakeResource,
    models: ModelsResource,
    launcher: JobLauncherResource,
) -> MaterializeResult:
    lk = lake.lake()
    job = {
        "lake": lk.url,
        "release": context.partition_key,
        "model": config.model,
        "pretrained": config.pretrained or None,
        "baseline": config.baseline or None,
        "baseline_pretrained": config.baseline_pretrained or None,
        "license_group": config.license_group,
        "share": config.share or None,
        "limit": config.limit,
        "batch_size": config.batch_size,
        "n_resamples": config.n_resamples,
        "seed": config.seed,
        "device": "cuda" if launcher.gpus else "cpu",
        "synthetic": models.synthetic,
        "benchmarks": config.benchmarks,
    }
    result = launcher.run(context, "pipelines.evaluation.job", job, lk.path("models", "eval", "runs"))
    return result.get_materialize_result()
