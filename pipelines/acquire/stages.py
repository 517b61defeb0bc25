"""Acquisition stages: the inventory of a release, and the raw articles of each (release, shard)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pipelines.acquire.download import acquire_shard
from pipelines.acquire.inventory import build_inventory
from pipelines.acquire.source import PmcSource
from pipelines.core.lake import Lake
from pipelines.core.rawstore import verify_raw
from pipelines.core.schemas import Table
from pipelines.core.stage import RELEASE, Check, Compute, Partition, Preview, Stage, StageResult

POOL = "pmc_source"  # one concurrency pool for every stage that talks to the PMC source


@dataclass
class InventoryStage(Stage):
    """List the source and diff the release against the previous one; records the lake's
    shard count on first use and refuses another one later."""

    source: PmcSource
    n_shards: int

    name = "pmc_inventory"
    level = RELEASE
    reads = (Table.INVENTORY,)
    writes = (Table.INVENTORY, Table.RELEASE_CHANGES, Table.INVENTORY_ERRORS)
    compute = Compute(pool=POOL)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release = partition.release
        shards = lake.ensure_layout(self.n_shards)
        previous = lake.previous_release(Table.INVENTORY, release)
        previous_rows = lake.read_release(Table.INVENTORY, previous).to_pylist() if previous else []
        requests_before = self.source.requests
        inventory = build_inventory(self.source, previous_rows, previous, self.n_shards)
        with lake.commit(self.name, release) as commit:  # every shard's inventory at once
            for shard in shards:
                commit.write_table(Table.INVENTORY, inventory.rows_by_shard.get(shard, []), shard=shard)
                commit.write_table(Table.RELEASE_CHANGES, inventory.changes_by_shard.get(shard, []), shard=shard)
            commit.write_table(Table.INVENTORY_ERRORS, inventory.problems, shard="all")
        rows = [r for shard in sorted(inventory.rows_by_shard) for r in inventory.rows_by_shard[shard]]
        changes = [c for shard in sorted(inventory.changes_by_shard) for c in inventory.changes_by_shard[shard]]
        errors = [r for r in rows if r["error"]]
        groups = Counter(r["license_group"] for r in rows)
        result = self.result(
            partition,
            ok=len(rows) - len(errors),
            error=len(errors) + len(inventory.problems),
            counts={
                "articles": len(rows),
                "previous_release": previous or "none",
                **{f"change_{k}": v for k, v in sorted(inventory.counts.items())},
                **{f"license_{k}": v for k, v in sorted(groups.items())},
                "source_requests": self.source.requests - requests_before,
            },
            paths={"path": lake.path("tables", Table.INVENTORY, f"release={release}")},
            previews={
                "preview": Preview(rows, ["pmcid", "version", "pmid", "license_code", "license_group", "change"]),
                "changes": Preview(changes, ["pmcid", "change", "previous_release", "reason"], 50),
                "problems": Preview(inventory.problems, ["location", "error"], 50),
            },
        )
        result.add_errors(errors, "pmcid", "error")
        result.add_errors(inventory.problems, "location", "error")
        return result


@dataclass
class AcquireStage(Stage):
    """Fetch the new and changed articles of one (release, shard) into one tar, carry over the
    unchanged ones, and verify the raw layer the manifest points at."""

    source: PmcSource
    concurrency: int | None = None  # articles fetched at once; None: the source policy's

    name = "pmc_raw_articles"
    reads = (Table.INVENTORY, Table.RAW_MANIFEST, Table.RAW_FILES)
    writes = (Table.RAW_MANIFEST, Table.RAW_FILES)
    compute = Compute(pool=POOL)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        inventory = lake.require(Table.INVENTORY, release, shard)
        previous = lake.previous_release(Table.RAW_MANIFEST, release)
        shard_result = acquire_shard(
            lake,
            self.source,
            release,
            shard,
            inventory.to_pylist(),
            self.concurrency or self.source.concurrency,
        )
        manifest = shard_result.manifest
        errors = [r for r in manifest if r["status"] == "error"]
        counts = shard_result.counts
        skipped = counts.get("carried", 0) + counts.get("already_done", 0) + counts.get("retracted_skipped", 0)
        result = self.result(
            partition,
            ok=counts.get("fetched", 0),
            error=len(errors),
            skipped=skipped,
            carried=counts.get("carried", 0) + counts.get("already_done", 0),  # stored by an earlier run
            bytes=shard_result.bytes_fetched,
            counts={
                "articles": len(manifest),
                **{k: v for k, v in sorted(counts.items())},
                "errors": len(errors),
                "files": len(shard_result.files),
                "bytes_stored": sum(f["size"] for f in shard_result.files),
                "source_requests": shard_result.requests,
                "source_bytes": shard_result.bytes_fetched,
                "new_tar": shard_result.new_tar or "none (nothing fetched)",
                "previous_release": previous or "none",
            },
            paths={"manifest": lake.table_path(Table.RAW_MANIFEST, release, shard)},
            previews={"preview": Preview(manifest, ["pmcid", "status", "n_files", "bytes", "error"])},
            checks=[raw_consistency(lake, manifest, shard_result.files)],
        )
        result.add_errors(errors, "pmcid", "error")
        return result


def raw_consistency(lake: Lake, manifest: list[dict], files: list[dict]) -> Check:
    """Fails when an ok/carried article lacks a file, or a referenced tar is missing or holds
    other bytes than recorded (size, md5, sha256)."""
    found = verify_raw(lake, manifest, files)
    return Check(
        "raw_articles_consistent",
        passed=found.ok,
        description="Every downloaded or carried article has its XML, and every indexed file's bytes are in "
        "its tar with the recorded size, md5 and sha256.",
        metadata={
            "missing_xml": found.missing_xml[:50],
            "missing_files": found.missing_files[:50],
            "missing_tars": found.missing_tars[:50],
            "size_mismatches": found.size_mismatches[:50],
            "checksum_mismatches": found.checksum_mismatches[:50],
            "files_checked": found.files_checked,
            "bytes_checked": found.bytes_checked,
        },
    )
