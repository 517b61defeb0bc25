"""``docs/benchmarks.md``, generated from ``benchmarks/results/*.json``: never hand-copied numbers.

One section per benchmark of :mod:`benchmarks.catalog`: what it measures (the first paragraph of
the module's docstring, read without importing it), its baseline as the results name it, the
headline numbers and ratios the catalog points at, and the run's date, commit, command and
machine as :mod:`benchmarks.record` wrote them. Results written before ``run`` was recorded say
so. A results file no entry claims is still shown, at the end, so none is silently left out.

    python -m benchmarks.report            # (re)write docs/benchmarks.md; `make bench` ends with it
    python -m benchmarks.report --check    # exit 1 when the page is not what the results give
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.catalog import BENCHMARKS, Benchmark, Col, Row, Table
from benchmarks.record import ROOT

PAGE = ROOT / "docs" / "benchmarks.md"
DASH = "—"


class ReportError(ValueError):
    """A catalog path that the results do not have (the benchmark's output changed shape)."""


def lookup(data: Any, path: str, *, key: str | None = None, root: Any = None) -> Any:
    """The value at ``path`` ("a/b/0/c") in ``data``.

    ``{key}`` is replaced by ``key`` (a table's row), ``{name}`` by the top-level value ``name`` of
    ``root``; a final ``#count`` is the length of the list before it. Raises ``KeyError`` naming
    the first missing part.
    """
    root = data if root is None else root
    if path.startswith("/"):
        data, path = root, path[1:]

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name == "key":
            if key is None:
                raise KeyError("{key} outside a table")
            return key
        return str(lookup(root, name))

    parts = re.sub(r"\{(\w+)\}", fill, path).split("/")
    value = data
    for i, part in enumerate(parts):
        if part == "#count" and i == len(parts) - 1 and isinstance(value, list | dict):
            return len(value)
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and re.fullmatch(r"-?\d+", part) and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError("/".join(parts[: i + 1]))
    return value


def fmt(value: Any, *, ratio: bool = False) -> str:
    """A number as a reader wants it: thousands grouped, four significant digits, ratios with ×."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    elif isinstance(value, list | dict):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    if ratio and isinstance(value, int | float):
        text += "×"
    return text.replace("|", "\\|").replace("\n", " ")


def summary(module: str, root: Path = ROOT) -> str:
    """The first paragraph of ``benchmarks/<module>.py``'s docstring, as Markdown (no import)."""
    source = (root / "benchmarks" / f"{module}.py").read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source)) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split()).replace("``", "`")


def _get(data: dict, path: str | None, where: str, **kw) -> Any:
    if path is None:
        return None
    try:
        return lookup(data, path, **kw)
    except KeyError as missing:
        raise ReportError(f"{where}: no {missing.args[0]!r} in the results (catalog path {path!r})") from None


def _cell(data: dict, item: Any, col: Col, key: str) -> str:
    try:
        value = lookup(item, col.path, key=key, root=data)
    except KeyError:
        return DASH  # tables span entries of several shapes: a method without mAP, a kind without tips
    return fmt(value, ratio=col.ratio)


def _has(data: dict, row: Row) -> bool:
    try:
        for path in (row.value, row.against, row.ratio):
            if path is not None:
                lookup(data, path)
    except KeyError:
        return False
    return True


def _rows(data: dict, rows: tuple[Row, ...], where: str) -> list[str]:
    rows = tuple(r for r in rows if not r.optional or _has(data, r))
    if not rows:
        return []
    lines = ["| | measured | against | ratio |", "|---|---|---|---|"]
    for row in rows:
        value, against, ratio = (_get(data, p, where) for p in (row.value, row.against, row.ratio))
        lines.append(f"| {row.measure} | {fmt(value)} | {fmt(against)} | {fmt(ratio, ratio=True)} |")
    return [*lines, ""]


def _table(data: dict, table: Table, where: str) -> list[str]:
    container = _get(data, table.over, where)
    if isinstance(container, dict):
        items = [(str(k), v) for k, v in container.items()]
    elif isinstance(container, list):
        items = [(str(i), v) for i, v in enumerate(container)]
    else:
        raise ReportError(f"{where}: {table.over!r} is neither a dict nor a list")
    lines = [
        f"{table.title}:",
        "",
        "| " + " | ".join([table.key_header, *(c.header for c in table.columns)]) + " |",
        "|" + "---|" * (len(table.columns) + 1),
    ]
    for key, item in items:
        label = fmt(_get(item, table.label, where)) if table.label else fmt(key)
        lines.append("| " + " | ".join([label, *(_cell(data, item, c, key) for c in table.columns)]) + " |")
    return [*lines, ""]


def _machine(data: dict) -> str:
    """The machine as ``run`` records it, else from what older results kept (cpus, python, ...)."""
    facts = (data.get("run") or {}).get("machine")
    if facts is None:
        facts = {}
        legacy = [data.get("machine"), data.get("setup"), data]
        for source in legacy:
            if isinstance(source, dict):
                for name in ("cpus", "python", "torch", "gpu", "device", "load_average_1_5_15_at_end"):
                    if name in source and not isinstance(source[name], dict):
                        facts.setdefault(name, source[name])
        if isinstance(data.get("machine"), str):
            facts["os"] = data["machine"]
        if "gpu" in facts:  # older results: false/null (none), or the device name
            gpu = facts.pop("gpu")
            facts["gpus"] = [gpu] if isinstance(gpu, str) else []
    parts = []
    if facts.get("cpus"):
        parts.append(f"{facts['cpus']} CPUs" + (f" ({facts['cpu_model']})" if facts.get("cpu_model") else ""))
    if facts.get("memory_gib"):
        parts.append(f"{fmt(facts['memory_gib'])} GiB memory")
    if "gpus" in facts:
        parts.append("GPU: " + ", ".join(facts["gpus"]) if facts["gpus"] else "no GPU")
    if facts.get("device"):
        parts.append(f"device {facts['device']}")
    for name, label in (("python", "Python"), ("torch", "torch"), ("os", "")):
        if facts.get(name):
            parts.append(f"{label} {facts[name]}".strip())
    if facts.get("load_average_1_5_15_at_end"):
        parts.append("load average at the end " + ", ".join(fmt(x) for x in facts["load_average_1_5_15_at_end"]))
    return "; ".join(parts) if parts else "not recorded"


def _run_line(data: dict, command: str) -> str:
    run = data.get("run")
    if not run:
        return f"**Run:** date and commit not recorded (written before `benchmarks/record.py`); `{command}`."
    date = run.get("date", "").replace("T", " ").replace("Z", " UTC") or "date not recorded"
    commit = run.get("commit")
    at = ""
    if commit:
        at = f" at commit `{commit.rstrip('+')}`" + (" with uncommitted changes" if commit.endswith("+") else "")
    return f"**Run:** {date}{at}; `{run.get('command') or command}`."


def _file_section(bench: Benchmark, path: Path, command: str, heading: bool) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    where = path.name
    link = f"../benchmarks/results/{path.name}"
    lines = [f"### `{path.name}`", ""] if heading else []
    measured = f": {fmt(data['benchmark'])}" if data.get("benchmark") else ""
    lines += [f"Results: [{path.name}]({link}){measured}.", ""]
    lines += [_run_line(data, command), "", f"**Machine:** {_machine(data)}.", ""]
    baseline = data.get(bench.baseline)
    if not isinstance(baseline, str):
        baseline = bench.baseline_text
    lines += [f"**Baseline** (measured in the same run): {baseline or 'none named in the results'}.", ""]
    lines += _rows(data, bench.rows, where)
    for table in bench.tables:
        lines += _table(data, table, where)
    passes = data.get("passes")
    if isinstance(passes, dict) and passes:
        lines += ["Checks: " + ", ".join(f"{name} {'✓' if ok else '✗ FAILED'}" for name, ok in passes.items()), ""]
    for note in bench.notes:
        try:
            text = lookup(data, note)
        except KeyError:
            continue
        lines += [f"> {fmt(text)}", ""]
    return lines


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render(root: Path = ROOT, benchmarks: tuple[Benchmark, ...] = BENCHMARKS) -> str:
    """The page for the checkout at ``root``: its ``benchmarks/results/*.json``, linked from ``docs/``."""
    results = root / "benchmarks" / "results"
    files = sorted(results.glob("*.json"))
    claimed: set[Path] = set()
    toc, body = [], []
    for bench in benchmarks:
        how = "`make gpu-check` (needs a CUDA GPU)" if bench.gpu else "`make bench`"
        toc.append(f"- [{bench.title}](#{anchor(bench.title)}): `benchmarks/{bench.module}.py`")
        body += [f"## {bench.title}", "", summary(bench.module, root), ""]
        body += [f"[`benchmarks/{bench.module}.py`](../benchmarks/{bench.module}.py), run by {how}.", ""]
        matched = [(run, p) for run in bench.runs for p in files if fnmatch.fnmatch(p.name, run.results)]
        for run in bench.runs:
            if not any(r is run for r, _ in matched):
                body += [f"Not run yet: `{run.command}` writes `{run.results}`.", ""]
        for run, path in matched:
            claimed.add(path)
            body += _file_section(bench, path, run.command, heading=len(matched) > 1)
    others = [p for p in files if p not in claimed]
    if others:
        toc.append("- [Results no benchmark claims](#results-no-benchmark-claims)")
        body += ["## Results no benchmark claims", "", "Add an entry to `benchmarks/catalog.py` for each.", ""]
        generic = Benchmark(module="", title="", runs=())
        for path in others:
            body += _file_section(generic, path, "unknown command", heading=True)
    head = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m benchmarks.report` from benchmarks/results/*.json: do not edit. -->",
        "",
        "Generated from `benchmarks/results/*.json` by `python -m benchmarks.report`; the numbers are never "
        "copied by hand (`tests/test_benchmark_report.py` fails when this page and the results disagree). "
        "`make bench` runs every CPU benchmark and regenerates the page; `make gpu-check` runs the GPU ones.",
        "",
        "Each benchmark measures a named baseline in the same run, so its ratios carry over to other machines; "
        "its absolute numbers (per second, seconds, MB) are those of the machine named under it, often a "
        "shared 2-core machine. Every number here is in the results file linked beside it, with the rest of "
        "what the run measured.",
        "",
        *toc,
        "",
    ]
    return "\n".join(head + body).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the results")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(
                f"{PAGE.relative_to(ROOT)} is not what the results give: run python -m benchmarks.report",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
