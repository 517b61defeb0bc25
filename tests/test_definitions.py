"""The code location loads, validates, and resolves every job, schedule and sensor."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.definitions import defs
from pipelines.acquire.source import open_source
from resources import settings

REPO = Path(__file__).resolve().parents[1]


def test_every_job_schedule_and_sensor_resolves():
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"pmc_inventory_job", "pmc_download_job", "publish_release_job"} <= jobs
    assert defs.resolve_schedule_def("yearly_pmc_refresh").cron_schedule == "0 2 2 1 *"
    assert defs.resolve_sensor_def("release_shards_sensor").job_name == "pmc_download_job"
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {
        "pmc_inventory",
        "pmc_raw_articles",
        "parsed_articles",
        "image_duplicates",
        "pubmed_metadata",
        "figure_embeddings",
        "concept_model",
        "concept_review",
        "cluster_labels",
        "figure_concepts",
        "dataset_samples",
        "webdataset_shards",
        "webdataset_concept_filtered",
        "webdataset_concept_balanced",
        "release_parquet",
        "dataset_card",
        "hf_upload",
    }


def test_dagster_definitions_validate_passes():
    dagster = Path(sys.executable).with_name("dagster")
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PANELFORGE_PROFILE": "demo"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "All code locations passed validation" in result.stderr + result.stdout


def test_unknown_profile_is_refused(monkeypatch):
    monkeypatch.setenv("PANELFORGE_PROFILE", "production")
    with pytest.raises(ValueError, match="PANELFORGE_PROFILE must be one of"):
        settings.profile()


def test_profile_defaults(monkeypatch):
    for name in ("PANELFORGE_SHARDS", "PANELFORGE_PMC_SOURCE", "PANELFORGE_HOME", "PANELFORGE_CONCURRENCY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PANELFORGE_PROFILE", "local")
    assert (settings.n_shards(), settings.pmc_source_url(), settings.lake_home()) == (
        256,
        "s3://pmc-oa-opendata",
        "./data",
    )
    monkeypatch.setenv("PANELFORGE_PROFILE", "demo")
    assert settings.n_shards() == 4 and settings.pmc_source_url().startswith("file://")
    monkeypatch.setenv("PANELFORGE_PROFILE", "cluster")
    assert settings.concurrency() == 8


def test_credentials_are_never_taken_from_the_url():
    with pytest.raises(ValueError, match="credentials in the source URL are not accepted"):
        open_source("ftp://user:secret@127.0.0.1:2121/pub")


def test_s3_url_maps_to_the_public_https_endpoint():
    source = open_source("s3://pmc-oa-opendata")
    assert source.transport.base_url == "https://pmc-oa-opendata.s3.amazonaws.com"
    assert source.layout.name == "cloud" and source.transport.limiter.rate == 20.0
    assert open_source("ftp://127.0.0.1:2121/pub").transport.limiter.rate == 3.0
