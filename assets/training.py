"""Training assets: models trained on the release, each launched as an external GPU job through
the ``launcher`` resource (a subprocess here, a Ray job or a Kubernetes job on a cluster)."""

import json

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, asset

from assets.groups import TRAINING
from assets.partitions import releases_partitions
from assets.release import webdataset_pairs, webdataset_shards
from pipelines.panels.stages import GPU_POOL
from pipelines.release.webdataset import dataset_dir, missing_subsets
from pipelines.training.clip import LONGCLIP_CONTEXTS, RECIPE_EPOCHS, ClipTrainConfig, longclip_config
from pipelines.training.multilevel import PRESETS, MultilevelConfig
from resources.lake import LakeResource
from resources.launcher import JobLauncherResource

CLIP_MODULE = "pipelines.training.clip"
MULTILEVEL_MODULE = "pipelines.training.multilevel"
_BIOMEDICA = ClipTrainConfig(train_data=["-"], run_dir="-")  # the recipe's defaults, read below
LONGCLIP = "bmc-longclip"
LONGCLIP_SUBSETS = ["commercial", "longcap-commercial"]  # figure-level + long-caption (BMC-LongCLIP+)
TRAINED_KEYS = ("model", "pretrained", "batch_size", "accum_freq", "lr", "warmup", "precision", "workers", "device")


class ClipTrainingSettings(Config):
    """BIOMEDICA's continual pretraining (``pipelines/training/clip.py``). ``subsets``: WebDataset
    subsets of the release (``commercial``, ``concept-filtered-commercial``, ...); more than one
    is a mixture, weighted by ``upsampling_factors`` when given. ``recipe`` picks the epochs
    (full 9, concept-balanced 27, concept-filtered 36) unless ``epochs`` is set. ``pretrained``: an
    OpenCLIP tag or a weights file; ``model`` may be ``hf-hub:`` or ``local-dir:``.

    ``recipe: bmc-longclip`` is BMC-LongCLIP instead (``longclip_config``: DFN-2B ViT-L/14 +
    BioClinical ModernBERT, ``context_length`` 77 / 154 / 512, on ``commercial`` + ``longcap-commercial``):
    every setting left at its default here takes that recipe's value; one you change is kept."""

    subsets: list[str] = ["commercial"]
    upsampling_factors: list[float] = []
    recipe: str = "full"
    epochs: int = 0
    model: str = _BIOMEDICA.model
    pretrained: str = _BIOMEDICA.pretrained
    batch_size: int = _BIOMEDICA.batch_size
    accum_freq: int = _BIOMEDICA.accum_freq
    lr: float = _BIOMEDICA.lr
    warmup: int = _BIOMEDICA.warmup
    precision: str = _BIOMEDICA.precision
    workers: int = _BIOMEDICA.workers
    device: str = _BIOMEDICA.device
    log_every_n_steps: int = _BIOMEDICA.log_every_n_steps
    wise_ft_alpha: float = _BIOMEDICA.wise_ft_alpha
    seed: int = 0
    text_model: str = ""  # a Hugging Face text tower (Hub id or folder); bmc-longclip's by default
    context_length: int = 512  # with a Hugging Face text tower only


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
    return job


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
    job = clip_job(config, [url(d) for d in dirs])
    result = launcher.run(context, CLIP_MODULE, job, url(lk.path("models", "clip", "runs")))
    return result.get_materialize_result()


class MultilevelTrainingSettings(Config):
    """Zoom-in (Panel2Patch) or region-aware (RegionMed-CLIP) training
    (``pipelines/training/multilevel.py``) on one license group's figure, panel and region subsets.
    A field left unset keeps the preset's value; ``overrides``: a JSON object of any other
    ``MultilevelConfig`` field (schedule, loss_weights, curriculum, negative_loss, ...)."""

    preset: str = "zoom-in"
    license_group: str = "commercial"
    model: str = "ViT-L-14"
    pretrained: str = ""
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    unfreeze_last_blocks: int | None = None
    device: str | None = None
    precision: str | None = None
    checkpoint_every: int | None = None
    log_every: int | None = None
    wise_ft_alpha: float | None = None
    seed: int = 0
    overrides: str = ""


def multilevel_job(config: MultilevelTrainingSettings, subset_dirs: dict[str, str]) -> dict:
    """The launched job's config (the launcher adds run_dir, checkpoint_dir and gpus); checked
    here so a typo fails the asset at once instead of on a GPU machine."""
    if config.preset not in PRESETS:
        raise Failure(f"preset must be one of {sorted(PRESETS)}, got {config.preset!r}", allow_retries=False)
    job = {"preset": config.preset, "model": config.model, "pretrained": config.pretrained, "seed": config.seed}
    job |= {f"{level}_data": [d] for level, d in subset_dirs.items()}
    optional = ("steps", "batch_size", "lr", "warmup", "unfreeze_last_blocks", "device", "precision")
    job |= {k: getattr(config, k) for k in (*optional, "checkpoint_every", "log_every", "wise_ft_alpha")
            if getattr(config, k) is not None}  # fmt: skip
    try:
        job |= json.loads(config.overrides) if config.overrides else {}
        MultilevelConfig.from_dict({**job, "run_dir": "-"}).validate()
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
) -> MaterializeResult:
    lk = lake.lake()
    release, group = context.partition_key, config.license_group
    names = {"figure": group, "panel": f"panel-{group}", "region": f"region-{group}"}
    dirs = {level: dataset_dir(lk, release, name) for level, name in names.items()}
    missing = missing_subsets(lk, release, names.values())
    if missing:
        raise Failure(f"release {release} lacks WebDataset subsets: {'; '.join(missing)}", allow_retries=False)
    url = (lambda path: path) if lk.is_local else lk.fs.unstrip_protocol  # the job needs s3:// on a remote lake
    job = multilevel_job(config, {level: url(d) for level, d in dirs.items()})
    result = launcher.run(context, MULTILEVEL_MODULE, job, url(lk.path("models", "multilevel", "runs")))
    return result.get_materialize_result()
