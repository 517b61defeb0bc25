"""The code location loads, validates, and resolves every job, schedule and sensor."""

from pathlib import Path

import pytest
from dagster import AssetKey, EnvVar

from jobs.definitions import defs
from pipelines.acquire.source import open_source
from resources.profiles import build_resources
from resources.settings import Settings, SettingsError

REPO = Path(__file__).resolve().parents[2]


# Every asset, by the group a reader expects to find it in (read from the pipeline's stages).
GROUPS = {
    "1_acquisition": {"pmc_inventory", "pmc_raw_articles"},
    "2_parsing": {"parsed_articles", "image_duplicates"},
    "3_metadata": {"pubmed_metadata"},
    "4_concepts": {"figure_embeddings", "concept_model", "concept_review", "cluster_labels", "figure_concepts"},
    "5_panels": {"panels", "panel_crops", "panel_training_set", "panel_detector"},
    "6_mining": {"pairs"},
    "7_long_captions": {"pair_negatives", "long_captions"},
    "8_release": {
        "dataset_samples",
        "webdataset_shards",
        "webdataset_concept_filtered",
        "webdataset_concept_balanced",
        "pair_samples",
        "webdataset_pairs",
        "release_parquet",
        "dataset_card",
        "hf_upload",
    },
    "9_training": {"clip_evaluation", "clip_continual_pretraining", "multilevel_training"},
}


def test_every_job_schedule_and_sensor_resolves():
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"pmc_inventory_job", "pmc_download_job", "publish_release_job"} <= jobs
    assert defs.resolve_sensor_def("yearly_pmc_refresh").job_name == "pmc_inventory_job"
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == set().union(*GROUPS.values())


def test_asset_groups_sort_in_pipeline_order_and_read_top_down():
    """The UI lists groups by name: sorted, they must follow the data, and no asset may depend on
    one in a later group (the catalog would read bottom-up there)."""
    graph = defs.resolve_asset_graph()
    found: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        found.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assert found == GROUPS and list(GROUPS) == sorted(GROUPS)
    rank = {asset: i for i, group in enumerate(GROUPS) for asset in GROUPS[group]}
    for key in graph.get_all_asset_keys():
        for parent in graph.get(key).parent_keys:
            assert rank[parent.to_user_string()] <= rank[key.to_user_string()], (parent, key)


def test_unknown_profile_is_refused():
    with pytest.raises(SettingsError, match="PANELFORGE_PROFILE must be one of"):
        Settings.from_env({"PANELFORGE_PROFILE": "production"})


def test_profile_defaults():
    local = Settings.from_env({})
    assert (local.shards, local.pmc_source, local.home, local.synthetic) == (
        256,
        "s3://pmc-oa-opendata",
        "./data",
        False,
    )
    demo = Settings.from_env({"PANELFORGE_PROFILE": "demo"})
    assert demo.shards == 4 and demo.pmc_source.startswith("file://") and demo.synthetic
    cluster = Settings.from_env({"PANELFORGE_PROFILE": "cluster"})
    assert (cluster.concurrency, cluster.gpus_per_actor) == (8, 1.0)
    assert Settings.from_env({"PANELFORGE_PROFILE": "demo", "PANELFORGE_SHARDS": "16"}).shards == 16


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({"PANELFORGE_PROFILE": "demo"}, "in_process"),
        ({}, "multiprocess"),
        ({"PANELFORGE_PROFILE": "cluster"}, "multiprocess"),
        ({"PANELFORGE_PROFILE": "cluster", "PANELFORGE_EXECUTOR": "in_process"}, "in_process"),
    ],
)
def test_a_run_without_executor_config_runs_its_steps_as_the_profile_says(env, mode):
    """What Dagster resolves for a run that names no executor (an automation run, a UI click):
    the demo's runs keep their steps in the run's process; a run config may still choose."""
    from dagster._core.system_config.objects import ResolvedRunConfig

    from jobs.definitions import build_definitions

    job = build_definitions(Settings.from_env(env)).get_job_def("pmc_inventory_job")
    assert list(ResolvedRunConfig.build(job, {}).execution.execution_engine_config) == [mode]
    other = "multiprocess" if mode == "in_process" else "in_process"
    chosen = ResolvedRunConfig.build(job, {"execution": {"config": {other: {}}}})
    assert list(chosen.execution.execution_engine_config) == [other]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PANELFORGE_SHARDS", "0", "PANELFORGE_SHARDS must be at least 1, got 0"),
        ("PANELFORGE_SHARDS", "-1", "PANELFORGE_SHARDS must be at least 1, got -1"),
        ("PANELFORGE_SHARDS", "abc", "PANELFORGE_SHARDS must be a whole number, got 'abc'"),
        ("PANELFORGE_RATE_LIMIT", "0", "PANELFORGE_RATE_LIMIT must be greater than 0, got '0'"),
        ("PANELFORGE_RATE_LIMIT", "fast", "PANELFORGE_RATE_LIMIT must be a number, got 'fast'"),
        ("PANELFORGE_PMC_SOURCE", "s3://", "PANELFORGE_PMC_SOURCE names no bucket"),
        ("PANELFORGE_PMC_SOURCE", "gopher://x", "PANELFORGE_PMC_SOURCE must start with one of"),
        ("PANELFORGE_PMC_SOURCE", "ftp://u:p@host/pub", "must not hold credentials"),
        ("PANELFORGE_CONCURRENCY", "0", "PANELFORGE_CONCURRENCY must be at least 1"),
        ("PANELFORGE_GPUS_PER_ACTOR", "-0.5", "PANELFORGE_GPUS_PER_ACTOR must be at least 0.0"),
        ("PANELFORGE_MAX_ERROR_RATE", "2", "PANELFORGE_MAX_ERROR_RATE must be at most 1.0"),
        ("PANELFORGE_SYNTHETIC", "maybe", "PANELFORGE_SYNTHETIC must be 1 or 0"),
        ("PANELFORGE_EXECUTOR", "threads", "PANELFORGE_EXECUTOR must be one of ('multiprocess', 'in_process')"),
        ("NCBI_EUTILS_URL", "eutils.ncbi.nlm.nih.gov", "NCBI_EUTILS_URL must be an http(s):// URL"),
        ("PANELFORGE_TAXONOMY", "/nonexistent/taxonomy.json", "PANELFORGE_TAXONOMY names no file"),
    ],
)
def test_bad_settings_name_their_variable(name, value, message):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({name: value})
    assert message in str(raised.value)


def test_secrets_reach_resources_as_env_vars(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("NCBI_API_KEY", "ncbi_secret_value")
    resources = build_resources(Settings.from_env({}))
    assert isinstance(resources["hub"].token, EnvVar) and resources["hub"].token.env_var_name == "HF_TOKEN"
    assert resources["eutils"].api_key.env_var_name == "NCBI_API_KEY"
    monkeypatch.delenv("HF_TOKEN")
    assert build_resources(Settings.from_env({}))["hub"].token is None


def test_nothing_under_pipelines_reads_the_environment():
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "pipelines").rglob("*.py")
        if "os.environ" in path.read_text() or "getenv(" in path.read_text()
    ]
    assert offenders == []


def test_credentials_are_never_taken_from_the_url():
    with pytest.raises(ValueError, match="credentials in the source URL are not accepted"):
        open_source("ftp://user:secret@127.0.0.1:2121/pub")


def test_s3_url_maps_to_the_public_https_endpoint():
    source = open_source("s3://pmc-oa-opendata")
    assert source.transport.base_url == "https://pmc-oa-opendata.s3.amazonaws.com"
    # the AWS bucket's own policy (README "Rate limits"); a mirror keeps its strict limit
    assert source.layout.name == "cloud" and source.transport.limiter.rate == 340.0
    assert source.transport.max_in_flight == 64
    assert open_source("ftp://127.0.0.1:2121/pub").transport.limiter.rate == 3.0


def test_vlm_and_text_encoder_settings_are_validated():
    with pytest.raises(SettingsError, match="PANELFORGE_VLM_BACKEND must be one of"):
        Settings.from_env({"PANELFORGE_VLM_BACKEND": "vllm"})
    with pytest.raises(SettingsError, match="needs PANELFORGE_VLM_URL"):
        Settings.from_env({"PANELFORGE_VLM_BACKEND": "openai"})
    with pytest.raises(SettingsError, match="PANELFORGE_VLM_URL must be an http"):
        Settings.from_env({"PANELFORGE_VLM_BACKEND": "openai", "PANELFORGE_VLM_URL": "localhost:8000"})
    with pytest.raises(SettingsError, match="PANELFORGE_TEXT_TOKENIZER must be"):
        Settings.from_env({"PANELFORGE_TEXT_TOKENIZER": "bert"})
    with pytest.raises(SettingsError, match="PANELFORGE_VLLM_ENV must be"):
        Settings.from_env({"PANELFORGE_VLLM_ENV": "opt/vllm-venv/bin/python"})  # relative: ambiguous on a worker
    assert Settings.from_env({}).vllm_env == "pip"
    venv = "/opt/vllm-venv/bin/python"
    assert Settings.from_env({"PANELFORGE_VLLM_ENV": venv}).vllm_env == venv
    server = Settings.from_env({"PANELFORGE_VLM_BACKEND": "openai", "PANELFORGE_VLM_URL": "http://gpu-1:8000"})
    assert (server.vlm_backend, server.vlm_url) == ("openai", "http://gpu-1:8000")
    assert Settings.from_env({"PANELFORGE_PROFILE": "cluster"}).vlm_backend == "ray"
    assert (
        Settings.from_env({"PANELFORGE_TEXT_TOKENIZER": "hf:/models/bioclinical"}).text_tokenizer
        == "hf:/models/bioclinical"
    )


def test_the_materialization_order_puts_every_asset_after_its_parents():
    from jobs.definitions import materialization_order

    graph = defs.resolve_asset_graph()
    order = [a.key for a in materialization_order(defs)]
    assert sorted(order) == sorted(graph.get_all_asset_keys())  # each asset once
    for position, key in enumerate(order):
        assert all(order.index(parent) < position for parent in graph.get(key).parent_keys), key


def _diagram() -> str:
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("## How data flows") :]
    return section.split("```")[1]


def test_the_docs_diagram_is_the_graph_of_definitions():
    """docs/architecture.md draws the asset graph by hand: every asset of the code location is in
    it, every name with an underscore in it is an asset (``webdataset_*``: the figure-level
    WebDataset subsets), and an arrow between two names is a dependency of the graph."""
    import fnmatch
    import re

    graph = defs.resolve_asset_graph()
    assets = {key.to_user_string() for key in graph.get_all_asset_keys()}
    diagram = _diagram()
    names = set(re.findall(r"[a-z][a-z0-9_]*\*?", diagram))
    drawn = {a for a in assets if a in names or ("webdataset_*" in names and fnmatch.fnmatch(a, "webdataset_*"))}
    assert drawn == assets, sorted(assets - drawn)
    assert {n for n in names if "_" in n and n != "webdataset_*"} <= assets
    edges = re.findall(r"([a-z][a-z0-9_]*)\s*─+[┬┴┼]?─*▶\s*(?=([a-z][a-z0-9_]*))", diagram)
    edges += [(b, a) for a, b in re.findall(r"([a-z][a-z0-9_]*)\s*◀─+\s*(?=([a-z][a-z0-9_]*))", diagram)]
    assert len(edges) > 15
    for parent, child in edges:
        if parent in assets and child in assets:
            assert AssetKey(parent) in graph.get(AssetKey(child)).parent_keys, f"{parent} ─▶ {child}"
