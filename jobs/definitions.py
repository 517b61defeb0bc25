"""The code location: every asset, job, schedule, sensor and resource of PanelForge."""

from __future__ import annotations

from dagster import Definitions

from assets.acquisition import pmc_inventory, pmc_raw_articles
from assets.concepts import cluster_labels, concept_model, concept_review, figure_concepts, figure_embeddings
from assets.parsing import image_duplicates, parsed_articles, pubmed_metadata
from assets.release import (
    dataset_card,
    dataset_samples,
    hf_upload,
    release_parquet,
    webdataset_concept_balanced,
    webdataset_concept_filtered,
    webdataset_shards,
)
from jobs.refresh import (
    pmc_download_job,
    pmc_inventory_job,
    publish_release_job,
    release_shards_sensor,
    yearly_pmc_refresh,
)
from resources.profiles import build_resources

defs = Definitions(
    assets=[
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
        release_parquet,
        dataset_card,
        hf_upload,
    ],
    jobs=[pmc_inventory_job, pmc_download_job, publish_release_job],
    schedules=[yearly_pmc_refresh],
    sensors=[release_shards_sensor],
    resources=build_resources(),
)
