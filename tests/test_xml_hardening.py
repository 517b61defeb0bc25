"""Hardened XML whatever the encoding.

The attack documents are a real sample article (SciELO's Hoehnea paper, Portuguese, so its text
is not ASCII) whose DOCTYPE is replaced by one declaring entities, re-encoded in UTF-8 and UTF-16
(both byte orders, with and without a byte-order mark), the declaration placed right after the
XML declaration, after a comment or after a processing instruction. Every one must be refused
with the same reason.
"""

import codecs
import re

import pytest

from pipelines.parse.nxml import UnsafeXmlError, XmlParseError, parse_article
from testing.loopback.sample_mirror import SAMPLE_DIR, article_files, sample_rows

REFUSAL = "document declares entities in an internal DTD subset; refused (XXE / entity expansion)"
PMCID = "PMC900000017"  # sample/articles/scielo-hoehnea-49-e1112020
# read in the XML by hand: its <article-title>, and three <fig>s with one <graphic> each
TITLE_START = "Prospecção química, atividade antioxidante, anticolinesterásica e antifúngica"

# name -> (codec, byte-order mark, encoding named in the XML declaration)
ENCODINGS = {
    "utf-8": ("utf-8", b"", "UTF-8"),
    "utf-8 with BOM": ("utf-8", codecs.BOM_UTF8, "UTF-8"),
    "utf-16-le with BOM": ("utf-16-le", codecs.BOM_UTF16_LE, "UTF-16"),
    "utf-16-be with BOM": ("utf-16-be", codecs.BOM_UTF16_BE, "UTF-16"),
    "utf-16-le without BOM": ("utf-16-le", b"", "UTF-16"),
    "utf-16-be without BOM": ("utf-16-be", b"", "UTF-16"),
}
BEFORE_DOCTYPE = {
    "right after the XML declaration": "",
    "after a comment": "<!-- converted by hand -->\n",
    "after a processing instruction": '<?xml-stylesheet type="text/xsl" href="jats.xsl"?>\n',
}
LAUGHS = '<!ENTITY lol0 "lol">' + "".join(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10))
# name -> (declarations in the internal subset, what the article title then holds)
DECLARATIONS = {
    "internal general entity": ('<!ENTITY e "injected">', "&e;"),
    "external general entity (file)": ('<!ENTITY e SYSTEM "file:///etc/passwd">', "&e;"),
    "external general entity (network)": ('<!ENTITY e PUBLIC "-//X//EN" "http://127.0.0.1:9/e.xml">', "&e;"),
    "internal parameter entity": ("<!ENTITY % p \"<!ENTITY e 'injected'>\"> %p;", "&e;"),
    "external parameter entity": ('<!ENTITY % p SYSTEM "http://127.0.0.1:9/evil.dtd"> %p;', ""),
    "parameter entity inside a declaration": ('<!ENTITY % p "x"><!ENTITY % q "%p;%p;">', ""),
    "billion laughs": (LAUGHS, "&lol9;"),
}


def _sample() -> tuple[str, list[str]]:
    """The article's text without its own XML declaration, and its image file names."""
    row = next(r for r in sample_rows() if r["pmcid"] == PMCID)
    xml, others = article_files(SAMPLE_DIR, row)
    text = xml.read_bytes().decode("utf-8")
    return re.sub(r"^\s*<\?xml[^>]*\?>\s*", "", text), sorted(p.name for p in others)


TEXT, FILES = _sample()


def encode(text: str, encoding: str) -> bytes:
    codec, bom, label = ENCODINGS[encoding]
    return bom + f'<?xml version="1.0" encoding="{label}"?>\n{text}'.encode(codec)


def attack(declarations: str, reference: str, before: str = "") -> str:
    """The sample article with a DOCTYPE declaring ``declarations``, ``reference`` in its title."""
    doctype = f"{before}<!DOCTYPE article [\n{declarations}\n]>\n"
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", doctype, TEXT, count=1)
    return text.replace("<article-title>", f"<article-title>{reference}", 1)


def test_the_attack_documents_are_what_they_claim():
    """The builder really puts the declaration and the reference where the tests say."""
    text = attack('<!ENTITY e "injected">', "&e;", BEFORE_DOCTYPE["after a comment"])
    assert text.startswith('<!-- converted by hand -->\n<!DOCTYPE article [\n<!ENTITY e "injected">\n]>')
    assert "<article-title>&e;Prospecção química" in text
    assert encode(text, "utf-16-be without BOM")[:4] == b"\x00<\x00?"
    assert encode(text, "utf-16-le with BOM")[:4] == b"\xff\xfe<\x00"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_benign_article_reads_the_same_in_every_encoding(encoding):
    twin = parse_article(TEXT.encode("utf-8"), pmcid=PMCID, files=FILES)
    parsed = parse_article(encode(TEXT, encoding), pmcid=PMCID, files=FILES)
    assert parsed.article["title"].startswith(TITLE_START)
    assert parsed.article["language"] == "pt"
    assert [f["image_files"] for f in parsed.figures] == [
        [f"2236-8906-hoehnea-49-e1112020-gf{i}.jpg"] for i in (1, 2, 3)
    ]
    assert parsed.figures[1]["label"] == "Figura 2."
    assert parsed.article == twin.article
    assert parsed.figures == twin.figures
    assert parsed.mentions == twin.mentions
    assert parsed.other_graphics == twin.other_graphics


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("before", BEFORE_DOCTYPE)
@pytest.mark.parametrize("kind", DECLARATIONS)
def test_every_entity_declaration_is_refused_in_every_encoding(kind, before, encoding):
    declarations, reference = DECLARATIONS[kind]
    document = encode(attack(declarations, reference, BEFORE_DOCTYPE[before]), encoding)
    with pytest.raises(UnsafeXmlError) as refused:
        parse_article(document, pmcid=PMCID, files=FILES)
    assert str(refused.value) == REFUSAL


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_billion_laughs_in_a_root_attribute_is_refused(encoding):
    """The reference sits in the root's start tag, read together with the DOCTYPE."""
    text = attack(LAUGHS, "").replace("<article ", '<article data-x="&lol9;" ', 1)
    with pytest.raises(UnsafeXmlError) as refused:
        parse_article(encode(text, encoding))
    assert str(refused.value) == REFUSAL


def test_an_external_dtd_is_never_read(tmp_path):
    """A DOCTYPE naming a DTD file (no internal subset) is allowed, but the file is not read: its
    entity never reaches the text."""
    dtd = tmp_path / "evil.dtd"
    dtd.write_text('<!ENTITY e "LEAKED">')
    text = re.sub(r"<!DOCTYPE[^>]*>", f'<!DOCTYPE article SYSTEM "{dtd.as_uri()}">', TEXT, count=1)
    parsed = parse_article(encode(text.replace("<article-title>", "<article-title>&e;", 1), "utf-16-le with BOM"))
    assert parsed.article["title"].startswith(TITLE_START)
    assert "LEAKED" not in parsed.article["title"]


def test_an_empty_internal_subset_declares_nothing():
    parsed = parse_article(encode(attack("", ""), "utf-16-be without BOM"), pmcid=PMCID)
    assert parsed.article["title"].startswith(TITLE_START)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'<?xml version="1.0"?><!--' + b"x" * 70_000 + b"--><article/>", "no root element within the first"),
        (encode("<!-- never closed", "utf-16-le with BOM"), "not well-formed"),
        (b"", "not well-formed"),
    ],
)
def test_a_prolog_without_a_root_is_a_parse_error(document, message):
    with pytest.raises(XmlParseError, match=message):
        parse_article(document)
