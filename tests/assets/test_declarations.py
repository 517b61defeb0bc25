"""The stage contract's declarations are what the assets use (issue 21 §5): the asset decorator
takes name, description, partitions, pool and kinds from the stage class, and the launchpad's
run configuration is generated from the settings dataclasses."""

import dataclasses

import pytest

from jobs.definitions import defs
from pipelines.core.stage import GPU_POOL, RELEASE, Compute, Stage, import_stages


def _stage_classes() -> list[type[Stage]]:
    import_stages()
    seen, todo = [], list(Stage.__subclasses__())
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in seen if isinstance(c.__dict__.get("name"), str)]


def test_compute_is_a_declaration_of_the_class_not_a_property():
    for cls in _stage_classes():
        assert isinstance(cls.compute, Compute), cls  # a property would be a property object here


def test_the_assets_take_pool_partitions_kinds_and_description_from_their_stage():
    graph = defs.resolve_asset_graph()
    by_name = {cls.name: cls for cls in _stage_classes()}
    # read by hand from the stage classes: the model stages hold the GPUs, the downloads and NCBI their hosts
    assert {n for n, c in by_name.items() if c.compute.pool == GPU_POOL} == {
        "figure_embeddings",
        "panels",
        "pairs",
        "long_captions",
    }
    assert by_name["pmc_raw_articles"].compute.pool == "pmc_source"
    assert by_name["pubmed_metadata"].compute.pool == "ncbi_eutils"
    checked = 0
    for key in graph.get_all_asset_keys():
        cls = by_name.get(key.to_user_string())
        if cls is None or key.to_user_string() == "webdataset_shards":
            continue  # the launched jobs; WebDatasetStage makes three assets, named per instance
        asset = graph.get(key).assets_def
        spec = next(s for s in asset.specs if s.key == key)
        assert asset.op.pool == cls.compute.pool, key
        assert set(cls.compute.kinds) <= set(spec.kinds), key
        assert (cls.level == RELEASE) == (asset.partitions_def.__class__.__name__ == "DynamicPartitionsDefinition")
        if key.to_user_string() not in ("pmc_inventory", "pubmed_metadata", "hf_upload"):  # their own wording
            assert spec.description == cls.__doc__, key
        checked += 1
    assert checked >= 20


def test_run_configuration_is_generated_from_the_settings_dataclasses():
    from assets.longcap import LongCapRunSettings
    from assets.mining import MiningRunSettings
    from assets.panels import PanelRunSettings
    from assets.parsing import ParseSettings
    from pipelines.longcap.refine import LongCapSettings
    from pipelines.mining.mine import MiningSettings
    from pipelines.panels.stages import PanelSettings
    from pipelines.parse.shard import ParseLimits

    assert ParseSettings().to_settings() == ParseLimits()
    assert ParseSettings(batch_rows=64).to_settings() == ParseLimits(batch_rows=64)
    assert set(ParseSettings.model_fields) == {"max_xml_bytes", "max_image_bytes", "max_image_pixels", "batch_rows"}
    mining = {f.name for f in dataclasses.fields(MiningSettings)} - {"require_canary"}
    assert set(MiningRunSettings.model_fields) == mining
    assert set(LongCapRunSettings.model_fields) == {"context_budget", "figures_per_batch"}
    assert set(PanelRunSettings.model_fields) == {"prefer", "consensus_min", "batch_size", "figures_per_batch", "ocr"}
    assert PanelRunSettings().to_settings().ocr == "tesseract"
    for config, settings in (
        (ParseSettings, ParseLimits),
        (MiningRunSettings, MiningSettings),
        (LongCapRunSettings, LongCapSettings),
        (PanelRunSettings, PanelSettings),
    ):
        defaults = settings()
        for name, field in config.model_fields.items():
            if name in config.overridden:
                continue
            assert field.default == getattr(defaults, name), (config.__name__, name)
    # what the launchpad shows differently, on purpose
    assert MiningRunSettings().region_concepts == [] and MiningSettings().region_concepts is None
    assert PanelRunSettings().prefer == "" and PanelSettings().prefer == "detr"


def _asset_configs() -> dict[str, type]:
    import inspect

    graph, configs = defs.resolve_asset_graph(), {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        fn = getattr(node.assets_def.op.compute_fn, "decorated_fn", None) if node.is_materializable else None
        param = inspect.signature(fn).parameters.get("config") if fn else None
        if param is not None:
            configs[key.to_user_string()] = param.annotation
    return configs


# The fields of each launchpad configuration that no settings dataclass holds, read by hand from
# the assets: what to train on, the asset's switches, the tars' name, the subset builders' arguments.
ASSET_ONLY = {
    "ClipTrainingSettings": {"subsets", "recipe", "exclude_heldout", "heldout_share"},
    "MultilevelTrainingSettings": {"license_group", "overrides", "exclude_heldout", "heldout_share"},
    "DetectorTrainingSettings": {"training_set_version"},
    "NegativesSettings": {"use_vlm"},
    "ConceptModelSettings": {"reuse_previous"},
    "ShardSettings": {"shard_name"},
    "ConceptFilterSettings": {"shard_name", "concepts"},
    "ConceptBalanceSettings": {"shard_name", "cap_per_concept"},
    "PairShardSettings": {"shard_name", "token_sample"},
}


def test_every_run_configuration_is_generated_and_its_defaults_are_the_dataclasses():
    """No launchpad configuration copies a settings dataclass field by field: each is made by
    ``config_from``; a generated field's default is the dataclass's unless overridden on purpose."""
    from assets.config import SettingsConfig

    configs = _asset_configs()
    assert len(configs) >= 20
    for asset, config in configs.items():
        assert issubclass(config, SettingsConfig), (asset, config)
        generated = set(config.settings_fields)
        assert set(config.model_fields) - generated == ASSET_ONLY.get(config.__name__, set()), config.__name__
        fields = {f.name: f for f in dataclasses.fields(config.settings_class)}
        for name, field_name in config.settings_fields.items():
            if name in config.overridden:
                continue
            field = fields[field_name]
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            assert config.model_fields[name].default == default, (config.__name__, name)


def test_the_launchpad_keeps_its_own_defaults_and_names_where_they_differ():
    """What the launchpad showed before its configurations were generated, read from the old
    hand-written classes: production defaults of the launched jobs, empty for "none", old names."""
    from assets.concepts import ConceptModelSettings, ReviewSettings
    from assets.evaluation import EvaluationSettings
    from assets.longcap import NegativesSettings
    from assets.panels import DetectorTrainingSettings, TrainingSetSettings
    from assets.release import PairShardSettings, ShardSettings, StatsSettings
    from assets.training import ClipTrainingSettings, MultilevelTrainingSettings
    from pipelines.concepts.model import ConceptModelConfig
    from pipelines.concepts.stages import ConceptReviewStage
    from pipelines.longcap.stages import NegativesStage
    from pipelines.panels.training import SyntheticSetStage
    from pipelines.release.stages import ReleaseTablesStage
    from pipelines.release.webdataset import ShardLimits

    evaluation = EvaluationSettings()
    assert (evaluation.model, evaluation.baseline, evaluation.share, evaluation.limit) == ("ViT-L-14", "", 0.0, 5000)
    assert evaluation.benchmarks == [] and evaluation.license_group == "commercial" and evaluation.n_resamples == 1000
    clip = ClipTrainingSettings()
    assert (clip.subsets, clip.recipe, clip.epochs, clip.upsampling_factors) == (["commercial"], "full", 0, [])
    assert (clip.batch_size, clip.accum_freq, clip.lr, clip.precision, clip.workers) == (1024, 2, 1e-6, "fp32", 8)
    assert (clip.text_model, clip.context_length, clip.gpu_memory_gb) == ("", 512, 80.0)
    multilevel = MultilevelTrainingSettings()
    assert (multilevel.preset, multilevel.model, multilevel.steps, multilevel.unfreeze_last_blocks) == (
        "zoom-in",
        None,
        None,
        None,
    )
    detector = DetectorTrainingSettings()
    assert (detector.steps, detector.batch_size, detector.lr, detector.checkpoint_every) == (20_000, 16, 1e-4, 500)
    assert detector.real_eval == "sample/panels/boxes.json" and detector.training_set_version == ""
    assert ConceptModelSettings().kmeans_backend == "auto" and ConceptModelSettings().reuse_previous is True
    concept_model = ConceptModelSettings(kmeans_backend="sklearn", k=5)
    assert concept_model.to_settings() == ConceptModelConfig(k=5, backend="sklearn")
    assert ShardSettings().limits() == ShardLimits()
    assert ShardSettings(max_samples_per_shard=7).limits() == ShardLimits(max_samples=7)
    assert PairShardSettings(max_shard_bytes=9, token_sample=3).limits() == ShardLimits(max_bytes=9)
    assert NegativesSettings(seed=4).to_settings(engine=None) == NegativesStage(None, seed=4)
    assert ReviewSettings(seed=2).to_settings() == ConceptReviewStage(seed=2)
    assert StatsSettings(token_sample=20).to_settings() == ReleaseTablesStage(token_sample=20)
    assert TrainingSetSettings().to_settings() == SyntheticSetStage()  # generated: 2000 figures, seed 0
    assert TrainingSetSettings(figures=12).to_settings().figures == 12


def test_a_renamed_field_and_a_subclass_field_reach_the_settings_as_they_should():
    from assets.config import config_from

    @dataclasses.dataclass
    class Limits:
        max_samples: int = 10
        max_bytes: int = 100

    limits_config = config_from(Limits, "LimitsConfig", rename={"max_samples": "samples_per_tar"})

    class WithName(limits_config):
        name: str = "x"  # an asset's own option: never passed to Limits

    assert set(WithName.model_fields) == {"samples_per_tar", "max_bytes", "name"}
    assert WithName(samples_per_tar=3, name="y").to_settings() == Limits(3, 100)
    assert WithName().values() == {"max_samples": 10, "max_bytes": 100}
    with pytest.raises(TypeError, match=r"no fields \['max_sample'\]"):
        config_from(Limits, "Typo", rename={"max_sample": "samples"})


def test_a_settings_field_without_a_default_or_a_misspelt_field_is_refused():
    from assets.config import config_from

    @dataclasses.dataclass
    class Needs:
        path: str
        size: int = 3

    with pytest.raises(TypeError, match="Needs.path has no default"):
        config_from(Needs, "NeedsConfig")
    assert set(config_from(Needs, "SizeConfig", exclude=("path",)).model_fields) == {"size"}
    with pytest.raises(TypeError, match=r"no fields \['sise'\]"):
        config_from(Needs, "Typo", fields=("sise",))
