"""Acquire one (release, shard) partition: carry over, skip what is done, fetch the rest.

Work is never lost or repeated:

* an article already complete in this partition (an earlier run) is kept as is — no request;
* an article unchanged since the previous release is *carried*: its manifest and file index
  rows point at the previous release's tar — no request, no copy;
* both are trusted only after :func:`verify_raw` finds their tar and bytes as recorded; an
  article whose tar vanished or whose bytes changed is fetched again (only that article);
* every other article is fetched into the partition's staging directory (kept across runs,
  so interrupted transfers resume and completed ones are not fetched again), then all newly
  fetched articles are appended as one immutable tar and the tables are rewritten atomically.

One article's failure is recorded in its manifest row and never stops the partition. An
unavailable source (:class:`SourceUnavailableError`) is no article's failure: it is raised,
the run fails with nothing written, and what was already staged is kept for the rerun.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipelines.acquire.layouts import StagedArticle
from pipelines.acquire.source import PmcSource
from pipelines.core.lake import Lake
from pipelines.core.rawstore import verify_raw, write_part
from pipelines.core.stage import Progress
from pipelines.net.retry import PermanentError, SourceUnavailableError

log = logging.getLogger(__name__)
DONE = ("ok", "carried")


@dataclass
class ShardResult:
    manifest: list[dict] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    requests: int = 0
    bytes_fetched: int = 0
    new_tar: str | None = None


def _rows(table) -> list[dict]:
    return table.to_pylist() if table is not None else []


def _by_pmcid(rows: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for row in rows:
        grouped.setdefault(row["pmcid"], []).append(row)
    return grouped


def _manifest_row(record: dict, status: str, **extra) -> dict:
    row = {
        "pmcid": record["pmcid"],
        "version": record["version"],
        "source": record["source"],
        "status": status,
        "error": None,
        "warning": record.get("warning"),
        "n_files": 0,
        "bytes": 0,
        "files": [],
        "md5": [],
        "dropped": [],
        "fetched_in_release": None,
    }
    row.update(extra)
    return row


def acquire_shard(
    lake: Lake,
    source: PmcSource,
    release: str,
    shard: str,
    inventory: list[dict],
    previous_release: str | None,
    concurrency: int = 4,
) -> ShardResult:
    """Bring the raw layer of (``release``, ``shard``) up to date with ``inventory``.

    Raises :class:`SourceUnavailableError` when the source cannot be reached: the tables are
    left as they were and the articles fetched so far stay staged, so the rerun does not fetch
    them again.
    """
    existing = {r["pmcid"]: r for r in _rows(lake.read_table("raw_manifest", release, shard))}
    existing_files = _by_pmcid(_rows(lake.read_table("raw_files", release, shard)))
    prev_manifest: dict[str, dict] = {}
    prev_files: dict[str, list[dict]] = {}
    if previous_release:
        prev_manifest = {r["pmcid"]: r for r in _rows(lake.read_table("raw_manifest", previous_release, shard))}
        prev_files = _by_pmcid(_rows(lake.read_table("raw_files", previous_release, shard)))

    result = ShardResult()
    manifest: dict[str, dict] = {}
    files: dict[str, list[dict]] = {}
    to_fetch: list[dict] = []
    trusted: dict[str, tuple[dict, str]] = {}  # pmcid -> (inventory row, "already_done" | "carried")
    for record in sorted(inventory, key=lambda r: r["pmcid"]):
        pmcid = record["pmcid"]
        if record["retracted"]:
            result.counts["retracted_skipped"] += 1
            continue
        if record["error"]:
            manifest[pmcid] = _manifest_row(record, "error", error=record["error"])
            continue
        done = existing.get(pmcid)
        if done and done["status"] in DONE and done["version"] == record["version"]:
            manifest[pmcid], files[pmcid] = done, existing_files.get(pmcid, [])
            trusted[pmcid] = (record, "already_done")
            continue
        prev = prev_manifest.get(pmcid)
        if record["change"] == "unchanged" and prev and prev["status"] in DONE:
            manifest[pmcid] = {
                **prev,
                "status": "carried",
                "warning": record.get("warning"),
                "fetched_in_release": prev["fetched_in_release"] or previous_release,
            }
            files[pmcid] = prev_files.get(pmcid, [])
            trusted[pmcid] = (record, "carried")
            continue
        to_fetch.append(record)

    # Trust nothing unchecked: a deleted or damaged tar sends its articles back to be fetched.
    check = verify_raw(lake, [manifest[p] for p in trusted], [f for p in trusted for f in files[p]])
    for pmcid in sorted(check.bad_pmcids):
        log.warning("%s: raw files missing or damaged in the lake; fetching again", pmcid)
        del manifest[pmcid], files[pmcid]
        to_fetch.append(trusted.pop(pmcid)[0])
        result.counts["repaired"] += 1
    to_fetch.sort(key=lambda r: r["pmcid"])
    result.counts.update(kind for _, kind in trusted.values())

    staging = lake.staging_dir(release, shard)
    requests_before, bytes_before = source.requests, source.bytes

    outages: list[SourceUnavailableError] = []

    def fetch(record: dict) -> tuple[dict, StagedArticle | None, str | None]:
        directory = staging / (f"{record['pmcid']}.{record['version']}" if record["version"] else record["pmcid"])
        staged = StagedArticle.load(directory)
        if staged is not None:
            return record, staged, None
        if outages:  # the source is down: asking again per article would only wait out retries
            return record, None, None
        try:
            return record, source.fetch(record, staging), None
        except SourceUnavailableError as exc:
            outages.append(exc)
            return record, None, None
        except PermanentError as exc:
            return record, None, str(exc)
        except Exception as exc:  # noqa: BLE001 - one article's surprise must not stop the shard
            log.exception("unexpected failure fetching %s", record["pmcid"])
            return record, None, f"unexpected {type(exc).__name__}: {exc}"

    progress = Progress(f"download {release}|{shard}", len(to_fetch), "articles")

    def fetch_counted(record: dict) -> tuple[dict, StagedArticle | None, str | None]:
        outcome = fetch(record)
        progress.advance(1, **({"failed": 1} if outcome[2] else {"staged": 1} if outcome[1] else {}))
        return outcome

    fetched: list[tuple[dict, StagedArticle]] = []
    with progress.heartbeat(), ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        outcomes = list(pool.map(fetch_counted, to_fetch))
    if outages:
        staged_count = sum(1 for _, staged, _ in outcomes if staged is not None)
        log.warning("%s; %d of %d articles staged for the rerun", outages[0], staged_count, len(to_fetch))
        raise outages[0]
    for record, staged, error in outcomes:
        if error:
            manifest[record["pmcid"]] = _manifest_row(record, "error", error=error)
            result.counts["error"] += 1
        elif not any(kind == "xml" for _, kind in staged.files):
            manifest[record["pmcid"]] = _manifest_row(record, "error", error="package has no article XML")
            result.counts["error"] += 1
        else:
            fetched.append((record, staged))

    if fetched:
        referenced = {f["tar_path"] for rows_ in (*existing_files.values(), *files.values()) for f in rows_}
        rows = write_part(lake, release, shard, fetched, referenced)
        result.new_tar = rows[0]["tar_path"] if rows else None
        new_files = _by_pmcid(rows)
        for record, staged in fetched:
            pmcid = record["pmcid"]
            files[pmcid] = sorted(new_files.get(pmcid, []), key=lambda f: f["name"])
            manifest[pmcid] = _manifest_row(
                record,
                "ok",
                n_files=len(files[pmcid]),
                bytes=sum(f["size"] for f in files[pmcid]),
                files=[f["name"] for f in files[pmcid]],
                md5=[f["md5"] for f in files[pmcid]],
                dropped=staged.dropped,
                fetched_in_release=release,
            )
            result.counts["fetched"] += 1

    result.manifest = [manifest[p] for p in sorted(manifest)]
    result.files = sorted((f for p in sorted(files) for f in files[p]), key=lambda f: (f["pmcid"], f["name"]))
    with lake.commit("pmc_raw_articles", release, shard) as commit:  # the manifest and its files' index together
        commit.write_table("raw_files", result.files)
        commit.write_table("raw_manifest", result.manifest)
    for _, staged in fetched:
        shutil.rmtree(staged.directory, ignore_errors=True)
    result.requests = source.requests - requests_before
    result.bytes_fetched = source.bytes - bytes_before
    result.counts["ok"] = sum(1 for r in result.manifest if r["status"] == "ok")
    return result
