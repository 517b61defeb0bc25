"""``make screenshots``: the pictures of the UI in docs/ui.md, taken from the demo's instance.

Starts the web server alone (no daemon: looking launches nothing) over ``.demo/dagster_home`` and
the demo's lake, opens it in headless Chromium and takes the steps of ``tests/e2e/test_ui_browser.py``
(``testing/ui.py``): the expanded asset lineage, a partitioned asset's partitions, a run of the
acquisition with its log, and a plot in an asset's metadata panel. Writes
``docs/screenshots/{asset-graph,partitioned-asset,run,metadata-plot}.png``. Run ``make demo`` first.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from testing.dagster_dev import REPO, DagsterDev
from testing.system import chromium

OUT = REPO / "docs" / "screenshots"
DEMO_HOME = REPO / ".demo" / "dagster_home"
RELEASE = "2026"


def demo_env() -> dict[str, str]:
    return {
        **os.environ,
        "PANELFORGE_PROFILE": "demo",
        "DAGSTER_HOME": str(DEMO_HOME),
        "HF_HUB_OFFLINE": "1",
    }


def latest_run(dev: DagsterDev, asset: str) -> str:
    """The run that last materialized ``asset`` (the demo materializes every asset once)."""
    found = dev.gql(
        """query($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
             ... on Asset { assetMaterializations(limit: 1) { runId } } } }""",
        path=[asset],
    )["assetOrError"]
    events = found.get("assetMaterializations") or []
    if not events:
        raise SystemExit(f"{asset} was never materialized in {DEMO_HOME}: run `make demo` first")
    return events[0]["runId"]


def take(dev: DagsterDev, executable: Path, out: Path) -> list[Path]:
    from playwright.sync_api import expect

    from testing.ui import GRAPH_VIEWPORT, chromium_browser, new_page, open_lineage, open_partitions, wait_run_status

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with chromium_browser(executable) as browser:
        page = new_page(browser, GRAPH_VIEWPORT)
        open_lineage(page, dev.base_url)
        written.append(out / "asset-graph.png")
        page.screenshot(path=str(written[-1]))
        page.close()

        page = new_page(browser)
        open_partitions(page, dev.base_url, "pmc_raw_articles", f"{RELEASE}|000")
        expect(page.get_by_text("Missing (0)", exact=True)).to_be_visible()
        written.append(out / "partitioned-asset.png")
        page.screenshot(path=str(written[-1]))

        page.goto(f"{dev.base_url}/runs/{latest_run(dev, 'pmc_raw_articles')}")
        wait_run_status(page, "Success", timeout_s=60)
        written.append(out / "run.png")
        page.screenshot(path=str(written[-1]))

        # the scree plot of the concept model: a Markdown image in the metadata panel
        open_partitions(page, dev.base_url, "concept_model", RELEASE)
        row = page.get_by_role("row").filter(has=page.get_by_text("scree_plot", exact=True))
        row.get_by_text("[Show Markdown]").click()  # long Markdown opens in a dialog
        expect(page.locator("img[src^='data:image/png']").first).to_be_visible()
        written.append(out / "metadata-plot.png")
        page.screenshot(path=str(written[-1]))
        page.close()
    return written


def main() -> int:
    executable = chromium()
    if executable is None:
        print("Chromium is not installed: apt-get install chromium", file=sys.stderr)
        return 1
    if not (DEMO_HOME / "dagster.yaml").exists():
        print(f"no demo instance at {DEMO_HOME}: run `make demo` first", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        dev = DagsterDev(demo_env(), Path(tmp) / "webserver.log", daemon=False)
        try:
            dev.wait_ready()
            for path in take(dev, executable, OUT):
                print(f"wrote {path.relative_to(REPO)}")
        finally:
            dev.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
