"""Parsing assets: articles, figures, mentions, other graphics and PubMed metadata per partition;
image duplicates per release."""

from collections import Counter

from dagster import (
    AssetDep,
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from assets.acquisition import pmc_raw_articles
from assets.metadata import preview, previous_release
from jobs.partitions import release_shard_partitions, releases_partitions
from pipelines.entrez.pubmed import pubmed_rows
from pipelines.parse.duplicates import find_duplicates
from pipelines.parse.shard import parse_shard
from resources.eutils import EutilsResource
from resources.lake import LakeResource


@asset(
    partitions_def=release_shard_partitions,
    deps=[pmc_raw_articles],
    group_name="parsing",
    kinds={"parquet"},
    backfill_policy=BackfillPolicy.multi_run(1),
    description="Every article's metadata and body text, its figures (with image size, sha256, dHash), "
    "the paragraphs that mention them, and non-figure graphics.",
)
def parsed_articles(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    previous = previous_release(lk.releases("articles"), release)
    result = parse_shard(lk, release, shard, previous)
    lk.refresh_catalog()
    for pmcid, error in result.first_errors:
        context.log.warning(f"{pmcid}: {error}")
    if result.errors > len(result.first_errors):
        context.log.warning(f"... and {result.errors - len(result.first_errors)} more parse errors")
    return MaterializeResult(
        metadata={
            "articles": result.articles,
            "parsed": result.parsed,
            "carried": result.carried,
            "parse_errors": result.errors,
            "figures": result.figures,
            "child_figures": result.child_figures,
            "images": result.images,
            "mentions": result.mentions,
            "other_graphics": result.other_graphics,
            **{f"flag_{k.replace(' ', '_')}": v for k, v in sorted(result.flags.items())},
            "path": MetadataValue.path(lk.path("tables", "figures", f"release={release}", f"shard={shard}")),
            "preview": preview(result.preview, ["pmcid", "fig_id", "label", "caption_text", "image_files"]),
        }
    )


@asset(
    partitions_def=releases_partitions,
    deps=[AssetDep(parsed_articles, partition_mapping=MultiToSingleDimensionPartitionMapping("release"))],
    group_name="parsing",
    kinds={"parquet"},
    description="Figure images shared across articles: exact (sha256) and near (dHash) duplicates, recorded.",
)
def image_duplicates(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    release = context.partition_key
    lk = lake.lake()
    rows = find_duplicates(lk.read_release("figures", release).to_pylist())
    lk.write_table("image_duplicates", release, "all", rows)
    lk.refresh_catalog()
    kinds = Counter(r["kind"] for r in rows)
    return MaterializeResult(
        metadata={
            "exact_pairs": kinds["exact"] // 2,
            "near_pairs": kinds["near"] // 2,
            "preview": preview(rows, ["pmcid", "fig_id", "kind", "other_pmcid", "other_fig_id", "distance"]),
        }
    )


@asset(
    partitions_def=release_shard_partitions,
    deps=[parsed_articles],
    group_name="parsing",
    kinds={"parquet"},
    pool="ncbi_eutils",
    backfill_policy=BackfillPolicy.multi_run(1),
    description="PubMed records (MeSH, publication types, dates, abstracts) and citing articles, by PMID.",
)
def pubmed_metadata(context: AssetExecutionContext, lake: LakeResource, eutils: EutilsResource) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    release, shard = keys["release"], keys["shard"]
    lk = lake.lake()
    articles = lk.read_table("articles", release, shard)
    client = eutils.client(lk, namespace=release)
    rows = pubmed_rows(client, articles.to_pylist() if articles is not None else [])
    lk.write_table("pubmed", release, shard, rows)
    lk.refresh_catalog()
    statuses = Counter(r["status"] for r in rows)
    return MaterializeResult(
        metadata={
            "pmids": len(rows),
            "articles_without_pmid": sum(1 for a in (articles.to_pylist() if articles else []) if not a["pmid"]),
            **{f"status_{k}": v for k, v in sorted(statuses.items())},
            "with_mesh": sum(1 for r in rows if r["mesh"]),
            "citing_links": sum(r["cited_by_count"] or 0 for r in rows),
            "eutils_requests": client.requests,
            "eutils_cache_hits": client.cache_hits,
            "preview": preview(rows, ["pmid", "pmcid", "status", "journal", "cited_by_count", "problem"]),
        }
    )
