"""The PubMed stage: PubMed records and citing articles for the PMIDs of one (release, shard)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pipelines.core.lake import Lake
from pipelines.core.schemas import Table
from pipelines.core.stage import Compute, Partition, Preview, Stage, StageResult
from pipelines.entrez.client import EntrezClient
from pipelines.entrez.pubmed import pubmed_rows

POOL = "ncbi_eutils"


@dataclass
class PubmedStage(Stage):
    """``client_for(lake, release)`` opens an E-utilities client caching answers in the lake
    (per release), so a rerun makes no request for what it already asked."""

    client_for: Callable[[Lake, str], EntrezClient]

    name = "pubmed_metadata"
    reads = (Table.ARTICLES,)
    writes = (Table.PUBMED,)
    compute = Compute(pool=POOL)

    def process(self, lake: Lake, partition: Partition) -> StageResult:
        release, shard = partition.release, partition.shard
        articles = lake.require(Table.ARTICLES, release, shard).select(["pmcid", "pmid"]).to_pylist()
        client = self.client_for(lake, release)
        rows = pubmed_rows(client, articles)
        lake.write_table(Table.PUBMED, release, shard, rows)
        statuses = Counter(r["status"] for r in rows)
        errors = [r for r in rows if r["status"] == "error"]
        result = self.result(
            partition,
            ok=statuses.get("ok", 0),
            error=len(errors),
            skipped=len(rows) - statuses.get("ok", 0) - len(errors),
            counts={
                "pmids": len(rows),
                "articles_without_pmid": sum(1 for a in articles if not a["pmid"]),
                **{f"status_{k}": v for k, v in sorted(statuses.items())},
                "with_mesh": sum(1 for r in rows if r["mesh"]),
                "citing_links": sum(r["cited_by_count"] for r in rows if (r["cited_by_count"] or 0) > 0),
                "eutils_requests": client.requests,
                "eutils_cache_hits": client.cache_hits,
            },
            previews={"preview": Preview(rows, ["pmid", "pmcid", "status", "journal", "cited_by_count", "problem"])},
        )
        result.add_errors(errors, "pmid", "problem")
        return result
