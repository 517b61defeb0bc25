"""docs/README.md lists every page under docs/, and every relative link of the README and the docs
resolves: to a file that exists and, with a ``#fragment``, to a heading of that page (GitHub's
anchors). Moving a README section into docs/ must move its links with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.report import anchor

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(page: Path) -> str:
    """The page without its code blocks (a ``[x](y)`` there is code, not a link)."""
    return re.sub(r"^\s*```.*?^\s*```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for match in re.finditer(r"^#{1,6} +(.+?) *$", prose(page), flags=re.M):
        slug = anchor(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")  # GitHub numbers repeated headings
    return found


def test_anchors_are_githubs():
    assert anchor("3. vLLM on Ray Data (`ray`)") == "3-vllm-on-ray-data-ray"
    assert anchor("From the demo to real weights") == "from-the-demo-to-real-weights"
    assert anchor("Mark-guided region mining: τ") == "mark-guided-region-mining-τ"


def test_the_docs_index_lists_every_page():
    index = REPO / "docs" / "README.md"
    linked = {(index.parent / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(prose(index))}
    pages = {p.resolve() for p in PAGES if p != index and p.parent != REPO}
    assert sorted(str(p.relative_to(REPO)) for p in pages - linked) == [], "pages docs/README.md does not list"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(page):
    broken = []
    for match in LINK.finditer(prose(page)):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked offline
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path) if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.relative_to(REPO)}")
    assert broken == []


def test_the_readme_stays_a_manual_read_in_ten_minutes():
    """The README is the user's manual (issue 22 §2): at most ~300 lines, with its contents line
    linking every one of its sections; the detail belongs on a page under docs/."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "README.md over 300 lines: move the detail into a docs/ page"
    sections = {anchor(m.group(1)) for m in re.finditer(r"^## +(.+?) *$", prose(REPO / "README.md"), flags=re.M)}
    contents = next(line for line in text.splitlines() if line.startswith("**Contents:**"))
    paragraph = text[text.index(contents) :].split("\n\n")[0]
    assert sections == set(re.findall(r"\]\(#([^)]+)\)", paragraph))
