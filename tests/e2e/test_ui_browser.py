"""The UI in a real browser: `dagster dev` on a fresh demo-like instance, opened in headless
Chromium (Playwright), the way a user looks at the lineage, a partitioned asset and a run, and
launches a materialization with the mouse. Screenshots land in the test's tmp folder."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from testing.dagster_dev import DagsterDev, cli, instance_env
from testing.system import chromium, require

pytestmark = pytest.mark.e2e

RELEASE = "2026"
SHARDS = ["000", "001", "002", "003"]  # PANELFORGE_SHARDS=4
SAMPLE_ARTICLES = 38  # sample/SOURCES.md: 38 articles in the bundled release
# set to a folder (e.g. docs/screenshots) to keep this run's screenshots there as well
SCREENSHOTS_ENV = "PANELFORGE_UI_SCREENSHOTS"


def shoot(page, tmp: Path, name: str, full_page: bool = False) -> None:
    page.screenshot(path=str(tmp / name), full_page=full_page)
    if os.environ.get(SCREENSHOTS_ENV):
        Path(os.environ[SCREENSHOTS_ENV]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp / name, Path(os.environ[SCREENSHOTS_ENV]) / name)


@pytest.fixture(scope="module")
def headless_chromium():
    executable = chromium()
    require(executable, "Chromium is not installed (apt-get install chromium; .ci/run does)")
    from testing.ui import chromium_browser  # Playwright is a dev extra: import only when it runs

    with chromium_browser(executable) as running:
        yield running


@pytest.fixture(scope="module")
def browser(headless_chromium):
    return headless_chromium


@pytest.fixture(scope="module")
def dagster_ui(tmp_path_factory, cloud_mirror):
    """A demo-like instance (demo profile, the sample mirror on disk) with release 2026 open.
    Automation ticks once at start (nothing to do yet) and not again for an hour, so the
    inventory launched from the UI does not set off the rest of the graph under the test."""
    tmp = tmp_path_factory.mktemp("ui")
    env = instance_env(
        tmp,
        cloud_mirror.as_uri(),
        PANELFORGE_PROFILE="demo",
        PANELFORGE_AUTOMATION_INTERVAL="3600",
        HF_HUB_OFFLINE="1",
    )
    cli(env, "setup-instance")
    assert f"release {RELEASE} is open with 4 shards" in cli(env, "add-release", RELEASE)
    dev = DagsterDev(env, tmp / "dagster_dev.log")
    try:
        dev.wait_ready()
        yield dev, tmp
    finally:
        dev.stop()


@pytest.fixture(scope="module")
def server(dagster_ui):
    return dagster_ui


@pytest.fixture(scope="module")
def launched(browser, server) -> str:
    """pmc_inventory[2026] materialized from the UI; the id of its run."""
    from testing.ui import materialize, new_page

    dev, _ = server
    page = new_page(browser)
    run_id = materialize(page, dev.base_url, "pmc_inventory")
    page.close()
    return run_id


def test_lineage_shows_every_asset(browser, server):
    from jobs.definitions import ASSETS
    from testing.ui import GRAPH_VIEWPORT, SIDEBAR_VIEWPORT, graph_labels, label_shows, new_page, open_lineage

    dev, tmp = server
    defined = {key.to_user_string() for a in ASSETS for key in a.keys}
    served = {"/".join(n["assetKey"]["path"]) for n in dev.gql("{ assetNodes { assetKey { path } } }")["assetNodes"]}
    assert served == defined and len(defined) == 29

    page = new_page(browser, GRAPH_VIEWPORT)
    open_lineage(page, dev.base_url)
    labels = graph_labels(page)
    shoot(page, tmp, "asset-graph.png")
    assert len(labels) == len(defined), labels
    assert [n for n in sorted(defined) if not any(label_shows(lb, n) for lb in labels)] == []
    page.close()

    from testing.ui import sidebar_names

    page = new_page(browser, SIDEBAR_VIEWPORT)
    open_lineage(page, dev.base_url)
    assert defined <= sidebar_names(page)
    page.close()


def test_launch_from_the_ui_and_read_the_run(browser, server, launched):
    from playwright.sync_api import expect

    from testing.ui import filter_log, new_page, wait_run_status

    dev, tmp = server
    page = new_page(browser)
    page.goto(f"{dev.base_url}/runs/{launched}")
    wait_run_status(page, "Success")
    expect(page.get_by_text(f"partition: {RELEASE}").first).to_be_visible()
    shoot(page, tmp, "run.png")
    # the stage's summary line (assets/report.py), written to the run log by the run's process
    filter_log(page, "ok, 0 failed")
    expect(page.get_by_text(f"pmc_inventory[{RELEASE}]: {SAMPLE_ARTICLES} ok, 0 failed, 0 skipped")).to_be_visible()
    page.close()
    status = dev.gql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", id=launched)
    assert status["runOrError"]["status"] == "SUCCESS"


def test_partitioned_asset_shows_the_release_and_its_shards(browser, server, launched):
    from playwright.sync_api import expect

    from testing.ui import new_page, open_partitions

    dev, tmp = server
    page = new_page(browser)
    open_partitions(page, dev.base_url, "pmc_raw_articles")
    expect(page.get_by_text("Missing (4)", exact=True)).to_be_visible()
    for key in [RELEASE, *SHARDS]:
        expect(page.get_by_text(key, exact=True).first).to_be_visible()
    shoot(page, tmp, "partitioned-asset.png")
    page.close()


def test_metadata_panel_renders_the_counts_and_a_table(browser, server, launched):
    from playwright.sync_api import expect

    from testing.ui import new_page, open_partitions, wait_run_status

    dev, tmp = server
    page = new_page(browser)
    page.goto(f"{dev.base_url}/runs/{launched}")
    wait_run_status(page, "Success")
    open_partitions(page, dev.base_url, "pmc_inventory", RELEASE)
    expect(page.get_by_text("Materialized (1)", exact=True)).to_be_visible()
    row = page.get_by_role("row").filter(has=page.get_by_text("items_ok", exact=True))
    expect(row).to_contain_text(str(SAMPLE_ARTICLES))
    # the preview is Markdown (assets/report.py): a table rendered inside the metadata table
    preview = page.locator("table table").filter(has=page.get_by_role("columnheader", name="license_group"))
    expect(preview).to_be_visible()
    # the preview's rows are sample articles: PMC ids in the first column
    expect(preview.get_by_role("cell", name=re.compile(r"^PMC\d+$")).first).to_be_visible()
    shoot(page, tmp, "metadata.png", full_page=True)
    page.close()
