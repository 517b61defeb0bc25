"""What a user does in the Dagster UI, driven in headless Chromium by Playwright: the browser test
and ``make screenshots`` take the same steps, so the pictures in docs/ui.md are what the test saw.

Playwright cannot download its own browser here, so it drives Debian's Chromium
(``testing.system.chromium()``), which is a few releases older than the one Playwright 1.65
was built against; the arguments below are the ones that work with it in a container as root.

Selectors are what a user reads (roles, button names, visible text) except where the UI has
nothing readable: the graph's asset nodes are matched by their CSS-module class prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container: the setuid sandbox is unavailable
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # nothing outside loopback is reachable anyway
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1600, "height": 1000}
# Wide enough that the expanded lineage of every group fits on one screen; the graph draws only the
# nodes in view, so a smaller window would hide some of them.
GRAPH_VIEWPORT = {"width": 2400, "height": 1350}
# The sidebar is a virtualized list: tall enough for the 9 groups and every asset row at once.
SIDEBAR_VIEWPORT = {"width": 1600, "height": 1800}
UI_TIMEOUT_MS = 60_000  # 2 cores: the first GraphQL answers of a fresh server take a while


@contextmanager
def chromium_browser(executable: Path) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(executable), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Browser, viewport: dict[str, int] = VIEWPORT) -> Page:
    """A page that dismisses the community sign-up dialog a fresh instance shows once, whenever
    it appears (it covers whatever the step wanted to click)."""
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(UI_TIMEOUT_MS)
    skip = page.get_by_role("button", name="Skip", exact=True)
    page.add_locator_handler(skip, lambda: skip.click())
    return page


def open_lineage(page: Page, base_url: str) -> None:
    """The global asset lineage with every group expanded (it opens with groups collapsed)."""
    page.goto(f"{base_url}/asset-groups")
    graph = page.locator("svg[class*=AssetGraphExplorer_svgContainer]")
    graph.locator("foreignObject").first.wait_for()
    size = page.viewport_size or VIEWPORT
    expand = page.get_by_role("menuitem").filter(has_text="Expand all groups")
    nodes = graph.locator("[class*=AssetNode_assetName]")
    for attempt in range(3):
        # the background's context menu (the left column is the sidebar: click far right and low);
        # the sign-up dialog of a fresh instance may pop up and close it, or swallow the click on
        # "Expand all groups" (the groups then stay collapsed), hence the retries
        page.mouse.click(size["width"] - 200, size["height"] - 40, button="right")
        try:
            expand.click(timeout=10_000)
            nodes.first.wait_for(timeout=20_000)
            return
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise


def graph_labels(page: Page) -> list[str]:
    """The names written on the graph's asset nodes (long ones middle-truncated: ``multilev…_training``)."""
    return [t.strip() for t in page.locator("[class*=AssetNode_assetName]").all_inner_texts()]


def label_shows(label: str, name: str) -> bool:
    """Whether a node label is ``name``, whole or middle-truncated with an ellipsis."""
    if "…" not in label:
        return label == name
    head, tail = label.split("…", 1)
    return len(head) + len(tail) < len(name) and name.startswith(head) and name.endswith(tail)


def sidebar_names(page: Page) -> set[str]:
    """Expand every group of the lineage's sidebar tree and return the names it lists (each row
    carries its full name as a title, even when the text is truncated)."""
    collapsed = page.locator('button:has([aria-label="arrow_drop_down"][style*="rotate(-90deg)"])')
    for _ in range(50):  # a group per click; the list re-renders after each
        if collapsed.count() == 0:
            break
        collapsed.first.click()
    titles = page.locator("[class*=MiddleTruncate_container]").evaluate_all("els => els.map(e => e.title)")
    return set(titles)


def open_partitions(page: Page, base_url: str, asset: str, partition: str | None = None) -> None:
    """An asset's partitions view (a grid for two dimensions); ``partition`` selects one."""
    query = f"&partition={partition}" if partition else ""
    page.goto(f"{base_url}/assets/{asset}?view=partitions{query}")
    expect(page.get_by_text(re.compile(r"^Missing \(\d+\)$"))).to_be_visible()


def materialize(page: Page, base_url: str, asset: str) -> str:
    """Materialize ``asset``'s every partition from its page, as a user does (Materialize…, All,
    Launch), open the run from the toast and return its id."""
    page.goto(f"{base_url}/assets/{asset}")
    page.get_by_role("button", name="Materialize…").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("button", name="All", exact=True).click()
    dialog.get_by_role("button", name=re.compile(r"^Launch \d+ runs?$")).click()
    toast = page.get_by_text(re.compile(r"^Launched run [0-9a-f]{8}$"))
    expect(toast).to_be_visible()
    page.get_by_role("link", name="View", exact=True).click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    return page.url.rsplit("/runs/", 1)[1].split("?")[0]


def wait_run_status(page: Page, status: str = "Success", timeout_s: float = 240) -> None:
    """Wait, on the run's page, until its status tag reads ``status``; the page updates itself."""
    expect(page.get_by_text(status, exact=True).first).to_be_visible(timeout=timeout_s * 1000)


def filter_log(page: Page, text: str) -> None:
    """Type ``text`` into the run log's filter, so the matching lines are in view of a virtualized list."""
    page.get_by_placeholder(re.compile("Filter", re.IGNORECASE)).first.fill(text)
