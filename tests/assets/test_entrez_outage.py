"""An E-utilities outage fails the run and writes nothing; per-article problems stay rows.

Citation counts read -1 (unknown, as in the release's samples) unless NCBI answered for a PMID
that PubMed knows. Expected values are read by hand from ``sample/entrez``.
"""

import functools
import socket

import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.parsing import pubmed_metadata
from pipelines.core.schemas import ARTICLES
from pipelines.entrez.client import EntrezClient, EntrezUnavailableError
from pipelines.entrez.pubmed import UNKNOWN_COUNT, pubmed_rows
from pipelines.net.retry import RetryPolicy
from resources.eutils import EutilsResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from testing.loopback.eutils_server import RECORDINGS, EutilsLoopbackServer
from testing.loopback.faults import Fault, FaultPlan
from tests.helpers import open_test_release

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)
RATE_LIMIT_BODY = (RECORDINGS / "errors" / "rate_limit_exceeded.documented.json").read_bytes()
HTML_PAGE = (RECORDINGS / "errors" / "biopython_pubmed3_pmfetch_asn1.html").read_bytes()
# A PMID with recorded citations (sample/entrez/elink/biopython_elink1.xml: 39 <Id>s in its
# pubmed_pubmed_citedin LinkSetDb); efetch was not recorded for it, so the server gets a minimal record.
CITED = "9298984"
CITED_RECORD = b"<PubmedArticle><MedlineCitation><PMID>9298984</PMID></MedlineCitation></PubmedArticle>"
BOOK = b"<PubmedBookArticle><BookDocument><PMID>20301295</PMID></BookDocument></PubmedBookArticle>"
# 27797938: recorded efetch (biopython_pubmed4.xml, PMC5442267), no recorded citations; 1: unknown to PubMed
ARTICLES_ROWS = [
    {"pmcid": "PMC5442267", "pmid": "27797938"},
    {"pmcid": "PMC9", "pmid": CITED},
    {"pmcid": "PMC2", "pmid": "1"},
]


def client(url, lake=None) -> EntrezClient:
    return EntrezClient(url, cache=lake, retry=FAST, rate_limit=100)


def cached(lake) -> list[str]:
    root = lake.path("cache")
    return [p for p in lake.fs.find(root)] if lake.fs.exists(root) else []


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/entrez/eutils"  # nothing listens there once the socket closed


def test_unreachable_service_raises_and_caches_nothing(lake):
    c = client(closed_port_url(), lake)
    with pytest.raises(EntrezUnavailableError, match="gave up after 4 attempts: efetch.fcgi: ConnectionError"):
        pubmed_rows(c, ARTICLES_ROWS)
    assert c.requests == 4 and cached(lake) == []


def test_503_to_everything_raises_after_the_retries(lake):
    plan = FaultPlan(faults=[Fault("", status=503, times=1_000)])
    with EutilsLoopbackServer(plan=plan) as server:
        c = client(server.url, lake)
        with pytest.raises(EntrezUnavailableError, match="HTTP 503"):
            pubmed_rows(c, ARTICLES_ROWS)
    assert plan.count() == 4 and cached(lake) == []


@pytest.mark.parametrize(
    "fault",
    [
        Fault("efetch", kind="body", status=200, body=RATE_LIMIT_BODY, times=1_000),  # NCBI's rate limit, with 200
        Fault("efetch", status=429, retry_after=0, times=1_000),
        Fault("efetch", kind="drop", times=1_000),  # every answer broken mid-body
    ],
)
def test_retries_exhausted_on_rate_limits_and_broken_transfers_raise(lake, fault):
    with EutilsLoopbackServer(plan=FaultPlan(faults=[fault])) as server:
        with pytest.raises(EntrezUnavailableError, match="gave up after 4 attempts"):
            client(server.url, lake).pubmed_records(["27797938"])
    assert cached(lake) == []


def test_a_broken_transfer_is_retried(lake):
    with EutilsLoopbackServer(plan=FaultPlan(faults=[Fault("efetch", kind="drop", times=1)])) as server:
        c = client(server.url, lake)
        records, problems = c.pubmed_records(["27797938"])
    assert list(records) == ["27797938"] and problems == {} and c.requests == 2


def test_an_endpoint_that_refuses_us_raises_without_retrying(lake):
    plan = FaultPlan(faults=[Fault("efetch", status=404, times=1_000)])
    with EutilsLoopbackServer(plan=plan) as server:
        with pytest.raises(EntrezUnavailableError, match="HTTP 404"):
            client(server.url, lake).pubmed_records(["27797938"])
    assert plan.count() == 1 and cached(lake) == []


def test_citations_failing_after_records_still_fail_the_run(lake):
    plan = FaultPlan(faults=[Fault("elink", status=502, times=1_000)])
    with EutilsLoopbackServer(plan=plan) as server:
        with pytest.raises(EntrezUnavailableError, match="elink.fcgi: HTTP 502"):
            pubmed_rows(client(server.url, lake), ARTICLES_ROWS)
    assert [p for p in cached(lake) if "/elink/" in p] == []  # the efetch answer was good and stays cached


def test_unknown_pmid_is_a_not_found_row_with_unknown_citations(lake):
    with EutilsLoopbackServer(extra_records={CITED: CITED_RECORD}) as server:
        rows = {r["pmid"]: r for r in pubmed_rows(client(server.url, lake), ARTICLES_ROWS)}
        # elink asked only for the PMIDs PubMed knows: an unknown PMID gets an empty link set
        assert server.ids_per_request == [3, 2]
    assert rows["1"]["status"] == "not_found" and rows["1"]["problem"] == "not found in PubMed"
    assert rows["1"]["cited_by_count"] == UNKNOWN_COUNT == -1 and rows["1"]["citing_pmids"] == []
    assert rows["1"]["citations_problem"] == "citations not fetched (PubMed status: not_found)"
    assert rows[CITED]["status"] == "ok" and rows[CITED]["cited_by_count"] == 39
    assert rows[CITED]["citing_pmids"][:3] == ["38830800", "38188366", "37424454"]
    # NCBI answered 27797938's link set with no citing articles: a known zero
    assert rows["27797938"]["cited_by_count"] == 0 and rows["27797938"]["citations_problem"] is None


def test_a_book_is_asked_for_citations_and_an_error_batch_is_not(lake):
    plan = FaultPlan(faults=[Fault("efetch", kind="body", status=200, body=HTML_PAGE, times=1)])
    wanted = [{"pmcid": "PMC1", "pmid": "20301295"}, {"pmcid": "PMC5442267", "pmid": "27797938"}]
    with EutilsLoopbackServer(plan=plan, extra_records={"20301295": BOOK}) as server:
        c = client(server.url, lake)
        records, problems = c.pubmed_records([w["pmid"] for w in wanted], batch=1)
        assert problems == {"20301295": "unexpected answer <html>"}  # batches go in PMID order
        assert len(cached(lake)) == 1  # the HTML answer was never written
        rows = {r["pmid"]: r for r in pubmed_rows(c, wanted)}  # the HTML fault is spent: both parse now
    assert rows["20301295"]["status"] == "book" and rows["20301295"]["cited_by_count"] == 0
    assert rows["27797938"]["status"] == "ok" and rows["27797938"]["cited_by_count"] == 0


def test_malformed_answer_is_an_error_row_with_unknown_citations(lake):
    plan = FaultPlan(faults=[Fault("efetch", kind="body", status=200, body=b"<PubmedArticleSet><Pub", times=1)])
    with EutilsLoopbackServer(plan=plan, extra_records={CITED: CITED_RECORD}) as server:
        rows = {r["pmid"]: r for r in pubmed_rows(client(server.url, lake), ARTICLES_ROWS)}
    assert [path for _, _, path in plan.log] == ["efetch.fcgi"]  # no PMID PubMed answered for: no elink
    assert {r["status"] for r in rows.values()} == {"error"}
    assert all(r["problem"].startswith("answer is not XML") and r["cited_by_count"] == -1 for r in rows.values())
    assert [p for p in cached(lake) if "/efetch/" in p] == []


def test_citation_problems_leave_the_count_unknown(lake):
    plan = FaultPlan(faults=[Fault("elink", kind="body", status=200, body=HTML_PAGE, times=1)])
    with EutilsLoopbackServer(plan=plan, extra_records={CITED: CITED_RECORD}) as server:
        rows = {r["pmid"]: r for r in pubmed_rows(client(server.url, lake), ARTICLES_ROWS)}
    assert rows[CITED]["status"] == "ok" and rows[CITED]["cited_by_count"] == -1
    assert rows[CITED]["citations_problem"] == "unexpected answer <html>" and rows[CITED]["citing_pmids"] == []


def materialize_pubmed(lake, tmp_path, url):
    empty = {n: None for n in ARTICLES.names} | {"keywords": [], "subjects": [], "parse_status": "ok"}
    full = [{**empty, **a} for a in ARTICLES_ROWS]
    lake.write_table("articles", "2026", "000", full)
    (tmp_path / "dh").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dh"))
    open_test_release(instance, "2026")
    return materialize(
        [pubmed_metadata],
        partition_key=MultiPartitionKey({"release": "2026", "shard": "000"}),
        instance=instance,
        resources={
            "lake": LakeResource(home=str(lake.root)),
            "eutils": EutilsResource(base_url=url),
            "quality": QualityResource(),
        },
        raise_on_error=False,
    )


def test_the_asset_fails_and_writes_no_rows_when_ncbi_is_unreachable(lake, tmp_path, monkeypatch):
    # the resource's client with the tests' fast retries: the production backoff only waits here
    # (five attempts, up to 7.5 s of sleep), it changes nothing the asset does with the outage
    monkeypatch.setattr("resources.eutils.EntrezClient", functools.partial(EntrezClient, retry=FAST))
    result = materialize_pubmed(lake, tmp_path, closed_port_url())
    assert not result.success
    assert lake.read_table("pubmed", "2026", "000") is None and cached(lake) == []


def test_the_asset_succeeds_with_an_unknown_pmid(lake, tmp_path):
    with EutilsLoopbackServer() as server:
        result = materialize_pubmed(lake, tmp_path, server.url)
    assert result.success
    rows = {r["pmid"]: r for r in lake.read_table("pubmed", "2026", "000").to_pylist()}
    assert {p: (r["status"], r["cited_by_count"]) for p, r in rows.items()} == {
        "27797938": ("ok", 0),
        CITED: ("not_found", -1),  # this server has no record for it
        "1": ("not_found", -1),
    }
