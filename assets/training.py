"""Training assets: models trained on the release, each launched as an external GPU job through
the ``launcher`` resource (a subprocess here, a Ray job or a Kubernetes job on a cluster).

In the synthetic profile (``make demo``, ``make ui``) the models are the tiny local ones the tests
use (``pipelines/training/tiny.py``, built once in the lake, marked synthetic), trained for a few
CPU steps: every setting left at its production default takes its demo value
(``assets/synthetic.py``), so the assets can be clicked in the demo's UI and finish in seconds;
their numbers are marked synthetic and are no quality claim.

Both assets keep the release's article-disjoint held-out split out of training: they resolve it
(the recorded ``models/eval/<release>/heldout.json``, else one recorded now by the evaluation's
default rule, :func:`pipelines.core.heldout.training_split`) and give the job its path as
``heldout``; the job drops those articles' samples (``pipelines/training/heldout.py``), so
``clip_evaluation`` on the held-out split scores articles the model never saw.
"""

import json
import typing

from dagster import AssetExecutionContext, Failure, MaterializeResult, asset

from assets.config import config_from
from assets.groups import TRAINING
from assets.partitions import releases_partitions
from assets.release import webdataset_pairs, webdataset_shards
from assets.synthetic import synthetic_models, synthetic_settings
from pipelines.compute.weights import ModelUnavailableError
from pipelines.core.heldout import DEFAULT_SHARE, heldout_path, training_split
from pipelines.core.lake import dataset_dir
from pipelines.core.stage import GPU_POOL
from pipelines.release.webdataset import missing_subsets
from pipelines.training.clip import (
    LONGCLIP_CONTEXTS,
    RECIPE_EPOCHS,
    ClipTrainConfig,
    check_memory,
    check_weights,
    longclip_config,
)
from pipelines.training.memory import GB
from pipelines.training.multilevel import PRESETS, MultilevelConfig
from pipelines.training.multilevel.budget import check_memory as multilevel_memory
from resources.compute import ModelsResource
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource

CLIP_MODULE = "pipelines.training.clip"
MULTILEVEL_MODULE = "pipelines.training.multilevel"
LONGCLIP = "bmc-longclip"
LONGCLIP_SUBSETS = ["commercial", "longcap-commercial"]  # figure-level + long-caption (BMC-LongCLIP+)
TRAINED_KEYS = ("model", "pretrained", "batch_size", "accum_freq", "lr", "warmup", "precision", "workers", "device",
                "grad_checkpointing")  # fmt: skip
# The synthetic profile's sizes: a few CPU steps of the tiny models (each applied to a setting
# left at its production default)
SYNTHETIC_CLIP = {"batch_size": 8, "accum_freq": 1, "epochs": 1, "warmup": 1, "workers": 1, "device": "cpu",
                  "log_every_n_steps": 1}  # fmt: skip
SYNTHETIC_MULTILEVEL = {"steps": 4, "batch_size": 4, "warmup": 1, "device": "cpu", "log_every": 1,
                        "checkpoint_every": 2}  # fmt: skip


_ClipJobSettings = config_from(
    ClipTrainConfig,
    "ClipTrainingSettings",
    fields=(
        "upsampling_factors",
        "epochs",
        *TRAINED_KEYS,
        "log_every_n_steps",
        "wise_ft_alpha",
        "seed",
        "text_model",
        "context_length",
        "gpu_memory_gb",
    ),  # fmt: skip
    overrides={
        "upsampling_factors": (list[float], []),  # empty: no mixture weights
        "epochs": (int, 0),  # 0: the recipe's
        "text_model": (str, ""),  # a Hugging Face text tower (Hub id or folder); bmc-longclip's by default
        "context_length": (int, 512),  # with a Hugging Face text tower only
        # the memory of the job's GPUs (an H100's 80 GB; 141 for an H200): the batch is checked against it
        # before launch and again by the job (pipelines/training/memory.py); 0: no check
        "gpu_memory_gb": (float, 80.0),
    },
    module=__name__,
)


class ClipTrainingSettings(_ClipJobSettings):
    """BIOMEDICA's continual pretraining (``pipelines/training/clip.py``). ``subsets``: WebDataset
    subsets of the release (``commercial``, ``concept-filtered-commercial``, ...); more than one
    is a mixture, weighted by ``upsampling_factors`` when given. ``recipe`` picks the epochs
    (full 9, concept-balanced 27, concept-filtered 36) unless ``epochs`` is set. ``pretrained``: an
    OpenCLIP tag or a weights file; ``model`` may be ``hf-hub:`` or ``local-dir:``.

    ``recipe: bmc-longclip`` is BMC-LongCLIP instead (``longclip_config``: DFN-2B ViT-L/14 +
    BioClinical ModernBERT, ``context_length`` 77 / 154 / 512, on ``commercial`` + ``longcap-commercial``):
    every setting left at its default here takes that recipe's value; one you change is kept."""

    # the asset's own options (the job's fields come from ClipTrainConfig, above)
    subsets: list[str] = ["commercial"]
    recipe: str = "full"
    # leave the release's held-out articles out (models/eval/<release>/heldout.json); False trains
    # on every article, and then no evaluation on that split measures generalisation
    exclude_heldout: bool = True
    heldout_share: float = DEFAULT_SHARE  # of the articles, when the release has no recorded split yet


def clip_job(config: ClipTrainingSettings, subset_dirs: list[str]) -> dict:
    """The launched job's config (the launcher adds run_dir, checkpoint_dir and gpus)."""
    if config.recipe == LONGCLIP:
        return longclip_job(config, subset_dirs)
    if config.recipe not in RECIPE_EPOCHS:
        known = sorted([*RECIPE_EPOCHS, LONGCLIP])
        raise Failure(f"recipe must be one of {known}, got {config.recipe!r}", allow_retries=False)
    factors = list(config.upsampling_factors) or None
    job = {
        "train_data": subset_dirs,
        "upsampling_factors": factors,
        "dataset_resampled": factors is not None,
        "epochs": config.epochs or RECIPE_EPOCHS[config.recipe],
        **{k: getattr(config, k) for k in TRAINED_KEYS},
        **{k: getattr(config, k) for k in ("log_every_n_steps", "wise_ft_alpha")},
        "seed": config.seed,
    }
    if config.text_model:
        job.update(text_model=config.text_model, context_length=config.context_length)
    return job | {"gpu_memory_gb": config.gpu_memory_gb}


def longclip_job(config: ClipTrainingSettings, subset_dirs: list[str]) -> dict:
    """BMC-LongCLIP's job: the recipe's values, then every setting changed from its default."""
    if config.context_length not in LONGCLIP_CONTEXTS:
        raise Failure(
            f"bmc-longclip's context_length is one of {LONGCLIP_CONTEXTS}, got {config.context_length}",
            allow_retries=False,
        )
    defaults = ClipTrainingSettings()
    changed = {
        k: getattr(config, k) for k in (*TRAINED_KEYS, "wise_ft_alpha") if getattr(config, k) != getattr(defaults, k)
    }
    if config.epochs:
        changed["epochs"] = config.epochs
    if config.text_model:
        changed["text_model"] = config.text_model
    factors = list(config.upsampling_factors) or None
    recipe = longclip_config(subset_dirs, "-", config.context_length, upsampling_factors=factors, **changed)
    keys = ("train_data", "upsampling_factors", "dataset_resampled", "epochs", *TRAINED_KEYS, "wise_ft_alpha",
            "text_model", "context_length")  # fmt: skip
    return {
        **{k: getattr(recipe, k) for k in keys},
        "log_every_n_steps": config.log_every_n_steps,
        "seed": config.seed,
        "gpu_memory_gb": config.gpu_memory_gb,
    }


@asset(
    partitions_def=releases_partitions,
    deps=[webdataset_shards],
    group_name=TRAINING,
    kinds={"pytorch"},
    pool=GPU_POOL,
    description="OpenCLIP continually pretrained on the release's WebDataset (BIOMEDICA's recipe: ViT-L-14 "
    "from CommonPool, batch 8192, lr 1e-6, fp32), as a launched GPU job: checkpoints in the lake (resumed "
    "after a failure) and the WiSE-FT-merged model exported for open_clip's local-dir: loader.",
)
def clip_continual_pretraining(
    context: AssetExecutionContext,
    config: ClipTrainingSettings,
    lake: LakeResource,
    launcher: JobLauncherResource,
    models: ModelsResource,
) -> MaterializeResult:
    lk = lake.lake()
    release = context.partition_key
    subsets = config.subsets
    if config.recipe == LONGCLIP and subsets == ClipTrainingSettings().subsets:
        subsets = LONGCLIP_SUBSETS
    dirs = [dataset_dir(lk, release, subset) for subset in subsets]
    missing = missing_subsets(lk, release, subsets)
    if missing:
        raise Failure(f"release {release} lacks WebDataset subsets: {'; '.join(missing)}", allow_retries=False)
    url = (lambda path: path) if lk.is_local else lk.fs.unstrip_protocol  # the job needs s3:// on a remote lake
    if models.synthetic:
        config = synthetic_clip_settings(config, lk.path("models", "synthetic"))
        context.log.info(f"synthetic profile: the tiny local model {config.model}, {config.epochs} CPU epoch(s)")
    job = clip_job(config, [url(d) for d in dirs])
    check_clip_job(job, config, launcher)  # settings first: resolving the split may record it
    held = resolve_heldout(context, lk, release, url, config.heldout_share) if config.exclude_heldout else {}
    job |= {"heldout": held.get("heldout_split")}
    result = launcher.run(context, CLIP_MODULE, job, url(lk.path("models", "clip", "runs")), tmp_url=lk.job_tmp_dir())
    result.metadata["synthetic"] = models.synthetic
    result.metadata.update(held)
    return result.get_materialize_result()


def resolve_heldout(context: AssetExecutionContext, lk, release: str, url, share: float = DEFAULT_SHARE) -> dict:
    """Resolve (recording it by ``share`` if need be) the held-out split training on ``release``
    excludes; its metadata, ``heldout_split`` being the path the job reads."""
    try:
        split, recorded = training_split(lk, release, share)
    except ValueError as exc:
        raise Failure(f"{exc}: set exclude_heldout to False to train on every article", allow_retries=False) from None
    path = heldout_path(lk, release)
    how = f"recorded now with share {split.share}" if recorded else "as recorded"
    held, total = len(split.pmcids), split.n_articles
    context.log.info(f"held-out split of {release} ({how}): {held} of {total} articles excluded from training")
    return {"heldout_split": url(path), "heldout_articles": held, "heldout_share": split.share}


def synthetic_clip_settings(config: ClipTrainingSettings, models_dir: str) -> ClipTrainingSettings:
    """The demo's run: the tiny models (a tiny ModernBERT as bmc-longclip's text tower) and
    :data:`SYNTHETIC_CLIP`'s sizes, for every setting left at its default."""
    model, text_model = synthetic_models(models_dir)
    sizes = {**SYNTHETIC_CLIP, "model": model, "pretrained": ""}
    if config.recipe == LONGCLIP:
        sizes["text_model"] = text_model
    return synthetic_settings(config, sizes)


def check_clip_job(job: dict, config: ClipTrainingSettings, launcher: JobLauncherResource) -> None:
    """Before launching: the weights are where the settings say (on this machine when the job runs
    here) and the per-GPU batch fits ``gpu_memory_gb``; each failure is one line naming the setting."""
    run = ClipTrainConfig.from_dict({**job, "run_dir": "-", "gpus": max(launcher.gpus, 1)})
    try:
        if launcher.backend == "subprocess":
            check_weights(run.model, run.pretrained)
        if run.gpu_memory_gb and run.device.startswith("cuda"):
            check_memory(run, run.gpu_memory_gb * GB)
    except ModelUnavailableError as exc:
        raise Failure(str(exc), allow_retries=False) from None
    except ValueError as exc:
        raise Failure(f"clip_continual_pretraining: {exc}", allow_retries=False) from None
    except OSError:
        pass  # a text tower's config that is not at hand here: the job checks on its own machine


# the run's fields a person may set; unset (None), each keeps the preset's value (model: ViT-L-14;
# pretrained: zoom-in BMC-CLIP, region-aware CommonPool)
PRESET_KEYS = ("model", "pretrained", "steps", "batch_size", "lr", "warmup", "unfreeze_last_blocks", "device",
               "precision", "checkpoint_every", "log_every", "wise_ft_alpha")  # fmt: skip
_MULTILEVEL_HINTS = typing.get_type_hints(MultilevelConfig)
_MultilevelJobSettings = config_from(
    MultilevelConfig,
    "MultilevelTrainingSettings",
    fields=("preset", "allow_random_init", *PRESET_KEYS, "seed", "gpu_memory_gb"),
    overrides={
        "preset": (str, "zoom-in"),
        **{k: (_MULTILEVEL_HINTS[k] | None, None) for k in PRESET_KEYS},
        # as clip_continual_pretraining's: the largest step is checked against it before launch and
        # again by the job (pipelines/training/multilevel/budget.py); 0: no check
        "gpu_memory_gb": (float, 80.0),
    },
    module=__name__,
)


class MultilevelTrainingSettings(_MultilevelJobSettings):
    """Zoom-in (Panel2Patch) or region-aware (RegionMed-CLIP) training
    (``pipelines/training/multilevel/``) on one license group's figure, panel and region subsets.
    A field left unset keeps the preset's value; ``overrides``: a JSON object of any other
    ``MultilevelConfig`` field (schedule, loss_weights, curriculum, negative_loss, ...)."""

    # the asset's own options (the job's fields come from MultilevelConfig, above)
    license_group: str = "commercial"
    overrides: str = ""
    exclude_heldout: bool = True  # leave the release's held-out articles out (see ClipTrainingSettings)
    heldout_share: float = DEFAULT_SHARE  # of the articles, when the release has no recorded split yet


def multilevel_job(config: MultilevelTrainingSettings, subset_dirs: dict[str, str]) -> dict:
    """The launched job's config (the launcher adds run_dir, checkpoint_dir and gpus); checked
    here, the largest step against ``gpu_memory_gb`` included, so a typo or a batch that cannot
    fit fails the asset at once instead of on a GPU machine."""
    if config.preset not in PRESETS:
        raise Failure(f"preset must be one of {sorted(PRESETS)}, got {config.preset!r}", allow_retries=False)
    job = {"preset": config.preset, "seed": config.seed, "allow_random_init": config.allow_random_init}
    job |= {f"{level}_data": [d] for level, d in subset_dirs.items()}
    job |= {k: getattr(config, k) for k in PRESET_KEYS if getattr(config, k) is not None}
    job |= {"gpu_memory_gb": config.gpu_memory_gb}
    try:
        job |= json.loads(config.overrides) if config.overrides else {}
        run = MultilevelConfig.from_dict({**job, "run_dir": "-"})
        run.validate()
        if run.gpu_memory_gb and run.device.startswith("cuda"):
            multilevel_memory(run, run.gpu_memory_gb * GB)
    except (ValueError, TypeError) as exc:
        raise Failure(f"multi-level training config: {exc}", allow_retries=False) from exc
    return job


@asset(
    partitions_def=releases_partitions,
    deps=[webdataset_shards, webdataset_pairs],
    group_name=TRAINING,
    kinds={"pytorch"},
    pool=GPU_POOL,
    description="OpenCLIP trained on the release's figure, panel and region pairs, as a launched GPU job: "
    "Panel2Patch's zoom-in recipe (M -> P -> R schedule, cross-level losses, last vision blocks unfrozen) "
    "or RegionMed-CLIP's region-aware one (hard negatives from neg.txt, global -> region curriculum).",
)
def multilevel_training(
    context: AssetExecutionContext,
    config: MultilevelTrainingSettings,
    lake: LakeResource,
    launcher: JobLauncherResource,
    models: ModelsResource,
) -> MaterializeResult:
    lk = lake.lake()
    release, group = context.partition_key, config.license_group
    names = {"figure": group, "panel": f"panel-{group}", "region": f"region-{group}"}
    dirs = {level: dataset_dir(lk, release, name) for level, name in names.items()}
    missing = missing_subsets(lk, release, names.values())
    if missing:
        raise Failure(f"release {release} lacks WebDataset subsets: {'; '.join(missing)}", allow_retries=False)
    url = (lambda path: path) if lk.is_local else lk.fs.unstrip_protocol  # the job needs s3:// on a remote lake
    if models.synthetic:
        model, _ = synthetic_models(lk.path("models", "synthetic"))
        config = synthetic_settings(config, {**SYNTHETIC_MULTILEVEL, "model": model, "pretrained": ""})
        context.log.info(f"synthetic profile: the tiny local model {config.model}, {config.steps} CPU steps")
    job = multilevel_job(config, {level: url(d) for level, d in dirs.items()})
    if launcher.backend == "subprocess":  # settings first: resolving the split may record it
        run = MultilevelConfig.from_dict({**job, "run_dir": "-"})
        try:
            check_weights(run.model, run.pretrained)
        except (ModelUnavailableError, ValueError) as exc:
            raise Failure(str(exc), allow_retries=False) from None
    held = resolve_heldout(context, lk, release, url, config.heldout_share) if config.exclude_heldout else {}
    job |= {"heldout": held.get("heldout_split")}
    result = launcher.run(
        context, MULTILEVEL_MODULE, job, url(lk.path("models", "multilevel", "runs")), tmp_url=lk.job_tmp_dir()
    )
    result.metadata["synthetic"] = models.synthetic
    result.metadata.update(held)
    return result.get_materialize_result()
