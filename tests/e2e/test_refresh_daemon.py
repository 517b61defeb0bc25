"""A yearly refresh through the real daemon: release 2026 is built, release 2027 is opened from the
command line and its inventory launched with ``dagster asset materialize``; declarative automation
(``panelforge_automation``, on by default) then carries 2027 through every stage on its own.

The mirror is small, five articles of the sample (every stage's time grows with the figures it
sees): the second release adds, changes (new version) and retracts an article and carries two
unchanged ones with images, one per shard. The test waits until every automated asset partition
of 2027 is materialized, then checks the lake, the source's request log, the blocking checks, and
that the daemon re-ran nothing of 2026.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    EventRecordsFilter,
    MultiPartitionKey,
    RunsFilter,
    materialize,
)
from dagster._core.instance.ref import InstanceRef

from assets.acquisition import pmc_inventory
from assets.partitions import open_release
from jobs.automation import AUTOMATION_SENSOR, STARTED_BY_A_PERSON, STARTED_BY_THE_SENSOR, UPLOAD
from jobs.definitions import build_definitions, materialization_order, per_shard, unbound
from pipelines.concepts.annotations import TEMPLATE_COLUMNS
from pipelines.core.lake import Lake
from pipelines.core.partitioning import shard_keys
from pipelines.core.taxonomy import load_taxonomy
from resources.profiles import build_resources
from resources.settings import Settings
from testing.dagster_dev import LOCATION, DagsterDev
from testing.loopback.eutils_server import EutilsLoopbackServer
from testing.loopback.faults import FaultPlan
from testing.loopback.s3_server import S3LoopbackServer
from testing.loopback.sample_mirror import build_cloud_mirror

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]  # two releases through mining, on 2 shared CPUs

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIRST, SECOND = "2026", "2027"
N_SHARDS = 2
SHARDS = shard_keys(N_SHARDS)
# read from sample/release.csv and the articles' folders: CHANGED (nxml/PMC3441633, shard 001) and
# RETRACTED (nxml/PMC6398430, shard 000) have 9 and 4 figures and no image; ADDED
# (articles/elife-46472, shard 000) has 8 figures, fig1.jpg to fig8.jpg
CHANGED, RETRACTED, ADDED = "PMC3441633", "PMC6398430", "PMC900000009"
# the articles both releases carry unchanged, one a shard so each shard has images in 2026:
# articles/scielo-hoehnea-49-e1112020 (shard 000; 3 figures, gf1 to gf3.jpg) and articles/elife-43154
# (shard 001; 3 figures: fig1.jpg, fig2.jpg and the author response's resp-fig1.jpg)
CARRIED = ("PMC900000017", "PMC900000008")
ADDED_FIGURES, CARRIED_FIGURES = 8, 3 + 3
MODEL = {"n_components": 16, "k": 8, "sample_size": 10_000, "seed": 0}  # the demo's small model
# every automated asset (all but the inventory, the launched jobs a person starts and the upload),
# parents first: the graph as Definitions has it
AUTOMATED = [
    a
    for a in unbound(materialization_order(build_definitions(Settings(shards=N_SHARDS))))
    if a.key.path[-1] not in {STARTED_BY_THE_SENSOR, UPLOAD, *STARTED_BY_A_PERSON}
]
SHARD_ASSETS = tuple(a for a in AUTOMATED if per_shard(a))
RELEASE_ASSETS = tuple(a for a in AUTOMATED if not per_shard(a))
WAIT_S = 1800  # a hang guard: ~25 runs one after another, each a process; 900 s ran out at load 20-45


def _mirrors(tmp: Path, rows: list[dict]) -> tuple[Path, Path]:
    """A small mirror of the sample (every stage's cost grows with its figures): 2026 holds CHANGED,
    RETRACTED and the CARRIED articles; 2027 has CHANGED at version 2, RETRACTED retracted and ADDED
    new, the CARRIED articles as they were."""
    rows = [r for r in rows if r["pmcid"] in {CHANGED, RETRACTED, ADDED, *CARRIED}]
    assert len(rows) == 5
    old = [dict(r) for r in rows if r["pmcid"] != ADDED]
    new = []
    for row in rows:
        row = dict(row)
        if row["pmcid"] == CHANGED:
            row["version"], row["last_updated"] = "2", "2027-01-01 00:00:00"
        if row["pmcid"] == RETRACTED:
            row["retracted"] = "yes"
        new.append(row)
    return build_cloud_mirror(tmp / "m2026", rows=old), build_cloud_mirror(tmp / "m2027", rows=new)


def _annotate(lake: Lake, version: str) -> None:
    """Two annotators fill the template concept_review wrote, agreeing on every cluster."""
    folder = lake.path("review", version)
    template = list(csv.DictReader(io.StringIO(lake.fs.cat(f"{folder}/annotations_template.csv").decode())))
    taxonomy = load_taxonomy()
    concepts, panels = taxonomy.global_concepts, taxonomy.panel_types
    for annotator in ("ann_a", "ann_b"):
        out = io.StringIO()
        writer = csv.DictWriter(out, TEMPLATE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in template:
            cluster = int(row["cluster_id"])
            row.update(panel_type=panels[0], global_concept=concepts[cluster % len(concepts)])
            writer.writerow(row)
        with lake.atomic_local_file(lake.path("annotations", version, f"{annotator}.csv")) as tmp:
            Path(tmp).write_text(out.getvalue())


def _runs(assets) -> list[list]:
    """The automated assets in the runs that build a release, parents first: each run the longest
    stretch of assets with one partitioning (a shard, or the release), and the cluster labels a run
    of their own, since the annotators fill in the template concept_review writes before them."""
    runs: list[list] = []
    for asset in assets:
        name = asset.key.path[-1]
        if runs and per_shard(runs[-1][0]) == per_shard(asset) and name != "cluster_labels":
            runs[-1].append(asset)
        else:
            runs.append([asset])
    return runs


def _build_first_release(instance, env: dict) -> str:
    """Release 2026, every stage but the upload, in this process (the quickest way: a run for each
    stretch of :func:`_runs` and partition, as the daemon's runs group them); returns the model version."""
    resources = build_resources(Settings.from_env(env))
    run_config = {
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},
        "ops": {"concept_model": {"config": MODEL}},
    }

    def run(assets, key) -> dict[str, dict]:
        names = {a.key.path[-1] for a in assets}
        config = run_config if "concept_model" in names else {"loggers": run_config["loggers"]}
        result = materialize(assets, partition_key=key, instance=instance, resources=resources, run_config=config)
        assert result.success, names
        events = result.get_asset_materialization_events()
        return {e.asset_key.path[-1]: e.materialization.metadata for e in events}

    open_release(instance, FIRST, N_SHARDS)
    run([pmc_inventory], FIRST)
    shards, metadata = [MultiPartitionKey({"release": FIRST, "shard": s}) for s in SHARDS], {}
    for assets in _runs(AUTOMATED):
        if assets[0].key.path[-1] == "cluster_labels":  # after concept_review wrote the template
            _annotate(Lake(env["PANELFORGE_HOME"]), metadata["concept_model"]["version"].value)
        for key in shards if per_shard(assets[0]) else [FIRST]:
            metadata.update(run(assets, key))
    labels = metadata["cluster_labels"]
    assert labels["annotated_clusters"].value == labels["clusters"].value > 0
    return metadata["concept_model"]["version"].value


def _expected_partitions() -> dict[AssetKey, set[str]]:
    shard_keys_ = {str(MultiPartitionKey({"release": SECOND, "shard": s})) for s in SHARDS}
    expected = {a.key: shard_keys_ for a in SHARD_ASSETS}
    expected.update({a.key: {SECOND} for a in RELEASE_ASSETS})
    return expected


def _failed_runs(instance) -> list:
    return instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.FAILURE]))


def _wait_for_release(instance, dev: DagsterDev) -> float:
    """Seconds until every automated asset partition of 2027 is materialized; fails on a failed run."""
    started, expected = time.time(), _expected_partitions()
    while True:
        missing = {
            k.to_user_string(): sorted(want - set(instance.get_materialized_partitions(k)))
            for k, want in expected.items()
        }
        missing = {k: v for k, v in missing.items() if v}
        if not missing:
            return time.time() - started
        failed = _failed_runs(instance)
        assert not failed, [(r.run_id, r.asset_selection, r.tags.get("dagster/partition")) for r in failed]
        assert dev.proc.poll() is None, dev.tail()
        assert time.time() - started < WAIT_S, f"still missing after {WAIT_S}s: {missing}\n{dev.tail()}"
        time.sleep(3)


def _wait_for_ticks(dev: DagsterDev, after: float, n: int) -> None:
    """Until the automation sensor has finished ``n`` ticks that began after ``after`` (a time)."""
    deadline = time.time() + 300
    while True:
        ticks = dev.gql(
            """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
                 ... on Sensor { sensorState { ticks(limit: 5) { timestamp status } } } } }""",
            s={**LOCATION, "sensorName": AUTOMATION_SENSOR},
        )["sensorOrError"]["sensorState"]["ticks"]
        if sum(1 for t in ticks if t["timestamp"] > after and t["status"] != "STARTED") >= n:
            return
        assert time.time() < deadline, f"the sensor did not tick {n} times in 300s: {ticks}\n{dev.tail()}"
        time.sleep(1)


@pytest.fixture(scope="module")
def daemon_refresh(tmp_path_factory, rows, _local_ray_session):
    """Both releases, as the module's tests read them. Every embedding runs on the session's local
    Ray, as a cluster's runs connect to theirs (``PANELFORGE_RAY_ADDRESS``): the first release's in
    this process, 2027's in the daemon's runs, none on a Ray of its own started for a few images."""
    import ray

    tmp = tmp_path_factory.mktemp("refresh_daemon")
    home, lake_dir = tmp / "dagster_home", tmp / "lake"
    m2026, m2027 = _mirrors(tmp, rows)
    base_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DAGSTER_HOME": str(home),
        "PANELFORGE_PROFILE": "demo",
        "PANELFORGE_SYNTHETIC": "1",
        "PANELFORGE_HOME": str(lake_dir),
        "PANELFORGE_SHARDS": str(N_SHARDS),
        "PANELFORGE_RATE_LIMIT": "200",
        "PANELFORGE_RATE_DIR": str(tmp / "ratelimit"),
        "PANELFORGE_AUTOMATION_INTERVAL": "5",
        "PANELFORGE_PANEL_DETECTOR": "none",  # the layout splitter alone: the daemon test is about the flow
        "PANELFORGE_RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PANELFORGE_OUTAGE_RETRIES": "0",
        "HF_HUB_OFFLINE": "1",
    }
    base_env.pop("PANELFORGE_HF_REPO", None)
    setup = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "setup-instance"], cwd=REPO, env=base_env, capture_output=True, text=True
    )
    assert setup.returncode == 0, setup.stderr
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))

    with EutilsLoopbackServer() as eutils:
        base_env["NCBI_EUTILS_URL"] = eutils.url
        with S3LoopbackServer(m2026) as first:
            version = _build_first_release(instance, {**base_env, "PANELFORGE_PMC_SOURCE": first.url})
        runs_of_first = {r.run_id for r in instance.get_runs()}

        plan = FaultPlan()
        with S3LoopbackServer(m2027, plan=plan) as second:
            env = {**base_env, "PANELFORGE_PMC_SOURCE": second.url}
            dev = DagsterDev(env, tmp / "dagster_dev.log")
            try:
                dev.wait_ready()
                sensor = dev.gql(
                    """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
                         ... on Sensor { sensorState { status } } } }""",
                    s={**LOCATION, "sensorName": AUTOMATION_SENSOR},
                )["sensorOrError"]
                added = [
                    subprocess.run(
                        [sys.executable, "-m", "jobs.cli", "add-release", SECOND],
                        cwd=REPO,
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    for _ in range(2)  # idempotent
                ]
                launched = subprocess.run(
                    [
                        str(BIN / "dagster"),
                        "asset",
                        "materialize",
                        "-m",
                        "jobs.definitions",
                        "--select",
                        "pmc_inventory",
                        "--partition",
                        SECOND,
                    ],
                    cwd=REPO,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
                seconds = _wait_for_release(instance, dev)
                # let the sensor tick twice more: nothing more is requested for a finished release
                _wait_for_ticks(dev, after=time.time(), n=2)
                later_runs = [r for r in instance.get_runs() if r.run_id not in runs_of_first]
            finally:
                dev.stop()
    print(f"\nrelease {SECOND} went through every stage in {seconds:.0f}s after its inventory")
    return {
        "lake": Lake(lake_dir),
        "instance": instance,
        "plan": plan,
        "version": version,
        "sensor": sensor,
        "added": added,
        "later_runs": later_runs,
    }


@pytest.fixture(scope="module")
def refreshed(daemon_refresh):
    return daemon_refresh


def test_cli_opened_the_release_and_automation_is_on(refreshed):
    assert refreshed["sensor"]["sensorState"]["status"] == "RUNNING"
    assert [a.returncode for a in refreshed["added"]] == [0, 0]
    assert all(f"release {SECOND} is open with {N_SHARDS} shards" in a.stdout for a in refreshed["added"])


def test_the_new_release_has_the_added_and_changed_articles(refreshed):
    lake = refreshed["lake"]
    articles = {r["pmcid"]: r for r in lake.read_release("articles", SECOND).to_pylist()}
    assert ADDED in articles and ADDED not in {r["pmcid"] for r in lake.read_release("articles", FIRST).to_pylist()}
    assert ADDED in {r["pmcid"] for r in lake.read_release("figures", SECOND).to_pylist()}
    manifest = {r["pmcid"]: r for r in lake.read_release("raw_manifest", SECOND).to_pylist()}
    assert (manifest[CHANGED]["version"], manifest[CHANGED]["fetched_in_release"]) == (2, SECOND)
    files = [r for r in lake.read_release("raw_files", SECOND).to_pylist() if r["pmcid"] == CHANGED]
    assert files and all(r["tar_path"].startswith(f"raw/release={SECOND}/") for r in files)
    samples = lake.read_release("samples", SECOND).to_pylist()
    assert ADDED in {r["pmcid"] for r in samples if r["status"] == "included"}
    assert CHANGED in {r["pmcid"] for r in samples}  # planned again (its figures have no image in the sample)


def test_the_retracted_article_is_gone_from_samples_and_shards(refreshed):
    lake = refreshed["lake"]
    assert RETRACTED in {r["pmcid"] for r in lake.read_release("samples", FIRST).to_pylist()}
    assert RETRACTED not in {r["pmcid"] for r in lake.read_release("articles", SECOND).to_pylist()}
    assert RETRACTED not in {r["pmcid"] for r in lake.read_release("samples", SECOND).to_pylist()}
    import pyarrow.parquet as pq

    manifests = lake.fs.glob(lake.path("dataset", SECOND, "*", "manifest.json"))
    assert manifests
    figure_level = [json.loads(lake.fs.cat(m)) for m in manifests if "/concept-" not in m]
    figure_level = [m for m in figure_level if m.get("level", "figure") == "figure"]  # not the pair levels
    total = sum(m["samples"] for m in figure_level)
    assert total == sum(1 for r in lake.read_release("samples", SECOND).to_pylist() if r["status"] == "included")
    sidecars = lake.fs.glob(lake.path("dataset", SECOND, "*", "*.parquet"))
    in_shards = {p for path in sidecars for p in pq.read_table(lake.fs.open(path)).column("pmcid").to_pylist()}
    assert ADDED in in_shards and RETRACTED not in in_shards
    assert lake.exists(lake.path("dataset", "README.md"))


def test_labels_come_from_the_first_releases_model_and_annotations(refreshed):
    lake = refreshed["lake"]
    labels = lake.read_table("cluster_labels", SECOND, "all").to_pylist()
    assert {r["model_version"] for r in labels} == {refreshed["version"]} and labels
    assert not [r for r in labels if r["fingerprint_mismatch"]]
    statuses = {r["label_status"] for r in lake.read_release("figure_concepts", SECOND).to_pylist()}
    assert statuses == {"labeled"}


def test_carried_articles_were_not_fetched_again(refreshed):
    log = refreshed["plan"].log
    fetched = {p.split("/")[2] for _, m, p in log if m.startswith("GET") and p.count("/") >= 3}
    assert fetched == {f"{ADDED}.1", f"{CHANGED}.2", f"{RETRACTED}.1"}


def test_blocking_checks_passed_and_nothing_of_the_first_release_reran(refreshed):
    instance = refreshed["instance"]
    records = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=10_000)
    latest = {}
    for record in sorted(records, key=lambda r: r.storage_id):
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        if (evaluation.partition or "").startswith(SECOND):
            latest[(evaluation.asset_key.to_user_string(), evaluation.check_name, evaluation.partition)] = evaluation
    blocking = {k: e.passed for k, e in latest.items() if e.blocking}
    assert blocking and all(blocking.values()), blocking
    checked = {k[0] for k in blocking}
    assert {"pmc_raw_articles", "parsed_articles", "pubmed_metadata", "figure_embeddings"} <= checked
    partitions = {r.tags.get("dagster/partition", "") for r in refreshed["later_runs"]}
    assert partitions and all(p.startswith(SECOND) for p in partitions), partitions
    assert not [r for r in refreshed["later_runs"] if r.status != DagsterRunStatus.SUCCESS]


def test_mining_reused_every_figure_that_did_not_change(refreshed):
    """Only the added article's figure images are mined again in 2027; the rest carry 2026's pairs."""
    lake = refreshed["lake"]
    rows = lake.read_release("mining_figures", SECOND).to_pylist()
    mined = {r["pmcid"] for r in rows if r["status"] == "mined"}
    assert mined == {ADDED}, mined  # CHANGED's figures have no image in the sample: nothing to mine
    assert {r["status"] for r in rows} == {"mined", "carried"}
    # one row per figure image: ADDED's eight mined, the six of the CARRIED articles reused
    statuses = [r["status"] for r in rows]
    assert (statuses.count("mined"), statuses.count("carried")) == (ADDED_FIGURES, CARRIED_FIGURES), rows
    assert {r["pmcid"] for r in rows if r["status"] == "carried"} == set(CARRIED)
    pairs = lake.read_release("pairs", SECOND).to_pylist()
    assert RETRACTED not in {p["pmcid"] for p in pairs} and ADDED in {p["pmcid"] for p in pairs}


def test_the_demo_profiles_runs_kept_their_steps_in_the_run_process(refreshed):
    """The demo profile's executor (PANELFORGE_EXECUTOR defaults to in_process there): no run the
    daemon launched started a process per step."""
    instance = refreshed["instance"]
    for run in refreshed["later_runs"]:
        messages = [e.message for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)]
        assert any(m.startswith("Executing steps in process") for m in messages), (run.run_id, messages)
        assert not any("multiprocess executor" in m for m in messages), (run.run_id, messages)
