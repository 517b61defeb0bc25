"""The path a user takes in the UI: `dagster dev` (web server + daemon), GraphQL launches, the lake."""

import time
from pathlib import Path

import pytest

from pipelines.core.lake import Lake
from testing.dagster_dev import DagsterDev, cli, instance_env
from testing.loopback.s3_server import S3LoopbackServer

SHARDS = ["000", "001", "002", "003"]

pytestmark = pytest.mark.e2e


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
            yield dev, Lake(tmp_path / "lake")
        finally:
            dev.stop()


def test_sample_release_through_the_web_server(dagster_dev):
    dev, lake = dagster_dev
    gql = dev.gql
    dev.add_release("2026")
    assert dev.wait_run(dev.launch("pmc_inventory_job", "2026")) == "SUCCESS"

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
