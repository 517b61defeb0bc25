"""Parse one PMC nXML / JATS article into typed records: article, figures, mentions, other graphics.

A pure function over bytes: no Dagster, no network. The parser is hardened: no DTD loading, no
network, no files, no entity expansion, and a document whose DOCTYPE declares entities (the XXE
and "billion laughs" attacks) is refused before its content is parsed. The decision is taken on
the DOCTYPE as libxml2 itself parsed it, so it holds in every encoding (UTF-16 with or without a
byte-order mark) and wherever the declaration sits (after a comment or a processing instruction).

Choices (documented in the README):

* A figure is a ``<fig>``, including a ``<fig specific-use="child-fig">`` inside a
  ``<fig-group>`` and figures of ``<sub-article>`` (author responses). A child figure's caption
  and graphics are its own, never its parent's.
* Not figures, recorded in ``other_graphics`` instead: graphics of ``<table-wrap>`` (table
  images), ``<disp-formula>``/``<inline-formula>`` and ``<inline-graphic>`` (equations and
  symbols), ``<supplementary-material>``, and graphical abstracts.
* Publication date: ``epub`` first, then ``ppub``, then ``collection`` (JATS 1.1+ spellings
  ``date-type="pub"`` with ``publication-format="electronic"``/``"print"`` count the same);
  precision is ``day``, ``month``, ``season`` or ``year``.
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

from pipelines.core.licenses import normalize_license

XLINK = "{http://www.w3.org/1999/xlink}href"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
# Raster formats, best first when file sizes are unknown: a GIF is usually the thumbnail of a
# JPEG/PNG/TIFF with the same stem. Extensions not listed (and none) rank between TIFF and GIF;
# vector and page formats are renditions too, but never chosen over a raster.
RASTER_PREFERENCE = {".jpg": 0, ".jpeg": 0, ".png": 1, ".tif": 2, ".tiff": 2, ".gif": 4}
OTHER_RASTER = 3
NOT_RASTER = (".eps", ".pdf", ".ps", ".svg")
IMAGE_EXTENSIONS = (*RASTER_PREFERENCE, *NOT_RASTER)
# PLOS ships PNG renditions as .PNG_L/.PNG_M/.PNG_S/.PNG_I (large to inline)
PLOS_SIZES = {"_l": 0, "_m": 1, "_s": 2, "_i": 3}
RANGE_DASH = re.compile(r"^\s*[\u2013\u2014\u2212-]\s*$|^\s*(?:to|through)\s*$")
SEASONS = {"spring", "summer", "fall", "autumn", "winter"}


ENTITY_REFUSAL = "document declares entities in an internal DTD subset; refused (XXE / entity expansion)"
# libxml2's codes for runaway entity references, which only declared entities can cause
_AMPLIFICATION = (etree.ErrorTypes.ERR_RESOURCE_LIMIT, etree.ErrorTypes.ERR_ENTITY_LOOP)
PROLOG_LIMIT = 65536  # bytes before the root's start tag; real articles need a few hundred


class UnsafeXmlError(ValueError):
    """The document declares entities (external or internal): refused, never expanded."""


class XmlParseError(ValueError):
    """The document is not a well-formed JATS article (truncated, bad encoding, wrong root)."""


class _RefuseExternal(etree.Resolver):
    """Every attempt to load an external resource (DTD, entity, XInclude) is refused: the parser
    options already forbid them, this makes a regression loud instead of a silent file read."""

    def resolve(self, url, pubid, context):
        raise UnsafeXmlError(f"document asks to load an external resource ({url}); refused (no network, no files)")


_HARDENED = {"resolve_entities": False, "no_network": True, "load_dtd": False, "dtd_validation": False}
_PARSER = etree.XMLParser(**_HARDENED, huge_tree=False, recover=False)
_PARSER.resolvers.add(_RefuseExternal())


@dataclass
class ParsedArticle:
    article: dict
    figures: list[dict] = field(default_factory=list)
    mentions: list[dict] = field(default_factory=list)
    other_graphics: list[dict] = field(default_factory=list)


# ---- small text helpers -----------------------------------------------------------------------
BLOCKS = ("p", "title", "label", "list-item", "td", "th", "break", "caption", "sec", "def", "term")


def _local(tag) -> str:
    """Element name without namespace; "" for comments and processing instructions."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[1] if tag[0] == "{" else tag


def _pad_blocks(root) -> None:
    """Put a space around every block element once, so text extraction (in C) never glues two
    blocks together ("First block.Second block.")."""
    for el in root.iter(*BLOCKS):
        el.text = " " + (el.text or "")
        el.tail = " " + (el.tail or "")


def _text(node, skip: tuple[str, ...] = ()) -> str:
    """Text of ``node`` with blocks separated by spaces and whitespace collapsed; elements named
    in ``skip`` (nested figures, tables) are left out."""
    if node is None:
        return ""
    if skip and _has_any(skip)(node):
        node = _without(node, skip)
    return " ".join(etree.tostring(node, method="text", encoding="unicode", with_tail=False).split())


@functools.cache
def _has_any(tags: tuple[str, ...]) -> etree.XPath:
    return etree.XPath("boolean(" + " | ".join(f".//{tag}" for tag in tags) + ")")


def _without(node, skip: tuple[str, ...]):
    """A copy of ``node`` without its ``skip`` descendants (their tails kept)."""
    copy = etree.fromstring(etree.tostring(node, with_tail=False))
    for tag in skip:
        for el in list(copy.iter(tag)):
            parent = el.getparent()
            if parent is None:
                continue
            previous = el.getprevious()
            if el.tail:
                if previous is not None:
                    previous.tail = (previous.tail or "") + el.tail
                else:
                    parent.text = (parent.text or "") + el.tail
            parent.remove(el)
    return copy


def _string(node, path: str) -> str:
    """The string value of an XPath (empty when nothing matches)."""
    return node.xpath(f"string({path})").strip()


def _first(node, path: str):
    found = node.xpath(path)
    return found[0] if found else None


# ---- loading ----------------------------------------------------------------------------------
def _pull_parser(recover: bool) -> etree.XMLPullParser:
    parser = etree.XMLPullParser(events=("start",), **_HARDENED, huge_tree=False, recover=recover)
    parser.resolvers.add(_RefuseExternal())
    return parser


def _root_start(parser: etree.XMLPullParser, data: bytes):
    """The root element as ``parser`` reaches its start tag, fed a byte at a time so that nothing
    after that tag (the content, any entity reference in it) has been read; None when the root
    does not start within :data:`PROLOG_LIMIT` bytes. Raises libxml2's syntax errors."""
    for i in range(min(len(data), PROLOG_LIMIT)):
        parser.feed(data[i : i + 1])
        for _, root in parser.read_events():
            return root
    if len(data) <= PROLOG_LIMIT:
        parser.close()  # the document ended before any element: libxml2 says why
    return None


def _prolog_dtd(data: bytes):
    """The internal DTD subset as libxml2 parsed it, read at the root's start tag (None: no DOCTYPE).

    libxml2 has detected the encoding by then, so UTF-16 with or without a byte-order mark and a
    DOCTYPE after comments or processing instructions are seen exactly like plain UTF-8.
    """
    try:
        root = _root_start(_pull_parser(recover=False), data)
    except etree.XMLSyntaxError as exc:
        root = _root_despite(exc, data)
    if root is None:
        raise XmlParseError(f"no root element within the first {PROLOG_LIMIT} bytes; not parsed")
    return root.getroottree().docinfo.internalDTD


def _root_despite(exc: etree.XMLSyntaxError, data: bytes):
    """The root of a document whose prolog libxml2 refused (a parameter-entity reference inside a
    declaration, an amplified entity in a root attribute), read again recovering, so that what its
    DOCTYPE declared can be looked at; the syntax error stands when that finds no root either.

    Amplification is only possible through declared entities, so it is refused outright.
    """
    if exc.code in _AMPLIFICATION:
        raise UnsafeXmlError(ENTITY_REFUSAL) from exc
    try:
        root = _root_start(_pull_parser(recover=True), data)
    except etree.XMLSyntaxError:
        root = None
    if root is None:
        raise XmlParseError(f"not well-formed XML: {exc}") from exc
    return root


def _refuse_entities(data: bytes) -> None:
    """Raise :class:`UnsafeXmlError` when the DOCTYPE declares any entity: general or parameter,
    internal or external. None is ever expanded or loaded; the same reason in every encoding."""
    dtd = _prolog_dtd(data)
    if dtd is not None and next(iter(dtd.entities()), None) is not None:
        raise UnsafeXmlError(ENTITY_REFUSAL)


def load_xml(source: bytes | str | Path) -> etree._Element:
    """Parse bytes or a file path with the hardened parser; return the ``<article>`` element."""
    data = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
    _refuse_entities(data)
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise XmlParseError(f"not well-formed XML: {exc}") from exc
    if _local(root.tag) == "pmc-articleset":
        articles = [el for el in root if _local(el.tag) == "article"]
        if not articles:
            raise XmlParseError("pmc-articleset holds no <article>")
        root = articles[0]
    if _local(root.tag) in ("book", "book-part-wrapper", "book-part"):
        raise XmlParseError(f"a book chapter (<{_local(root.tag)}>), not a journal article: not parsed")
    if _local(root.tag) != "article":
        raise XmlParseError(f"unknown root element <{_local(root.tag)}>; expected <article> or <pmc-articleset>")
    if root.tag[0] == "{":  # JATS itself in a namespace (rare): compare plain names everywhere
        _strip_namespaces(root)
    _pad_blocks(root)
    return root


def _strip_namespaces(root) -> None:
    """JATS has no default namespace, but some producers add one (and hwp:/ali: prefixes);
    element names are compared by local name everywhere, attributes keep their namespaces."""
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith("{"):
            el.tag = etree.QName(el).localname
    etree.cleanup_namespaces(root)


# ---- article metadata -------------------------------------------------------------------------
def _article_ids(meta) -> dict[str, str]:
    ids: dict[str, str] = {}
    for node in meta.xpath("article-id"):
        kind = node.get("pub-id-type") or ""
        if kind and kind not in ids and (node.text or "").strip():
            ids[kind] = node.text.strip()
    return ids


def _pub_date(meta) -> tuple[str | None, str | None, str | None]:
    """(ISO date, precision, which date) by the epub > ppub > collection precedence."""
    candidates: dict[str, object] = {}
    for node in meta.xpath("pub-date"):
        kind = node.get("pub-type") or node.get("date-type") or ""
        fmt = node.get("publication-format") or ""
        if kind == "pub" and fmt == "electronic" or kind == "epub":
            kind = "epub"
        elif kind == "pub" and fmt == "print" or kind == "ppub":
            kind = "ppub"
        elif kind not in ("collection", "epub-ppub"):
            continue
        if node.findtext("year"):
            candidates.setdefault("collection" if kind == "epub-ppub" else kind, node)
    for kind in ("epub", "ppub", "collection"):
        node = candidates.get(kind)
        if node is None:
            continue
        year = node.findtext("year").strip()
        month, day = (node.findtext("month") or "").strip(), (node.findtext("day") or "").strip()
        season = "" if month.isdigit() else (node.findtext("season") or month).strip()
        month = month if month.isdigit() else ""
        if month and day.isdigit():
            return f"{int(year):04d}-{int(month):02d}-{int(day):02d}", "day", kind
        if month:
            return f"{int(year):04d}-{int(month):02d}", "month", kind
        if season:
            return f"{int(year):04d}", "season", kind
        return f"{int(year):04d}", "year", kind
    return None, None, None


def _license(meta) -> dict:
    lic = _first(meta, "permissions/license | license")  # NLM 2.x has no <permissions>
    url = None
    if lic is not None:
        url = lic.get(XLINK) or _string(lic, ".//*[local-name()='license_ref']") or None
        url = url.strip() if isinstance(url, str) and url.strip() else None
    ref = _string(meta, "permissions//*[local-name()='license_ref']")
    url = url or (ref.strip() if ref else None)
    text = _text(lic) if lic is not None else ""
    # older articles state the licence only in prose, sometimes in <copyright-statement>
    prose = " ".join(_text(n) for n in meta.xpath("permissions | copyright-statement | license"))
    kind = lic.get("license-type") if lic is not None else None
    normalized = normalize_license(url or _license_from_text(prose) or kind)
    return {
        "license_url": url,
        "license_code": normalized.code,
        "license_group": normalized.group,
        "license_text": text or prose or None,
    }


def _license_from_text(text: str) -> str | None:
    """PLOS and others state the licence only in prose ("Creative Commons Attribution License")."""
    lowered = text.lower()
    if "public domain" in lowered and "cc0" not in lowered and "dedication" not in lowered:
        return "PDM"
    if "creative commons" not in lowered and "cc by" not in lowered and "cc0" not in lowered:
        return None
    if "cc0" in lowered or "public domain dedication" in lowered:
        return "CC0"
    if "attribution" in lowered or "cc by" in lowered:
        parts = ["CC BY"]
        parts += ["NC"] if "noncommercial" in lowered or "non-commercial" in lowered else []
        parts += ["ND"] if "noderivatives" in lowered or "no derivatives" in lowered else []
        parts += ["SA"] if "sharealike" in lowered or "share alike" in lowered else []
        return "-".join(parts)
    return None


def _citation(meta, journal: str | None, year: str | None) -> str | None:
    volume, issue = meta.findtext("volume"), meta.findtext("issue")
    fpage, lpage, eloc = meta.findtext("fpage"), meta.findtext("lpage"), meta.findtext("elocation-id")
    parts = [journal or ""]
    parts.append(f" {year}" if year else "")
    if volume:
        parts.append(f";{volume.strip()}" + (f"({issue.strip()})" if issue else ""))
    if fpage:
        parts.append(f":{fpage.strip()}" + (f"-{lpage.strip()}" if lpage else ""))
    elif eloc:
        parts.append(f":{eloc.strip()}")
    citation = "".join(parts).strip()
    return citation or None


_BODY_BLOCKS = etree.XPath(
    ".//*[self::p or self::title][not(ancestor::fig or ancestor::table-wrap or ancestor::fig-group"
    " or ancestor::supplementary-material or ancestor::p)]"
)


def _body_text(body) -> str:
    """Plain text of the body: section titles and paragraphs on their own lines; figure and
    table captions are left out (they live in the figures table)."""
    if body is None:
        return ""
    lines = (_text(el, skip=("fig", "table-wrap", "fig-group", "supplementary-material")) for el in _BODY_BLOCKS(body))
    return "\n".join(line for line in lines if line)


def _article_record(article, pmcid: str | None) -> dict:
    front = article.find("front")
    meta = front.find("article-meta") if front is not None else None
    if meta is None:
        raise XmlParseError("article has no <front>/<article-meta>")
    ids = _article_ids(meta)
    journal_meta = front.find("journal-meta")
    journal = None
    if journal_meta is not None:
        journal = (
            _string(journal_meta, ".//journal-title")
            or _string(journal_meta, "journal-id[@journal-id-type='nlm-ta']")
            or None
        )
        journal = re.sub(r"\s+", " ", journal).strip() if journal else None
    date, precision, date_kind = _pub_date(meta)
    abstract_nodes = [a for a in meta.xpath("abstract") if a.get("abstract-type") not in ("graphical", "teaser")]
    keywords = [_text(k) for k in meta.xpath("kwd-group/kwd") if _text(k)]
    subjects = [_text(s) for s in meta.xpath("article-categories//subject") if _text(s)]
    body = article.find("body")
    pmc = ids.get("pmc") or ids.get("pmcid") or ids.get("pmcaid")
    pmc = f"PMC{pmc}" if pmc and pmc.isdigit() else pmc
    return {
        "pmcid": pmcid or pmc,
        "pmid": ids.get("pmid"),
        "doi": ids.get("doi"),
        "title": _text(_first(meta, "title-group/article-title")) or None,
        "abstract": "\n".join(_text(a) for a in abstract_nodes) or None,
        "keywords": keywords,
        "subjects": subjects,
        "article_type": article.get("article-type"),
        "journal": journal,
        "pub_date": date,
        "pub_date_precision": precision,
        "pub_date_type": date_kind,
        **_license(meta),
        "citation": _citation(meta, journal, date[:4] if date else None),
        "body_text": _body_text(body) or None,
        "has_body": body is not None,
        "ref_count": len(article.xpath("back/ref-list//ref")),
        "language": article.get(XML_LANG) or "en",
    }


# ---- figures and graphics ---------------------------------------------------------------------
def _href_stem(href: str) -> str:
    """``info:doi/10.1371/journal.pone.0056489.g001`` -> ``pone.0056489.g001``;
    ``https://host/a/b/x.jpg`` -> ``x.jpg``; ``fig1`` -> ``fig1``."""
    href = href.strip()
    if href.startswith("info:doi/"):
        tail = href.rsplit("/", 1)[-1]
        return tail.split("journal.", 1)[1] if "journal." in tail else tail
    return posixpath.basename(href.split("?", 1)[0])


Files = list[str] | dict[str, int | None]  # image file names, or names with their sizes in bytes


class FileIndex:
    """The article's image files by name and by stem, built once per article.

    ``files`` is a list of names, or a mapping of name to size in bytes (None: unknown); sizes,
    when every rendition of an image has one, decide which rendition is kept.
    """

    def __init__(self, files: Files):
        self.names = set(files)
        self.sizes = {n: s for n, s in files.items() if s is not None} if isinstance(files, dict) else {}
        self.by_stem: dict[str, list[str]] = {}
        for f in files:
            stem = posixpath.splitext(f)[0]
            for key in {stem, f, _rendition_key(f)}:
                self.by_stem.setdefault(key, []).append(f)

    def candidates(self, href: str) -> list[str]:
        """Every file that is a rendition of the graphic ``href`` names: the exact name, the same
        stem with any extension, and the ``_HTML``/``_Print`` twins of either."""
        name = _href_stem(href)
        ext = posixpath.splitext(name)[1].lower()
        stem = posixpath.splitext(name)[0] if ext in IMAGE_EXTENSIONS else name
        exact = [name] if name in self.names else []
        return list(dict.fromkeys(exact + self.by_stem.get(stem, []) + self.by_stem.get(_rendition_key(name), [])))

    def best_first(self, names: list[str]) -> list[str]:
        """Renditions of one image, the one to keep first: a raster before a vector or page
        format; then the largest file when every size is known, else JPEG, PNG, TIFF before GIF
        (the thumbnail); then ``_HTML`` before ``_Print``; the name breaks remaining ties."""
        names = list(dict.fromkeys(names))
        sized = all(n in self.sizes for n in names)
        return sorted(names, key=lambda n: _rank(n, -self.sizes[n] if sized else 0))


def _rendition_key(name: str) -> str:
    """What the renditions of one image share: the file name without a known image extension
    and without the ``_HTML``/``_Print`` suffix (``fig1_Print.tif`` and ``fig1_HTML.jpg`` -> ``fig1``)."""
    stem, ext = posixpath.splitext(name)
    stem = stem if ext.lower() in IMAGE_EXTENSIONS or _plos_png(ext) else name
    return stem.removesuffix("_HTML").removesuffix("_Print")


def _plos_png(ext: str) -> bool:
    return ext.lower()[:5] == ".png_" and ext.lower()[4:] in PLOS_SIZES


def _rank(name: str, size_key: int) -> tuple[int, int, int, int, int, str]:
    ext = posixpath.splitext(name)[1].lower()
    raster = 1 if ext in NOT_RASTER else 0
    fmt = RASTER_PREFERENCE[".png"] if _plos_png(ext) else RASTER_PREFERENCE.get(ext, OTHER_RASTER)
    plos = PLOS_SIZES[ext[4:]] if _plos_png(ext) else 0
    html = 0 if "_HTML" in name else (2 if "_Print" in name else 1)
    return (raster, size_key, fmt, plos, html, name)


def resolve_graphic(href: str, files: Files | FileIndex) -> tuple[str | None, list[str]]:
    """Return (chosen image file, other renditions) for a graphic href among the package files.

    Candidates are the exact name, the same stem with any extension (hrefs without extension, or
    ``.tif`` in the XML with a ``.jpg`` in the package) and ``_HTML``/``_Print`` twins; the
    largest raster rendition is chosen (see :meth:`FileIndex.best_first`) and the rest listed,
    even when the href names a rendition exactly: a GIF thumbnail never wins over its JPEG.
    """
    index = files if isinstance(files, FileIndex) else FileIndex(files)
    ordered = index.best_first(index.candidates(href))
    return (ordered[0], ordered[1:]) if ordered else (None, [])


def _graphics_of(fig) -> list:
    """Graphics that belong to this figure itself, not to a child figure nested inside it."""
    out = []
    for g in fig.iter("graphic"):
        owner = next((a for a in g.iterancestors() if _local(a.tag) in ("fig", "table-wrap")), None)
        if owner is fig:
            out.append(g)
    return out


def _images_of(fig, files: FileIndex) -> tuple[list[str], list[str], list[str]]:
    """(image files, other renditions, unresolved hrefs) of one figure.

    Graphics inside one ``<alternatives>`` are renditions of one image; so are graphics whose
    hrefs differ only by extension or ``_HTML``/``_Print``, and a graphic marked ``specific-use``
    (SciELO's web thumbnail) next to an unmarked one. Each image keeps one rendition and lists the
    others; it is missing only when none of its renditions ships.
    """
    chosen, others, missing = [], [], []
    for unit in _rendition_units(fig):
        main = [c for g in unit if not g.get("specific-use") for c in files.candidates(g.get(XLINK))]
        marked = [c for g in unit if g.get("specific-use") for c in files.candidates(g.get(XLINK))]
        ordered = files.best_first(main) + files.best_first([c for c in marked if c not in main])
        if not ordered:
            missing.extend(g.get(XLINK) for g in unit)
            continue
        chosen.append(ordered[0])
        others.extend(ordered[1:])
    return list(dict.fromkeys(chosen)), others, missing


def _rendition_units(fig) -> list[list]:
    """The figure's graphics grouped by the image they show: one ``<alternatives>``, or one
    rendition key (:func:`_rendition_key` of the href)."""
    units: list[list] = []
    unit_of: dict = {}
    for g in _graphics_of(fig):
        href = g.get(XLINK)
        if not href:
            continue
        parent = g.getparent()
        keys = [_rendition_key(_href_stem(href))] + ([parent] if _local(parent.tag) == "alternatives" else [])
        unit = next((unit_of[k] for k in keys if k in unit_of), None)
        if unit is None:
            unit = []
            units.append(unit)
        unit.append(g)
        for key in keys:
            unit_of.setdefault(key, unit)
    return units


def _caption(fig) -> tuple[str | None, str | None]:
    caption = fig.find("caption")
    if caption is None:
        return None, None
    title = _text(caption.find("title")) or None
    # the caption without its title and without nested child figures
    paragraphs = [_text(p, skip=("fig",)) for p in caption if _local(p.tag) != "title" and _local(p.tag) != "fig"]
    text = " ".join(p for p in paragraphs if p) or None
    return title, text


def _group_id(group) -> str | None:
    main = next((f for f in group.iter("fig") if f.get("specific-use") != "child-fig"), None)
    return group.get("id") or (main.get("id") if main is not None else None)


def _context(el) -> str:
    for a in el.iterancestors():
        tag = _local(a.tag)
        if tag == "table-wrap":
            return "table-wrap"
        if tag in ("disp-formula", "inline-formula"):
            return tag
        if tag == "supplementary-material":
            return "supplementary-material"
        if tag == "abstract" and a.get("abstract-type") == "graphical":
            return "graphical-abstract"
    return "inline-graphic" if _local(el.tag) == "inline-graphic" else "other"


def _is_graphical_abstract(fig) -> bool:
    return fig.get("fig-type") in ("graphical-abstract", "graphical abstract") or any(
        _local(a.tag) == "abstract" and a.get("abstract-type") == "graphical" for a in fig.iterancestors()
    )


def _figures(article, pmcid: str | None, files: Files | None) -> tuple[list[dict], list[dict]]:
    figures, other = [], []
    index = FileIndex(files) if files is not None else None
    fig_nodes = set()
    for fig in article.iter("fig"):
        if _is_graphical_abstract(fig):
            continue
        fig_nodes.add(fig)
        parent = next((a for a in fig.iterancestors() if _local(a.tag) == "fig"), None)
        group = next((a for a in fig.iterancestors() if _local(a.tag) == "fig-group"), None)
        is_child = fig.get("specific-use") == "child-fig" or parent is not None
        if is_child and parent is None and group is not None:  # eLife: the group's main figure
            parent = next((f for f in group.iter("fig") if f.get("specific-use") != "child-fig"), None)
        title, text = _caption(fig)
        hrefs = [g.get(XLINK) for g in _graphics_of(fig) if g.get(XLINK)]
        chosen, others, missing = _images_of(fig, index) if index is not None else ([], [], [])
        flags = []
        if not (title or text):
            flags.append("empty caption")
        if not hrefs:
            flags.append("no graphic")
        if missing:
            flags.append("image missing from package: " + ", ".join(missing))
        figures.append(
            {
                "pmcid": pmcid,
                "fig_id": fig.get("id"),
                "label": _text(fig.find("label")) or None,
                "caption_title": title,
                "caption_text": text,
                "parent_fig_id": parent.get("id") if parent is not None else None,
                # eLife's <fig-group> rarely has an id: the group is named by its main figure
                "fig_group_id": _group_id(group) if group is not None else None,
                "is_child": is_child,
                "in_sub_article": any(_local(a.tag) == "sub-article" for a in fig.iterancestors()),
                "graphic_hrefs": hrefs,
                "image_files": chosen,
                "other_renditions": sorted(set(others) - set(chosen)),
                "flags": flags,
            }
        )
    for el in article.iter("graphic", "inline-graphic"):
        owner = next((a for a in el.iterancestors() if _local(a.tag) == "fig"), None)
        if owner is not None and owner in fig_nodes:
            continue
        href = el.get(XLINK)
        image = resolve_graphic(href, index)[0] if (href and index is not None) else None
        other.append({"pmcid": pmcid, "context": _context(el), "element_id": el.get("id"), "href": href, "file": image})
    return figures, other


# ---- mentions ---------------------------------------------------------------------------------
def _fig_refs(paragraph, order: dict[str, int], ids_in_order: list[str], label_to_id: dict[str, str]) -> list[str]:
    """Figure ids a paragraph refers to: multi-id rids, ranges "Figs 2–4" written as two xrefs
    around a dash, and a single xref whose own text is a range."""
    xrefs = [x for x in paragraph.iter("xref") if x.get("ref-type") == "fig"]
    found: list[str] = []
    for i, xref in enumerate(xrefs):
        rids = [r for r in (xref.get("rid") or "").split() if r]
        found.extend(rids)
        if (
            i + 1 < len(xrefs)
            and xref.tail is not None
            and RANGE_DASH.match(xref.tail)
            and xref.getnext() is xrefs[i + 1]
        ):
            start, end = rids[-1:] or [None], (xrefs[i + 1].get("rid") or "").split()[:1] or [None]
            if start[0] in order and end[0] in order and order[start[0]] < order[end[0]]:
                found.extend(ids_in_order[order[start[0]] + 1 : order[end[0]]])
        match = re.search(r"(\d+)\s*[\u2013\u2014\u2212-]\s*(\d+)\s*$", xref.text or "")
        if match and len(rids) == 1:
            low, high = int(match.group(1)), int(match.group(2))
            for number in range(low, high + 1):
                fig_id = label_to_id.get(str(number))
                if fig_id:
                    found.append(fig_id)
    return list(dict.fromkeys(found))


def _mark_xrefs(xrefs) -> None:
    """Replace each figure xref's content by an inline marker ``[text](fig:ID)``, in place.

    Runs last in :func:`parse_article` (everything else has read the tree by then), so the
    paragraphs' text can be taken by lxml in one C call instead of copying each paragraph.
    """
    for xref in xrefs:
        marker = f"[{_text(xref)}](fig:{xref.get('rid')})"
        for child in list(xref):
            xref.remove(child)
        xref.text = marker


MENTION_BLOCKS = ("p", "td", "th", "list-item", "title", "def", "term")
_FIG_XREFS = etree.XPath(".//xref[@ref-type='fig'][not(ancestor::caption or ancestor::fig)]")


def _block_of(xref):
    """The paragraph holding an xref: the outermost ``<p>``, else a table cell, list item or title."""
    blocks = [a for a in xref.iterancestors() if _local(a.tag) in MENTION_BLOCKS]
    paragraphs = [b for b in blocks if _local(b.tag) == "p"]
    return paragraphs[-1] if paragraphs else (blocks[0] if blocks else None)


def _mentions(article, pmcid: str | None, figures: list[dict]) -> list[dict]:
    """One row per (paragraph, figure): every ``xref ref-type="fig"`` outside figure captions,
    nested in bold, lists or tables included, grouped by the paragraph that holds it."""
    ids_in_order = [f["fig_id"] for f in figures if f["fig_id"]]
    order = {fig_id: i for i, fig_id in enumerate(ids_in_order)}
    label_to_id = {}
    for f in figures:
        number = re.search(r"(\d+)", f["label"] or "")
        if number and not f["is_child"] and number.group(1) not in label_to_id:
            label_to_id[number.group(1)] = f["fig_id"]
    xrefs = _FIG_XREFS(article)
    blocks = list(dict.fromkeys(b for b in map(_block_of, xrefs) if b is not None))
    refs = [_fig_refs(block, order, ids_in_order, label_to_id) for block in blocks]
    _mark_xrefs(xrefs)
    rows = []
    for index, (block, fig_ids) in enumerate(zip(blocks, refs, strict=True)):
        section = next((a for a in block.iterancestors() if _local(a.tag) == "sec"), None)
        text = _text(block, skip=("fig", "table-wrap"))
        for fig_id in fig_ids:
            rows.append(
                {
                    "pmcid": pmcid,
                    "fig_id": fig_id,
                    "paragraph_index": index,
                    "section": _text(section.find("title")) if section is not None else None,
                    "text": text,
                    "fig_known": fig_id in order,
                }
            )
    return rows


def parse_article(source: bytes | str | Path, pmcid: str | None = None, files: Files | None = None) -> ParsedArticle:
    """Parse one article (bytes or a path) into its article, figure, mention and graphic rows.

    ``files`` are the names of the article's image files, or a mapping of name to size in bytes
    (then the largest rendition of a graphic is kept); given, graphic hrefs are resolved to them.
    ``pmcid`` overrides the id in the XML (publisher JATS has none). Raises
    :class:`UnsafeXmlError` or :class:`XmlParseError` with a readable reason.
    """
    article = load_xml(source)
    record = _article_record(article, pmcid)
    figures, other = _figures(article, record["pmcid"], files)
    record["n_figures"] = len(figures)
    return ParsedArticle(record, figures, _mentions(article, record["pmcid"], figures), other)
