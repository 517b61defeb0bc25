"""The code location: every asset, job, sensor and resource of PanelForge.

Settings are read once here, when the code location loads (``Settings.from_env``): a bad
value fails the load with the variable's name, and nothing is read at import time elsewhere.
"""

from __future__ import annotations

from dagster import AssetsDefinition, Definitions, MultiPartitionsDefinition

from assets.acquisition import pmc_inventory, pmc_raw_articles
from assets.concepts import (
    cluster_labels,
    concept_model,
    concept_review,
    figure_concepts,
    figure_embeddings,
)
from assets.evaluation import clip_evaluation
from assets.longcap import long_captions, pair_negatives
from assets.mining import pairs
from assets.panels import panel_crops, panel_detector, panel_training_set, panels
from assets.parsing import image_duplicates, parsed_articles, pubmed_metadata
from assets.release import (
    dataset_card,
    dataset_samples,
    hf_upload,
    pair_samples,
    release_parquet,
    webdataset_concept_balanced,
    webdataset_concept_filtered,
    webdataset_pairs,
    webdataset_shards,
)
from assets.training import clip_continual_pretraining, multilevel_training
from jobs.automation import automation_sensor, with_automation
from jobs.pools import with_pool_waits
from jobs.refresh import (
    pmc_download_job,
    pmc_inventory_job,
    publish_release_job,
    yearly_refresh_sensor,
)
from resources.profiles import build_resources
from resources.settings import Settings

ASSETS = [
    pmc_inventory,
    pmc_raw_articles,
    parsed_articles,
    image_duplicates,
    pubmed_metadata,
    figure_embeddings,
    concept_model,
    concept_review,
    cluster_labels,
    figure_concepts,
    dataset_samples,
    webdataset_shards,
    webdataset_concept_filtered,
    webdataset_concept_balanced,
    pair_samples,
    webdataset_pairs,
    release_parquet,
    dataset_card,
    hf_upload,
    panels,
    panel_crops,
    panel_training_set,
    panel_detector,
    pairs,
    pair_negatives,
    long_captions,
    clip_evaluation,
    clip_continual_pretraining,
    multilevel_training,
]


def materialization_order(definitions: Definitions) -> list[AssetsDefinition]:
    """Every asset of ``definitions`` in an order that materializes each after its parents: the
    graph's topological levels; within a level the per-shard assets first (so consecutive ones can
    share a run per shard), then by name. The demo and the tests walk the graph this way instead
    of listing it again."""
    graph = definitions.resolve_asset_graph()
    assets = [
        graph.get(key).assets_def
        for level in graph.toposorted_asset_keys_by_level
        for key in sorted(level, key=lambda k: k.to_user_string())
    ]
    level_of = {key: i for i, level in enumerate(graph.toposorted_asset_keys_by_level) for key in level}
    return sorted(assets, key=lambda a: (level_of[a.key], not per_shard(a), a.key.to_user_string()))


def unbound(assets: list[AssetsDefinition]) -> list[AssetsDefinition]:
    """``assets`` as ``ASSETS`` holds them, without the resources ``Definitions`` bound to them:
    what ``materialize`` takes with resources of its own (the demo's, a test's)."""
    by_key = {a.key: a for a in ASSETS}
    return [by_key[a.key] for a in assets]


def per_shard(asset: AssetsDefinition) -> bool:
    """The asset runs per release × shard (else per release)."""
    return isinstance(asset.partitions_def, MultiPartitionsDefinition)


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or Settings.from_env()
    return Definitions(
        assets=with_automation(ASSETS, publish=settings.hf_repo is not None),
        jobs=[pmc_inventory_job, pmc_download_job, publish_release_job],
        sensors=[yearly_refresh_sensor(settings.shards), automation_sensor(settings.automation_interval_s)],
        resources=build_resources(settings),
        # Dagster's default executor in the profile's mode, plus an INFO line naming who holds a
        # pool a step waits for
        executor=with_pool_waits(settings.executor),
    )


defs = build_definitions()
