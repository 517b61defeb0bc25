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


def test_the_configs_not_generated_agree_with_their_settings():
    """Where the launchpad's names differ from the dataclass's (or it adds a switch), the defaults
    must still be the stage's."""
    from assets.longcap import NegativesSettings
    from assets.panels import TrainingSetSettings
    from assets.release import ShardSettings
    from pipelines.longcap.stages import NegativesStage
    from pipelines.panels.training import SyntheticSetStage
    from pipelines.release.webdataset import ShardLimits

    assert ShardSettings().limits() == ShardLimits()
    negatives, stage = NegativesSettings(), NegativesStage()
    assert (negatives.max_per_type, negatives.vlm_per_pair, negatives.seed) == (
        stage.max_per_type,
        stage.vlm_per_pair,
        stage.seed,
    )
    assert TrainingSetSettings().to_settings() == SyntheticSetStage()  # generated: 2000 figures, seed 0
    assert TrainingSetSettings(figures=12).to_settings().figures == 12


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
