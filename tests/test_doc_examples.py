"""The Python examples (``>>>`` lines) of the README and of every page under docs/ run and print
what the page says. Each page runs in its own namespace, from the repository root (the examples
open files by their repository paths)."""

from __future__ import annotations

import doctest
import io
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def examples(page: Path) -> doctest.DocTest:
    # a code fence ends an example's expected output, as a blank line does
    text = "\n".join("" if line.lstrip().startswith("```") else line for line in page.read_text().splitlines())
    name = str(page.relative_to(REPO))
    return doctest.DocTestParser().get_doctest(text, {}, name, name, 0)


def test_the_readme_shows_python_examples():
    assert examples(REPO / "README.md").examples, "the README shows no Python example"


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p).examples], ids=lambda p: str(p.relative_to(REPO)))
def test_examples_hold(page, monkeypatch):
    monkeypatch.chdir(REPO)
    test = examples(page)  # a fresh namespace per page
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
