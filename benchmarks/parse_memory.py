"""Parse memory benchmark: peak RSS of one shard's parse as the shard grows, streaming vs in memory.

The bundled sample (38 articles, their images) is acquired once into a temporary lake; the
benchmark shards then hold 1x, 4x, 16x and 64x copies of its articles under new PMCIDs (their
``raw_files`` rows point at the same tar members, so every copy is read, parsed and its images
decoded like a real article). Each measurement runs in a fresh subprocess and reports its own
peak RSS (``ru_maxrss``) and the RSS before parsing (interpreter and imports):

* ``streaming``: :func:`pipelines.parse.shard.parse_shard`, rows streamed to Parquet in batches;
* ``in_memory`` (baseline, in the same run): :func:`parse_shard_in_memory`, the previous code,
  which built the four tables as lists of rows and then wrote them.

Both parse each shard from scratch (``parse``) and then carry every article of it over into a
next release (``carry``: previous rows copied, nothing parsed). Memory is flat when the peak at
64x is the peak at 1x; the in-memory baseline grows with the shard. About 4 minutes on 2 cores.

    python -m benchmarks.parse_memory [--copies 1 4 16 64]

Writes ``benchmarks/results/parse_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.record import write_results

RESULTS = Path(__file__).parent / "results" / "parse_memory.json"
RELEASE = "2026"
PARSE_TABLES = ("articles", "figures", "mentions", "other_graphics")


# ---- the baseline: the previous parse_shard, whole tables in memory -----------------------------
def parse_shard_in_memory(lake, release: str, shard: str, previous_release: str | None) -> dict[str, int]:
    """The parse step before streaming (PanelForge ca0ff67^): every row of the four tables in
    lists, previous partitions read whole for carry-over, images read whole, then written."""
    from pipelines.core.rawstore import read_raw_file
    from pipelines.core.schemas import ARTICLES
    from pipelines.images.info import image_info
    from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article

    def error_row(pmcid: str, error: str) -> dict:
        row = {name: None for name in ARTICLES.names}
        row.update(pmcid=pmcid, keywords=[], subjects=[], parse_status="error", parse_error=error)
        return row  # fingerprint None: the baseline keeps no reuse key

    manifest = lake.read_table("raw_manifest", release, shard)
    files_by_article: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in lake.read_table("raw_files", release, shard).to_pylist():
        files_by_article[row["pmcid"]][row["name"]] = row
    previous: dict[str, dict[str, list[dict]]] = {t: defaultdict(list) for t in PARSE_TABLES}
    if previous_release:
        for table in PARSE_TABLES:
            old = lake.read_table(table, previous_release, shard)
            for row in old.to_pylist() if old is not None else []:
                previous[table][row["pmcid"]].append(row)
    tables: dict[str, list[dict]] = {t: [] for t in PARSE_TABLES}
    for article in manifest.to_pylist():
        pmcid = article["pmcid"]
        if article["status"] not in ("ok", "carried"):
            continue
        old_article = previous["articles"].get(pmcid)
        if article["status"] == "carried" and old_article and old_article[0]["parse_status"] == "ok":
            for table in PARSE_TABLES:
                tables[table].extend(previous[table].get(pmcid, []))
            continue
        files = files_by_article[pmcid]
        xml_rows = [f for f in files.values() if f["kind"] == "xml"]
        images = sorted(n for n, f in files.items() if f["kind"] == "image")
        try:
            parsed = parse_article(read_raw_file(lake, xml_rows[0]), pmcid=pmcid, files=images)
        except (UnsafeXmlError, XmlParseError, IndexError) as exc:
            tables["articles"].append(error_row(pmcid, str(exc)))
            continue
        for fig in parsed.figures:
            info = [image_info(read_raw_file(lake, files[name])) for name in fig["image_files"]]
            fig.update(
                widths=[i["width"] for i in info],
                heights=[i["height"] for i in info],
                sha256=[files[name]["sha256"] for name in fig["image_files"]],
                phash=[i["phash"] for i in info],
                image_errors=[i["error"] for i in info],
            )
        tables["articles"].append({**parsed.article, "parse_status": "ok", "parse_error": None, "fingerprint": None})
        tables["figures"].extend(parsed.figures)
        tables["mentions"].extend(parsed.mentions)
        tables["other_graphics"].extend(parsed.other_graphics)
    for table in PARSE_TABLES:
        lake.write_table(table, release, shard, tables[table])
    return {"articles": len(tables["articles"]), "figures": len(tables["figures"])}


def streaming(lake, release: str, shard: str, previous_release: str | None) -> dict[str, int]:
    from pipelines.parse.shard import parse_shard

    result = parse_shard(lake, release, shard)  # finds the previous release's rows itself
    return {"articles": result.articles, "figures": result.figures}


VARIANTS = {"streaming": streaming, "in_memory": parse_shard_in_memory}


# ---- inputs ---------------------------------------------------------------------------------------
def build_sample_lake(root: Path):
    """The sample acquired into ``root/lake`` (release 2026, 4 shards), as the pipeline does it."""
    from testing.pipeline import sample_lake

    return sample_lake(root, RELEASE, parse=False)


def replicate(lake, copies: int, release: str, status: str) -> int:
    """Write shard ``000`` of ``release``: ``copies`` copies of every sample article under new
    PMCIDs, pointing at the sample's tar members. Returns the number of articles. The PMCIDs
    depend on ``copies``, so a shard of another size holds none of them (parsing reuses an
    article's rows from any earlier release with the same PMCID and bytes)."""
    manifest = lake.read_release("raw_manifest", RELEASE).to_pylist()
    files = lake.read_release("raw_files", RELEASE).to_pylist()
    manifest_rows, file_rows = [], []
    for copy in range(copies):
        for index, article in enumerate(manifest):
            new = f"PMC{90_000_000 + copies * 100_000 + copy * 1000 + index}"
            manifest_rows.append({**article, "pmcid": new, "status": status})
            file_rows += [{**f, "pmcid": new} for f in files if f["pmcid"] == article["pmcid"]]
    lake.write_table("raw_manifest", release, "000", manifest_rows)
    lake.write_table("raw_files", release, "000", file_rows)
    return len(manifest_rows)


# ---- one measurement per subprocess ----------------------------------------------------------------
def child(variant: str, root: str, release: str, previous: str | None) -> None:
    import warnings

    from pipelines.core.lake import Lake
    from pipelines.parse import images, nxml, shard  # noqa: F401 - imported before the baseline RSS

    warnings.simplefilter("ignore")
    lake = Lake(root)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    counts = VARIANTS[variant](lake, release, "000", previous)
    cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({**counts, "cpu_s": round(cpu, 2), "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024}))


def measure(variant: str, root: str, release: str, previous: str | None) -> dict:
    args = [sys.executable, "-m", "benchmarks.parse_memory", "--child", variant, root, release, previous or ""]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = round(result["peak_rss_mb"], 1)
    result["parse_increment_mb"] = round(result["peak_rss_mb"] - result.pop("rss_before_mb"), 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--child", nargs=4, metavar=("VARIANT", "ROOT", "RELEASE", "PREVIOUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, root, release, previous = args.child
        child(variant, root, release, previous or None)
        return
    from pipelines.parse.shard import ParseLimits

    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="parse-memory-") as tmp:
        lake = build_sample_lake(Path(tmp))
        for copies in args.copies:
            parsed, carried = f"x{copies}", f"x{copies}c"
            n = replicate(lake, copies, parsed, "ok")
            replicate(lake, copies, carried, "carried")
            row = {"copies": copies, "articles_per_shard": n}
            for variant in VARIANTS:  # the baseline last, so both carry the rows streaming wrote
                row[f"parse_{variant}"] = measure(variant, lake.root, parsed, None)
                row[f"carry_{variant}"] = measure(variant, lake.root, carried, parsed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    first, last = rows[0], rows[-1]

    def ratio(key: str, field: str = "peak_rss_mb") -> float:
        return round(last[key][field] / first[key][field], 2)

    limits = ParseLimits()
    result = {
        "benchmark": "peak RSS of parsing one shard as it grows (sample articles replicated), one process each",
        "baseline": "parse_shard_in_memory: the previous parse_shard (all four tables in lists, then written)",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "limits": {k: getattr(limits, k) for k in limits.__dataclass_fields__},
        "runs": rows,
        "peak_ratio_largest_to_smallest": {
            f"{phase}_{variant}": ratio(f"{phase}_{variant}") for phase in ("parse", "carry") for variant in VARIANTS
        },
        f"in_memory_over_streaming_peak_at_{last['copies']}x": {
            phase: round(last[f"{phase}_in_memory"]["peak_rss_mb"] / last[f"{phase}_streaming"]["peak_rss_mb"], 2)
            for phase in ("parse", "carry")
        },
        "streaming_cpu_over_in_memory_cpu_parse": round(
            sum(r["parse_streaming"]["cpu_s"] for r in rows) / sum(r["parse_in_memory"]["cpu_s"] for r in rows), 2
        ),
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
