"""A loopback NCBI E-utilities server that answers from recorded real responses.

The recordings (``sample/entrez``, from Biopython's test suite) are indexed by the PMID inside
each record: an efetch answer is assembled from the recorded ``PubmedArticle`` elements of the
requested PMIDs (unknown PMIDs are left out, as NCBI does), an elink answer from the recorded
single-id ``LinkSet``s (an id without recorded links gets an empty link set). GET and POST are
both accepted. Faults (429, NCBI's rate-limit body, errors, transfers broken mid-body) come from
a :class:`FaultPlan`.
"""

from __future__ import annotations

import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Self

from lxml import etree

from testing.loopback.base import LoopbackHttpServer, send_body
from testing.loopback.faults import FaultPlan

RECORDINGS = Path(__file__).resolve().parents[2] / "sample" / "entrez"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)


def index_recordings(directory: Path = RECORDINGS) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """({pmid: PubmedArticle XML}, {pmid: LinkSet XML}) from the recorded answers."""
    articles: dict[str, bytes] = {}
    for path in sorted((directory / "efetch_pubmed").glob("*.xml")):
        root = etree.fromstring(path.read_bytes(), _PARSER)
        for node in root.findall("PubmedArticle"):
            articles[node.findtext("MedlineCitation/PMID").strip()] = etree.tostring(node)
    linksets: dict[str, bytes] = {}
    for path in sorted((directory / "elink").glob("*.xml")):
        root = etree.fromstring(path.read_bytes(), _PARSER)
        for node in root.findall("LinkSet"):
            ids = [i.text.strip() for i in node.findall("IdList/Id") if i.text]
            if len(ids) == 1 and node.find("LinkSetDb") is not None:
                linksets[ids[0]] = etree.tostring(node)
    return articles, linksets


class EutilsLoopbackServer(LoopbackHttpServer):
    """Serve recorded E-utilities answers on 127.0.0.1; use as a context manager."""

    def __init__(self, plan: FaultPlan | None = None, extra_records: dict[str, bytes] | None = None):
        self.plan = plan or FaultPlan()
        self.articles, self.linksets = index_recordings()
        self.articles.update(extra_records or {})
        self.api_keys_seen: list[bool] = []
        self.ids_per_request: list[int] = []

    @property
    def url(self) -> str:
        return f"{self.address}/entrez/eutils"

    def answer(self, endpoint: str, params: dict[str, list[str]]) -> tuple[int, bytes]:
        ids = [i for value in params.get("id", []) for i in value.split(",") if i]
        self.ids_per_request.append(len(ids))
        if endpoint == "efetch.fcgi" and params.get("db") == ["pubmed"]:
            body = b"".join(self.articles[i] for i in ids if i in self.articles)
            return 200, b'<?xml version="1.0" ?>\n<PubmedArticleSet>' + body + b"</PubmedArticleSet>"
        if endpoint == "elink.fcgi":
            sets = [
                self.linksets.get(i)
                or f"<LinkSet><DbFrom>pubmed</DbFrom><IdList><Id>{i}</Id></IdList></LinkSet>".encode()
                for i in ids
            ]
            return 200, b'<?xml version="1.0" ?>\n<eLinkResult>' + b"".join(sets) + b"</eLinkResult>"
        return 200, b"<eSummaryResult><ERROR>Invalid endpoint or database</ERROR></eSummaryResult>"

    def start(self) -> Self:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self, query: str) -> None:
                endpoint = urllib.parse.urlsplit(self.path).path.rsplit("/", 1)[-1]
                params = urllib.parse.parse_qs(query)
                server.api_keys_seen.append("api_key" in params)
                fault = server.plan.record(self.command, endpoint)
                if fault is not None and fault.kind != "drop":
                    status, body = fault.status, fault.body or b"<ERROR>injected</ERROR>"
                else:
                    status, body = server.answer(endpoint, {k: v for k, v in params.items() if k != "api_key"})
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                send_body(self, body, fault)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                self._handle(urllib.parse.urlsplit(self.path).query)

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                self._handle(self.rfile.read(length).decode())

        return self._serve(Handler, "eutils-loopback")
