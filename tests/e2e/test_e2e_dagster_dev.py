"""The path a user takes in the UI: `dagster dev` (web server + daemon) on PostgreSQL, GraphQL
launches, the lake. One ``dagster dev`` serves the module (``tests/conftest.py``'s ``dagster_dev``);
each test opens its own release on it and reads only that."""

import time

import pytest
from dagster import AssetKey, DagsterInstance

from jobs.instance import CLUSTER_INSTANCE_FILE
from pipelines.core.lake import Lake

SHARDS = ["000", "001", "002", "003"]
RELEASE, POSTGRES_RELEASE = "2031", "2032"  # each test's own release on the module's instance

pytestmark = pytest.mark.e2e


def test_setup_instance_set_the_shipped_pool_limits(dagster_dev):
    # the instance users get: the shipped file and its pool limits, set by the command line
    assert "pool pmc_source: 1" in dagster_dev.setup_output
    assert (dagster_dev.home / "dagster.yaml").exists()


def test_sample_release_through_the_web_server(dagster_dev):
    """The module's ``dagster dev`` (tests/conftest.py): an inventory launched as the launchpad
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


def test_a_partition_materialized_through_the_web_server_lives_in_postgres(dagster_dev, monkeypatch):
    """The module's ``dagster dev`` (tests/conftest.py): the cluster profile as it is, except what
    needs a cluster: a local lake instead of S3, the loopback S3 server as the PMC source, 4 shards.
    The launcher (Ray) and the VLM backend are not used by the inventory and load without a
    cluster. The automation sensor is slowed to once an hour so it does not start the download
    stage behind the inventory run. What the web server, daemon and run recorded is read from
    PostgreSQL, then back through an instance opened here, in another process than the server's."""
    dev, pg = dagster_dev.dev, dagster_dev.pg
    assert (dagster_dev.home / "dagster.yaml").read_text() == CLUSTER_INSTANCE_FILE.read_text()
    dev.add_release(POSTGRES_RELEASE)
    run_id = dev.launch("pmc_inventory_job", POSTGRES_RELEASE)
    assert dev.wait_run(run_id, timeout=240) == "SUCCESS", dev.tail()

    assert pg.query("SELECT status, pipeline_name FROM runs WHERE run_id = %s", run_id) == [
        ("SUCCESS", "pmc_inventory_job")
    ]
    materialized = pg.query(
        "SELECT asset_key, partition FROM event_logs"
        " WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        run_id,
    )
    assert materialized == [('["pmc_inventory"]', POSTGRES_RELEASE)]
    releases = pg.query("SELECT partition FROM dynamic_partitions WHERE partitions_def_name = 'releases'")
    assert (POSTGRES_RELEASE,) in releases
    inventory = Lake(dagster_dev.lake_dir).read_release("inventory", POSTGRES_RELEASE)
    assert inventory.num_rows == 38  # the sample mirror's articles

    run = dev.gql(
        """query($id: ID!) { runOrError(runId: $id) { ... on Run { status jobName tags { key value } } } }""",
        id=run_id,
    )["runOrError"]
    assert run["status"] == "SUCCESS" and run["jobName"] == "pmc_inventory_job"
    assert {"key": "dagster/partition", "value": POSTGRES_RELEASE} in run["tags"]

    # an instance opened from the same dagster.yaml, as another web server, daemon or pod would
    for name in ("DAGSTER_HOME", *pg.dagster_env()):
        monkeypatch.setenv(name, dagster_dev.env[name])
    with DagsterInstance.get() as instance:
        stored = instance.get_run_by_id(run_id)
        assert stored.status.value == "SUCCESS" and stored.tags["dagster/partition"] == POSTGRES_RELEASE
        events = instance.fetch_materializations(AssetKey("pmc_inventory"), limit=100).records
        ours = [(e.partition_key, e.run_id) for e in events if e.partition_key == POSTGRES_RELEASE]
        assert ours == [(POSTGRES_RELEASE, run_id)]
        assert POSTGRES_RELEASE in instance.get_dynamic_partitions("releases")

    # the password reached every process through the environment and no log line
    logs = [dev.log_path, *sorted((dagster_dev.home / "storage").rglob("*.*"))]
    assert not [log for log in logs if log.is_file() and pg.password in log.read_text(errors="replace")]
