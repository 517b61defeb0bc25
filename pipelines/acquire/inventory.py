"""The inventory of a release and its diff against the previous release."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from pipelines.acquire.files import KEEP_VERSION
from pipelines.acquire.source import PmcSource
from pipelines.core.fingerprints import fingerprint
from pipelines.core.partitioning import shard_of


@dataclass
class InventoryResult:
    rows_by_shard: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    changes_by_shard: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    problems: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def listing_fingerprint(row: dict) -> str:
    """The key of an article's remote package as the source lists it (an ``inventory`` row or
    record): its version, last update and file paths, with the rules of what is kept of it
    (:data:`KEEP_VERSION`). The same key is the same package: the inventory calls the article
    unchanged, and acquisition reuses the files it stored under that key instead of fetching
    them (``raw_manifest.fingerprint``). A timestamp counts to the second, as the table keeps it."""
    updated = row["last_updated"]
    return fingerprint(
        {
            "pmcid": row["pmcid"],
            "version": row["version"],
            "last_updated": int(updated.timestamp()) if updated is not None else None,
            "source_paths": list(row["source_paths"] or []),
            "kept": KEEP_VERSION,
        }
    )


def _same_content(old: dict, new: dict) -> bool:
    return listing_fingerprint(old) == listing_fingerprint(new) and not old["retracted"]


def build_inventory(
    source: PmcSource, previous_rows: list[dict], previous_release: str | None, n_shards: int
) -> InventoryResult:
    """List ``source`` and classify every article as added, changed, unchanged or retracted;
    articles of ``previous_rows`` that are no longer listed are reported as removed.

    An unreachable source raises :class:`~pipelines.net.retry.SourceUnavailableError`
    (from the transport) rather than giving an empty or partial inventory."""
    previous = {row["pmcid"]: row for row in previous_rows}
    records, problems = source.inventory(previous)
    result = InventoryResult(problems=[p.__dict__ for p in problems])
    seen: set[str] = set()
    for record in sorted(records, key=lambda r: r.pmcid):
        if record.pmcid in seen:
            result.problems.append({"location": "listing", "raw": record.pmcid, "error": "listed twice; first kept"})
            continue
        seen.add(record.pmcid)
        old = previous.get(record.pmcid)
        if record.retracted:
            change = "retracted"
        elif old is None:
            change = "added"
        elif _same_content(old, record.__dict__):
            change = "unchanged"
        else:
            change = "changed"
        shard = shard_of(record.pmcid, n_shards)
        result.rows_by_shard[shard].append(record.row(change))
        result.counts[change] += 1
        if change != "unchanged":
            result.changes_by_shard[shard].append(
                {
                    "pmcid": record.pmcid,
                    "change": change,
                    "previous_release": previous_release if old else None,
                    "previous_version": old["version"] if old else None,
                    "version": record.version,
                    "reason": "retracted in the source listing" if change == "retracted" else None,
                }
            )
    for pmcid in sorted(set(previous) - seen):
        result.counts["removed"] += 1
        result.changes_by_shard[shard_of(pmcid, n_shards)].append(
            {
                "pmcid": pmcid,
                "change": "removed",
                "previous_release": previous_release,
                "previous_version": previous[pmcid]["version"],
                "version": None,
                "reason": "no longer listed in the OA subset",
            }
        )
    result.counts["problems"] = len(result.problems)
    return result
