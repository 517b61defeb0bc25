"""docs/benchmarks.md is generated from the committed results; every benchmark is in the catalog
and in `make bench`; results carry the facts of their run."""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.catalog import BENCHMARKS, Benchmark, Col, Row, Run, Table
from benchmarks.record import ROOT, write_results
from benchmarks.report import PAGE, README, ReportError, fmt, lookup, render, with_panel_quality

# the machinery, not measurements
NOT_BENCHMARKS = {"__init__", "record", "catalog", "report", "vlm_cost", "mining_report"}


def test_committed_page_is_what_the_results_give():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/benchmarks.md differs from what benchmarks/results/*.json give: run `python -m benchmarks.report` "
        "(or `make bench-report`) and commit the page; never edit its numbers by hand"
    )


def test_the_readme_panel_table_is_what_the_results_give():
    readme = README.read_text(encoding="utf-8")
    assert readme == with_panel_quality(readme), "README's panel table is stale: run `python -m benchmarks.report`"
    assert "| holdout | **the figure decision** |" in readme  # the unseen split is reported beside tune


def test_every_benchmark_and_results_file_is_in_the_catalog():
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - NOT_BENCHMARKS
    assert {b.module for b in BENCHMARKS} == modules
    for module in modules:  # one writer, so every result records its run
        assert "write_results(" in (ROOT / "benchmarks" / f"{module}.py").read_text(), f"{module} writes its own JSON"
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    for path in files:
        owners = [b.module for b in BENCHMARKS for r in b.runs if fnmatch.fnmatch(path.name, r.results)]
        assert len(owners) == 1, f"{path.name} belongs to {owners or 'no benchmark'} (benchmarks/catalog.py)"


def _recipe(target: str) -> list[str]:
    """The commands of a Makefile target, `$(BIN)/python` read as `python`, variables of the environment dropped."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = re.sub(r"^((\$\(\w+\)|\w+=\S*) )*\$\(BIN\)/python", "python", line.strip())
        commands.append(command)
    return commands


def test_make_bench_runs_every_cpu_benchmark_then_the_report():
    expected = [r.command for b in BENCHMARKS if not b.gpu for r in b.runs]
    commands = _recipe("bench")
    assert commands[-1] == "python -m benchmarks.report"
    assert sorted(commands[:-1]) == sorted(expected)
    assert _recipe("bench-report") == ["python -m benchmarks.report"]
    gpu = [r.command for b in BENCHMARKS if b.gpu for r in b.runs]
    if gpu:  # the GPU benchmarks run where a GPU is, by their own target
        assert sorted(c for c in _recipe("gpu-check") if c.startswith("python -m benchmarks.")) == sorted(
            [*gpu, "python -m benchmarks.report"]
        )


def test_lookup_reads_paths_keys_top_level_values_and_counts():
    data = {"chosen": 0.15, "tau": {"0.15": {"f1": 0.7}}, "runs": [{"mb": 1}, {"mb": 2}], "fails": ["a", "b", "c"]}
    assert lookup(data, "tau/{chosen}/f1") == 0.7
    assert lookup(data, "runs/-1/mb") == 2
    assert lookup(data, "runs/0/mb") == 1
    assert lookup(data, "fails/#count") == 3
    assert lookup(data["runs"][0], "/tau/{key}/f1", key="0.15", root=data) == 0.7
    with pytest.raises(KeyError, match="tau/0.2"):
        lookup(data, "tau/0.2/f1")
    with pytest.raises(KeyError, match="runs/2"):
        lookup(data, "runs/2/mb")


def test_numbers_are_formatted_for_reading():
    assert fmt(1234.6) == "1,235"
    assert fmt(10000) == "10,000"
    assert fmt(0.123456) == "0.1235"
    assert fmt(60.0) == "60"
    assert fmt(2.24, ratio=True) == "2.24×"
    assert fmt(None, ratio=True) == "—"
    assert fmt(True) == "yes"
    assert fmt("a|b") == "a\\|b"


def _checkout(tmp_path: Path, results: dict[str, dict]) -> Path:
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "speed.py").write_text(
        '"""Speed benchmark: how fast ``thing`` goes\non two lines.\n\nMore detail that is not shown."""\n'
    )
    for name, data in results.items():
        (tmp_path / "benchmarks" / "results" / name).write_text(json.dumps(data))
    return tmp_path


SPEED = Benchmark(
    "speed",
    "Speed",
    (Run("python -m benchmarks.speed", "speed.json"), Run("python -m benchmarks.speed --fast", "speed-fast.json")),
    rows=(
        Row("items/s against the old code", "ours/rate", "old/rate", "speedup"),
        Row("errors found", "errors/#count"),
        Row("tokens/s (kinds of run that have it)", "tokens_per_s", optional=True),
    ),
    tables=(
        Table("Per size", "sizes", "size", (Col("seconds", "s"), Col("over the first", "/ratios/{key}", ratio=True))),
    ),
)


def test_page_shows_the_numbers_baseline_run_and_machine_of_each_results_file(tmp_path):
    speed = {
        "benchmark": "items per second",
        "run": {
            "date": "2026-01-02T03:04:05Z",
            "command": "python -m benchmarks.speed",
            "commit": "0123456789ab+",
            "machine": {
                "cpus": 8,
                "memory_gib": 31.3,
                "gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB"],
                "python": "3.11.7",
            },
        },
        "baseline": "the old code",
        "ours": {"rate": 12.5},
        "old": {"rate": 5},
        "speedup": 2.5,
        "errors": ["x", "y"],
        "tokens_per_s": 40,
        "sizes": {"small": {"s": 1.5}, "large": {"s": 3.0}},
        "ratios": {"small": 1.0},
        "passes": {"never_slower": True, "flat_memory": False},
        "note": "CPU only",
    }
    old = {"ours": {"rate": 1}, "old": {"rate": 1}, "speedup": 1, "errors": [], "sizes": [], "cpus": 2}
    other = {"benchmark": "something new", "baseline": "nothing"}
    root = _checkout(tmp_path, {"speed.json": speed, "speed-fast.json": old, "zzz.json": other})
    page = render(root, (SPEED,))
    assert "Speed benchmark: how fast `thing` goes on two lines." in page and "More detail" not in page
    assert "### `speed.json`" in page and "### `speed-fast.json`" in page  # two files: a heading each
    assert "Results: [speed.json](../benchmarks/results/speed.json): items per second." in page
    assert (
        "**Run:** 2026-01-02 03:04:05 UTC at commit `0123456789ab` with uncommitted changes; "
        "`python -m benchmarks.speed`." in page
    )
    assert "**Machine:** 8 CPUs; 31.3 GiB memory; GPU: NVIDIA H100 80GB HBM3, 81559 MiB; Python 3.11.7." in page
    assert "**Baseline** (measured in the same run): the old code." in page
    assert "| items/s against the old code | 12.5 | 5 | 2.5× |" in page
    assert "| errors found | 2 | — | — |" in page
    assert page.count("| tokens/s (kinds of run that have it) | 40 | — | — |") == 1  # only speed.json has it
    assert "| small | 1.5 | 1× |" in page and "| large | 3 | — |" in page  # a missing cell is a dash
    assert "Checks: never_slower ✓, flat_memory ✗ FAILED" in page
    assert "> CPU only" in page
    # a result written before runs were recorded says so, and names the catalog's command
    assert (
        "**Run:** date and commit not recorded (written before `benchmarks/record.py`); "
        "`python -m benchmarks.speed --fast`." in page
    )
    assert "**Machine:** 2 CPUs." in page and "none named in the results" in page
    # a results file no benchmark claims is still shown
    assert "## Results no benchmark claims" in page and "### `zzz.json`" in page and "something new" in page


def test_a_benchmark_without_results_says_how_to_run_it(tmp_path):
    root = _checkout(
        tmp_path, {"speed.json": {"ours": {"rate": 2}, "old": {"rate": 1}, "speedup": 2, "errors": [], "sizes": {}}}
    )
    page = render(root, (SPEED,))
    assert "Not run yet: `python -m benchmarks.speed --fast` writes `speed-fast.json`." in page
    assert "### `speed.json`" not in page  # one file: no heading of its own


def test_a_results_file_missing_a_catalog_path_fails_naming_both(tmp_path):
    root = _checkout(
        tmp_path, {"speed.json": {"ours": {"rate": 2}, "old": {}, "speedup": 2, "errors": [], "sizes": {}}}
    )
    with pytest.raises(ReportError, match=r"speed\.json: no 'old/rate' in the results"):
        render(root, (SPEED,))


def test_results_are_written_with_the_facts_of_their_run(tmp_path):
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    out = write_results(tmp_path / "x.json", {"value": 1, "benchmark": "b", "out": f"{ROOT}/benchmarks/results/x.json"})
    data = json.loads(out.read_text())
    assert list(data) == ["benchmark", "run", "value", "out"]  # what it measures, then where and when
    assert data["out"] == "benchmarks/results/x.json"  # no machine path in a committed result
    run = data["run"]
    when = dt.datetime.strptime(run["date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    assert before <= when <= dt.datetime.now(dt.UTC)
    assert run["machine"]["cpus"] == os.cpu_count()
    assert run["machine"]["python"] == platform.python_version()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert run["commit"].rstrip("+") == head.stdout.strip()
    assert run["command"].startswith("python ")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # written atomically, nothing left beside it
