"""The E-utilities client against the loopback server replaying recorded NCBI answers."""

import pytest
from dagster import DagsterInstance, MultiPartitionKey, materialize

from assets.parsing import pubmed_metadata
from pipelines.entrez.client import EntrezClient, EntrezUnavailableError
from pipelines.entrez.records import EntrezAnswerError, parse_citedin, parse_pubmed_articles
from pipelines.net.retry import RetryPolicy
from resources.eutils import EutilsResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from testing.loopback.eutils_server import RECORDINGS, EutilsLoopbackServer
from testing.loopback.faults import Fault, FaultPlan
from tests.helpers import open_test_release

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)
# PMIDs of the recorded efetch answers (read from sample/entrez/efetch_pubmed/*.xml)
RECORDED = ["9997", "11700088", "11748933", "12091962", "27797938", "28775130", "29768149", "29963580", "30108519"]
RATE_LIMIT_BODY = (RECORDINGS / "errors" / "rate_limit_exceeded.documented.json").read_bytes()


def client(server, lake=None, **kwargs) -> EntrezClient:
    return EntrezClient(server.url, cache=lake, retry=FAST, rate_limit=100, **kwargs)


def test_recorded_pubmed_records_are_keyed_by_their_own_pmid():
    records, problems = parse_pubmed_articles((RECORDINGS / "efetch_pubmed" / "biopython_pubmed4.xml").read_bytes())
    assert problems == {} and list(records) == ["27797938"]
    record = records["27797938"]
    assert len(record["mesh"]) == 21 and record["pmcid"] == "PMC5442267" and record["journal"] == "Gut"
    assert record["publication_types"][:2] == ["Journal Article", "Observational Study"]
    mesh = {m["name"]: m for m in record["mesh"]}
    assert all(m["ui"].startswith("D") for m in record["mesh"])
    assert any(m["major"] for m in mesh.values()) or any(q["major"] for m in mesh.values() for q in m["qualifiers"])
    two, _ = parse_pubmed_articles((RECORDINGS / "efetch_pubmed" / "biopython_pubmed2.xml").read_bytes())
    assert sorted(two) == ["11700088", "11748933"]
    assert two["11700088"]["mesh"] == [] and len(two["11748933"]["mesh"]) == 11


def test_recorded_citations():
    links, problems = parse_citedin((RECORDINGS / "elink" / "biopython_elink1.xml").read_bytes())
    assert list(links) == ["9298984"] and len(links["9298984"]) == 39 and problems == {}
    links, problems = parse_citedin((RECORDINGS / "elink" / "biopython_elink3.xml").read_bytes())
    assert links == {} and set(problems) == {"11812492", "11774222"}  # one link set for two ids


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("esummary/biopython_esummary8.xml", "unexpected answer <eSummaryResult>: Neither query_key nor id specified"),
        ("errors/biopython_pubmed3_pmfetch_asn1.html", "unexpected answer <html>"),
        ("errors/rate_limit_exceeded.documented.json", "JSON error answer"),
        ("epost/biopython_epost2.xml", "unexpected answer <ePostResult>"),
    ],
)
def test_error_answers_are_named(path, message):
    with pytest.raises(EntrezAnswerError, match=message):
        parse_pubmed_articles((RECORDINGS / path).read_bytes())


def test_batched_posts_one_id_per_link_set_and_missing_pmids(tmp_path):
    wanted = RECORDED + ["1", "2"]  # two PMIDs PubMed does not know
    with EutilsLoopbackServer() as server:
        c = client(server)
        records, problems = c.pubmed_records(wanted, batch=4)
        links, link_problems = c.citing_pmids(["9298984", "12242737", "1"], batch=2)
    assert sorted(records) == sorted(RECORDED)
    assert problems == {"1": "not found in PubMed", "2": "not found in PubMed"}
    assert server.ids_per_request == [4, 4, 3, 2, 1]  # 11 ids in batches of 4, then 3 ids in batches of 2
    assert [len(links[p]) for p in ("9298984", "12242737", "1")] == [39, 6, 0] and link_problems == {}
    assert c.requests == 5


def test_rate_limit_answers_are_retried_and_answers_cached(lake):
    plan = FaultPlan(
        faults=[
            Fault("efetch", kind="body", status=200, body=RATE_LIMIT_BODY, times=1),
            Fault("efetch", status=429, retry_after=0, times=1),
            Fault("elink", status=503, times=1),
        ]
    )
    with EutilsLoopbackServer(plan=plan) as server:
        first = client(server, lake, cache_namespace="2026")
        records, _ = first.pubmed_records(RECORDED)
        links, _ = first.citing_pmids(["9298984"])
        assert sorted(records) == sorted(RECORDED) and len(links["9298984"]) == 39
        assert first.requests == 3 + 2  # efetch: rate-limit body, 429, answer; elink: 503, answer
        again = client(server, lake, cache_namespace="2026")
        assert again.pubmed_records(RECORDED)[0] == records and again.citing_pmids(["9298984"])[0] == links
        assert again.requests == 0 and again.cache_hits == 2
        fresh = client(server, lake, cache_namespace="2027")  # a new release asks afresh
        fresh.pubmed_records(RECORDED)
        assert fresh.requests == 1


def test_a_bad_answer_affects_only_its_batch_and_is_not_cached(lake):
    book = b"""<PubmedBookArticle><BookDocument><PMID Version="1">20301295</PMID></BookDocument></PubmedBookArticle>"""
    plan = FaultPlan(faults=[Fault("efetch", kind="body", status=200, body=b"<html>oops</html>", times=1)])
    with EutilsLoopbackServer(plan=plan, extra_records={"20301295": book}) as server:
        c = client(server, lake)
        records, problems = c.pubmed_records(["9997", "20301295", "27797938"], batch=1)
        # batches go in PMID order: the first (20301295) got an HTML page instead of XML
        assert problems == {"20301295": "unexpected answer <html>"}
        assert sorted(records) == ["27797938", "9997"]
        assert len(lake.fs.find(lake.path("cache"))) == 2  # the HTML answer was never written
        retry = client(server, lake)
        records, problems = retry.pubmed_records(["9997", "20301295", "27797938"], batch=1)
        assert sorted(records) == ["27797938", "9997"]
        assert problems["20301295"].startswith("PubMed returned a PubmedBookArticle")
        assert retry.requests == 1  # only the batch whose bad answer was not cached


def test_api_key_sets_the_limit_and_stays_out_of_caches_and_errors(lake):
    plan = FaultPlan(faults=[Fault("efetch", status=500, times=10)])
    with EutilsLoopbackServer(plan=plan) as server:
        url = server.url
        resource = EutilsResource(base_url=url, api_key="s3cr3t-key")  # profiles pass EnvVar("NCBI_API_KEY")
        c = resource.client(lake, namespace="2026")
        assert c.limiter.rate == 10.0
        c.retry = FAST
        with pytest.raises(EntrezUnavailableError, match="HTTP 500") as raised:
            c.pubmed_records(["9997"])
        assert "s3cr3t" not in str(raised.value) and "s3cr3t" not in repr(raised.value.__cause__)
        assert all(server.api_keys_seen)
        c.citing_pmids(["9997"])
    cached = [p for p in lake.fs.find(lake.path("cache"))]
    assert cached and not any("s3cr3t" in p or "s3cr3t" in lake.fs.cat(p).decode("utf-8", "replace") for p in cached)
    assert EutilsResource(base_url=url).client(lake, namespace="x").limiter.rate == 3.0


def test_pubmed_asset_joins_by_pmid(lake, tmp_path):
    articles = [
        {"pmcid": "PMC5442267", "pmid": "27797938"},
        {"pmcid": "PMC1", "pmid": None},
        {"pmcid": "PMC2", "pmid": "1"},
    ]
    instance = _parsed(lake, tmp_path, "2026", "000", articles)
    with EutilsLoopbackServer() as server:
        result = materialize(
            [pubmed_metadata],
            partition_key=MultiPartitionKey({"release": "2026", "shard": "000"}),
            instance=instance,
            resources={
                "lake": LakeResource(home=str(lake.root)),
                "eutils": EutilsResource(base_url=server.url),
                "quality": QualityResource(),
            },
        )
    assert result.success
    rows = {r["pmid"]: r for r in lake.read_table("pubmed", "2026", "000").to_pylist()}
    assert set(rows) == {"27797938", "1"}
    assert rows["27797938"]["pmcid"] == "PMC5442267" and rows["27797938"]["status"] == "ok"
    assert len(rows["27797938"]["mesh"]) == 21 and rows["27797938"]["cited_by_count"] == 0
    assert rows["1"]["status"] == "not_found" and rows["1"]["cited_by_count"] == -1  # unknown, not "cited by none"


def _parsed(lake, tmp_path, release: str, shard: str, articles: list[dict]) -> DagsterInstance:
    """``articles`` (pmcid, pmid) as the parse stage writes them, and an instance with the release open."""
    full = [
        {**{name: None for name in lake_articles_fields()}, **a, "keywords": [], "subjects": [], "parse_status": "ok"}
        for a in articles
    ]
    lake.write_table("articles", release, shard, full)
    (tmp_path / "dh").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dh"))
    open_test_release(instance, release)
    return instance


def lake_articles_fields():
    from pipelines.core.schemas import ARTICLES

    return ARTICLES.names


def test_invalid_api_key_raises_without_quoting_the_key(lake):
    # the JSON NCBI answers an unknown key with (hand-written, not a recording): it echoes the key
    body = b'{"error":"API key invalid","api-key":"s3cr3t-key","type":"invalid","status":"unknown"}'
    plan = FaultPlan(faults=[Fault("efetch", kind="body", status=400, body=body, times=10)])
    with EutilsLoopbackServer(plan=plan) as server:
        with pytest.raises(EntrezUnavailableError, match="rejected the API key") as raised:
            client(server, lake, api_key="s3cr3t-key").pubmed_records(["9997"])
    assert "s3cr3t" not in str(raised.value) and plan.count() == 1


def test_the_demo_profile_answers_from_the_recordings_and_never_asks_ncbi(tmp_path, monkeypatch):
    """`make demo`, `make ui`, then the command-line refresh of docs/partitions.md: `pubmed_metadata` ran with
    the demo profile's resources, which pointed at NCBI itself; offline, every shard failed after
    about 19 minutes of retries. The demo profile now serves the recorded answers on loopback for
    every step that uses E-utilities, wherever the step runs. Names other than loopback cannot be
    resolved here, and every attempt is recorded."""
    import socket

    from resources.profiles import build_resources
    from resources.settings import Settings

    asked: list[str] = []
    resolve = socket.getaddrinfo

    def loopback_only(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost", "::1"):
            asked.append(host)
            raise socket.gaierror(f"{host}: no network in this test")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
    env = {"PANELFORGE_PROFILE": "demo", "PANELFORGE_HOME": str(tmp_path / "lake"), "PANELFORGE_OUTAGE_RETRIES": "0"}
    settings = Settings.from_env(env)
    assert settings.eutils_recorded and settings.eutils_url == "https://eutils.ncbi.nlm.nih.gov/entrez/eutils"
    resources = build_resources(settings)
    lake = resources["lake"].lake()
    articles = [{"pmcid": "PMC5442267", "pmid": "27797938"}, {"pmcid": "PMC2", "pmid": "1"}]
    instance = _parsed(lake, tmp_path, "2027", "001", articles)
    result = materialize(
        [pubmed_metadata],
        partition_key=MultiPartitionKey({"release": "2027", "shard": "001"}),
        instance=instance,
        resources={name: resources[name] for name in ("lake", "eutils", "quality")},
        raise_on_error=False,
    )
    assert asked == [] and result.success
    rows = {r["pmid"]: r["status"] for r in lake.read_table("pubmed", "2027", "001").to_pylist()}
    assert rows == {"27797938": "ok", "1": "not_found"}  # 27797938 is in the recordings, 1 is not
    # with NCBI_EUTILS_URL set, the demo profile uses that server, as every other profile does
    assert not Settings.from_env({**env, "NCBI_EUTILS_URL": "http://127.0.0.1:9/entrez/eutils"}).eutils_recorded
