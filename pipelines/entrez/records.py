"""Parsers for E-utilities answers: efetch PubMed XML and elink link sets.

Records are keyed by the PMID inside each record, never by their position in the answer, so a
missing, merged or reordered record can only affect itself.
"""

from __future__ import annotations

from lxml import etree

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=True)


class EntrezAnswerError(ValueError):
    """The answer is not the XML we asked for (HTML, an ``<ERROR>``, a JSON error body)."""


def _root(data: bytes, expected: tuple[str, ...]) -> etree._Element:
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        raise EntrezAnswerError(f"JSON error answer: {stripped[:200].decode('utf-8', 'replace')}")
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise EntrezAnswerError(f"answer is not XML: {stripped[:80]!r}...") from exc
    error = root.findtext("ERROR")
    if root.tag not in expected:
        raise EntrezAnswerError(f"unexpected answer <{root.tag}>" + (f": {error}" if error else ""))
    if error and not len(root.findall("LinkSet")) and not len(root.findall("PubmedArticle")):
        raise EntrezAnswerError(f"E-utilities error: {error}")
    return root


def _text(node) -> str:
    return " ".join("".join(node.itertext()).split()) if node is not None else ""


def _date(node) -> str | None:
    if node is None:
        return None
    year, month, day = node.findtext("Year"), node.findtext("Month"), node.findtext("Day")
    if not year:
        return _text(node.find("MedlineDate")) or None
    parts = [year.strip()]
    if month:
        parts.append(f"{int(month):02d}" if month.strip().isdigit() else month.strip())
        if day:
            parts.append(f"{int(day):02d}")
    return "-".join(parts)


def parse_pubmed_articles(data: bytes) -> tuple[dict[str, dict], dict[str, str]]:
    """Return ``({pmid: record}, {pmid: problem})`` for an efetch ``db=pubmed`` answer.

    Book records (``PubmedBookArticle``) are reported as problems: they have no journal,
    MeSH or publication types to join to an article.
    """
    root = _root(data, ("PubmedArticleSet",))
    records: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for book in root.findall("PubmedBookArticle"):
        pmid = book.findtext("BookDocument/PMID")
        if pmid:
            problems[pmid.strip()] = "PubMed returned a PubmedBookArticle (a book chapter), not a journal article"
    for node in root.findall("PubmedArticle"):
        citation = node.find("MedlineCitation")
        pmid = (citation.findtext("PMID") or "").strip() if citation is not None else ""
        if not pmid:
            continue
        article = citation.find("Article")
        mesh = []
        for heading in citation.findall("MeshHeadingList/MeshHeading"):
            descriptor = heading.find("DescriptorName")
            mesh.append(
                {
                    "ui": descriptor.get("UI"),
                    "name": _text(descriptor),
                    "major": descriptor.get("MajorTopicYN") == "Y",
                    "qualifiers": [
                        {"ui": q.get("UI"), "name": _text(q), "major": q.get("MajorTopicYN") == "Y"}
                        for q in heading.findall("QualifierName")
                    ],
                }
            )
        abstract = [
            (f"{part.get('Label')}: " if part.get("Label") else "") + _text(part)
            for part in (article.findall("Abstract/AbstractText") if article is not None else [])
        ]
        dates = {
            d.get("PubStatus"): _date(d) for d in node.findall("PubmedData/History/PubMedPubDate") if d.get("PubStatus")
        }
        ids = {i.get("IdType"): (i.text or "").strip() for i in node.findall("PubmedData/ArticleIdList/ArticleId")}
        records[pmid] = {
            "pmid": pmid,
            "title": _text(article.find("ArticleTitle")) if article is not None else None,
            "abstract": "\n".join(a for a in abstract if a) or None,
            "journal": _text(article.find("Journal/Title")) or None if article is not None else None,
            "journal_abbrev": _text(citation.find("MedlineJournalInfo/MedlineTA")) or None,
            "languages": [_text(x) for x in article.findall("Language")] if article is not None else [],
            "publication_types": [
                _text(x)
                for x in (article.findall("PublicationTypeList/PublicationType") if article is not None else [])
            ],
            "mesh": mesh,
            "keywords": [_text(k) for k in citation.findall("KeywordList/Keyword") if _text(k)],
            "pubmed_date": dates.get("pubmed"),
            "entrez_date": dates.get("entrez"),
            "medline_status": citation.get("Status"),
            "pmcid": ids.get("pmc") or None,
            "doi": ids.get("doi") or None,
        }
    return records, problems


def parse_citedin(data: bytes) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Return ``({pmid: citing pmids}, {pmid: problem})`` for an elink answer.

    Each request id comes back in its own ``LinkSet`` (one ``id=`` parameter per PMID); a link
    set holding several ids (ids joined by commas) cannot be attributed and is reported.
    """
    root = _root(data, ("eLinkResult",))
    links: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for linkset in root.findall("LinkSet"):
        ids = [i.text.strip() for i in linkset.findall("IdList/Id") if i.text]
        citing = [
            link.text.strip()
            for db in linkset.findall("LinkSetDb")
            if db.findtext("LinkName") == "pubmed_pubmed_citedin"
            for link in db.findall("Link/Id")
            if link.text
        ]
        if len(ids) != 1:
            for pmid in ids:
                problems[pmid] = f"link set combines {len(ids)} ids; citations cannot be attributed"
            continue
        error = linkset.findtext("ERROR")
        if error:
            problems[ids[0]] = f"elink error: {error}"
            continue
        links[ids[0]] = citing
    return links, problems
