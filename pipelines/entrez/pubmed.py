"""The ``pubmed`` rows of one partition: PubMed records and citing articles for its PMIDs.

``cited_by_count`` is the number of citing articles when NCBI answered for a PMID that PubMed
knows (0: it answered with none), and ``UNKNOWN_COUNT`` (-1, as in the release's samples)
otherwise: not found, an error, or citations not fetched; ``citations_problem`` then says why.
:class:`~pipelines.entrez.client.EntrezUnavailableError` propagates: an outage is never a row.
"""

from __future__ import annotations

from pipelines.core.schemas import PUBMED
from pipelines.entrez.client import EntrezClient

UNKNOWN_COUNT = -1


def _status(problem: str) -> str:
    if problem == "not found in PubMed":
        return "not_found"
    return "book" if "PubmedBookArticle" in problem else "error"


def pubmed_rows(client: EntrezClient, articles: list[dict]) -> list[dict]:
    """One row per distinct PMID of ``articles`` (rows of the ``articles`` table), by PMID.

    Citations are asked only for PMIDs PubMed knows (records and books): NCBI answers an
    unknown PMID with an empty link set, which would read as "cited by none"."""
    pmcid_of = {a["pmid"]: a["pmcid"] for a in articles if a.get("pmid")}
    records, problems = client.pubmed_records(pmcid_of)
    status = {pmid: "ok" if pmid in records else _status(problems[pmid]) for pmid in pmcid_of}
    citing, citing_problems = client.citing_pmids(p for p, s in status.items() if s in ("ok", "book"))
    rows = []
    for pmid in sorted(pmcid_of, key=int):
        row = {name: None for name in PUBMED.names}
        row.update(languages=[], publication_types=[], mesh=[], keywords=[], citing_pmids=[])
        if pmid in records:
            row.update({k: v for k, v in records[pmid].items() if k in row and k not in ("pmcid", "doi")})
        else:
            row["problem"] = problems[pmid]
        row["pmid"], row["pmcid"], row["status"] = pmid, pmcid_of[pmid], status[pmid]
        if pmid in citing:
            row["citing_pmids"] = citing[pmid]
            row["cited_by_count"] = len(citing[pmid])
        else:
            row["cited_by_count"] = UNKNOWN_COUNT
            not_asked = f"citations not fetched (PubMed status: {status[pmid]})"
            row["citations_problem"] = citing_problems.get(pmid) or not_asked
        rows.append(row)
    return rows
