"""The path a user takes in the UI: `dagster dev` (web server + daemon), GraphQL launches, the lake."""

import time
from pathlib import Path

import pytest

from pipelines.lake import Lake
from testing.dagster_dev import DagsterDev, cli, instance_env
from testing.loopback.s3_server import S3LoopbackServer

LOCATION = {"repositoryLocationName": "jobs.definitions", "repositoryName": "__repository__"}
SHARDS = ["000", "001", "002", "003"]

pytestmark = pytest.mark.e2e


def wait_run(gql, run_id: str, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = gql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=run_id)["runOrError"][
            "status"
        ]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    raise TimeoutError(f"run {run_id} did not finish")


@pytest.fixture
def dagster_dev(tmp_path, cloud_mirror):
    with S3LoopbackServer(cloud_mirror) as server:
        env = instance_env(tmp_path, server.url)
        # the instance users get: the shipped dagster.yaml and its pool limits, set by the command line
        assert "pool pmc_source: 1" in cli(env, "setup-instance")
        assert (Path(env["DAGSTER_HOME"]) / "dagster.yaml").exists()
        dev = DagsterDev(env, tmp_path / "dagster_dev.log")
        try:
            dev.wait_ready()
            yield dev.gql, Lake(tmp_path / "lake")
        finally:
            dev.stop()


def test_sample_release_through_the_web_server(dagster_dev):
    gql, lake = dagster_dev
    added = gql(
        """mutation($sel: RepositorySelector!, $key: String!) {
             addDynamicPartition(repositorySelector: $sel, partitionsDefName: "releases", partitionKey: $key) {
               __typename ... on PythonError { message } } }""",
        sel=LOCATION,
        key="2026",
    )["addDynamicPartition"]
    assert added["__typename"] == "AddDynamicPartitionSuccess", added

    launched = gql(
        """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
             __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        params={
            "selector": {**LOCATION, "jobName": "pmc_inventory_job"},
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "2026"}]},
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    assert wait_run(gql, launched["run"]["runId"]) == "SUCCESS"

    backfill = gql(
        """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
             __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
        params={
            "partitionNames": [f"2026|{s}" for s in SHARDS],
            "assetSelection": [{"path": ["pmc_raw_articles"]}],
        },
    )["launchPartitionBackfill"]
    assert backfill["__typename"] == "LaunchBackfillSuccess", backfill
    deadline = time.time() + 420
    while time.time() < deadline:
        status = gql(
            """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
                 ... on PartitionBackfill { status } } }""",
            id=backfill["backfillId"],
        )["partitionBackfillOrError"]["status"]
        if status not in ("REQUESTED", "CANCELING"):
            break
        time.sleep(2)
    assert status in ("COMPLETED", "COMPLETED_SUCCESS"), status

    manifest = lake.read_release("raw_manifest", "2026").to_pylist()
    assert len(manifest) == 38 and {r["status"] for r in manifest} == {"ok"}
    assert lake.read_release("raw_files", "2026").num_rows == 38 + 157
    materialized = gql(
        """query { assetOrError(assetKey: {path: ["pmc_raw_articles"]}) { ... on Asset {
             assetMaterializations(limit: 10) { partition } } } }"""
    )["assetOrError"]["assetMaterializations"]
    assert sorted(m["partition"] for m in materialized) == [f"2026|{s}" for s in SHARDS]
