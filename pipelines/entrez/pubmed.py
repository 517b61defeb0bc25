"""The ``pubmed`` rows of one partition: PubMed records and citing articles for its PMIDs."""

from __future__ import annotations

from pipelines.entrez.client import EntrezClient
from pipelines.schemas import PUBMED


def _status(problem: str) -> str:
    if problem == "not found in PubMed":
        return "not_found"
    return "book" if "PubmedBookArticle" in problem else "error"


def pubmed_rows(client: EntrezClient, articles: list[dict]) -> list[dict]:
    """One row per distinct PMID of ``articles`` (rows of the ``articles`` table), by PMID."""
    pmcid_of = {a["pmid"]: a["pmcid"] for a in articles if a.get("pmid")}
    records, problems = client.pubmed_records(pmcid_of)
    citing, citing_problems = client.citing_pmids(pmcid_of)
    rows = []
    for pmid in sorted(pmcid_of, key=int):
        row = {name: None for name in PUBMED.names}
        row.update(languages=[], publication_types=[], mesh=[], keywords=[], citing_pmids=[])
        if pmid in records:
            row.update({k: v for k, v in records[pmid].items() if k in row and k not in ("pmcid", "doi")})
            row["status"] = "ok"
        else:
            row["status"], row["problem"] = _status(problems[pmid]), problems[pmid]
        row["pmid"], row["pmcid"] = pmid, pmcid_of[pmid]
        if pmid in citing:
            row["citing_pmids"] = citing[pmid]
            row["cited_by_count"] = len(citing[pmid])
        else:
            row["citations_problem"] = citing_problems.get(pmid)
        rows.append(row)
    return rows
