"""Acquire one (release, shard) partition: carry over, skip what is done, fetch the rest.

Work is never lost or repeated:

* every stored article is keyed by :func:`~pipelines.acquire.inventory.listing_fingerprint` of the
  listing it was fetched for (``raw_manifest.fingerprint``), and looked up where every stage looks
  (:func:`~pipelines.core.stage.reuse_releases`: the previous release, then this partition, whose
  rows win);
* an article already complete in this partition with the listing's key (an earlier run) is kept
  as is — no request;
* an article stored by the previous release with the listing's key (unchanged since) is *carried*:
  its manifest and file index rows point at the previous release's tar — no request, no copy;
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

from pipelines.acquire.inventory import listing_fingerprint
from pipelines.acquire.layouts import StagedArticle
from pipelines.acquire.source import PmcSource
from pipelines.core.lake import Lake
from pipelines.core.rawstore import verify_raw, write_part
from pipelines.core.stage import Partition, Progress, reuse_releases
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
        "fingerprint": listing_fingerprint(record),
    }
    row.update(extra)
    return row


def _stored_key(row: dict, listed: dict | None) -> str | None:
    """The key a stored article is reused by: its ``fingerprint``; None for an error (fetched
    again). A row written before the key was stored gets it from the listing of its own release
    (``listed``), which it was fetched or carried for, when that lists the same version."""
    if row["status"] not in DONE:
        return None
    if row["fingerprint"]:
        return row["fingerprint"]
    if listed and listed["version"] == row["version"] and not listed["retracted"] and not listed["error"]:
        return listing_fingerprint(listed)
    return None


def stored_articles(
    lake: Lake, release: str, shard: str, inventory: list[dict]
) -> dict[str, tuple[str, dict, list[dict]]]:
    """key: (release, manifest row, file rows) of every article stored where every stage looks
    for results to reuse (the previous release, then this partition: a later one wins), with the
    same key as the listing (:func:`_stored_key`). ``inventory`` is this release's listing."""
    found: dict[str, tuple[str, dict, list[dict]]] = {}
    for source in reuse_releases(lake, ("raw_manifest", "raw_files"), Partition(release, shard)):
        rows = _rows(lake.read_table("raw_manifest", source, shard))
        listed: dict[str, dict] = {}
        if any(not r["fingerprint"] for r in rows):  # a lake written before the key was stored
            listing = inventory if source == release else _rows(lake.read_table("inventory", source, shard))
            listed = {r["pmcid"]: r for r in listing}
        files = _by_pmcid(_rows(lake.read_table("raw_files", source, shard)))
        for row in rows:
            if key := _stored_key(row, listed.get(row["pmcid"])):
                found[key] = (source, row, files.get(row["pmcid"], []))
    return found


def acquire_shard(
    lake: Lake,
    source: PmcSource,
    release: str,
    shard: str,
    inventory: list[dict],
    concurrency: int = 4,
) -> ShardResult:
    """Bring the raw layer of (``release``, ``shard``) up to date with ``inventory``.

    Raises :class:`SourceUnavailableError` when the source cannot be reached: the tables are
    left as they were and the articles fetched so far stay staged, so the rerun does not fetch
    them again.
    """
    stored = stored_articles(lake, release, shard, inventory)

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
        key = listing_fingerprint(record)
        if key not in stored:
            to_fetch.append(record)
            continue
        stored_in, row, files[pmcid] = stored[key]
        if stored_in == release:
            manifest[pmcid] = {**row, "fingerprint": key}
            trusted[pmcid] = (record, "already_done")
        else:
            manifest[pmcid] = {
                **row,
                "status": "carried",
                "warning": record.get("warning"),
                "fetched_in_release": row["fetched_in_release"] or stored_in,
                "fingerprint": key,
            }
            trusted[pmcid] = (record, "carried")

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
        referenced = {f["tar_path"] for rows_ in files.values() for f in rows_}  # and the tars this partition named
        for batch in lake.iter_batches("raw_files", release, shard, columns=["tar_path"]):
            referenced.update(batch["tar_path"].to_pylist())
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
