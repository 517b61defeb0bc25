"""Evaluation of CLIP checkpoints on what the release produced, as a launched GPU job."""

from typing import Any

from dagster import AssetExecutionContext, Failure, MaterializeResult, asset

from assets.config import config_from
from assets.groups import TRAINING
from assets.partitions import releases_partitions
from assets.release import webdataset_pairs
from assets.synthetic import synthetic_models, synthetic_settings
from pipelines.compute.weights import ModelUnavailableError
from pipelines.core.heldout import check_evaluation_share, heldout_path
from pipelines.core.stage import GPU_POOL
from pipelines.evaluation.job import EvalJobConfig
from pipelines.training.clip import COMMONPOOL, check_weights
from resources.compute import ModelsResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource

EvaluationSettings = config_from(
    EvalJobConfig,
    "EvaluationSettings",
    """``model``: an OpenCLIP name (with ``pretrained``), ``hf-hub:<id>`` or ``local-dir:<dir>``
    (a training run's exported ``model/``); ``baseline``: a checkpoint evaluated in the same run
    for comparison; ``share``: record an article-disjoint held-out split of that share first when
    the release has none (0: use the recorded split; a different share over a recorded split is
    refused, since training left out exactly the recorded articles); ``benchmarks``: extra datasets, each
    ``{kind: vqa-rad | slake | medmnist | hf | image-folder | manifest, path: ..., <options>}``
    (paths as the job's machine sees them). In the synthetic profile a model left at its default
    is the tiny local one the training assets use (its numbers are marked synthetic).""",
    exclude=("lake", "release", "device", "synthetic"),  # the partition, the lake, the launcher and the profile
    # the launchpad's forms: empty for "none" (the job's None), a list for the job's tuple
    overrides={
        "model": (str, "ViT-L-14"),
        "pretrained": (str, COMMONPOOL),
        "baseline": (str, ""),
        "baseline_pretrained": (str, ""),
        "share": (float, 0.0),
        "limit": (int, 5000),
        "benchmarks": (list[dict[str, Any]], []),
    },
    module=__name__,
)


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
    if models.synthetic:
        model, _ = synthetic_models(lk.path("models", "synthetic"))
        config = synthetic_settings(config, {"model": model, "pretrained": ""})
    if not config.share and not lk.exists(heldout_path(lk, context.partition_key)):
        raise Failure(
            f"no held-out split recorded for release {context.partition_key}: set share (e.g. 0.1) to record one",
            allow_retries=False,
        )
    try:
        check_evaluation_share(lk, context.partition_key, config.share or None)
    except ValueError as exc:
        raise Failure(str(exc), allow_retries=False) from None
    if launcher.backend == "subprocess":
        try:
            for model, pretrained in ((config.model, config.pretrained), (config.baseline, config.baseline_pretrained)):
                if model:
                    check_weights(model, pretrained)
        except (ModelUnavailableError, ValueError) as exc:
            raise Failure(str(exc), allow_retries=False) from None
    unset = ("pretrained", "baseline", "baseline_pretrained", "share")  # empty or 0 in the launchpad: None
    job = {
        "lake": lk.url,
        "release": context.partition_key,
        **config.values(),
        **{k: getattr(config, k) or None for k in unset},
        "device": "cuda" if launcher.gpus else "cpu",
        "synthetic": models.synthetic,
    }
    result = launcher.run(
        context, "pipelines.evaluation.job", job, lk.path("models", "eval", "runs"), tmp_url=lk.job_tmp_dir()
    )
    result.metadata["synthetic"] = models.synthetic
    return result.get_materialize_result()
