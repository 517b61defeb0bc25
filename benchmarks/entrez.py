"""E-utilities requests per 10,000 articles, against BIOMEDICA's one efetch per 200 articles.

Runs the client against the loopback E-utilities server (recorded answers; PMIDs it does not
know are answered as PubMed does, by leaving them out) for 10,000 PMIDs, counting the requests
the server receives for efetch (PubMed records) and elink (citing articles), then repeats the
run against the same lake cache. Baseline, same run: BIOMEDICA's ETL, 1 efetch per 200 PMIDs
(GET) and no elink.

    python -m benchmarks.entrez

Writes ``benchmarks/results/entrez.json``.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.record import write_results
from pipelines.core.lake import Lake
from pipelines.entrez.client import EFETCH_BATCH, ELINK_BATCH, EntrezClient
from testing.loopback.eutils_server import EutilsLoopbackServer
from testing.loopback.faults import FaultPlan

RESULTS = Path(__file__).parent / "results" / "entrez.json"
N = 10_000
BIOMEDICA_EFETCH_BATCH = 200


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, EutilsLoopbackServer(plan=FaultPlan()) as server:
        pmids = sorted(server.articles) + [str(40_000_000 + i) for i in range(N - len(server.articles))]
        lake = Lake(Path(tmp) / "lake")
        first = EntrezClient(server.url, cache=lake, cache_namespace="bench", rate_limit=1000)
        records, problems = first.pubmed_records(pmids)
        links, _ = first.citing_pmids(pmids)
        per_endpoint = Counter(path for _, _, path in server.plan.log)
        served = len(server.plan.log)
        again = EntrezClient(server.url, cache=lake, cache_namespace="bench", rate_limit=1000)
        again.pubmed_records(pmids)
        again.citing_pmids(pmids)
        rerun = len(server.plan.log) - served
    efetch, elink = per_endpoint["efetch.fcgi"], per_endpoint["elink.fcgi"]
    baseline_efetch = -(-N // BIOMEDICA_EFETCH_BATCH)
    result = {
        "benchmark": "E-utilities requests for 10,000 articles (PubMed records + citing articles)",
        "baseline": "BIOMEDICA ETL: one efetch per 200 PMIDs, no elink (no citation counts)",
        "pmids": N,
        "batch_sizes": {"efetch_post": EFETCH_BATCH, "elink_post_one_id_per_pmid": ELINK_BATCH},
        "panelforge": {"efetch": efetch, "elink": elink, "total": efetch + elink},
        "biomedica": {"efetch": baseline_efetch, "elink": 0, "total": baseline_efetch},
        "efetch_reduction": round(baseline_efetch / efetch, 1),
        "records_found": len(records),
        "pmids_reported_missing": len(problems),
        "pmids_with_citation_lists": len(links),
        "rerun_requests_with_cache": rerun,
        "minutes_at_3_req_s_for_6_4M_articles": round(640 * (efetch + elink) / 3 / 60, 1),
    }
    write_results(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
