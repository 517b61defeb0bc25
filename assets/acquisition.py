"""Acquisition assets: the release inventory and the raw articles of each (release, shard)."""

from collections import Counter

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from assets.metadata import preview, previous_release
from jobs.partitions import release_shard_partitions, releases_partitions
from pipelines.acquire.download import acquire_shard
from pipelines.acquire.inventory import build_inventory
from pipelines.acquire.rawstore import verify_raw
from pipelines.partitioning import shard_keys
from resources.lake import LakeResource
from resources.pmc_source import PmcSourceResource
from resources.settings import n_shards

POOL = "pmc_source"  # one concurrency pool for every asset that talks to the PMC source


@asset(
    partitions_def=releases_partitions,
    group_name="acquisition",
    kinds={"parquet"},
    pool=POOL,
    backfill_policy=BackfillPolicy.multi_run(1),
    description="The article list of a PMC-OA release, normalized, and its diff against the previous release.",
)
def pmc_inventory(
    context: AssetExecutionContext, lake: LakeResource, pmc_source: PmcSourceResource
) -> MaterializeResult:
    release = context.partition_key
    lk = lake.lake()
    previous = previous_release(lk.releases("inventory"), release)
    previous_rows = lk.read_release("inventory", previous).to_pylist() if previous else []
    with pmc_source.open() as source:
        result = build_inventory(source, previous_rows, previous, n_shards())
        requests = source.requests
    for shard in shard_keys(n_shards()):
        lk.write_table("inventory", release, shard, result.rows_by_shard.get(shard, []))
        lk.write_table("release_changes", release, shard, result.changes_by_shard.get(shard, []))
    lk.write_table("inventory_errors", release, "all", result.problems)
    lk.refresh_catalog()
    rows = [r for shard in sorted(result.rows_by_shard) for r in result.rows_by_shard[shard]]
    groups = Counter(r["license_group"] for r in rows)
    changes = [c for shard in sorted(result.changes_by_shard) for c in result.changes_by_shard[shard]]
    context.log.info(f"release {release}: {len(rows)} articles, changes {dict(result.counts)}, previous {previous}")
    return MaterializeResult(
        metadata={
            "articles": len(rows),
            "previous_release": previous or "none",
            **{f"change_{k}": v for k, v in sorted(result.counts.items())},
            **{f"license_{k}": v for k, v in sorted(groups.items())},
            "source_requests": requests,
            "path": MetadataValue.path(lk.path("tables", "inventory", f"release={release}")),
            "preview": preview(rows, ["pmcid", "version", "pmid", "license_code", "license_group", "change"]),
            "changes": preview(changes, ["pmcid", "change", "previous_release", "reason"], limit=50),
            "problems": preview(result.problems, ["location", "error"], limit=50),
        }
    )


@asset(
    partitions_def=release_shard_partitions,
    deps=[AssetDep(pmc_inventory, partition_mapping=MultiToSingleDimensionPartitionMapping("release"))],
    group_name="acquisition",
    kinds={"parquet"},
    pool=POOL,
    backfill_policy=BackfillPolicy.multi_run(1),
    description="Each article's nXML and figure images, in one uncompressed tar per partition run, indexed.",
    check_specs=[
        AssetCheckSpec(
            "raw_articles_consistent",
            asset="pmc_raw_articles",
            description="Every downloaded or carried article has its XML, and every indexed file's bytes"
            " are in its tar with the recorded size, md5 and sha256.",
        )
    ],
)
def pmc_raw_articles(
    context: AssetExecutionContext, lake: LakeResource, pmc_source: PmcSourceResource
) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    inventory = lk.read_table("inventory", release, shard)
    if inventory is None:
        raise Failure(f"no inventory for release {release}: materialize pmc_inventory[{release}] first")
    previous = previous_release(lk.releases("raw_manifest"), release)
    with pmc_source.open() as source:
        result = acquire_shard(lk, source, release, shard, inventory.to_pylist(), previous, pmc_source.concurrency)
    lk.refresh_catalog()
    errors = [r for r in result.manifest if r["status"] == "error"]
    check = _consistency(lk, result.manifest, result.files)
    for row in errors:
        context.log.warning(f"{row['pmcid']}: {row['error']}")
    return MaterializeResult(
        metadata={
            "articles": len(result.manifest),
            **{k: v for k, v in sorted(result.counts.items())},
            "errors": len(errors),
            "files": len(result.files),
            "bytes_stored": sum(f["size"] for f in result.files),
            "source_requests": result.requests,
            "source_bytes": result.bytes_fetched,
            "new_tar": MetadataValue.path(lk.path(result.new_tar)) if result.new_tar else "none (nothing fetched)",
            "previous_release": previous or "none",
            "manifest": MetadataValue.path(lk.table_path("raw_manifest", release, shard)),
            "preview": preview(result.manifest, ["pmcid", "status", "n_files", "bytes", "error"]),
        },
        check_results=[check],
    )


def _consistency(lk, manifest: list[dict], files: list[dict]) -> AssetCheckResult:
    """Fails when an ok/carried article lacks a file or a referenced tar is missing or holds other bytes."""
    found = verify_raw(lk, manifest, files)
    return AssetCheckResult(
        check_name="raw_articles_consistent",
        passed=found.ok,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "missing_xml": MetadataValue.json(found.missing_xml[:50]),
            "missing_files": MetadataValue.json(found.missing_files[:50]),
            "missing_tars": MetadataValue.json(found.missing_tars[:50]),
            "size_mismatches": MetadataValue.json(found.size_mismatches[:50]),
            "checksum_mismatches": MetadataValue.json(found.checksum_mismatches[:50]),
            "files_checked": found.files_checked,
        },
    )
