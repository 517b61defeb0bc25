"""The README's Python examples (``>>>`` lines) run and print what the README says."""

import doctest
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_examples_hold(monkeypatch):
    monkeypatch.chdir(REPO)  # the examples open files by their repository paths
    # a code fence ends an example's expected output, as a blank line does
    text = "\n".join("" if line.startswith("```") else line for line in (REPO / "README.md").read_text().splitlines())
    test = doctest.DocTestParser().get_doctest(text, {}, "README.md", "README.md", 0)
    assert test.examples, "the README shows no Python example"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0
