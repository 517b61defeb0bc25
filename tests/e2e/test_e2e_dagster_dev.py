"""The path a user takes in the UI: `dagster dev` (web server + daemon), GraphQL launches, the lake."""

import time

import pytest

from pipelines.core.lake import Lake

SHARDS = ["000", "001", "002", "003"]
RELEASE = "2031"  # this test's own release on the session's instance (test_postgres_instance opens 2032)

pytestmark = pytest.mark.e2e


def test_setup_instance_set_the_shipped_pool_limits(dagster_dev):
    # the instance users get: the shipped file and its pool limits, set by the command line
    assert "pool pmc_source: 1" in dagster_dev.setup_output
    assert (dagster_dev.home / "dagster.yaml").exists()


def test_sample_release_through_the_web_server(dagster_dev):
    """The session's ``dagster dev`` (tests/conftest.py): an inventory launched as the launchpad
    does, then a backfill of the download over the release's four shards, run by the daemon."""
    dev, lake = dagster_dev.dev, Lake(dagster_dev.lake_dir)
    gql = dev.gql
    dev.add_release(RELEASE)
    assert dev.wait_run(dev.launch("pmc_inventory_job", RELEASE)) == "SUCCESS"

    backfill = gql(
        """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
             __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
        params={
            "partitionNames": [f"{RELEASE}|{s}" for s in SHARDS],
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

    manifest = lake.read_release("raw_manifest", RELEASE).to_pylist()
    assert len(manifest) == 38 and {r["status"] for r in manifest} == {"ok"}
    assert lake.read_release("raw_files", RELEASE).num_rows == 38 + 157
    materialized = gql(
        """query($partitions: [String!]) { assetOrError(assetKey: {path: ["pmc_raw_articles"]}) { ... on Asset {
             assetMaterializations(limit: 10, partitions: $partitions) { partition } } } }""",
        partitions=[f"{RELEASE}|{s}" for s in SHARDS],
    )["assetOrError"]["assetMaterializations"]
    assert sorted(m["partition"] for m in materialized) == [f"{RELEASE}|{s}" for s in SHARDS]
